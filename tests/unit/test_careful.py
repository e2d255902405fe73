"""The ingress's careful pass over a batch it failed on with a bug (bridge.ingress.careful)."""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from bridge.errors import StoreError
from bridge.ingress.batch import Batch
from bridge.ingress.careful import is_bug, one_offset_at_a_time, pieces
from bridge.message import Cancel, Reason, Rejected, Scheduled
from bridge.store import Shard
from tests.unit.fake_message import message

A, B = Shard("delay", 0), Shard("delay", 1)


def rec(offset: int, value: bytes = b"v") -> Scheduled:
    return Scheduled(offset, 1_800_000_000_000, "orders", b"k", value, [], f"id-{offset}")


def batch() -> tuple[list[Message], Batch]:
    """Partition 0: records at 3, 4 (two cancels at one offset), a rejected one at 5, a record
    at 6; partition 1: a record at 10."""
    bad = Rejected(Reason.BAD_DUE_TIME, "no")
    at = [(A, 3), (A, 4), (A, 5), (A, 6), (B, 10)]
    messages = [message(s.topic, s.partition, o, 0, b"v", []) for s, o in at]
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {
        A: (6, [rec(3), Cancel(4, "x"), Cancel(4, "y"), rec(6, b"poison")]),
        B: (10, [rec(10)]),
    }
    return messages, Batch(stored, [(messages[2], bad)], {A: 3, B: 10}, {A: 99, B: 98})


def test_a_batch_in_pieces_is_each_offset_once_in_order() -> None:
    _, whole = batch()
    got = [
        (s, high, [r.offset for r in recs], len(p.rejected), p.low[s], p.newest_ms)
        for p in pieces(whole)
        for s, (high, recs) in p.stored.items()
    ]
    assert got == [
        (A, 3, [3], 0, 3, {}),
        (A, 4, [4, 4], 0, 4, {}),
        (A, 5, [], 1, 5, {}),
        (A, 6, [6], 0, 6, {A: 99}),
        (B, 10, [10], 0, 10, {B: 98}),
    ]


def test_the_offset_that_fails_twice_is_dead_lettered_and_the_rest_handled() -> None:
    messages, whole = batch()
    marks: dict[Shard, int] = {}
    handled: list[tuple[Shard, int, list[bytes | None], list[str]]] = []

    def handle(_: list[Message], piece: Batch) -> None:
        [(shard, (high, recs))] = piece.stored.items()
        if any(isinstance(r, Scheduled) and r.value == b"poison" for r in recs):
            raise ValueError("a bug")
        values = [r.value for r in recs if isinstance(r, Scheduled)]
        handled.append((shard, high, values, [w.detail for _, w in piece.rejected]))
        marks[shard] = high

    assert one_offset_at_a_time(handle, marks, messages, whole) == 1
    assert [(s, h) for s, h, _, _ in handled] == [(A, 3), (A, 4), (A, 5), (A, 6), (B, 10)]
    assert handled[3][3] == ["the bridge failed to store it (a bug): ValueError: a bug"]
    assert marks == {A: 6, B: 10}


def test_a_failure_that_passes_or_comes_after_storing_costs_no_record() -> None:
    messages, whole = batch()
    marks: dict[Shard, int] = {}
    failed: set[int] = set()

    def handle(_: list[Message], piece: Batch) -> None:
        [(shard, (high, _records))] = piece.stored.items()
        assert not piece.rejected or high == 5, "nothing dead-lettered but the parser's"
        if high == 3 and high not in failed:  # fails once, then passes
            failed.add(high)
            raise RuntimeError("a race")
        marks[shard] = high
        if high == 6:  # stored, then a bug in what follows
            raise KeyError("after storing")

    assert one_offset_at_a_time(handle, marks, messages, whole) == 0
    assert marks == {A: 6, B: 10}


def test_what_is_not_a_bug_is_raised_for_the_batch_to_be_read_again() -> None:
    messages, whole = batch()

    def handle(_: list[Message], piece: Batch) -> None:
        raise StoreError("Redis away")

    with pytest.raises(StoreError):
        one_offset_at_a_time(handle, {}, messages, whole)
    assert is_bug(ValueError()) and not is_bug(StoreError("x")) and not is_bug(ConnectionError())
