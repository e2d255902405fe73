"""A loop's slow turns are logged with where the time went; usual turns are not."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from bridge.turns import SLOW_S, Turns, name_os_thread


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_turn_that_keeps_to_its_wait_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    turns = Turns("sender", clock)
    for _ in range(3):
        turns.begin()
        clock.now += 0.004
        turns.mark("producing due records")
        turns.waits(0.5)
        clock.now += 0.5 + SLOW_S / 2  # woke late, not late enough to matter
    turns.begin()
    assert turns.slowest_s == pytest.approx(0.004 + SLOW_S / 2)
    assert not caplog.records


def test_a_slow_turn_names_its_parts_and_how_late_it_woke(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    turns = Turns("mover", clock)
    turns.begin()
    clock.now += 0.002
    turns.mark("applying delivery reports")
    clock.now += 0.9
    turns.mark("claiming from redis")
    clock.now += 0.001
    turns.mark("applying delivery reports")  # a part marked twice adds up
    turns.waits(0.010)
    clock.now += 0.010 + 0.4
    with caplog.at_level(logging.WARNING, logger="bridge.turns"):
        turns.begin()
    [record] = caplog.records
    assert record.getMessage() == (
        "the mover loop's turn ran 1,303 ms past its 10 ms wait: applying delivery reports 3 ms, "
        "claiming from redis 900 ms, waking 400 ms"
    )
    caplog.clear()
    turns.begin()  # the next turn starts afresh
    assert not caplog.records


def test_a_loop_thread_is_named_apart_where_the_system_keeps_names() -> None:
    named: list[str] = []

    def body() -> None:
        name_os_thread("read-back")
        comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm")
        named.append(comm.read_text().strip() if comm.exists() else "db-read-back")

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert named == ["db-read-back"]
