"""The SageMaker `serve` entrypoint: one container contract for TorchServe or Triton.

SageMaker starts the container with `serve`, then polls `GET /ping` and sends
`POST /invocations` on SAGEMAKER_BIND_TO_PORT. This front answers both itself:
/ping is 503 until every worker (or instance) has loaded and warmed up, because
TorchServe's own /ping says Healthy before that. The engine runs behind it on
loopback ports. A model that cannot load ends the process non-zero, so SageMaker
marks the endpoint failed instead of waiting on it.

The model comes from /opt/ml/model (SageMaker's model_data) when it holds one, else
from the model baked into the image: a .mar, a Triton repository or a neuronserve
artifact. Each is reduced to its artifact and packaged here for the core groups of
this host, so SAGEMAKER_MODEL_SERVER_WORKERS can be honoured (and capped).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import requests

from ..artifact import MANIFEST, Manifest, read_manifest
from ..compile import get_target
from ..cores import NoFreeCoreGroup, group_count
from ..spec import DeploySpec
from ..tasks import RequestError, decode_payload, get_task

log = logging.getLogger("neuronserve.sagemaker")

MODEL_DIR = "/opt/ml/model"
BAKED_DIR = "/opt/neuronserve/model"
CONFIG_FILE = "/opt/neuronserve/neuronserve.json"


class ModelSourceError(RuntimeError):
    pass


def find_artifact(source: Path, work: Path) -> Path:
    """The neuronserve artifact inside `source`: itself, a .mar's or a Triton repository's."""
    if (source / MANIFEST).is_file():
        return source
    mars = sorted(source.glob("*.mar"))
    if mars:
        out = work / "from-mar"
        with zipfile.ZipFile(mars[0]) as z:
            members = [n for n in z.namelist() if n.startswith("artifact/")]
            if not members:
                raise ModelSourceError(f"{mars[0]} holds no neuronserve artifact/ folder")
            z.extractall(out, members)
        return out / "artifact"
    for manifest in sorted(source.glob(f"*/artifact/{MANIFEST}")) + sorted(
            source.glob(f"*/*/artifact/{MANIFEST}")):
        return manifest.parent  # a no-archive .mar folder, or <repo>/<name>/1/artifact
    raise ModelSourceError(
        f"{source} holds no model: expected a neuronserve artifact (manifest.json), a .mar "
        "built by `neuronserve package torchserve`, or a Triton repository built by "
        "`neuronserve package triton`")


def plan_workers(manifest, cores_per_worker: int, requested: int | None) -> int:
    kind = get_target(manifest.target).core_kind
    try:
        groups = group_count(kind, cores_per_worker)
    except NoFreeCoreGroup as e:
        raise ModelSourceError(str(e)) from None
    if requested and requested > groups:
        log.warning("SAGEMAKER_MODEL_SERVER_WORKERS=%d capped to %d: this host has %d %s core "
                    "group(s) of %d core(s)", requested, groups, groups, kind, cores_per_worker)
    return min(requested or groups, groups)


class Backend:
    def __init__(self, engine: str, artifact: Path, manifest: Manifest, work: Path,
                 workers: int, timeout_s: int, cores_per_worker: int):
        from ..spec import load_spec

        self.engine, self.work = engine, work
        self.manifest = manifest  # already verified by the caller
        self.task = get_task(self.manifest.task)
        self.name = self.manifest.name
        ports = _free_ports(8)
        self.spec: DeploySpec = load_spec(None, {
            "name": self.name, "artifact": artifact, "workers": workers,
            "cores_per_worker": cores_per_worker, "response_timeout_s": timeout_s,
            "token_auth": False, "model_store": work / "store", "run_dir": work / "ts",
            "triton_repository": work / "repo", "triton_run_dir": work / "tr",
            "inference_port": ports[0], "management_port": ports[1], "metrics_port": ports[2],
            "http_port": ports[3], "grpc_port": ports[4], "triton_metrics_port": ports[5],
            "grpc_inference_port": ports[6], "grpc_management_port": ports[7]})
        self.timeout_s = timeout_s

    def start(self) -> None:
        s = self.spec
        if self.engine == "torchserve":
            from ..packaging.torchserve import package_torchserve
            from . import torchserve

            package_torchserve(s.artifact, s)
            self.instance = torchserve.start(s.model_store, s.run_dir, log=log.info)
        else:
            from ..packaging.triton import package_triton
            from . import triton

            package_triton(s.artifact, s)
            self.instance = triton.start(s.triton_repository, s.triton_run_dir, s.http_port,
                                         s.grpc_port, s.triton_metrics_port, log=log.info)

    def stop(self) -> None:
        if self.engine == "torchserve":
            from . import torchserve

            torchserve.stop(self.spec.run_dir, log=log.info)
        else:
            from . import triton

            triton.stop(self.spec.triton_run_dir, log=log.info)

    def invoke(self, body: bytes, content_type: str) -> tuple[int, object]:
        if self.engine == "torchserve":
            r = requests.post(f"{self.instance.inference_url}/predictions/{self.name}",
                              data=body, headers={"Content-Type": content_type},
                              timeout=self.timeout_s)
            return r.status_code, r.json()
        return self._invoke_triton(body, content_type)

    def _invoke_triton(self, body: bytes, content_type: str) -> tuple[int, object]:
        """Same JSON in and out as the TorchServe engine, through Triton's tensors."""
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        try:
            inputs, parameters = decode_payload(body, content_type)
            request = self.task.parse(inputs, parameters)
        except RequestError as e:
            return e.status, {"code": e.status, "error": e.message}
        client = httpclient.InferenceServerClient(self.instance.http_url.removeprefix("http://"),
                                                  network_timeout=self.timeout_s)
        output = "LOGITS" if self.manifest.labels else "EMBEDDING"
        rows = []
        step = self.manifest.grid.max_batch  # Triton's max_batch_size texts per request
        for start in range(0, len(request.texts), step):
            chunk = request.texts[start : start + step]
            tensors = []
            columns = {"TEXT": [t[0] if isinstance(t, tuple) else t for t in chunk]}
            if any(isinstance(t, tuple) for t in chunk):
                columns["TEXT_PAIR"] = [t[1] for t in chunk]
            for name, values in columns.items():
                t = httpclient.InferInput(name, [len(values), 1], "BYTES")
                t.set_data_from_numpy(np.array([[v.encode()] for v in values], dtype=object))
                tensors.append(t)
            try:
                rows.append(client.infer(self.name, tensors).as_numpy(output))
            except InferenceServerException as e:
                status = int(e.status() or 500)
                return status, {"code": status, "error": e.message()}
        return 200, self.task.respond(np.concatenate(rows), request,
                                      {"labels": self.manifest.labels})


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Front(BaseHTTPRequestHandler):
    backend: Backend | None = None  # set once the engine is ready

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
        if Front.backend is None:
            return self._send(503, {"status": "loading"})
        return self._send(200, {"status": "ready"})

    def do_POST(self):
        if self.path.split("?")[0] != "/invocations":
            return self._send(404, {"error": f"no route {self.path}: use POST /invocations"})
        if Front.backend is None:
            return self._send(503, {"error": "the model is still loading"})
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        content_type = self.headers.get("Content-Type") or "application/json"
        if content_type.split(";")[0].strip() not in ("application/json", "text/plain"):
            return self._send(415, {"error": f"unsupported Content-Type {content_type}: send "
                                             "application/json or text/plain"})
        try:
            status, payload = Front.backend.invoke(body, content_type)
        except (requests.RequestException, ValueError) as e:
            status, payload = 502, {"error": f"model server did not answer properly: {e}"}
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the front
            log.exception("invocation failed")
            status, payload = 500, {"error": f"invocation failed: {e}"}
        return self._send(status, payload)


def _model_source() -> Path:
    mounted = Path(os.environ.get("NEURONSERVE_MODEL_DIR", MODEL_DIR))
    if mounted.is_dir() and any(mounted.iterdir()):
        return mounted
    baked = Path(os.environ.get("NEURONSERVE_BAKED_MODEL", BAKED_DIR))
    if baked.is_dir() and any(baked.iterdir()):
        return baked
    raise ModelSourceError(f"no model in {mounted} (SageMaker model_data) nor baked into the "
                           f"image at {baked}")


def _engine() -> str:
    engine = os.environ.get("NEURONSERVE_ENGINE")
    config = Path(os.environ.get("NEURONSERVE_CONFIG", CONFIG_FILE))
    if not engine and config.is_file():
        engine = json.loads(config.read_text()).get("engine")
    engine = engine or "torchserve"
    if engine not in ("torchserve", "triton"):
        raise ModelSourceError(f"NEURONSERVE_ENGINE={engine!r}: use torchserve or triton")
    return engine


def main() -> int:
    # Our own handler: libraries imported below may configure the root logger too.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s neuronserve %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    workers_env = os.environ.get("SAGEMAKER_MODEL_SERVER_WORKERS")
    timeout_s = int(os.environ.get("SAGEMAKER_MODEL_SERVER_TIMEOUT", "60"))
    server = ThreadingHTTPServer((os.environ.get("NEURONSERVE_BIND", "0.0.0.0"), port), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log.info("listening on port %d: /ping is 503 until the model is loaded", port)

    backend = None
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        work = Path(os.environ.get("NEURONSERVE_WORK_DIR") or tempfile.mkdtemp(prefix="ns-sm-"))
        engine = _engine()
        source = _model_source()
        artifact = find_artifact(source, work)
        manifest = read_manifest(artifact)
        cpw = int(os.environ.get("NEURONSERVE_CORES_PER_WORKER", "1"))
        workers = plan_workers(manifest, cpw, int(workers_env) if workers_env else None)
        log.info("serving %s (%s) from %s with %s, %d worker(s)", manifest.name, manifest.task,
                 source, engine, workers)
        backend = Backend(engine, artifact, manifest, work, workers, timeout_s, cpw)
        backend.start()
    except Exception as e:  # noqa: BLE001 - any load failure must end the container
        log.error("neuronserve: model failed to load: %s", " | ".join(str(e).splitlines()))
        if backend is not None:
            backend.stop()
        server.shutdown()
        return 1
    Front.backend = backend
    log.info("ready: /ping answers 200")
    stopping.wait()
    Front.backend = None
    backend.stop()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
