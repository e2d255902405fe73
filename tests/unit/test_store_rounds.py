"""A batch is stored in calls of bounded size, a record's several cancels never split."""

from __future__ import annotations

from bridge.message import Cancel, Scheduled
from bridge.store import Shard
from bridge.store.adding import rounds

A, B = Shard("delay", 0), Shard("delay", 1)


def _rec(offset: int) -> Scheduled:
    return Scheduled(offset, 1, "out", None, b"", [], f"delay:0:{offset}")


def test_a_batch_is_cut_into_calls_at_record_ends_high_where_the_batch_is_at_the_last() -> None:
    many = Cancel(3, "a", 0, None, tuple((f"x{i}", None) for i in range(4))).each()
    records: list[Scheduled | Cancel] = [_rec(0), _rec(1), _rec(2), *many, _rec(4)]
    cut = rounds({A: (9, records), B: (5, [_rec(5)])}, most=2)
    assert [
        {s: (high, [r.offset for r in part]) for s, (high, part) in r.items()} for r in cut
    ] == [
        {A: (1, [0, 1]), B: (5, [5])},
        {A: (3, [2, 3, 3, 3, 3, 3])},  # the five cancels of offset 3 stay together
        {A: (9, [4])},
    ]
    assert rounds({A: (7, [])}) == [{A: (7, [])}]


def test_batches_within_a_call_are_one_round_as_they_are() -> None:
    """The ingress's batches (500 records at most) are never cut: one round, untouched."""
    two: list[Scheduled | Cancel] = [_rec(0), _rec(1)]
    assert rounds({A: (9, two), B: (5, [_rec(5)])}, most=2) == [{A: (9, two), B: (5, [_rec(5)])}]
    assert len(rounds({A: (9, [*two, _rec(2)])}, most=2)) == 2
