"""Run the front in this process, with the workers it starts behind it.

The front listens first, so probes get an honest 503 while the workers load, and
answers once every worker is ready. A model that cannot load ends the process non-zero
(SageMaker then marks the endpoint failed instead of waiting). Workers whose
supervisor is gone (Deployment.stuck) are restarted. SIGTERM or SIGINT: the
front stops accepting, lets requests in flight finish (up to the deadline), then stops
the workers and exits (uvicorn's graceful shutdown, then the lifespan's exit).

    python -m neuronserve.serve.front.server RUN_DIR/front.json

is how `neuronserve serve front` starts it in the background (launch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from ...processes import ServeError, port_taken, private_dir
from ...spec import load_spec
from ...tracing import TRACING, TracingUnavailable, settings
from ..deployment import Deployment, deployment_for
from .app import build_app
from .config import FrontConfig
from .launch import WORKERS_DIR
from .protocol import with_deadlines
from .serving import Serving

if TYPE_CHECKING:
    from ...workers.answers import WorkerClient

log = logging.getLogger("neuronserve.front")

# how often the front asks its workers whether only a restart can make it whole again
WHOLE_CHECK_S = 5.0


def configure_logging() -> None:
    # Our own handler on our namespace: libraries imported later may configure the root.
    root = logging.getLogger("neuronserve")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s neuronserve %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def _start_tracing(config: FrontConfig) -> None:
    """Traces go where the spec or OpenTelemetry's variables say, if anywhere (said)."""
    try:
        TRACING.start(config.otlp_endpoint, config.otlp_service_name, config.otlp_protocol)
    except TracingUnavailable as e:
        raise ServeError(str(e)) from None
    if TRACING.on:
        endpoint, protocol, service = settings(
            config.otlp_endpoint, config.otlp_protocol, config.otlp_service_name
        )
        log.info("traces of every request go to %s (OTLP, %s) as %s", endpoint, protocol, service)


def run(config: FrontConfig, make_deployment: Callable[[], Deployment]) -> int:
    """Serve until told to stop; the exit status (1 if the model failed to load). A run
    folder another local user owns or can write is refused first (ServeError): the
    workers' store and the catalog the workers follow live in it."""
    private_dir(config.run_dir)
    taken = port_taken(config.address, config.port)
    if taken:
        raise ServeError(f"the front cannot listen: {taken}")
    _start_tracing(config)
    serving = Serving(config)
    server: dict[str, uvicorn.Server] = {}
    deployments: list[Deployment] = []
    # a restart (_keep_whole) and the last stop never run at once
    workers_lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        bring_up = asyncio.create_task(
            _bring_up(serving, make_deployment, deployments, server, workers_lock)
        )
        try:
            yield
        finally:
            bring_up.cancel()
            if serving.catalog is not None:
                await serving.catalog.close()
            if serving.client is not None:
                await serving.client.close()
            serving.metrics.close()
            for deployment in deployments:
                log.info("stopping the workers")
                await asyncio.to_thread(_holding, workers_lock, deployment.stop)
            await asyncio.to_thread(TRACING.stop)  # what is left goes out before the exit

    _room_for_connections(config.max_connections)
    uv = uvicorn.Server(_uvicorn_config(config, build_app(serving, lifespan)))
    server["uvicorn"] = uv
    auth = (f"API keys on (from {config.keys.where})" if config.keys else "no API key needed") + (
        " (SageMaker's contract)" if config.sagemaker else ""
    )
    until = (
        "the workers are up (models load on POST /models)"
        if config.multi_model
        else "every model is loaded"
    )
    log.info(
        "front listening on %s (%s); /health and /ping answer 503 until %s", config.url, auth, until
    )
    # uvicorn raises the stop signal again once it has shut down; after a graceful stop
    # that would only turn a clean exit into a killed one
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uv.run()
    return serving.exit_code or (0 if uv.started else 1)


def _uvicorn_config(config: FrontConfig, app: Any) -> uvicorn.Config:
    """How uvicorn serves the front's app."""
    return uvicorn.Config(
        app,
        host=config.address,
        port=config.port,
        loop="uvloop",
        http=with_deadlines(config.header_timeout_s, config.keep_alive_s),
        # beyond it new requests get 503: file descriptors stay for probes and workers
        limit_concurrency=config.max_connections,
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        # X-Forwarded-* would let any client claim another address: not trusted
        proxy_headers=False,
        ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
        ssl_keyfile=str(config.tls_key) if config.tls_key else None,
        # requests in flight get this long to finish after SIGTERM
        timeout_graceful_shutdown=int(config.deadline_s) + 1,
        # uvicorn's default 5 s equals our Retry-After: a client that waits as told
        # and reuses its connection races the close and loses the request
        timeout_keep_alive=int(config.keep_alive_s),
    )


def _room_for_connections(connections: int) -> None:
    """Raise the open-file limit (up to the hard one) so `connections` client connections
    leave descriptors for the workers' connections, logs and probes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        top = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


async def _bring_up(
    serving: Serving,
    make_deployment: Callable[[], Deployment],
    deployments: list[Deployment],
    server: dict[str, uvicorn.Server],
    workers_lock: threading.Lock,
) -> None:
    uv = server["uvicorn"]
    # uvicorn runs the lifespan before it binds: the workers start once the front's port
    # is taken
    while not uv.started and not uv.should_exit:
        await asyncio.sleep(0.01)
    if uv.should_exit:
        return
    try:
        deployment = make_deployment()
        deployments.append(deployment)
        log.info(
            "starting the workers for %s, %d worker(s)",
            deployment.tasks,
            deployment.plan.workers,
        )
        await asyncio.to_thread(deployment.start)
        if deployment.plan.kind == "neuron" and not serving.metrics.watch_neuron_cores():
            log.warning(
                "neuron-monitor is not installed: /metrics will not show the NeuronCores' "
                "utilization (install aws-neuronx-tools)"
            )
        models = deployment.served_models()
        client = deployment.client()
        if deployment.multi_model:
            await _start_catalog(serving, deployment, client)
        else:
            serving.attach(models, client)
        log.info("ready: %s serving %s", serving.config.url, deployment.tasks)
        if not deployment.multi_model:  # (a restart would lose what was loaded since)
            await _keep_whole(serving, deployment, workers_lock)
    except Exception as e:  # noqa: BLE001 - any load failure must end the process
        log.error("neuronserve: model failed to load: %s", " | ".join(str(e).splitlines()))
        serving.exit_code = 1
        uv.should_exit = True


async def _keep_whole(
    serving: Serving, deployment: Deployment, lock: threading.Lock, every_s: float = WHOLE_CHECK_S
) -> None:
    """Restart the workers whenever only a restart can make them whole again (their
    supervisor is gone: it replaces a dead or hung worker itself): /health answers 503
    `loading` and requests 503 with Retry-After for the restart's time, instead of
    workers lost until someone restarts the server. A restart that fails ends the front
    as a failed load does."""
    said_before = False
    while True:
        await asyncio.sleep(every_s)
        try:
            why = await asyncio.to_thread(deployment.stuck)
        except Exception as e:  # noqa: BLE001 - asking again is all there is to do
            log.warning("could not tell whether the workers are whole: %s", e)
            continue
        # a restart costs every request for its time: only on the same word twice running
        said_before, act = why is not None, said_before and why is not None
        if not act:
            continue
        said_before = False
        log.error("neuronserve: restarting the workers: %s", why)
        serving.starting = True
        await asyncio.to_thread(_holding, lock, deployment.restart)
        # a client of the new workers: their sockets are new too
        old, serving.client = serving.client, deployment.client()
        if old is not None:
            await old.close()
        serving.starting = False
        log.info("restarted the workers: serving %s", deployment.tasks)


def _holding(lock: threading.Lock, fn: Callable[[], None]) -> None:
    with lock:
        fn()


async def _start_catalog(serving: Serving, deployment: Deployment, client: WorkerClient) -> None:
    """Multi-model: the workers started empty; the models given at start are loaded like
    any later one, before the front says it is ready."""
    config = serving.config
    catalog = deployment.catalog(serving, config.memory_budget_mb, config.idle_unload_s)
    serving.catalog, serving.starting = catalog, True
    serving.attach({}, client)
    for name, (_, artifact) in deployment.initial.items():
        await catalog.register(name, str(artifact))
    serving.starting = False
    catalog.start()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m neuronserve.serve.front.server RUN_DIR/front.json", file=sys.stderr)
        return 2
    configure_logging()
    saved = json.loads(Path(args[0]).read_text())
    spec = load_spec(None, saved["spec"])
    config = FrontConfig.of(spec.front, spec.limits, spec.multi_model)
    work = config.run_dir / WORKERS_DIR
    sources = [Path(x) for x in saved["sources"]]
    return run(config, lambda: deployment_for(spec, sources, work))


if __name__ == "__main__":
    sys.exit(main())
