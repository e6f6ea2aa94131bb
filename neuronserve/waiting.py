"""Waiting for a condition: the one poll loop of every wait in neuronserve (a port that
answers, a status file, a process that has executed or gone, workers that say ready),
each with its own deadline and pace. What is waited on ends the wait early by raising
(a server that exited during its start says so at once, not at the deadline)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], timeout_s: float, every_s: float = 0.05) -> T | None:
    """`check()`'s first truthy answer, asked every `every_s` seconds and once more at
    the deadline; None when `timeout_s` has passed without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(every_s, left))


async def until_async(
    check: Callable[[], Awaitable[T]], timeout_s: float, every_s: float = 0.05
) -> T | None:
    """`until`, for an event loop: `check` is awaited, the loop runs meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(every_s, left))
