"""Runner: one artifact loaded and served, the same way for every task, target and server.

    decode -> tokenize -> plan (pick buckets, pad) -> call (the device) -> finish (unpad) -> respond

Servers hand the Runner one batch as they formed it (`start`) and get back one result
per request (what the task's `finish` gives), or a `RequestError` that fails that
request alone while its neighbours are served; `respond` makes a result the task's JSON
(the TorchServe handler; our front does it itself), `tensors` its named tensors
(Triton).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .artifact import ArtifactError, Manifest, read_manifest, read_verified
from .buckets import Bucket, engine_batch_sizes
from .errors import internal_error
from .execution import Executor, InputLayout, Module, Planned, Row, RunReport
from .exports import served
from .images import ImagePreprocessor
from .inflight import IN_FLIGHT, Countdown, InFlight
from .targets import get_target, pipeline_depth
from .tasks import RequestError, TaskRequest, get_task
from .tasks.base import RequestLimits, Text, prompted
from .tokenization import Encoded, TextTokenizer

log = logging.getLogger(__name__)

Response = Any  # a JSON-able response (numpy arrays: orjson), or a RequestError for it alone
Outputs = Any  # one request's results (Task.finish), or its RequestError


class Runner:
    def __init__(  # noqa: PLR0913 - the artifact, and how this worker serves it
        self,
        artifact_dir: Path | str,
        truncation: bool | None = None,
        warmup: bool = True,
        cores: int = 1,
        limits: RequestLimits | None = None,
        name: str | None = None,
        pipeline: bool | None = None,
        in_flight: int = IN_FLIGHT,
    ):
        """`cores`: how many cores this process holds; a target whose calls each run on
        one core (Neuron) gets a copy of every module per core. `limits`: what one request
        may hold (413 beyond), checked before anything is tokenized. `name`: what the
        model is served as (default: the artifact's). `pipeline`: serve a large batch in
        device-sized groups, the host's work beside the device's (default: on a target
        whose calls leave the CPU free). `in_flight`: batches a pipelined Runner holds
        at once (`start`)."""
        self.artifact_dir = Path(artifact_dir)
        # every file checked against its sha256 before any is loaded
        self.manifest: Manifest = read_manifest(self.artifact_dir)
        m = self.manifest
        self.name = name or m.name
        _check_validated(m, self.artifact_dir)
        self.task = get_task(m.task)
        self.target = get_target(m.target)
        self.grid = m.grid
        self.truncation = m.truncation if truncation is None else truncation
        self.limits = limits or RequestLimits()
        self.tokenizer, self.preprocessor = self._inputs()
        copies = self.target.replicas(cores, int(m.compiler.get("cores_per_module", 1)))
        self._loaded = self._load_modules(copies)
        self.executor = Executor(
            self._module_of(0),
            self.grid,
            InputLayout.of(m),
            [self._module_of(k) for k in range(1, copies)],
            m.bucket_ms,
        )
        self.info = {**m.task_info(), "tokenizer": self.tokenizer}
        # texts per pipelined group (0: not pipelined): the largest batch the device's
        # own cost curve says is worth a call (the bucket times), as servers form them
        pipelined = pipeline_depth(m.target) > 1 if pipeline is None else pipeline
        self.group_rows = max(engine_batch_sizes(self.grid, m.bucket_ms)) if pipelined else 0
        self._flight = InFlight(in_flight)
        if warmup:
            self.warmup()

    def _load_modules(self, copies: int) -> list[dict[str, Module]]:
        """One load per module file and copy: a dynamic-shape target's buckets share one
        module; copy k goes to core k (of the cores this process sees) when there are
        several. Every file is checked against its sha256 before it is loaded."""
        m = self.manifest
        per_module = int(m.compiler.get("cores_per_module", 1))
        files = {f: read_verified(self.artifact_dir, m, f) for f in sorted(set(m.modules.values()))}
        names = [i.name for i in m.inputs]
        return [
            {
                f: served(
                    self.target.load(
                        self.artifact_dir / f, k * per_module if copies > 1 else None, data
                    ),
                    m.exported,
                    names,
                )
                for f, data in files.items()
            }
            for k in range(copies)
        ]

    def _inputs(self) -> tuple[TextTokenizer | None, ImagePreprocessor | None]:
        """The tokenizer (or image processor): files are read once, checked against the
        manifest, and loaded from those bytes."""
        m = self.manifest
        if m.tokenizer is not None:
            text = read_verified(self.artifact_dir, m, m.tokenizer.file).decode()
            return TextTokenizer(
                self.artifact_dir / m.tokenizer.file, m.tokenizer.max_length, text
            ), None
        if m.image is not None:
            return None, ImagePreprocessor.verified(self.artifact_dir, m)
        return None, None

    @property
    def max_sequence_length(self) -> int:
        return self.grid.max_seq

    def _module_of(self, copy: int) -> Callable[[Bucket], Module]:
        loaded, module_for = self._loaded[copy], self.manifest.module_for
        return lambda bucket: loaded[module_for(bucket)]

    def warmup(self, rounds: int = 2) -> None:
        """Run every bucket of every copy so no request pays for first-call graph
        optimisation. A module per bucket (Neuron) is run `rounds` times per bucket:
        TorchScript's profiling executor specialises on a module's second call. One
        module serving every shape (the CPU targets) pays that once, not per shape (only
        its very first calls are slow; every other shape runs at its steady time from its
        first call: the development guide's observations), so it runs the smallest bucket
        `rounds` + 1 times and every other bucket once: a restarted worker is ready in a
        fraction of the time."""
        shared = len(set(self.manifest.modules.values())) == 1
        for k, bucket in enumerate(self.grid.buckets):
            rows: list[Row] = [self.executor.layout.blank_row(bucket.seq)]
            times = rounds if not shared else (rounds + 1 if k == 0 else 1)
            for module_for in (self.executor.module_for, *self.executor.copies):
                for _ in range(times):
                    self.executor.run_bucket(rows, bucket, module_for)

    def parse(self, body: Any, content_type: str | None = None) -> TaskRequest:
        """Decode one request body into the task's request (raises RequestError)."""
        inputs, parameters = self.task.decode(body, content_type, self.limits.json_depth)
        return self.task.parse(inputs, parameters)

    def responses_for_bodies(
        self, bodies: Sequence[tuple[Any, str | None]], report: RunReport | None = None
    ) -> list[Response]:
        """Decode, serve as one batch and answer: one JSON-able answer (or RequestError)
        per (body, content_type), waiting for them (the offline reference, bench's
        in-process runner)."""
        parsed: list[TaskRequest | RequestError] = []
        for body, content_type in bodies:
            try:
                parsed.append(self.parse(body, content_type))
            except RequestError as e:
                parsed.append(e)
        return self.responses(parsed, report)

    def outputs(
        self, requests: Sequence[TaskRequest | RequestError], report: RunReport | None = None
    ) -> list[Outputs]:
        """`start`, waited on."""
        return self.start(requests, report).result()

    def responses(
        self, requests: Sequence[TaskRequest | RequestError], report: RunReport | None = None
    ) -> list[Response]:
        """`start`, waited on, each result answered (`respond`)."""
        results = self.outputs(requests, report)
        return [self.respond(r, o) for r, o in zip(requests, results, strict=True)]

    def respond(self, request: TaskRequest | RequestError, results: Outputs) -> Response:
        """The task's JSON-able answer (numpy arrays: orjson) for one request's results;
        an error passed through."""
        if isinstance(request, RequestError) or isinstance(results, RequestError):
            return results
        return self.task.respond(results, request, self.info)

    def tensors(self, request: TaskRequest, results: Outputs) -> dict[str, Any]:
        """One request's results as its task's named tensors (neuronserve.tensors: what
        Triton answers), with the tokens the model read of each text."""
        from .tensors import results_tensors

        return results_tensors(self.manifest.task, results, self.info, request.tokens)

    def start(
        self, requests: Sequence[TaskRequest | RequestError], report: RunReport | None = None
    ) -> Future[list[Outputs]]:
        """Each request's results (`Task.finish`: model output rows for the per-row
        tasks, JSON-able results for the others), one per text, for one batch, errors in
        place, as a future: the one pipeline (tokenize, pad, device, unpad, finish)
        every server runs, ours and the adapters (which wait on it).

        On a target whose calls leave the host's CPU free (a NeuronCore) the batch is
        served in groups: this thread tokenizes and pads each group and queues it for
        the device's thread, whose calls go back to back, and the finishing thread
        unpads each one as the device returns it. The future completes when the last
        group is finished, so the caller may parse and start the next batch while the
        device runs this one: two batches in flight keep the device busy through one
        batch's host work (parse, answers, the server's hand-offs). A third waits here
        for a slot, so the server's own queue, not this process's memory, holds the
        backlog. A batch that finds the device idle goes in groups of `group_rows`
        texts (the efficient batch), so the device starts on its first group soon; one
        that finds another batch in flight cannot start before that one ends, so its
        groups are as large as the grid's largest batch and the bucket times choose its
        calls (`Executor.plan`): the device's cheapest rows.

        Elsewhere (the CPU, where the model and the host's work share the cores) the
        batch is served on this thread, in one call, and the future is already done."""
        done: Future[list[Outputs]] = Future()
        report = report if report is not None else RunReport()
        report.requests = len(requests)
        results: list[Outputs | None] = [None] * len(requests)
        if self.group_rows:
            return self._start_pipelined(requests, results, report, done)
        prepared = self._prepare(requests, list(range(len(requests))), results, report)
        self._complete(prepared, requests, results, self._call(prepared), report)
        # every slot is filled now: refused at parse, refused here, or given its results
        done.set_result(cast(list[Outputs], results))
        return done

    def _start_pipelined(
        self,
        requests: Sequence[TaskRequest | RequestError],
        results: list[Outputs | None],
        report: RunReport,
        done: Future[list[Outputs]],
    ) -> Future[list[Outputs]]:
        flight = self._flight
        behind = flight.enter()
        failed: list[BaseException] = []

        def finished() -> None:
            flight.leave()
            if failed:
                done.set_exception(failed[0])
            else:  # every slot is filled: refused at parse, refused here, or its results
                done.set_result(cast(list[Outputs], results))

        parts = Countdown(finished)
        rows = self.grid.max_batch if behind else self.group_rows
        try:
            groups = self._groups(requests, rows)
            if not behind and len(groups) == 1:
                # alone on the device: its thread finishes the one group too, one thread
                # hand-off fewer on a lone request's way (nothing waits for the device)
                prepared = self._prepare(requests, groups[0], results, report)
                parts.add()
                flight.device.submit(self._run_alone, parts, requests, results, prepared, report)
                return done
            for group in groups:
                prepared = self._prepare(requests, group, results, report)
                running = flight.device.submit(self._call, prepared)
                parts.add()
                flight.finishing.submit(
                    self._finish_group, parts, requests, results, prepared, running, report
                )
        except BaseException as e:  # the groups queued still finish; then the batch fails
            failed.append(e)
            raise
        finally:
            parts.close()
        return done

    def _finish_group(  # noqa: PLR0913 - one group of one batch
        self,
        parts: Countdown,
        requests: Sequence[TaskRequest | RequestError],
        results: list[Outputs | None],
        prepared: _Prepared,
        running: Future[Any],
        report: RunReport,
    ) -> None:
        try:
            self._complete(prepared, requests, results, running.result(), report)
        finally:
            parts.settle()

    def _run_alone(
        self,
        parts: Countdown,
        requests: Sequence[TaskRequest | RequestError],
        results: list[Outputs | None],
        prepared: _Prepared,
        report: RunReport,
    ) -> None:
        try:
            self._complete(prepared, requests, results, self._call(prepared), report)
        finally:
            parts.settle()

    def close(self) -> None:
        """Wait for the batches in flight to be answered, then stop the threads."""
        self._flight.close()

    def _groups(self, requests: Sequence[TaskRequest | RequestError], rows: int) -> list[list[int]]:
        """The batch's requests in groups of about `rows` texts (at least one group)."""
        groups: list[list[int]] = [[]]
        texts = 0
        for i, r in enumerate(requests):
            if groups[-1] and texts >= rows:
                groups.append([])
                texts = 0
            groups[-1].append(i)
            texts += len(r.texts) if isinstance(r, TaskRequest) else 0
        return groups

    def _prepare(
        self,
        requests: Sequence[TaskRequest | RequestError],
        group: list[int],
        results: list[Outputs | None],
        report: RunReport,
    ) -> _Prepared:
        """Admit, tokenize and check the requests of `group`: refusals go into
        `results`, the rest become the padded tensors of one device call."""
        for i in group:
            r = requests[i]
            results[i] = r if isinstance(r, RequestError) else self._admit(r)
        live = [
            (i, r)
            for i in group
            if isinstance(r := requests[i], TaskRequest) and results[i] is None
        ]
        texts = sum(len(r.texts) for _, r in live)
        report.texts += texts

        t0, at = time.perf_counter(), time.time_ns()
        encoded = self._encode(live, results)
        report.tokenize_ms += (time.perf_counter() - t0) * 1e3
        report.stages.append(("tokenize", at, time.time_ns(), {"texts": texts}))

        rows: list[Row] = []
        owners: list[tuple[int, list[list[Encoded]]]] = []
        for i, request in live:
            mine = encoded.get(i)
            if mine is None:
                continue  # refused while tokenizing
            results[i] = (
                self._too_long(mine)
                or self.task.check_encoded(mine, request, self.info)
                or self._too_large(mine, request)
            )
            if results[i] is None:
                rows.extend(e.row() for windows in mine for e in windows)
                owners.append((i, mine))
                if self.preprocessor is None:  # what OpenAI's usage reports, counted once
                    request.tokens = [sum(len(e.ids) for e in windows) for windows in mine]
        try:
            at = time.time_ns()
            planned = self.executor.plan(rows)
            report.stages.append(("pad", at, time.time_ns(), {"rows": len(rows)}))
            return _Prepared(planned, owners)
        except Exception:  # the group fails, the worker must not
            log.exception("padding the batch")
            return _Prepared(internal_error("padding the batch"), owners)

    def _call(self, prepared: _Prepared) -> Any:
        """The device's part of a group (nothing else, so that on a pipelined target
        its thread goes from one call to the next)."""
        if isinstance(prepared.planned, RequestError):
            return prepared.planned
        try:
            return self.executor.call(prepared.planned)
        except Exception:  # the group fails, the worker must not
            log.exception("running the model")
            return internal_error("running the model")

    def _complete(
        self,
        prepared: _Prepared,
        requests: Sequence[TaskRequest | RequestError],
        results: list[Outputs | None],
        called: Any,
        report: RunReport,
    ) -> None:
        """Each prepared request's results from its rows of the device call's output."""
        out = called
        if not isinstance(called, RequestError):
            try:
                out = self.executor.finish(cast(Planned, prepared.planned), called, report)
            except Exception:  # the group fails, the worker must not
                log.exception("unpadding the outputs")
                out = internal_error("unpadding the outputs")
        pos = 0
        for i, mine in prepared.owners:
            n = sum(len(windows) for windows in mine)
            results[i] = (
                out
                if isinstance(out, RequestError)
                else self._finish(out[pos : pos + n], mine, cast(TaskRequest, requests[i]))
            )
            pos += n

    def _admit(self, request: TaskRequest) -> RequestError | None:
        """The request's 413 over this worker's limits, or None after putting the prompt
        it names (or the model's default prompt) before its texts."""
        refused = self.limits.check(request)
        if refused is not None or not self.task.takes_prompts:
            return refused
        m = self.manifest
        try:
            name = request.parameters.get("prompt_name")
            request.texts = prompted(request.texts, m.prompts, m.default_prompt_name, name)
        except RequestError as e:
            return e
        return None

    def _finish(self, rows: Any, encoded: list[list[Encoded]], request: TaskRequest) -> Outputs:
        try:
            return self.task.finish(rows, encoded, request, self.info)
        except RequestError as e:
            return e
        except Exception:  # noqa: BLE001 - this request fails, its neighbours do not
            return internal_error("building the answer")

    def _encode(
        self, live: Sequence[tuple[int, TaskRequest]], results: list[Outputs | None]
    ) -> dict[int, list[list[Encoded]]]:
        """Each live request's texts as token rows (one per text; a text's windows for a
        windowed task), tokenized in one call per way of truncating (almost always one):
        the deployment's, unless a request chose. A request that cannot be tokenized
        gets its error in `results`."""
        if self.preprocessor is not None:
            return self._encode_images(live, results)
        if self.task.windowed:
            return self._encode_windows(live, results)
        chunked = [(i, r) for i, r in live if r.parameters.get("chunking")]
        if chunked:
            whole = [(i, r) for i, r in live if not r.parameters.get("chunking")]
            return {**self._encode(whole, results), **self._encode_chunks(chunked, results)}
        tokenizer = cast(TextTokenizer, self.tokenizer)
        offsets = self.task.uses_offsets
        modes: dict[tuple[bool, str], list[int]] = {}
        texts: list[Text] = []
        for _, r in live:
            truncate = self.truncation if r.truncate is None else r.truncate
            mode = (truncate, r.truncation_direction if truncate else "right")
            modes.setdefault(mode, []).extend(range(len(texts), len(texts) + len(r.texts)))
            texts.extend(r.texts)
        encoded: list[Encoded | None]
        if len(modes) == 1:  # the usual batch: one call, no reordering
            (truncate, direction), _ = modes.popitem()
            encoded = list(tokenizer.encode(texts, truncate, direction, offsets))
        else:
            encoded = [None] * len(texts)
            for (truncate, direction), idx in modes.items():
                for k, e in zip(
                    idx,
                    tokenizer.encode([texts[k] for k in idx], truncate, direction, offsets),
                    strict=True,
                ):
                    encoded[k] = e
        out, pos = {}, 0
        for i, r in live:
            out[i] = [[cast(Encoded, e)] for e in encoded[pos : pos + len(r.texts)]]
            pos += len(r.texts)
        return out

    def _encode_images(
        self, live: Sequence[tuple[int, TaskRequest]], results: list[Outputs | None]
    ) -> dict[int, list[list[Any]]]:
        """Each request's images as pixel rows, one image decoded at a time (a request
        with one that is not an image, or too large, fails alone)."""
        preprocessor = cast(ImagePreprocessor, self.preprocessor)
        out = {}
        for i, r in live:
            try:
                out[i] = [[row] for row in preprocessor.rows(cast(list[bytes], r.texts))]
            except RequestError as e:
                results[i] = e
        return out

    def _encode_windows(
        self, live: Sequence[tuple[int, TaskRequest]], results: list[Outputs | None]
    ) -> dict[int, list[list[Encoded]]]:
        tokenizer = cast(TextTokenizer, self.tokenizer)
        out = {}
        for i, r in live:
            stride = r.parameters.get("doc_stride") or default_stride(self.max_sequence_length)
            try:
                out[i] = [tokenizer.windows(cast(tuple[str, str], t), stride) for t in r.texts]
            except ValueError as e:
                results[i] = RequestError(
                    f"the question and doc_stride {stride} leave no room for the context in "
                    f"the largest compiled length ({self.max_sequence_length} tokens): send a "
                    f"shorter question or a smaller doc_stride ({e})",
                    status=413,
                )
        return out

    def _encode_chunks(
        self, live: Sequence[tuple[int, TaskRequest]], results: list[Outputs | None]
    ) -> dict[int, list[list[Encoded]]]:
        """Each text of a request that asked for chunking as its chunks of the largest
        compiled length (one when it fits), at most max_chunks_per_request in all."""
        tokenizer = cast(TextTokenizer, self.tokenizer)
        out = {}
        for i, r in live:
            overlap = r.parameters["chunking"]["overlap"]
            try:
                chunks = [tokenizer.chunks(cast(str, t), overlap) for t in r.texts]
            except ValueError as e:
                results[i] = RequestError(
                    f"chunking.overlap {overlap} leaves no room for new text in a chunk of "
                    f"{self.max_sequence_length} tokens: ask for a smaller overlap ({e})",
                    status=422,
                )
                continue
            results[i] = self.limits.check_chunks(sum(len(c) for c in chunks))
            if results[i] is None:
                out[i] = chunks
        return out

    def _too_long(self, encoded: Sequence[Sequence[Any]]) -> RequestError | None:
        """The 413 for a request holding a text over the largest compiled length, which
        is left whole only when truncation is off."""
        if self.preprocessor is not None:
            return None  # every image is made the compiled size
        for k, windows in enumerate(encoded):
            e = windows[0]
            if len(e.ids) > self.max_sequence_length:
                chunks = ' or embedded in chunks ("chunking": true)' * (
                    "chunking" in self.task.parameters
                )
                return RequestError(
                    f"inputs[{k}] is {e.full_length} tokens long; this model was compiled "
                    f"for at most {self.max_sequence_length} tokens and truncation is off. Send "
                    'shorter text, ask for it to be cut ("truncate": true in the request\'s '
                    f"parameters){chunks}, compile with a larger --sequence-lengths, or set "
                    "`truncation: true` for the deployment.",
                    status=413,
                )
        return None

    def _too_large(
        self, encoded: Sequence[Sequence[Any]], request: TaskRequest
    ) -> RequestError | None:
        """The 413 for a request whose answer would be over max_answer_bytes (every
        token's vector of many long texts), found from its tokens before anything runs:
        an answer TorchServe cannot carry would kill the worker sending it."""
        tokens = [len(e.ids) for windows in encoded for e in windows if hasattr(e, "ids")]
        found = self.task.answer_bytes(tokens, request.parameters, self.info)
        return self.limits.check_answer(*found) if found else None


@dataclass
class _Prepared:
    """A group made ready for the device (its padded tensors, or why padding failed)
    and, per request served, its index and its texts' rows."""

    planned: Planned | RequestError
    owners: list[tuple[int, list[list[Encoded]]]]


def default_stride(max_length: int) -> int:
    """The question-answering pipeline's doc_stride (128), at most half a window."""
    return min(128, max_length // 2)


def _check_validated(manifest: Manifest, artifact_dir: Path) -> None:
    if manifest.exported is not None and not manifest.exported.allowed:
        raise ArtifactError(
            f"{artifact_dir} holds a module {manifest.exported.by} compiled, imported without "
            "--allow-exported-module: a TorchScript archive runs code of its own when it is "
            "loaded, so it is not loaded. Compile the export again with "
            "--allow-exported-module if you trust where it came from, or with --recompile"
        )
    if manifest.validation_status == "failed":
        raise ArtifactError(
            f"{artifact_dir} failed its check on this host: {manifest.validation_note}. "
            "Recompile it (a higher precision, or a lower accuracy floor if that is acceptable)"
        )
    if manifest.validation_status == "pending":
        log.warning(
            "%s has not been checked against its eager reference yet (%s): run "
            "`neuronserve validate %s` on this host before trusting its answers",
            artifact_dir,
            manifest.validation_note,
            artifact_dir,
        )
