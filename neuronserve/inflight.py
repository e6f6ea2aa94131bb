"""What a batch in flight needs: InFlight, a pipelined Runner's threads and its slots for
batches; Countdown, the parts of one batch that finish on other threads (a Runner's
groups, a worker's models) and the one call made when the last of them is done."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Countdown:
    """`done` is called once, on the thread that settles the last part, and only after
    `close`: parts added while the batch is still being handed out cannot finish it
    early."""

    def __init__(self, done: Callable[[], None]):
        self._done = done
        self._lock = threading.Lock()
        self._open = 1  # the handing out itself, then one per part

    def add(self) -> None:
        with self._lock:
            self._open += 1

    def settle(self) -> None:
        """One part is done (its results are in place)."""
        with self._lock:
            self._open -= 1
            if self._open:
                return
        self._done()

    def close(self) -> None:
        """Every part has been added."""
        self.settle()


# batches a pipelined Runner holds at once: one on the device, one being parsed, padded
# or answered beside it (the Neuron runtime queues a core's executions the same way)
IN_FLIGHT = 2


class InFlight:
    """A pipelined Runner's threads and the batches it holds: the device's calls on one
    thread, one after the other; unpadding and answers on another; at most `limit`
    batches at once (a thread pool starts its thread at its first task)."""

    def __init__(self, limit: int = IN_FLIGHT):
        self.device = ThreadPoolExecutor(1, "neuronserve-device")
        self.finishing = ThreadPoolExecutor(1, "neuronserve-finish")
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._held = 0

    def enter(self) -> int:
        """Wait for a slot; how many batches were in flight before this one."""
        self._slots.acquire()
        with self._lock:
            self._held += 1
            return self._held - 1

    def leave(self) -> None:
        with self._lock:
            self._held -= 1
        self._slots.release()

    def close(self) -> None:
        """Wait for the batches in flight to be answered, then stop the threads."""
        self.device.shutdown(wait=True)
        self.finishing.shutdown(wait=True)
