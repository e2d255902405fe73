"""A batch is stored in calls of bounded size, a record's several cancels never split; a cancel
that found nothing is kept while its topic is not whole in Redis."""

from __future__ import annotations

from collections.abc import Collection
from typing import cast

from bridge.message import Cancel, Scheduled
from bridge.store import Elsewhere, Shard
from bridge.store.across import not_whole
from bridge.store.adding import rounds
from bridge.store.inventory import Inventory

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


class _Watermarks:
    """What :func:`not_whole` asks Redis: the watermarks it holds, and the shards read again."""

    def __init__(self, held: dict[Shard, int], rereading: frozenset[Shard] = frozenset()) -> None:
        self.held = held
        self._rereading = rereading

    def watermarks(self, shards: list[Shard]) -> dict[Shard, int]:
        return {s: self.held[s] for s in shards if s in self.held}

    def rereading(self, shards: list[Shard]) -> tuple[set[Shard], set[Shard]]:
        return set(shards) & self._rereading, {s for s in shards if s not in self.held}


def test_a_cancel_that_found_nothing_is_kept_while_another_partition_is_not_whole() -> None:
    """Read behind its end, or its watermark lost in Redis since the caller saw it: another
    partition of the cancel's topic may yet hold its record. Its own, or another topic's, never
    keeps it."""
    c, other = Shard("delay", 2), Shard("other", 1)
    known = {A: 10, B: 20, c: 30}
    whole = cast(Inventory, _Watermarks({A: 10, B: 20, c: 30}))
    lost_b = cast(Inventory, _Watermarks({A: 10, c: 30}))
    assert not_whole(whole, [A], lambda: [], known, {}) == frozenset()
    assert not_whole(whole, [A], lambda: [B], known, {}) == {A}
    assert not_whole(whole, [A], lambda: [A, other], known, {}) == frozenset()
    assert not_whole(lost_b, [A], lambda: [], known, {}) == {A}
    assert not_whole(lost_b, [B], lambda: [], known, {}) == frozenset()  # its own loss: a rebuild
    assert not_whole(lost_b, [A, other], lambda: [], {**known, other: 5}, {}) == {A}
    assert not_whole(whole, [], lambda: [B], known, {}) == frozenset()


def test_a_cancel_is_kept_while_another_replicas_partition_is_read_again() -> None:
    """A partition this replica does not own (not ``known``), read again by its owner after a
    loss (meta "reread"): whether the add's look saw it so, or Redis says so when asked."""
    c, d = Shard("delay", 2), Shard("delay", 3)
    known = {A: 10, B: 20}
    rereading = cast(Inventory, _Watermarks(known, frozenset({d})))
    whole = cast(Inventory, _Watermarks(known))
    partitions = {"delay": 4}
    assert not_whole(rereading, [A], lambda: [], known, partitions) == {A}
    assert not_whole(whole, [A], lambda: [], known, partitions) == frozenset()
    assert not_whole(rereading, [d], lambda: [], known, partitions) == frozenset()  # its own
    looked = Elsewhere({}, frozenset({c}), frozenset({d}))  # c: no state, whose loss is unknown
    assert not_whole(whole, [A], lambda: [], known, partitions, looked) == {A}
    assert (
        not_whole(whole, [A], lambda: [], known, partitions, looked._replace(rereading=frozenset()))
        == frozenset()
    )


def test_a_cancel_is_kept_while_another_replicas_partition_has_no_state_and_its_log_has_records() -> (
    None
):
    """Redis lost a partition another replica owns, which has not found out yet: Redis holds no
    state of it at all. Its log holding records (``logged``, read in Kafka) tells it from a
    partition that never had any, which keeps nothing — whether the add's look saw it so, or
    Redis says so when asked."""
    c, d = Shard("delay", 2), Shard("delay", 3)
    known = {A: 10, B: 20}
    held = cast(Inventory, _Watermarks({**known, d: 5}))  # c: no state
    partitions = {"delay": 4}
    asked: list[list[Shard]] = []

    def logged(shards: Collection[Shard]) -> set[Shard]:
        asked.append(list(shards))
        return {c} & set(shards)

    assert not_whole(held, [A], lambda: [], known, partitions, logged=logged) == {A}
    assert asked == [[c]]  # only the partition with no state is asked of Kafka
    assert not_whole(held, [A], lambda: [], known, partitions, logged=lambda s: ()) == frozenset()
    looked = Elsewhere({}, frozenset({c}))
    assert not_whole(held, [A], lambda: [], known, partitions, looked, logged) == {A}
    assert not_whole(held, [c], lambda: [], known, partitions, looked, logged) == frozenset()
    empty = Elsewhere({}, frozenset())
    assert not_whole(held, [A], lambda: [], known, partitions, empty, logged) == frozenset()
