"""Runner: the one pad-run-unpad path every task, target and server uses.

    decode -> tokenize (whole batch) -> pick bucket -> pad -> run -> unpad -> task output

Server adapters hand the Runner a list of request bodies (one batch as their server
formed it) and get back one result per request: a JSON-able response, or a
`RequestError` that fails that request alone while its neighbours are served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .artifact import Manifest, read_manifest
from .buckets import Bucket, BucketGrid, pad_batch, padding_ratio, unpad
from .compile import get_target
from .tasks import RequestError, TaskRequest, decode_payload, get_task
from .tokenization import TextTokenizer

log = logging.getLogger(__name__)


@dataclass
class BucketRun:
    bucket: Bucket
    rows: int
    real_tokens: int
    model_ms: float

    @property
    def padding_ratio(self) -> float:
        return padding_ratio(self.real_tokens, self.bucket)


@dataclass
class RunReport:
    """What one Runner call did, for the servers' metrics."""

    requests: int = 0
    texts: int = 0
    tokenize_ms: float = 0.0
    runs: list[BucketRun] = field(default_factory=list)

    @property
    def model_ms(self) -> float:
        return sum(r.model_ms for r in self.runs)

    @property
    def padding_ratio(self) -> float:
        real = sum(r.real_tokens for r in self.runs)
        total = sum(r.bucket.batch * r.bucket.seq for r in self.runs)
        return (total - real) / max(real, 1)


def run_bucket(module: Callable[..., torch.Tensor], rows: Sequence[dict[str, Sequence[int]]],
               bucket: Bucket, input_names: Sequence[str],
               pad_values: dict[str, int]) -> np.ndarray:
    """Pad `rows` to `bucket`, run `module`, drop the padding rows."""
    arrays = pad_batch(rows, bucket, input_names, pad_values)
    with torch.inference_mode():
        out = module(*(torch.from_numpy(arrays[n]) for n in input_names))
    return unpad(out.float().numpy(), len(rows))


def run_rows(module_for: Callable[[Bucket], Callable[..., torch.Tensor]],
             rows: Sequence[dict[str, Sequence[int]]], grid: BucketGrid,
             input_names: Sequence[str], pad_values: dict[str, int], output_dim: int,
             report: RunReport | None = None) -> np.ndarray:
    """The pad-run-unpad path: bucket rows by length, run each chunk through the module
    `module_for` gives for its bucket, return outputs in the rows' order.

    The Runner serves with it and `compile` measures accuracy with it, so what was
    validated is what is served.
    """
    lengths = [len(r["input_ids"]) for r in rows]
    out = np.empty((len(rows), output_dim), dtype=np.float32)
    for chunk in grid.chunks(lengths):
        bucket = grid.choose(len(chunk), max(lengths[i] for i in chunk))
        t0 = time.perf_counter()
        out[chunk] = run_bucket(module_for(bucket), [rows[i] for i in chunk], bucket,
                                input_names, pad_values)
        if report is not None:
            report.runs.append(BucketRun(bucket, len(chunk), sum(lengths[i] for i in chunk),
                                         (time.perf_counter() - t0) * 1e3))
    return out


Result = Any  # a JSON-able response, or a RequestError for that request alone


class Runner:
    def __init__(self, artifact_dir: Path | str, truncation: bool | None = None,
                 verify: bool = True, warmup: bool = True):
        self.artifact_dir = Path(artifact_dir)
        self.manifest: Manifest = read_manifest(self.artifact_dir, verify=verify)
        m = self.manifest
        self.task = get_task(m.task)
        self.target = get_target(m.target)
        self.grid = m.grid
        self.input_names = [i.name for i in m.inputs]
        self.pad_values = {i.name: i.pad_value for i in m.inputs}
        self.truncation = m.tokenizer.truncation if truncation is None else truncation
        self.tokenizer = TextTokenizer(self.artifact_dir / m.tokenizer.file, m.tokenizer.max_length)
        # one load per file: a dynamic-shape target's buckets all share one module
        self._loaded = {f: self.target.load(self.artifact_dir / f)
                        for f in sorted(set(m.modules.values()))}
        if m.weights:
            self.target.attach_weights(list(self._loaded.values()), self.artifact_dir / m.weights)
        self.info = {"labels": m.labels}
        if warmup:
            self.warmup()

    @property
    def max_sequence_length(self) -> int:
        return self.grid.max_seq

    def _module(self, bucket: Bucket) -> torch.nn.Module:
        return self._loaded[self.manifest.module_for(bucket)]

    def warmup(self, rounds: int = 2) -> None:
        """Run every bucket so no request pays for first-call graph optimisation.

        TorchScript's profiling executor specialises on the second call of a shape,
        hence two rounds.
        """
        for bucket in self.grid.buckets:
            rows = [{"input_ids": [self.pad_values.get("input_ids", 0)] * bucket.seq,
                     "attention_mask": [1] * bucket.seq, "token_type_ids": [0] * bucket.seq}]
            for _ in range(rounds):
                self._run_bucket(rows, bucket)

    def _run_bucket(self, rows: Sequence[dict[str, Sequence[int]]], bucket: Bucket) -> np.ndarray:
        return run_bucket(self._module(bucket), rows, bucket, self.input_names, self.pad_values)

    def forward(self, rows: Sequence[dict[str, Sequence[int]]],
                report: RunReport | None = None) -> np.ndarray:
        """Model outputs for token rows, in order: bucket by length, pad, run, unpad."""
        return run_rows(self._module, rows, self.grid, self.input_names, self.pad_values,
                        self.manifest.output_dim, report)

    def parse(self, body: Any, content_type: str | None = None) -> TaskRequest:
        """Decode one request body into the task's request (raises RequestError)."""
        inputs, parameters = decode_payload(body, content_type)
        return self.task.parse(inputs, parameters)

    def run(self, requests: Sequence[TaskRequest | RequestError],
            report: RunReport | None = None) -> list[Result]:
        """Serve already-parsed requests as one batch: JSON-able responses, with errors
        passed through in place."""
        raw = self.infer(requests, report)
        return [r if isinstance(r, RequestError) else self.task.respond(r, req, self.info)
                for r, req in zip(raw, requests, strict=True)]

    def infer(self, requests: Sequence[TaskRequest | RequestError],
              report: RunReport | None = None) -> list[np.ndarray | RequestError]:
        """Model outputs (one row per text) for each request of one batch; errors in place.

        Tensor-based servers (Triton) turn these rows into their output tensors with
        `task.tensors`; JSON servers use `run`.
        """
        report = report if report is not None else RunReport()
        results: list[Any] = list(requests)
        live = [i for i, r in enumerate(requests) if isinstance(r, TaskRequest)]
        texts = [t for i in live for t in requests[i].texts]
        report.requests, report.texts = len(requests), len(texts)

        t0 = time.perf_counter()
        encoded = self.tokenizer.encode(texts, truncate=self.truncation)
        report.tokenize_ms = (time.perf_counter() - t0) * 1e3

        rows, owners, pos = [], [], 0
        for i in live:
            n = len(requests[i].texts)
            mine = encoded[pos : pos + n]
            pos += n
            too_long = [k for k, e in enumerate(mine) if len(e.ids) > self.max_sequence_length]
            if too_long:
                k = too_long[0]
                results[i] = RequestError(
                    f"inputs[{k}] is {mine[k].full_length} tokens long; this model was compiled "
                    f"for at most {self.max_sequence_length} tokens and truncation is off. Send "
                    "shorter text, compile with a larger --sequence-lengths, or set "
                    "`truncation: true`.",
                    status=413,
                )
                continue
            rows.extend(e.row() for e in mine)
            owners.append((i, n))

        try:
            outputs = self.forward(rows, report) if rows else np.empty((0, 0), np.float32)
        except Exception as e:  # noqa: BLE001 - the batch fails, the worker must not
            log.exception("model execution failed")
            for i, _ in owners:
                results[i] = RequestError(f"model execution failed: {e}", status=500)
            return results

        pos = 0
        for i, n in owners:
            results[i] = outputs[pos : pos + n]
            pos += n
        return results

    def handle(self, bodies: Sequence[tuple[Any, str | None]],
               report: RunReport | None = None) -> list[Result]:
        """Decode, then run: one result (or RequestError) per (body, content_type)."""
        parsed: list[TaskRequest | RequestError] = []
        for body, content_type in bodies:
            try:
                parsed.append(self.parse(body, content_type))
            except RequestError as e:
                parsed.append(e)
        return self.run(parsed, report)
