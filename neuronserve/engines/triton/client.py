"""The front's client of Triton: a request's texts as KServe v2 binary tensors (TEXT, and
TEXT_PAIR), over the front's own aiohttp pool (kserve.py), its results back from the
task's output tensor (neuronserve.tensors: the front answers, as for every engine);
readiness from Triton's model readiness and the live stubs (Triton says READY while a
dead stub is still handed batches)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from ... import tensors
from ...tasks import RequestError
from ...tensors import TOKENS
from ...tracing import STAGES, TRACE_ASK, TRACING, Stage, parse_stages
from ...worker import MODEL_PARAMETER
from ..client import (
    PLAIN,
    PROBE_TIMEOUT,
    EngineClient,
    EngineUnavailable,
    WorkerCounts,
    WorkerDied,
    metrics_text,
    once_more,
)
from . import kserve

if TYPE_CHECKING:
    from ...served import ServedModel
    from ...tasks import TaskRequest

# How Triton's Python backend says the instance that held a request died with it: "Stub
# process '<instance>' is not healthy." (500) for a batch handed to a dead stub, until
# the healer replaces it
_DIED = ("is not healthy",)
# Triton names the dead instance: "Stub process 'cores1_0' is not healthy."
_INSTANCE = re.compile(r"Stub process '([^']+)'")
# what Triton answers while a whole model reloads (a repository the healer cannot heal
# an instance at a time): the front says 503 and Retry-After, not the engine's 500/404
_RELOADING = ("Request for unknown model", "is not ready")
# how long the front waits for the healer to take a dead instance out of rotation
SETTLE_S = 5.0
# how long /health waits for Triton's word on the model before it goes by the stubs
_READY_WAIT_S = 0.5


@dataclass(frozen=True)
class TritonUrls:
    http: str
    metrics: str
    # the header carrying the key inference is behind (TritonInstance.headers)
    auth: dict[str, str] = field(default_factory=dict)


class TritonClient(EngineClient):
    def __init__(  # noqa: PLR0913 - the engine's facts, each one of its own
        self,
        name: str,
        urls: TritonUrls,
        instances: int,
        connections: int,
        alive: Callable[[], int],
        out_of_rotation: Callable[[str], bool],
    ):
        """`name`: the Triton model holding the served models; `alive`: its live instances (stub
        processes) now; `out_of_rotation(instance)`: whether Triton no longer hands that
        instance batches from a dead stub (TritonInstance.out_of_rotation)."""
        # inference as KServe v2 binary tensors on a pool of its own (kserve.py); the
        # front's deadline bounds a request, not this session
        self._infer_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._infer_url = f"{urls.http}/v2/models/{name}/infer"
        self._ready_url = f"{urls.http}/v2/models/{name}/ready"
        self._model_url = f"{urls.http}/v2/models/{name}"
        # the outputs the Triton model declares (its metadata), once asked
        self._outputs: set[str] | None = None
        self._aux = aiohttp.ClientSession(timeout=PROBE_TIMEOUT)
        self._metrics_url = f"{urls.metrics}/metrics"
        self._name, self._instances, self._alive = name, instances, alive
        self._headers = {**PLAIN, **urls.auth}
        self._out_of_rotation = out_of_rotation

    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        """The request's results (`Task.finish`) from Triton: its texts as TEXT (and
        TEXT_PAIR) rows, the task's parameters as Triton request parameters (the
        instances build per-text results with them: entities, answers, predictions), and
        the model's name."""
        task = model.handler
        # Triton's parameters are scalars: a list of names travels comma-joined
        params: dict[str, Any] = {
            k: ",".join(v) if isinstance(v, list) else v
            for k, v in request.parameters.items()
            if isinstance(v, (bool, int, str, list))
        }
        params[MODEL_PARAMETER] = model.worker_name
        if request.truncate is not None:
            params["truncate"] = request.truncate
            params["truncation_direction"] = request.truncation_direction
        # TEXT_PAIR covers a whole call, so pairs and single texts go in calls of their own
        texts = request.texts
        pieces = [
            idx
            for pairs in (False, True)
            if (idx := [i for i, t in enumerate(texts) if isinstance(t, tuple) == pairs])
        ]
        codec = tensors.of(task.name)
        m = model.manifest
        output = codec.output_for(request.parameters) or tensors.first_output(
            task.name, m.output_dim, m.labels
        )
        outputs = [output, *await self._extra_outputs(model, codec, params)]
        calls = [
            self._infer(task.name, [texts[i] for i in piece], params, outputs) for piece in pieces
        ]
        # one piece (most requests) awaited as it is: gather would make it a task
        parts = (
            [await calls[0]]
            if len(calls) == 1
            else await asyncio.gather(*calls, return_exceptions=True)
        )
        results: list[Any] = [None] * len(texts)
        tokens: list[int] | None = [0] * len(texts)
        for piece, part in zip(pieces, parts, strict=True):
            if isinstance(part, BaseException):
                raise part
            if STAGES in part:
                TRACING.stages(_stages(part[STAGES]))
            for i, result in zip(piece, codec.decode(part[output], model.task_info), strict=True):
                results[i] = result
            counts = tensors.token_counts(part.get(TOKENS))
            if counts is None or tokens is None:
                tokens = None
            else:
                for i, n in zip(piece, counts, strict=True):
                    tokens[i] = n
        request.tokens = tokens
        # rows (a vector per text) stack; per-token results (a matrix per text) cannot
        rows = isinstance(results[0], np.ndarray) and results[0].ndim == 1
        return np.stack(results) if rows else results

    async def _extra_outputs(
        self, model: ServedModel, codec: tensors.TaskTensors, params: dict[str, Any]
    ) -> list[str]:
        """What a request asks for beside its results, where the model declares it: each
        text's token count (OpenAI's usage), and a traced request's instance stages
        (tokenizing, padding, each device call), asked for with a parameter."""
        extra = []
        if codec.counts_tokens and model.tokenizer is not None and await self._declares(TOKENS):
            extra.append(TOKENS)
        if TRACING.recording() and await self._declares(STAGES):
            extra.append(STAGES)
            params[TRACE_ASK] = True
        return extra

    async def _declares(self, output: str) -> bool:
        """Whether the Triton model declares `output` (a repository packaged before it
        did does not: the front counts the tokens itself, and traces no instance), its
        metadata asked once."""
        if self._outputs is None:
            try:
                async with self._aux.get(self._model_url, headers=self._headers) as resp:
                    if resp.status != 200:
                        return False
                    meta = await resp.json(content_type=None)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
                return False
            self._outputs = {o.get("name") for o in meta.get("outputs", [])}
        return output in self._outputs

    async def _infer(
        self, task: str, texts: list, params: dict[str, Any], outputs: list[str]
    ) -> dict[str, np.ndarray]:
        first = [tensors.bytes_element(t[0] if isinstance(t, tuple) else t) for t in texts]
        columns = {tensors.input_name(task): first}
        if isinstance(texts[0], tuple):
            columns[tensors.PAIR_INPUT] = [tensors.bytes_element(t[1]) for t in texts]
        body, headers = kserve.infer_body(columns, outputs, params or None)
        headers = {**self._headers, **headers}

        async def send() -> dict[str, np.ndarray]:
            try:
                async with self._infer_session.post(
                    self._infer_url, data=body, headers=headers
                ) as resp:
                    raw = await resp.read()
                    if resp.status == 200:
                        found = tensors.unpack_all(raw, resp.headers.get(kserve.HEADER_LENGTH))
                        if outputs[0] not in found:
                            raise ValueError(f"Triton's answer holds no output {outputs[0]!r}")
                        return found
            except (aiohttp.ClientError, OSError) as e:
                raise EngineUnavailable(f"Triton did not answer: {e}") from None
            message = kserve.error_message(raw)
            if any(d in message for d in _DIED):
                named = _INSTANCE.search(message)
                raise WorkerDied(
                    f"Triton's instance died: {message}", named.group(1) if named else ""
                )
            if any(r in message for r in _RELOADING):
                raise EngineUnavailable(f"Triton is reloading the model: {message}")
            raise RequestError.from_engine(message, resp.status)

        return await once_more(send, f"a request to {self._name}", self._settle)

    async def _settle(self, died: WorkerDied) -> None:
        """Wait (at most SETTLE_S) until the healer has the dead instance out of rotation,
        so that the request sent again goes to a live one."""
        if not died.worker:
            return
        check = self._out_of_rotation
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while asyncio.get_running_loop().time() < deadline:
            out: bool = await asyncio.to_thread(check, died.worker)
            if out:
                return
            await asyncio.sleep(0.02)

    async def health(self) -> WorkerCounts:
        alive = await asyncio.to_thread(self._alive)
        try:
            # Triton holds this answer while it updates the model's instances (the
            # healer's loads, seconds): the live stubs say it is serving meanwhile
            ready = await asyncio.wait_for(self._ready(), _READY_WAIT_S)
        except asyncio.TimeoutError:
            ready = alive > 0
        except (aiohttp.ClientError, OSError):
            ready = False
        # Triton says READY while a dead stub is still handed batches: the live stubs
        # are the truth (the healer replaces one that is missing)
        return WorkerCounts(alive if ready else 0, self._instances)

    async def _ready(self) -> bool:
        """KServe v2 model readiness: 200 when ready."""
        async with self._aux.get(self._ready_url, headers=self._headers) as resp:
            await resp.read()
            return resp.status == 200

    async def metrics(self) -> str:
        return await metrics_text(self._aux, self._metrics_url)

    async def close(self) -> None:
        await self._infer_session.close()
        await self._aux.close()


def _stages(tensor: np.ndarray) -> list[Stage]:
    """An instance's stages from its STAGES output (JSON in its first element)."""
    try:
        return parse_stages(json.loads(tensor.reshape(-1)[0]), engine="triton")
    except (ValueError, IndexError, TypeError):
        return []
