"""Worker threads for convert and verify: an ordered, bounded map, and the default count.

The heavy steps (``preadv``/``pwrite``, numpy and torch copies, crc32, hashing) release the
GIL, so threads scale with the cores; torch's own intra-op threads are switched off while
they run, since several workers each starting a team of OpenMP threads oversubscribe the
cores (measured: 2.5x slower with one worker on two cores, mostly spin-waiting).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from mxfp4conv import lazy_torch


def default_workers() -> int:
    """The cores this process may run on, at most 16. Measured: on 2 cores two workers beat one
    for every target, on 16 cores sixteen beat eight; the kernel's copies and writeback run in
    the same threads' system calls, so none is left idle for them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(16, cores))


IN_FLIGHT_BYTES = 768 << 20  # all running jobs together (peak RSS = this + the interpreter)


def chunk_budget(workers: int, chunk_bytes: int) -> int:
    """Bytes of experts per job: a running job holds about three copies of its chunk (read,
    transformed, temporaries), and all of them together stay under ``IN_FLIGHT_BYTES``."""
    return max(1 << 20, min(chunk_bytes, IN_FLIGHT_BYTES // (3 * max(1, workers))))


@contextmanager
def one_torch_thread(load: bool = True):
    """torch's intra-op threads set to one for the block. ``load=False``: only if torch is
    imported already (a run that has no use for torch does not import it for this)."""
    if load:
        import torch
    else:
        torch = lazy_torch.loaded()
        if torch is None:
            yield
            return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class OrderedPool:
    """``map(fn, jobs)`` runs ``fn(job)`` on the workers with at most ``depth`` jobs submitted
    and not yet consumed, and yields ``(job, result)`` in submission order. Jobs are drawn
    from the iterable on the calling thread. Leaving the ``with`` block by an exception
    cancels what has not started and waits for what has."""

    def __init__(self, workers: int, depth: int | None = None, name: str = "mxfp4conv"):
        self.workers = max(1, workers)
        self.depth = depth or 2 * self.workers + 1
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name)
        self._pending: deque = deque()

    def map(self, fn: Callable, jobs: Iterable) -> Iterator[tuple]:
        for job in jobs:
            self._pending.append((job, self._pool.submit(fn, job)))
            while len(self._pending) > self.depth:
                job0, fut = self._pending.popleft()
                yield job0, fut.result()
        while self._pending:
            job0, fut = self._pending.popleft()
            yield job0, fut.result()

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            for _, fut in self._pending:
                fut.cancel()
            self._pending.clear()
            self._pool.shutdown(wait=True, cancel_futures=True)
        else:
            self._pool.shutdown(wait=True)
