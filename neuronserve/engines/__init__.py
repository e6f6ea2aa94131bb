"""The engines, one package each (triton/, torchserve/), behind the contract beside them:
base.py (Engine: package, start, ready or stuck, stop), client.py (the front's client),
bench.py (what bench and soak need). Which engines exist is neuronserve.registry's."""
