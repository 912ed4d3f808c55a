"""Blocks of array work computed on the machine's cores, their results taken in order.

The what-if's GPU pass, its hot-spot series and the replay's phase-trend fit split their
columns into blocks that depend on nothing but their inputs. numpy releases the GIL inside its
array loops, so two threads keep two cores busy; the caller adds the blocks' results in block
order, so nothing it computes depends on how many workers there were or which finished first.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["WORKERS", "in_order"]

#: Blocks computed at once: one per core, at most two (a what-if block's temporaries are
#: ~0.1 GB at 24 h / 10 s, and the 2-vCPU machine is the one its targets are set on).
WORKERS = max(1, min(2, os.cpu_count() or 1))

A = TypeVar("A")
R = TypeVar("R")


def in_order(fn: Callable[[A], R], items: Iterable[A], workers: int | None = None) -> Iterator[R]:
    """``fn(item)`` for each item, in the items' order, computed ``workers`` (default
    :data:`WORKERS`) at a time with
    at most ``workers`` results submitted and not yet taken (memory stays bounded: unlike
    :meth:`concurrent.futures.Executor.map`, which submits every item at once). An exception
    of ``fn`` is raised where its result is taken."""
    items = list(items)
    workers = WORKERS if workers is None else workers
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="dctwin-block") as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
