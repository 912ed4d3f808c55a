"""twin.blocks.in_order: results in the items' order, a bounded number waiting, errors where
their result is taken."""

from __future__ import annotations

import threading
import time

import pytest

from twin import blocks


def test_results_come_in_the_items_order_whichever_finishes_first() -> None:
    def slow_first(i: int) -> int:
        time.sleep(0.02 if i % 2 == 0 else 0.0)
        return i * i

    assert list(blocks.in_order(slow_first, range(9), workers=2)) == [i * i for i in range(9)]
    assert list(blocks.in_order(slow_first, range(9), workers=1)) == [i * i for i in range(9)]
    assert list(blocks.in_order(slow_first, [], workers=2)) == []


def test_no_more_than_the_workers_are_submitted_ahead_of_the_consumer() -> None:
    started: list[int] = []
    lock = threading.Lock()

    def record(i: int) -> int:
        with lock:
            started.append(i)
        return i

    gen = blocks.in_order(record, range(20), workers=2)
    assert next(gen) == 0
    time.sleep(0.05)  # a pool that ran ahead would have started every item by now
    with lock:
        assert len(started) <= 3, started
    assert list(gen) == list(range(1, 20))


def test_an_error_of_a_block_is_raised_where_its_result_is_taken() -> None:
    def fail_on_three(i: int) -> int:
        if i == 3:
            raise ValueError("block 3 failed")
        return i

    gen = blocks.in_order(fail_on_three, range(6), workers=2)
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="block 3 failed"):
        next(gen)


def test_the_default_is_the_module_setting_read_at_each_call(monkeypatch) -> None:
    seen: set[str] = set()

    def where(i: int) -> int:
        seen.add(threading.current_thread().name)
        return i

    monkeypatch.setattr(blocks, "WORKERS", 1)
    assert list(blocks.in_order(where, range(4))) == [0, 1, 2, 3]
    assert seen == {threading.current_thread().name}  # one worker: the caller's own thread
