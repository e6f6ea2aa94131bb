"""The HTTP front: one ASGI application (Starlette on uvicorn) that speaks the APIs
clients already call, in front of neuronserve's workers.

    client ─▶ guard.py (request id, API key, body limit, in-flight bound, deadline, metrics)
           ─▶ routes.py (OpenAI, text-embeddings-inference, Cohere, SageMaker, /health,
                         /info, /metrics, /openapi.json, /docs) ─▶ schemas.py (bodies)
           ─▶ serving.py (the table of models, limits, splitting, coalescing.py)
           ─▶ workers/client.py (a unix socket to each worker; the workers batch, queue
                                 and run the model)

server.py runs the front and the workers it starts (`neuronserve serve front`, the
SageMaker entrypoint); launch.py starts and stops it in the background for the CLI.
The front never runs a model itself.
"""
