"""neuronserve's workers: the front hands each core group's worker process its requests
over a unix socket in a private folder, with no server in between (client.py, wire.py,
worker.py), a supervisor replaces one that dies or hangs (supervisor.py), and the store
they load is packaged for each start (package.py, store.py)."""
