"""The SageMaker `serve` entrypoint: one container contract for TorchServe or Triton.

SageMaker starts the container with `serve`, then polls `GET /ping` and sends
`POST /invocations` on SAGEMAKER_BIND_TO_PORT. This front answers both itself:
/ping is 503 until every worker (or instance) has loaded and warmed up, because
TorchServe's own /ping says Healthy before that. The engine (serve/engine.py) runs
behind it on loopback ports, packaged for this host's core groups so
SAGEMAKER_MODEL_SERVER_WORKERS can be honoured (and capped). A model that cannot load
ends the process non-zero, so SageMaker marks the endpoint failed instead of waiting.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from .. import placement
from ..artifact import read_manifest
from .engine import Engine
from .model_source import engine_name, find_model, model_source

log = logging.getLogger("neuronserve.sagemaker")


class Front(BaseHTTPRequestHandler):
    engine: Engine | None = None  # set once the engine is ready

    def log_message(self, fmt, *args):  # route access lines through logging
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.split("?")[0] != "/ping":
            return self._send(404, {"error": f"no route {self.path}: use GET /ping"})
        if Front.engine is None:
            return self._send(503, {"status": "loading"})
        return self._send(200, {"status": "ready"})

    def do_POST(self):
        if self.path.split("?")[0] != "/invocations":
            return self._send(404, {"error": f"no route {self.path}: use POST /invocations"})
        if Front.engine is None:
            return self._send(503, {"error": "the model is still loading"})
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        content_type = self.headers.get("Content-Type") or "application/json"
        if content_type.split(";")[0].strip() not in ("application/json", "text/plain"):
            return self._send(
                415,
                {
                    "error": f"unsupported Content-Type {content_type}: send "
                    "application/json or text/plain"
                },
            )
        try:
            status, payload = Front.engine.invoke(body, content_type)
        except (requests.RequestException, ValueError) as e:
            status, payload = 502, {"error": f"model server did not answer properly: {e}"}
        except Exception as e:  # one bad request must not stop the front (logged)
            log.exception("invocation failed")
            status, payload = 500, {"error": f"invocation failed: {e}"}
        return self._send(status, payload)


def start_engine(work: Path, timeout_s: int) -> Engine:
    """Find the model, plan workers for this host from SageMaker's settings, start the
    engine behind the front."""
    source = model_source()
    found = find_model(source, work)
    manifest = read_manifest(found.artifact)
    cpw = int(os.environ.get("NEURONSERVE_CORES_PER_WORKER", "1"))
    requested = os.environ.get("SAGEMAKER_MODEL_SERVER_WORKERS")
    plan = placement.plan(
        placement.PlanRequest(
            manifest.target,
            workers=int(requested) if requested else None,
            cores_per_worker=cpw,
            cores_per_module=int(manifest.compiler.get("cores_per_module", 1)),
        ),
        serving_host=True,
    )
    if requested and int(requested) > plan.workers:
        log.warning(
            "SAGEMAKER_MODEL_SERVER_WORKERS=%s capped to %d: this host has %d %s core "
            "group(s) of %d core(s)",
            requested,
            plan.workers,
            plan.groups,
            plan.kind,
            cpw,
        )
    settings: dict[str, Any] = {
        "workers": plan.workers,
        "cores_per_worker": cpw,
        "response_timeout_s": timeout_s,
    }
    if found.packaged is not None:
        # what was given at packaging time wins over the artifact again here
        settings["truncation"] = found.packaged.truncation
    engine = Engine(engine_name(), found.artifact, work, settings)
    log.info(
        "serving %s (%s) from %s with %s, %d worker(s)",
        manifest.name,
        manifest.task,
        source,
        engine.engine_name,
        plan.workers,
    )
    try:
        engine.start()
    except BaseException:
        engine.stop()
        raise
    return engine


def _logging() -> None:
    # Our own handler on our namespace: libraries imported later may configure the root.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s neuronserve %(message)s"))
    root = logging.getLogger("neuronserve")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def main() -> int:
    _logging()
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    timeout_s = int(os.environ.get("SAGEMAKER_MODEL_SERVER_TIMEOUT", "60"))
    server = ThreadingHTTPServer((os.environ.get("NEURONSERVE_BIND", "0.0.0.0"), port), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log.info("listening on port %d: /ping is 503 until the model is loaded", port)

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        work = Path(os.environ.get("NEURONSERVE_WORK_DIR") or tempfile.mkdtemp(prefix="ns-sm-"))
        engine = start_engine(work, timeout_s)
    except Exception as e:  # noqa: BLE001 - any load failure must end the container
        log.error("neuronserve: model failed to load: %s", " | ".join(str(e).splitlines()))
        server.shutdown()
        return 1
    Front.engine = engine
    log.info("ready: /ping answers 200")
    stopping.wait()
    Front.engine = None
    engine.stop()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
