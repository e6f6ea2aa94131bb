"""`neuronserve doctor ARTIFACT`: the first-run check on a Neuron host.

It checks, on the hardware, the behaviour CI can only see through the stand-in SDK:
- the NeuronCores this host gives the process (neuron-ls, the container's grant);
- that a worker's Neuron runtime reserves only the core it leased: a probe process
  leases and pins a core, loads a module, and `neuron-ls` is asked which cores it holds
  (the runtime "reserves" the cores it sees "for the current process");
- that padded batch-1 requests answer like the CPU eager model (the artifact's reference
  check, whose batch-1 buckets include a padded row);
- that calls do not copy the weights host-to-device each time: a call is timed against
  the time copying the module's weights would take;
- per-bucket model latency, beside the published numbers the project grew from.
Exit status 1 when a check fails.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import cores, placement
from .artifact import Manifest, read_manifest
from .compile.base import CompileError
from .compile.check import check_modules, load_modules, runnable_target
from .compile.reference import REFERENCE_FILE, Reference, tensors
from .execution import InputLayout, Module
from .placement import core_kind
from .spec import WorkerSection

# host-to-device bandwidth assumed for the weight-copy estimate (PCIe Gen4 x16 order)
HOST_TO_DEVICE_BYTES_PER_S = 16e9
# published numbers the project grew from (AWS's and Hugging Face's blog posts): end-to-end
# p95, BERT-base, seq 128
SEEDS = [
    "Inf1 (AWS ML blog, 'Achieve 12x higher throughput'): BERT-base seq 128, batch 1, "
    "inf1.xlarge data parallel p95 16.5 ms (245 sentences/s), 4-core pipeline 13.8 ms; "
    "inf1.6xlarge 16-core pipeline 6.9 ms (1793 sentences/s)",
    "Inf2 (Hugging Face blog, 'Accelerating Transformers with Inferentia2'): BERT-base p95 "
    "about 6x below the other setups up to sequence 256; 4x better than Inf1",
]


@dataclass
class Finding:
    name: str
    status: str  # PASS, FAIL, WARN or SKIP
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


def run_doctor(
    artifact: Path,
    probe_timeout_s: float = 300,
    others: Sequence[Path] = (),
    worker: WorkerSection | None = None,
) -> list[Finding]:
    """The memory plan of `artifact` with `others` served beside it (every worker holds
    them all, laid out as `worker` says), then, for a Neuron artifact, the checks on this
    host's NeuronCores."""
    manifest = read_manifest(artifact)
    findings = [memory(worker or WorkerSection(), [artifact, *others])]
    if core_kind(manifest.target) != "neuron":
        return [
            *findings,
            Finding(
                "target",
                "SKIP",
                f"{artifact} is compiled for {manifest.target}; the "
                "doctor checks Neuron artifacts on Neuron hosts",
            ),
        ]
    findings.append(discovery())
    if findings[-1].status != "PASS":
        return findings
    findings.append(leased_cores_only(artifact, manifest, probe_timeout_s))
    findings.extend(on_one_core(artifact, manifest))
    return findings


def memory(worker: WorkerSection, artifacts: list[Path]) -> Finding:
    """Each worker's memory with every model loaded, as packaging plans it."""
    manifests = [read_manifest(a, verify=False) for a in artifacts]
    try:
        plan = placement.plan(placement.PlanRequest.of(worker, manifests))
    except (placement.PlacementError, ValueError) as e:
        return Finding("memory plan", "SKIP", f"no worker plan on this host: {e}")
    found = placement.memory_plan(
        [(m.name, m, a) for m, a in zip(manifests, artifacts, strict=True)],
        plan,
        cores.instance_family(),
    )
    lines = "\n".join(found.lines())
    if not found.fits:
        return Finding("memory plan", "FAIL", f"over budget:\n{lines}")
    return Finding("memory plan", "PASS", f"fits:\n{lines}")


def discovery() -> Finding:
    try:
        found = cores.discover_neuron_cores()
    except cores.NoFreeCoreGroup as e:
        return Finding("NeuronCores", "FAIL", str(e))
    given = os.environ.get("NEURON_RT_VISIBLE_CORES")
    source = f"given to this container: NEURON_RT_VISIBLE_CORES={given}" if given else "neuron-ls"
    return Finding("NeuronCores", "PASS", f"{len(found)} core(s) {found} ({source})")


_PROBE = """
import json, sys
from neuronserve import cores, placement
from neuronserve.targets import get_target
lease = placement.claim("neuron", 1, owner="neuronserve doctor probe")
cores.pin(lease)
module = get_target(sys.argv[1]).load(sys.argv[2])
print(json.dumps({"core": lease.cores[0]}), flush=True)
sys.stdin.readline()
"""


def leased_cores_only(artifact: Path, manifest: Manifest, timeout_s: float) -> Finding:
    """A probe worker leases one core and loads a module; neuron-ls says what it holds."""
    name = "runtime uses only the leased core"
    module = artifact / sorted(set(manifest.modules.values()))[0]
    probe = subprocess.Popen(
        [sys.executable, "-c", _PROBE, manifest.target, str(module)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert probe.stdout is not None and probe.stdin is not None
        line = probe.stdout.readline()
        if not line:
            probe.wait(timeout_s)
            return Finding(
                name,
                "FAIL",
                "the probe worker could not load the module: "
                + (probe.stderr.read() if probe.stderr else "")[-500:],
            )
        leased = json.loads(line)["core"]
        held = held_cores(probe.pid)
        if held is None:
            return Finding(
                name,
                "SKIP",
                f"the probe leased core {leased}; neuron-ls does not "
                "say which cores each process holds here",
            )
        status = "PASS" if held == [leased] else "FAIL"
        return Finding(
            name,
            status,
            f"the probe leased core {leased}; neuron-ls shows its runtime holding {held}",
        )
    finally:
        if probe.stdin is not None and probe.poll() is None:
            probe.stdin.write("\n")
            probe.stdin.flush()
        try:
            probe.wait(30)
        except subprocess.TimeoutExpired:
            probe.kill()


def held_cores(pid: int) -> list[int] | None:
    """The NeuronCores `neuron-ls` lists for process `pid` (None if it does not say)."""
    try:
        out = subprocess.run(
            ["neuron-ls", "--json-output"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        devices = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    held: set[int] = set()
    for device in devices if isinstance(devices, list) else []:
        for proc in device.get("neuron_processes") or []:
            if proc.get("pid") == pid:
                ids = proc.get("neuroncore_ids")
                if ids is None:
                    return None
                held.update(int(c) for c in ids)
    return sorted(held)


def on_one_core(artifact: Path, manifest: Manifest) -> list[Finding]:
    """The checks that run modules, in this process, on one leased core."""
    name = "padded batch-1 answers match CPU eager"
    try:
        target = runnable_target(artifact, manifest)
        with target.compiling({}):
            loaded = load_modules(artifact, manifest, target)
            verdict = check_modules(artifact, manifest, loaded)
            timed = timings(artifact, manifest, loaded)
    except CompileError as e:
        return [Finding(name, "FAIL", str(e))]
    batch1 = [v for v in verdict.validation if v.batch == 1]
    worst = max((v.max_abs_diff for v in batch1), default=0.0)
    detail = (
        f"max |neuron - eager| {worst:.3g} over {len(batch1)} batch-1 bucket(s), "
        f"padded and full; accuracy {verdict.accuracy}"
    )
    if verdict.refused:
        return [Finding(name, "FAIL", f"{detail}; refused: {verdict.refused}"), *timed]
    return [Finding(name, "PASS", detail), *timed]


def timings(
    artifact: Path, manifest: Manifest, loaded: dict[str, Module], calls: int = 20
) -> list[Finding]:
    """Per-bucket median model time; the slowest bucket's against a weight copy."""
    reference = Reference.load(artifact / REFERENCE_FILE)
    layout = InputLayout.of(manifest)
    medians = {}
    for bucket in manifest.grid.buckets:
        module = loaded[manifest.module_for(bucket)]
        inputs = tensors(reference.inputs[bucket.key][0], layout)
        times = []
        with torch.inference_mode():
            for _ in range(calls + 2):
                t0 = time.perf_counter()
                module(*inputs)
                times.append((time.perf_counter() - t0) * 1e3)
        medians[bucket.key] = statistics.median(times[2:])
    rows = "; ".join(f"{k} {v:.2f} ms" for k, v in medians.items())
    findings = [
        Finding("per-bucket model latency", "PASS", f"{rows}. Published: " + " | ".join(SEEDS))
    ]
    weight_bytes = int(manifest.compiler.get("weight_bytes", 0))
    if weight_bytes:
        copy_ms = weight_bytes / HOST_TO_DEVICE_BYTES_PER_S * 1e3
        slowest = max(medians.values())
        ok = slowest < copy_ms
        findings.append(
            Finding(
                "weights stay on the device",
                "PASS" if ok else "WARN",
                f"slowest bucket call {slowest:.2f} ms; copying the {weight_bytes / 1e6:.1f} MB of "
                f"weights to the device would take about {copy_ms:.2f} ms"
                + (
                    ""
                    if ok
                    else ": calls are no faster than a weight copy would be; check "
                    "neuron-top for host-to-device traffic"
                ),
            )
        )
    return findings
