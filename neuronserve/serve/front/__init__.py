"""The HTTP front: one ASGI application (Starlette on uvicorn) that speaks the APIs
clients already call, in front of either engine on loopback.

    client ─▶ guard.py (request id, API key, body limit, in-flight bound, deadline, metrics)
           ─▶ routes.py (OpenAI, text-embeddings-inference, SageMaker, /health, /info,
                         /metrics, /openapi.json, /docs) ─▶ schemas.py (pydantic bodies)
           ─▶ clients.py (TorchServe's JSON and Triton's KServe v2 binary tensors,
                          kserve.py, both on aiohttp: the engine batches, queues and runs
                          the model)

server.py runs the front and the engine it starts (`neuronserve serve front`, the
SageMaker entrypoint); launch.py starts and stops it in the background for the CLI.
The front forwards: it never batches or runs a model itself.
"""
