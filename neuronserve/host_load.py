"""How busy the chip and the host are: each NeuronCore's utilization, read from
neuron-monitor as it streams, and the CPU seconds of a process tree. The front exports
both on /metrics, `neuronserve bench` records them per point, and `doctor --url` reads
them to say which one sets the pace.

neuron-monitor writes one JSON report per period to stdout; its `neuroncore_counters`
group gives, per runtime, `neuroncores_in_use: {core: {neuroncore_utilization: percent
during the period}}` ("Neuron Monitor User Guide", JSON output format:
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/neuron-monitor-user-guide.html).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

MONITOR = "neuron-monitor"


def core_utilization(report: dict[str, Any], owned: set[int] | None = None) -> dict[int, float]:
    """Each NeuronCore's utilization (percent over the report's period) in one
    neuron-monitor report, over every runtime it lists; with `owned`, only the runtimes
    of those processes (neuron-monitor sees every process's NeuronCores on the host,
    other tenants' too) where the report names the runtime's pid."""
    out: dict[int, float] = {}
    for runtime in report.get("neuron_runtime_data") or []:
        if owned is not None and "pid" in runtime and runtime["pid"] not in owned:
            continue
        counters = (runtime.get("report") or {}).get("neuroncore_counters") or {}
        for core, data in (counters.get("neuroncores_in_use") or {}).items():
            with contextlib.suppress(TypeError, ValueError):
                out[int(core)] = float(data.get("neuroncore_utilization") or 0.0)
    return out


class NeuronMonitor:
    """neuron-monitor run in the background, its NeuronCore counters only: the recent
    reports (`history`: the latest is `utilization`, a window's mean `mean_between`)
    and each core's sum of percent x seconds since it started (`busy_seconds`)."""

    def __init__(self, period_s: float = 1.0, owned: Callable[[], set[int]] | None = None) -> None:
        """`owned`: the processes whose NeuronCores count (the deployment's), asked at
        each report; None: every process's."""
        self.period_s = period_s
        self.owned = owned
        self.busy: dict[int, float] = {}
        # (monotonic time received, utilization per core) of the recent reports
        self.history: deque[tuple[float, dict[int, float]]] = deque(maxlen=3600)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._config: Path | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which(MONITOR) is not None

    def start(self) -> bool:
        """Start it where neuron-monitor is installed (False where it is not)."""
        if not self.available():
            return False
        config = {
            "period": f"{self.period_s:g}s",
            "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}]}],
            "system_metrics": [],
        }
        fd, name = tempfile.mkstemp(prefix="neuron-monitor-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        self._config = Path(name)
        self._proc = subprocess.Popen(
            [MONITOR, "-c", name],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, name="neuron-monitor", daemon=True).start()
        return True

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            found = core_utilization(report, self.owned() if self.owned else None)
            period = self.period_s
            with contextlib.suppress(StopIteration, TypeError, ValueError, AttributeError):
                runtime = next(iter(report.get("neuron_runtime_data") or []))
                period = float(runtime["report"]["neuroncore_counters"]["period"])
            with self._lock:
                self.history.append((time.monotonic(), found))
                for core, percent in found.items():
                    self.busy[core] = self.busy.get(core, 0.0) + percent / 100 * period

    def utilization(self) -> dict[int, float]:
        with self._lock:
            return dict(self.history[-1][1]) if self.history else {}

    def mean_between(self, start: float, end: float) -> float | None:
        """The mean utilization (a fraction) of the cores in use over the reports whose
        period lies within [start, end] (time.monotonic()); None without any."""
        with self._lock:
            inside = [
                found
                for t, found in self.history
                if start <= t - self.period_s and t <= end + 0.05 and found
            ]
        values = [pct for found in inside for pct in found.values()]
        return sum(values) / len(values) / 100 if values else None

    def busy_seconds(self) -> dict[int, float]:
        with self._lock:
            return dict(self.busy)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
            self._proc = None
        if self._config is not None:
            self._config.unlink(missing_ok=True)
            self._config = None


def tree_cpu(roots: list[int]) -> Iterator[tuple[psutil.Process, float]]:
    """Each live process of the trees under `roots` (each once), with its CPU seconds
    (user + system) so far; a process that ends meanwhile is left out."""
    seen: set[int] = set()
    for pid in roots:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            yield p, t.user + t.system


def cpu_seconds(pid: int | None = None) -> tuple[float, float]:
    """CPU seconds so far of process `pid` (default: this one) and of every process under
    it: (its own, its children's)."""
    root = os.getpid() if pid is None else pid
    own = below = 0.0
    for p, seconds in tree_cpu([root]):
        if p.pid == root:
            own = seconds
        else:
            below += seconds
    return own, below


# a share of time above which a resource is the one that sets the pace
SATURATED = 0.85


def pace(neuroncores_busy: float | None, host_busy: float) -> str:
    """What sets the pace, from the NeuronCores' mean utilization and the share of the
    host's CPUs in use (fractions), and what to change."""
    if neuroncores_busy is not None and neuroncores_busy >= SATURATED:
        return (
            "the chip: its NeuronCores are busy; more throughput needs more NeuronCores "
            "(a larger instance, or workers on cores left idle)"
        )
    if host_busy >= SATURATED:
        return (
            "the host: its CPUs are busy while the NeuronCores wait; give each NeuronCore "
            "more vCPUs (a larger instance), or cut CPU per request (more texts per "
            "request, so that each request's overhead is shared)"
        )
    if neuroncores_busy is None:
        return "neither is saturated (no NeuronCore utilization to compare)"
    return (
        "neither: the NeuronCores and the CPUs both have room, so requests wait on each "
        "other in turn; raise the concurrency or the batch (max_batch_delay_ms)"
    )


def _series(text: str) -> dict[str, float]:
    """A Prometheus text exposition's samples summed by metric name (labels dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def read_metrics(url: str, key: str | None = None) -> str:
    """A running front's /metrics text, with its key when given (never carried on to
    where a redirect points). Raises OSError when it cannot be read."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {key}"} if key else {}

    class Stay(urllib.request.HTTPRedirectHandler):
        # a redirect is answered as the error it is here: urllib would carry the key on
        # to wherever it points
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    request = urllib.request.Request(url.rstrip("/") + "/metrics", headers=headers)
    try:
        with urllib.request.build_opener(Stay).open(request, timeout=10) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            raise OSError(
                f"{url}/metrics answered {e.code}, a redirect to "
                f"{e.headers.get('Location')!r}: not followed (it would take the key "
                "along); give the front's own address"
            ) from None
        raise OSError(f"{url}/metrics answered {e.code}: {e.read()[:200]!r}") from None
    except (urllib.error.URLError, ValueError) as e:
        raise OSError(f"cannot read {url}/metrics: {e}") from None


def front_pace(url: str, seconds: float = 10.0, key: str | None = None) -> list[str]:
    """Read a running front's /metrics twice, `seconds` apart, and say what set the
    pace in between: requests per second, host CPU per request, the NeuronCores' mean
    utilization and the share of this host's CPUs the deployment used (run it on the
    host that serves). Raises OSError when the front cannot be read."""

    def read() -> tuple[float, dict[str, float]]:
        text = read_metrics(url, key)
        return time.monotonic(), _series(text)

    t0, before = read()
    time.sleep(seconds)
    t1, after = read()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    wall = t1 - t0
    requests = delta("neuronserve_front_requests_total")
    cpu = delta("neuronserve_host_cpu_seconds_total")
    host = cpu / (wall * (os.cpu_count() or 1))
    cores = int(after.get("neuronserve_neuroncores_in_use", 0))
    busy = delta("neuronserve_neuroncore_busy_seconds_total")
    chip = busy / (wall * cores) if cores else None
    lines = [
        f"over {wall:.0f}s: {requests / wall:.1f} requests/s, host CPU "
        + (f"{cpu * 1e3 / requests:.2f} ms per request, " if requests else "")
        + f"{host:.0%} of this host's {os.cpu_count()} CPUs in use"
        + (f"; NeuronCores {chip:.0%} busy ({cores} in use)" if chip is not None else ""),
        f"pace set by {pace(chip, host)}",
    ]
    return lines
