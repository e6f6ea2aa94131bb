"""A pod's container run with docker the way a kubelet runs it: what the manifest says,
translated field by field, and nothing it does not say; its probes polled as declared.

What a kubelet would do that docker does not is said where it matters: an emptyDir of
medium Memory is a tmpfs of its sizeLimit (mode 1777, tmpfs's own default, as on a node);
a disk emptyDir is a fresh folder of mode 0777 (kubernetes pkg/volume/emptydir,
defaultPerm); a PersistentVolumeClaim, or what KServe's storage initializer fetched, is a
host folder bind-mounted where the manifest puts it.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from images import docker

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(q: str) -> int:
    """A Kubernetes memory quantity in bytes ("3Gi", "512Mi", "1000")."""
    for suffix, factor in UNITS.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * factor
    return int(q)


def run_args(
    pod: dict[str, Any],
    container: dict[str, Any],
    image: str,
    secrets: dict[tuple[str, str], str],
    claims: dict[str, Path],
    resources: dict[str, Any] | None = None,
) -> list[str]:
    """`docker run -d` arguments for `container` of pod spec `pod`. `secrets`: each
    (Secret, key)'s value; `claims`: the host folder behind each PersistentVolumeClaim (or
    KServe's storage location, under the claim name "kserve-provision-location");
    `resources`: where they are set elsewhere (KServe: the InferenceService's model)."""
    args = ["run", "-d"]
    for port in container.get("ports", []):
        args += ["-p", f"127.0.0.1::{port['containerPort']}"]
    args += _security(container.get("securityContext", {}), image)
    for e in container.get("env", []):
        if "valueFrom" in e:
            ref = e["valueFrom"]["secretKeyRef"]
            args += ["-e", f"{e['name']}={secrets[(ref['name'], ref['key'])]}"]
        else:
            args += ["-e", f"{e['name']}={e['value']}"]
    limits = (resources or container.get("resources", {})).get("limits", {})
    if "cpu" in limits:
        args += ["--cpus", str(limits["cpu"])]
    if "memory" in limits:
        args += ["--memory", str(quantity(limits["memory"]))]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        args += _mount(volumes[mount["name"]], mount, claims)
    if "command" in container:
        args += ["--entrypoint", container["command"][0]]
    args.append(image)
    return args + container.get("command", [])[1:] + container.get("args", [])


def _security(sc: dict[str, Any], image: str) -> list[str]:
    args = []
    if sc.get("runAsNonRoot"):
        # the kubelet refuses to start a container whose user is root
        user = str(sc.get("runAsUser") or "")
        user = user or docker("image", "inspect", "-f", "{{.Config.User}}", image).stdout.strip()
        assert user and user.split(":")[0] not in ("0", "root"), user
    if "runAsUser" in sc:
        args += ["--user", str(sc["runAsUser"])]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for cap in sc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    # no seccompProfile: the kubelet's default, Unconfined; RuntimeDefault: the runtime's
    # own profile, which is docker's default
    if sc.get("seccompProfile", {}).get("type", "Unconfined") == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    return args


def _mount(volume: dict[str, Any], mount: dict[str, Any], claims: dict[str, Path]) -> list[str]:
    path, ro = mount["mountPath"], ":ro" if mount.get("readOnly") else ""
    if "emptyDir" in volume:
        empty = volume["emptyDir"]
        if empty.get("medium") == "Memory":
            size = f",size={quantity(empty['sizeLimit'])}" if "sizeLimit" in empty else ""
            return ["--tmpfs", f"{path}:rw,exec{size}"]
        folder = Path(tempfile.mkdtemp(prefix="ns-emptydir-"))
        folder.chmod(0o777)
        return ["-v", f"{folder}:{path}{ro}"]
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]
        ro = ":ro" if mount.get("readOnly") or claim.get("readOnly") else ""
        return ["-v", f"{claims[claim['claimName']]}:{path}{ro}"]
    raise AssertionError(f"a volume the tier cannot stand in for: {volume}")


@dataclass(eq=False)  # a key of the prober's schedule: hashed by identity
class Probe:
    """One of the container's probes, as the kubelet runs an httpGet probe: every
    periodSeconds, each try bounded by timeoutSeconds, a status 200-399 a success."""

    spec: dict[str, Any]
    url: str
    results: list[bool] = field(default_factory=list)

    def once(self) -> bool:
        get = self.spec["httpGet"]
        try:
            timeout = self.spec.get("timeoutSeconds", 1)
            status = requests.get(f"{self.url}{get['path']}", timeout=timeout).status_code
        except (requests.ConnectionError, requests.Timeout):
            status = 0
        self.results.append(200 <= status < 400)
        return self.results[-1]

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    def failed(self) -> bool:
        """failureThreshold failures in a row: the kubelet restarts (liveness, startup)
        or unreadies (readiness) the container."""
        n = self.spec.get("failureThreshold", 3)
        return len(self.results) >= n and not any(self.results[-n:])


class Pod:
    """A running container and its kubelet's probes: startup first, then readiness and
    liveness together on their own periods (in a thread) until stopped."""

    def __init__(self, container: dict[str, Any], args: list[str]):
        self.id = docker(*args).stdout.strip()
        port = container["ports"][0]["containerPort"]
        host = docker("port", self.id, f"{port}/tcp").stdout.split()[0].rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{host}"
        self.startup = Probe(container["startupProbe"], self.url)
        self.readiness = Probe(container["readinessProbe"], self.url)
        self.liveness = Probe(container["livenessProbe"], self.url)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # what stopped the prober, if anything

    def logs(self) -> str:
        done = docker("logs", self.id, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def started(self) -> float:
        """Run the startup probe as declared; seconds until it passed. Fails the test if
        the kubelet would have restarted the container."""
        began = time.monotonic()
        time.sleep(self.startup.spec.get("initialDelaySeconds", 0))
        while not self.startup.once():
            assert not self.startup.failed(), f"startup probe failed: {self.logs()}"
            time.sleep(self.startup.period)
        self._thread = threading.Thread(target=self._probe, daemon=True)
        self._thread.start()
        return time.monotonic() - began

    def _probe(self) -> None:
        due = {self.readiness: 0.0, self.liveness: 0.0}
        try:
            while not self._done.is_set():
                now = time.monotonic()
                for probe, at in due.items():
                    if now >= at:
                        probe.once()
                        due[probe] = now + probe.period
                self._done.wait(min(due.values()) - time.monotonic())
        except Exception as e:  # noqa: BLE001 - said by ready() and lived()
            self.error = e

    def ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(self.readiness.results):
            assert self.error is None and time.monotonic() < deadline, (self.error, self.logs())
            time.sleep(0.1)

    def lived(self, probes: int) -> None:
        """Wait until the liveness probe has run `probes` times; each must have passed, and
        readiness never failed once ready."""
        deadline = time.monotonic() + probes * self.liveness.period + 30
        while len(self.liveness.results) < probes:
            assert self.error is None and time.monotonic() < deadline, self.error
            time.sleep(0.5)
        assert all(self.liveness.results), (self.liveness.results, self.logs())
        first = self.readiness.results.index(True)
        assert all(self.readiness.results[first:]), (self.readiness.results, self.logs())

    def stop(self, grace_s: int) -> tuple[int, float]:
        """As the kubelet ends a pod: SIGTERM, SIGKILL after terminationGracePeriodSeconds.
        Its exit code and how long it took."""
        self._done.set()
        started = time.monotonic()
        docker("stop", "-t", str(grace_s), self.id, timeout=grace_s + 30)
        took = time.monotonic() - started
        return int(docker("inspect", "-f", "{{.State.ExitCode}}", self.id).stdout), took

    def remove(self) -> None:
        self._done.set()
        docker("rm", "-f", "-v", self.id, check=False)
