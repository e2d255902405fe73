"""What a re-read leaves out (bridge.ingress.Settled), with a journal reader that only answers
what the test says (the real one: tests/integration/test_journal.py)."""

from __future__ import annotations

from typing import cast

from bridge.errors import BridgeError
from bridge.ingress import Settled
from bridge.journal import Entry, Fate, JournalReader
from bridge.message import Cancel, Scheduled
from bridge.store import Shard, Store

A, B = Shard("delay", 0), Shard("delay", 1)


class FakeReader:
    def __init__(
        self, settled: dict[Shard, frozenset[int]], failing: frozenset[Shard] = frozenset()
    ):
        self._settled, self._failing = settled, failing
        self.asked: list[tuple[Shard, int]] = []
        self.closed = False

    def fates(self, shard: Shard, start: int, topic_id: str = "") -> list[Entry]:
        """Every entry of the shard, before ``start`` too (the real reader's are since the
        record at ``start`` was produced, which may hold fates of earlier offsets)."""
        self.asked.append((shard, start))
        if shard in self._failing:
            raise BridgeError("Kafka did not answer")
        return [
            Entry(Fate.DELIVERED, o, f"id-{o}", 10 * o, 1)
            for o in sorted(self._settled.get(shard, ()))
        ]

    def close(self) -> None:
        self.closed = True


def rec(offset: int) -> Scheduled:
    return Scheduled(offset, 1_800_000_000_000, "orders", b"k", b"v", [], f"id-{offset}")


def test_settled_records_are_left_out_until_the_read_passes_the_last_of_them() -> None:
    reader = FakeReader({A: frozenset({3, 5, 9})})
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: 4})
    assert reader.asked == [(A, 4)] and reader.closed
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {
        A: (6, [rec(4), rec(5), rec(6)]),
        B: (2, [rec(2)]),
    }
    assert settled.drop(stored) == 1
    assert [r.offset for r in stored[A][1]] == [4, 6] and [r.offset for r in stored[B][1]] == [2]
    later: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (9, [rec(9)])}
    assert settled.drop(later) == 1 and later[A][1] == []
    again: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (9, [rec(9)])}
    assert settled.drop(again) == 0, "past the last settled offset: nothing is held any more"


def test_a_cancel_is_never_left_out() -> None:
    settled = Settled(lambda: cast(JournalReader, FakeReader({A: frozenset({7})})))
    settled.load({A: 0})
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (7, [Cancel(7, "x")])}
    assert settled.drop(stored) == 0 and len(stored[A][1]) == 1


def test_a_journal_that_cannot_be_read_leaves_the_partition_as_before() -> None:
    reader = FakeReader({A: frozenset({1}), B: frozenset({1})}, failing=frozenset({A}))
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: 0, B: 0})
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {
        A: (1, [rec(1)]),
        B: (1, [rec(1)]),
    }
    assert settled.drop(stored) == 1 and len(stored[A][1]) == 1 and stored[B][1] == []


def test_without_a_journal_or_after_a_revoke_nothing_is_left_out() -> None:
    Settled(None).load({A: 0})  # no reader is made
    reader = FakeReader({A: frozenset({1})})
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: 0})
    settled.forget({A})
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (1, [rec(1)])}
    assert settled.drop(stored) == 0


class FakeStore:
    def __init__(self) -> None:
        self.settled: list[tuple[Shard, list[tuple[int, int, str]]]] = []

    def settle(self, shard: Shard, settled: list[tuple[int, int, str]]) -> int:
        self.settled.append((shard, list(settled)))
        return len(settled)


def test_a_rolled_back_partition_forgets_in_redis_what_the_journal_settled_before_its_start() -> (
    None
):
    """Redis lost writes, acknowledgements among them: the records they removed are back in
    Redis, below where the re-read starts. Only a rolled-back partition's are forgotten (a
    partition read again for another reason holds none of them)."""
    store = FakeStore()
    reader = FakeReader({A: frozenset({1, 2, 6}), B: frozenset({1, 7})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store))
    settled.load({A: 5, B: 5}, rolled_back={A})
    assert store.settled == [(A, [(1, 10, "id-1"), (2, 20, "id-2")])]
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (6, [rec(5), rec(6)])}
    assert settled.drop(stored) == 1 and [r.offset for r in stored[A][1]] == [5]
