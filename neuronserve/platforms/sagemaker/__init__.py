"""SageMaker: the container build context (context.py, files/), the entrypoint the
container runs (entrypoint.py) and the endpoint's scaling policy (scaling.py)."""
