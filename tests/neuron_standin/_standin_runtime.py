"""The stand-in's Neuron runtime: the part of the AWS Neuron SDK a compiled module talks to.

Only the tests put tests/neuron_standin on the path. There is no Neuron hardware here,
so this emulates what the AWS Neuron documentation says the SDK does, and records every
call and the process's Neuron variables as one JSON line in $NEURONSERVE_STANDIN_LOG:

- A traced module is a TorchScript module holding an opaque compiled graph (the "NEFF",
  here a serialized TorchScript graph). When it is loaded with torch.jit.load, the runtime
  loads the NEFF onto a NeuronCore, and refuses if there is no Neuron device:
  "inference can only be executed on a Neuron instance" and "upon torch.jit.load, it is
  loaded to a Neuron device" (torch-neuronx trace API, Notes:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.html).
- Placement: "every Neuron traced model ScriptModule within a process is loaded to each
  available NeuronCore in round-robin order" (same page), unless a placement context
  (torch_neuronx.experimental.neuron_cores_context) names the core.
- Visible cores: NEURON_RT_VISIBLE_CORES is "a single NeuronCore index or an inclusive
  range"; "the resulting range must be contiguous" (Neuron runtime configuration and
  developer guides:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/nrt-configurable-parameters.html).
  Without it the runtime takes every core of the host. In a container the core ids are
  the host's, and only the devices given to the container exist
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/build-run-neuron-container.html).
- Cores belong to one process: "By default, Neuron Runtime initializes all the cores
  present in the system and reserves them for the current process", and "Once a
  NeuronCore is reserved for a process, it cannot be used by another process at all,
  until the process reserving that NeuronCore is terminated" (Neuron Runtime
  configuration guide, NeuronCore allocation:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/guides/configuration-guide.html).
  The stand-in reserves each core it initialises with a lock file of the fake host
  (NEURON_STANDIN_DEVICE_DIR), which the kernel drops when the process dies; a runtime
  that finds one of its cores held fails to initialise, as the real one does. Several
  models loaded by one process share its cores.
- A model traced with inline_weights_to_neff=False keeps its weights on the host: "on
  every inference call, the weights move from CPU to Neuron" unless
  torch_neuronx.move_trace_to_device was called (trace API page, warning). Each such call
  is recorded as a `weight_copy` event.

Device time (NEURON_STANDIN_DEVICE_TIME=inf2-bert-base): for measuring a server's pace.
A call whose input rows were all computed before (on the CPU, the first time, each row's
output kept for every module of the same model, whichever bucket or copy computed it: an
encoder's rows are independent of their batch) holds its NeuronCore for the time AWS
publishes for that shape and returns the kept outputs without using the CPU: the core
runs one call at a time (a process's calls on one core queue, as the runtime queues
executions on a core), and its busy time is counted where the stand-in's neuron-monitor
reads it (`device_ms` says where the figures come from). Answers stay right; only
repeated rows (a benchmark's texts, compile's bucket timing) run at the device's pace.
What this cannot tell: the real device's time for another model or shape than the
table's, DMA and host-runtime overheads beyond the published latency, and how the real
runtime overlaps queued executions.

The fake host is described by environment variables the tests set:
    NEURON_STANDIN_CORES    NeuronCores of the host (unset or 0: no Neuron device)
    NEURON_STANDIN_GRANTED  the cores a container was given, e.g. "4-7" (default: all)
    NEURON_STANDIN_SDK      the Neuron SDK release it pretends to be (default 2.21.0)
    NEURON_STANDIN_DEVICE_DIR  where the host's cores are reserved (one lock file each)
                            and their busy time is counted
    NEURON_STANDIN_DEVICE_TIME  a table of `DEVICE_TIMES` (unset: every call computes), or
                            a test's own as JSON ({"seq": 16, "batch_ms": {"1": 150}}:
                            a call slow enough to time, not a published figure)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import itertools
import json
import mmap
import os
import struct
import tempfile
import threading
import time

import torch

NEURON_VARS = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURONCORE_GROUP_SIZES")


def record(event: str, **data) -> None:
    path = os.environ.get("NEURONSERVE_STANDIN_LOG")
    if not path:
        return
    data.update(event=event, pid=os.getpid(), env={k: os.environ.get(k) for k in NEURON_VARS})
    with open(path, "a") as f:
        f.write(json.dumps(data) + "\n")


def shapes(example) -> list[list[int]]:
    example = example if isinstance(example, tuple) else (example,)
    return [list(t.shape) for t in example]


def sdk_version() -> tuple[int, ...]:
    return tuple(int(x) for x in os.environ.get("NEURON_STANDIN_SDK", "2.21.0").split("."))


def parse_cores(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.append(int(part))
    return out


class NeuronRuntimeError(RuntimeError):
    pass


# Published per-call device latency (p50, ms) by batch size at sequence length 128, for
# bert-base-uncased on inf2.xlarge with torch-neuronx (Neuron SDK 2.26/2.27 benchmark
# tables: "Inf2 Inference Performance", Encoder Models,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/benchmarks/inf2/inf2-performance.html,
# their data in aws-neuron-sdk's latency_data_encoder.csv): bert-base batch 1 at 1.00 ms,
# batch 8 at 5.97 ms per call; distilbert batch 1 at 0.58 ms, batch 16 at 6.01 ms. Only
# length 128 is published: another length is timed in proportion to it, and any model
# as the table named.
DEVICE_TIMES = {
    "inf2-bert-base": {"seq": 128, "batch_ms": {1: 1.00, 8: 5.97}},
    "inf2-distilbert": {"seq": 128, "batch_ms": {1: 0.58, 16: 6.01}},
}
# the counter file of a core: busy seconds and calls (two doubles), mapped by the process
# holding the core and read by neuron-monitor
BUSY_FORMAT = "dd"


def table_of(table: str) -> dict:
    """A table of `DEVICE_TIMES` by name, or one given as JSON."""
    if not table.startswith("{"):
        return DEVICE_TIMES[table]
    given = json.loads(table)
    return {"seq": given["seq"], "batch_ms": {int(b): ms for b, ms in given["batch_ms"].items()}}


def device_ms(table: str, batch: int, seq: int) -> float:
    """A call's device time: the table's batch sizes interpolated (beyond them, the same
    cost per row as between the last two), in proportion to the sequence length."""
    entry = table_of(table)
    points = sorted(entry["batch_ms"].items())
    segments = list(itertools.pairwise(points))
    (b0, t0), (b1, t1) = next((seg for seg in segments if batch <= seg[1][0]), segments[-1])
    per_row = (t1 - t0) / (b1 - b0)
    ms = t0 + (batch - b0) * per_row if batch >= b0 else t0 * batch / b0
    return ms * seq / entry["seq"]


class _Core:
    """One NeuronCore as the device-time mode runs it: one call at a time, busy time
    counted in the core's counter file."""

    def __init__(self, core: int) -> None:
        self.lock = threading.Lock()
        path = os.path.join(_device_dir(), f"nc{core}.busy")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, struct.calcsize(BUSY_FORMAT))
        self.counter = mmap.mmap(fd, struct.calcsize(BUSY_FORMAT))
        os.close(fd)
        self.busy_s, self.calls = 0.0, 0
        # how late this host's sleep wakes (the median of a few), taken off each hold so
        # that a call lasts the published time rather than that plus the emulation's wake
        late = []
        for _ in range(15):
            t0 = time.perf_counter()
            time.sleep(0.001)
            late.append(time.perf_counter() - t0 - 0.001)
        self.wake_s = sorted(late)[len(late) // 2]

    def hold(self, seconds: float, called: float) -> None:
        """Hold the core until `seconds` after the call began (`called`, perf_counter),
        or after the core came free when another call held it: the published latency is
        the whole call's, the runtime's own host work included."""
        if not self.lock.acquire(blocking=False):
            self.lock.acquire()
            called = time.perf_counter()
        try:
            time.sleep(max(0.0, called + seconds - self.wake_s - time.perf_counter()))
            self.busy_s += seconds
            self.calls += 1
            struct.pack_into(BUSY_FORMAT, self.counter, 0, self.busy_s, float(self.calls))
        finally:
            self.lock.release()


class _Runtime:
    """Initialised once per process, at the first model load, from the environment of
    that moment (as the runtime reads NEURON_RT_* when it initialises)."""

    def __init__(self) -> None:
        host = int(os.environ.get("NEURON_STANDIN_CORES") or 0)
        if host <= 0:
            raise NeuronRuntimeError(
                "NRT init failed: no Neuron device found (/dev/neuron*): a compiled Neuron "
                "model can only be loaded and run on a Neuron instance"
            )
        granted = parse_cores(os.environ.get("NEURON_STANDIN_GRANTED") or f"0-{host - 1}")
        visible_env = os.environ.get("NEURON_RT_VISIBLE_CORES")
        if visible_env:
            if "," in visible_env:
                raise NeuronRuntimeError(
                    f"NRT init failed: NEURON_RT_VISIBLE_CORES={visible_env} is not a single "
                    "core or a contiguous range"
                )
            visible = parse_cores(visible_env)
            missing = sorted(set(visible) - set(granted))
            if missing:
                raise NeuronRuntimeError(
                    f"NRT init failed: NEURON_RT_VISIBLE_CORES={visible_env} names NeuronCores "
                    f"{missing} this container was not given (it has {granted})"
                )
        else:
            visible = granted  # by default the runtime takes every core it can see
        self.cores = visible
        self.next = 0
        self.lock = threading.Lock()
        self.reserved: list[int] = []
        try:
            for core in visible:
                self.reserved.append(_reserve(core))
        except NeuronRuntimeError:
            self.release()
            raise
        record("runtime_init", cores=self.cores)

    def release(self) -> None:
        for fd in self.reserved:
            os.close(fd)
        self.reserved.clear()

    def load(self, blob: torch.Tensor, name: str, place: int | None) -> int:
        with self.lock:
            if place is None:
                index = self.next % len(self.cores)
                self.next += 1
            else:
                if not 0 <= place < len(self.cores):
                    raise NeuronRuntimeError(
                        f"NeuronCore {place} is not among the "
                        f"{len(self.cores)} visible to this process"
                    )
                index = place
            graph = torch.jit.load(io.BytesIO(blob.numpy().tobytes()))
            handle = len(_models) + 1
            _models[handle] = (graph, self.cores[index], _family(graph))
        record("load", model=name, core=self.cores[index], handle=handle)
        return handle


def _family(graph: torch.jit.ScriptModule) -> str:
    """What the modules of one model share and another model's do not: the traced graph's
    operations (pooling, normalisation, every token's vectors and auto-cast each add
    their own), not its constants (a bucket's shapes), and its weights, sampled (a
    model's buckets hold the same tensors; two models' differ throughout)."""
    digest = hashlib.blake2b(digest_size=16)
    for node in graph.inlined_graph.nodes():
        digest.update(node.kind().encode())
    for name, tensor in sorted(graph.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        sample = flat[:: max(1, flat.numel() // 64)].contiguous()
        digest.update(sample.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _device_dir() -> str:
    return os.environ.get("NEURON_STANDIN_DEVICE_DIR") or os.path.join(
        tempfile.gettempdir(), f"neuron-standin-{os.getuid()}"
    )


def _reserve(core: int) -> int:
    """Hold NeuronCore `core` for this process until it exits (or the runtime is reset)."""
    folder = _device_dir()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"nc{core}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        record("core_busy", core=core, holder=holder)
        raise NeuronRuntimeError(
            f"NRT init failed: NeuronCore {core} is reserved by another process (pid "
            f"{holder}); a NeuronCore is used by one process until that process ends"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def reset() -> None:
    """Drop this process's runtime and the cores it reserved (the tests' fake hosts)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.release()
        _runtime = None
    with _cores_lock:
        _cores.clear()
    _kept.clear()
    _row_graphs.clear()


_runtime: _Runtime | None = None
# every model loaded in this process, by handle (kept across the tests' runtime resets)
_models: dict[int, tuple[torch.jit.ScriptModule, int, str]] = {}
_runtime_lock = threading.Lock()
# device-time mode: each core's clock, and each model's output per input row. By row,
# not by whole batch: an encoder's rows never see each other, and a server under load
# batches a benchmark's one text per length with padding rows in every count up to the
# bucket's, each count a batch never computed before (BERT-base at 16 x 128: seconds of
# this CPU per batch, a stall no device has, that filled TorchServe's job queue). By
# model, not by module: every bucket and pipelined copy of one model answers a row alike,
# so a row one of them computed is not computed again by the others (a worker's warm-up
# and a benchmark's first load ran each module's rows on the CPU once more)
_cores: dict[int, _Core] = {}
_cores_lock = threading.Lock()
_kept: dict[tuple, list[torch.Tensor]] = {}
KEPT_MAX = 4096
# each model's batch-1 module by row shape, once it has run: where a row not kept is
# computed, whatever the batch it came in (a benchmark's first text arriving in a full
# batch cost a 16 x 128 BERT-base call on the CPU, on a module never warmed, where no
# device stalls)
_row_graphs: dict[tuple, torch.jit.ScriptModule] = {}
# set by torch_neuronx.experimental.neuron_cores_context: the core index models load to
placement = threading.local()


@contextlib.contextmanager
def neuron_cores_context(start_nc: int = -1, nc_count: int = -1):
    """The placement API (torch_neuronx.experimental and torch_neuron.experimental): models
    torch.jit.load creates inside it are placed on NeuronCore `start_nc` ("allow a model to
    be placed on a given NeuronCore only at torch.jit.load() time", NeuronCore Placement
    APIs: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-core-placement.html)."""
    previous = getattr(placement, "core", None)
    placement.core = None if start_nc < 0 else start_nc
    try:
        yield
    finally:
        placement.core = previous


def runtime() -> _Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = _Runtime()
        return _runtime


@torch.library.custom_op("neuron_standin::load", mutates_args=())
def load(blob: torch.Tensor, name: str) -> int:
    return runtime().load(blob, name, getattr(placement, "core", None))


def _outputs(graph: torch.jit.ScriptModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The graph's answer as a list: one tensor, or each of a tuple's (a model traced
    with several outputs, as optimum-neuron's exports are)."""
    with torch.no_grad():
        out = graph(*inputs)
    return [t.clone() for t in (out if isinstance(out, (tuple, list)) else (out,))]


def _execute(handle: int, inputs: list[torch.Tensor], host_weight_bytes: int) -> list[torch.Tensor]:
    if handle not in _models:
        raise NeuronRuntimeError(
            "this Neuron model is not loaded on a NeuronCore (traced "
            "with cpu_backend=True: move it to a Neuron instance and "
            "torch.jit.load it there)"
        )
    called = time.perf_counter()
    graph, core, family = _models[handle]
    shape = tuple(tuple(t.shape) for t in inputs)
    record(
        "execute",
        handle=handle,
        core=core,
        thread=threading.get_ident(),
        shapes=[list(s) for s in shape],
    )
    if host_weight_bytes:
        record("weight_copy", handle=handle, core=core, bytes=host_weight_bytes)
    table = os.environ.get("NEURON_STANDIN_DEVICE_TIME")
    if not table:
        return _outputs(graph, inputs)
    with _cores_lock:
        if core not in _cores:
            _cores[core] = _Core(core)
        timed = _cores[core]
    batch = shape[0][0]
    rows = [
        (family, shape[0][1:], hash(b"".join(t[i].numpy().tobytes() for t in inputs)))
        for i in range(batch)
    ]
    if batch == 1:
        _row_graphs.setdefault(rows[0][:2], graph)
    kept = [_kept.get(row) for row in rows]
    if any(k is None for k in kept):  # computed on the CPU, the core held meanwhile
        with timed.lock:
            computed = _computed(graph, inputs, rows, kept)
        return computed if computed is not None else _stacked([_kept[row] for row in rows])
    # token inputs are (batch, length); an image's pixels are timed at the table's length
    seq = shape[0][1] if len(shape[0]) == 2 else table_of(table)["seq"]
    timed.hold(device_ms(table, batch, seq) / 1e3, called)
    return _stacked(kept)


def _stacked(kept: list) -> list[torch.Tensor]:
    """A batch's outputs from its rows' kept outputs."""
    return [torch.stack([k[j] for k in kept]) for j in range(len(kept[0]))]


def _computed(
    graph: torch.jit.ScriptModule,
    inputs: list[torch.Tensor],
    rows: list[tuple],
    kept: list[list[torch.Tensor] | None],
) -> list[torch.Tensor] | None:
    """Compute the rows not kept and keep them, each distinct row once, through the
    model's batch-1 module when one has run (a new text in a full batch, often the same
    text in every row, costs one row of CPU, not the batch's, on a module already
    warmed); None when every row is kept now, else the batch's whole answer (no batch-1
    module yet, an output not by row, or no room to keep more). Either way the call
    counts no device time: the CPU's stands in for it."""
    one = _row_graphs.get(rows[0][:2])
    missing = [i for i, k in enumerate(kept) if k is None]
    if one is not None and len(_kept) + len(missing) <= KEPT_MAX:
        for i in missing:
            if rows[i] in _kept:  # the same row again in this batch
                continue
            out = _outputs(one, [t[i : i + 1] for t in inputs])
            if not all(o.shape[:1] == (1,) for o in out):
                break
            _kept[rows[i]] = [o[0] for o in out]
        else:
            return None
    batch = len(rows)
    out = _outputs(graph, inputs)
    if len(_kept) < KEPT_MAX and all(o.shape[:1] == (batch,) for o in out):
        _kept.update((row, [o[i].clone() for o in out]) for i, row in enumerate(rows))
    return out


@torch.library.custom_op("neuron_standin::execute", mutates_args=())
def execute(handle: int, inputs: list[torch.Tensor], host_weight_bytes: int) -> torch.Tensor:
    return _execute(handle, inputs, host_weight_bytes)[0]


@torch.library.custom_op("neuron_standin::execute_outputs", mutates_args=())
def execute_outputs(
    handle: int, inputs: list[torch.Tensor], host_weight_bytes: int
) -> list[torch.Tensor]:
    return _execute(handle, inputs, host_weight_bytes)


def serialize(graph: torch.jit.ScriptModule) -> torch.Tensor:
    buf = io.BytesIO()
    torch.jit.save(graph, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).clone()


class NeuronModel(torch.nn.Module):
    """What trace returns: a TorchScript module holding the compiled graph as bytes, loaded
    onto a NeuronCore by the runtime when it is created or loaded (__setstate__)."""

    def __init__(self, blob: torch.Tensor, name: str, host_weight_bytes: int):
        super().__init__()
        self.blob = blob
        self.name = name
        # weights left on the host (inline_weights_to_neff=False) until moved to the device
        self.host_weight_bytes = host_weight_bytes
        self.handle = 0

    def forward(
        self, a: torch.Tensor, b: torch.Tensor | None = None, c: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.neuron_standin.execute(
            self.handle, self._inputs(a, b, c), self.host_weight_bytes
        )

    def _inputs(
        self, a: torch.Tensor, b: torch.Tensor | None, c: torch.Tensor | None
    ) -> list[torch.Tensor]:
        # a traced model is called with the example inputs' tensors it was traced with
        # (torch_neuronx.trace's `example_inputs`: "a tuple of tensors"; api-torch-neuronx-
        # trace.html above): one for an image model's pixels, up to three for token ids,
        # mask and token types
        inputs = [a]
        if b is not None:
            inputs.append(b)
        if c is not None:
            inputs.append(c)
        return inputs

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, str, int, bool]:
        return (self.blob, self.name, self.host_weight_bytes, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, str, int, bool]) -> None:
        self.blob = state[0]
        self.name = state[1]
        self.host_weight_bytes = state[2]
        self.training = state[3]
        self.handle = torch.ops.neuron_standin.load(self.blob, self.name)


class NeuronModelOutputs(NeuronModel):
    """A compiled graph that answers several tensors (a model traced returning a tuple, as
    optimum-neuron's exports are: last_hidden_state and pooler_output, or
    token_embeddings and sentence_embedding): called, it answers all of them in order
    (the SDK answers a tuple; a TorchScript list here)."""

    def forward(
        self, a: torch.Tensor, b: torch.Tensor | None = None, c: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        return torch.ops.neuron_standin.execute_outputs(
            self.handle, self._inputs(a, b, c), self.host_weight_bytes
        )


def compiled_module(
    graph: torch.jit.ScriptModule, name: str, host_weight_bytes: int, outputs: int = 1
) -> torch.jit.ScriptModule:
    """The scripted NeuronModel for `graph` (answering `outputs` tensors). As with the real
    SDK, the model is loaded once it exists, which needs a device; on a build host
    trace(cpu_backend=True) returns it unloaded (see trace)."""
    kind = NeuronModel if outputs == 1 else NeuronModelOutputs
    return torch.jit.script(kind(serialize(graph), name, host_weight_bytes))
