"""What a re-read leaves out (bridge.ingress.Settled), with a journal reader that only answers
what the test says (the real one: tests/integration/test_journal.py)."""

from __future__ import annotations

from typing import cast

import pytest

from bridge.catchup import LIVE_MARGIN_MS
from bridge.errors import BridgeError, StoreError
from bridge.ingress import Settled, put_back
from bridge.journal import Entry, Fate, JournalReader
from bridge.message import H_PAUSED, H_REPLACES, Cancel, Scheduled, origin
from bridge.store import Backlog, ResumePoint, Shard, Store

A, B, C = Shard("delay", 0), Shard("delay", 1), Shard("delay", 2)


class FakeReader:
    def __init__(
        self, settled: dict[Shard, frozenset[int]], failing: frozenset[Shard] = frozenset()
    ):
        self._settled, self._failing = settled, failing
        self.asked: list[tuple[Shard, int]] = []
        self.since: list[int | None] = []  # each read's since_ms
        self.closed = False

    def fates(
        self, shard: Shard, start: int, topic_id: str = "", **given: int | bool | None
    ) -> list[Entry]:
        """Every entry of the shard, before ``start`` too (the real reader's are since the
        record at ``start`` was produced, which may hold fates of earlier offsets)."""
        self.asked.append((shard, start))
        since = given.get("since_ms")
        self.since.append(since if isinstance(since, int) else None)
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


def test_a_schedules_record_left_out_says_where_the_schedule_is() -> None:
    """A recurring schedule's record with its own delay-id whose step the journal holds
    delivered is not stored, but stands in the batch as where the schedule is (add.lua's
    registry); a one-shot record, and a schedule known by its default id, leave nothing."""
    settled = Settled(lambda: cast(JournalReader, FakeReader({A: frozenset({3, 5, 6, 9})})))
    settled.load({A: 0})
    running = Scheduled(3, 1, "orders", None, b"v", [], "poll", recurring=True, timestamp_ms=7)
    paused = Scheduled(
        5, 1, "orders", None, b"v", [(H_PAUSED, b"1")], "poll", recurring=True, continues=3
    )
    by_default = Scheduled(9, 1, "orders", None, b"v", [], origin("delay", 0, 9), recurring=True)
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {
        A: (9, [running, paused, rec(6), by_default])
    }
    assert settled.drop(stored) == 4
    left = stored[A][1]
    assert [(c.offset, c.delay_id, c.timestamp_ms) for c in left] == [
        (3, "poll", 7),
        (5, "poll", 0),
    ]
    assert [cast(Cancel, c).left_out for c in left] == [False, True]


def test_a_schedules_record_left_out_as_cancelled_says_the_schedule_ended_there() -> None:
    class Withdrawn(FakeReader):
        def fates(
            self, shard: Shard, start: int, topic_id: str = "", **_: int | bool | None
        ) -> list[Entry]:
            return [
                Entry(Fate.CANCELLED, 3, "poll", 1, 2, by="delay:1:9"),
                Entry(Fate.REPLACED, 4, "poll", 1, 2, by="delay:0:8"),
                Entry(Fate.DEAD_LETTERED, 5, "poll", 1, 2),
            ]

    settled = Settled(lambda: cast(JournalReader, Withdrawn({})))
    settled.load({A: 0})
    records = [Scheduled(o, 1, "orders", None, b"v", [], "poll", recurring=True) for o in (3, 4, 5)]
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (5, list(records))}
    assert settled.drop(stored) == 3
    # Replaced: what replaced it says what the registry has; dead-lettered: nothing.
    assert [(c.offset, cast(Cancel, c).left_withdrawn) for c in stored[A][1]] == [(3, True)]


def test_a_schedule_the_journal_holds_ended_before_the_start_goes_no_further() -> None:
    """A cancel read while the schedule's occurrence at offset 2 was delivered (or in flight)
    ended it there, before the re-read's start (the commit passed both): the records carrying it
    on from there, and from those, are left out, each where the schedule ended; one replaced from
    another partition ends it too, and a schedule of the same id made by its producer after the
    end is not one of them."""

    class Ended(FakeReader):
        def fates(
            self, shard: Shard, start: int, topic_id: str = "", **_: int | bool | None
        ) -> list[Entry]:
            return [
                Entry(Fate.DELIVERED, 2, "poll", 1, 2, "orders", 0, 0),
                Entry(Fate.CANCELLED, 2, "poll", 1, 2, by="delay:1:9"),
                Entry(Fate.REPLACED, 3, "tick", 1, 2, by="delay:1:10"),
            ]

    settled = Settled(lambda: cast(JournalReader, Ended({})))
    settled.load({A: 5}, ends={A: 12})

    def carried(offset: int, sid: str, continues: int | None) -> Scheduled:
        return Scheduled(offset, 1, "o", None, b"v", [], sid, recurring=True, continues=continues)

    records = [
        carried(6, "poll", 2),
        carried(7, "tick", 3),
        carried(8, "poll", 6),
        carried(9, "poll", None),
        carried(10, "poll", 9),
    ]
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (10, list(records))}
    assert settled.drop(stored) == 3
    assert [(r.offset, isinstance(r, Cancel) and r.left_withdrawn) for r in stored[A][1]] == [
        (6, True),
        (7, True),
        (8, True),
        (9, False),
        (10, False),
    ]


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
    def __init__(self, oldest_due_ms: int | None = 1) -> None:
        self.settled: list[tuple[Shard, list[tuple[int, int, str]]]] = []
        self.leased: list[bool] = []
        self.oldest_due_ms = oldest_due_ms  # of the records due that wait (None: none)
        self.down = False  # every call fails, as while Redis loads its data set
        self.points: dict[Shard, ResumePoint] = {}
        self.inventory = self

    def resume_points(self, shards: list[Shard]) -> dict[Shard, ResumePoint]:
        if self.down:
            raise StoreError("redis is loading its data set")
        return {s: self.points[s] for s in shards if s in self.points}

    def backlog(self, shards: list[Shard], now_ms: int) -> Backlog:
        due = self.oldest_due_ms is not None
        return Backlog(now_ms, 0, int(due), 0, self.oldest_due_ms)

    def settle(self, shard: Shard, settled: list[tuple[int, int, str]], *, leased: bool) -> int:
        if self.down:
            raise StoreError("redis is loading its data set")
        self.settled.append((shard, list(settled)))
        self.leased.append(leased)
        return len(settled)


def test_a_partition_read_again_forgets_in_redis_what_the_journal_settled_before_its_start() -> (
    None
):
    """Redis may have lost writes, acknowledgements among them, with nothing to tell (the
    adversary with two replicas, seed 13): the records they removed are back in Redis, below
    where the re-read starts. Every partition read again has them forgotten."""
    store = FakeStore()
    reader = FakeReader({A: frozenset({1, 2, 6}), B: frozenset({1, 7})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store))
    settled.load({A: 5, B: 5})
    assert store.settled == [(A, [(1, 10, "id-1"), (2, 20, "id-2")]), (B, [(1, 10, "id-1")])]
    assert store.leased == [True, True], "records in flight too: no take-over looks them up"
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (6, [rec(5), rec(6)])}
    assert settled.drop(stored) == 1 and [r.offset for r in stored[A][1]] == [5]


def test_an_assignment_leaves_records_in_flight_to_the_take_overs_reconciliation() -> None:
    """At an assignment (when Redis last took a write of each partition given), what an earlier
    owner left leased is the take-over's to look up in the journal: only what waits is
    forgotten here."""
    store = FakeStore()
    reader = FakeReader({A: frozenset({1, 2, 6})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store))
    settled.load({A: 5}, {A: 7}, {A: ResumePoint(4, 5, False, 1)})
    assert store.settled == [(A, [(1, 10, "id-1"), (2, 20, "id-2")])] and store.leased == [False]


def test_an_assignment_below_the_watermark_forgets_what_the_journal_holds_up_to_it() -> None:
    """An assignment may start below Redis's watermark (at a cancel it keeps to look for in the
    other partitions): the re-read does not store again what lies up to the watermark, Redis has
    it, so what a rollback put back there is forgotten too (the adversary, seed 20: 228 twice)."""
    store = FakeStore()
    reader = FakeReader({A: frozenset({1, 2, 6, 8})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store))
    settled.load({A: 3}, {A: 9}, {A: ResumePoint(6, 3, False, 1)})
    assert [o for o, _, _ in store.settled[0][1]] == [1, 2, 6], "8: the re-read leaves it out"


class Holds:
    """What a Settled asks of the mover's claims (CatchUp.hold), as it stands."""

    def __init__(self) -> None:
        self.held: set[Shard] = set()

    def __call__(self, shard: Shard, held: bool) -> None:
        (self.held.add if held else self.held.discard)(shard)


def test_a_forget_redis_refuses_holds_the_partitions_claims_until_it_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis restarting from an AOF missing its tail put records back that the journal holds as
    delivered, and refuses the forget while it loads: they were delivered again once it
    answered (the adversary with lanes, seed 6). The partition claims nothing until it is
    done; one whose forget went through claims at once."""
    monkeypatch.setattr(put_back, "RETRY_S", 0.0)
    store, holds = FakeStore(), Holds()
    reader = FakeReader({A: frozenset({1, 2})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store), hold=holds)
    store.down = True
    settled.load({A: 5})
    assert holds.held == {A} and store.settled == []
    settled.settle_held()
    assert holds.held == {A} and store.settled == [], "still loading: still held"
    store.down = False
    settled.settle_held()
    assert holds.held == set() and store.settled == [(A, [(1, 10, "id-1"), (2, 20, "id-2")])]
    assert store.leased == [True], "as the load would have: in flight too"
    settled.load({B: 5})
    assert holds.held == set(), "nothing refused: nothing held"


def test_an_assignment_redis_did_not_answer_forgets_what_it_holds_once_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis loading at an assignment gives no resume point: the partition is read again from
    the group's commit, and Redis may hold any of its records, put back or not. Once it
    answers, what the journal holds is forgotten there as at an assignment it answered: up to
    its watermark, or before the re-read's start; a partition at its end, from when Redis last
    took a write of it. A partition revoked meanwhile is let go."""
    monkeypatch.setattr(put_back, "RETRY_S", 0.0)
    store, holds = FakeStore(oldest_due_ms=4_000), Holds()
    reader = FakeReader({A: frozenset({1, 2, 6, 8}), B: frozenset({1}), C: frozenset({1})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store), hold=holds)
    store.down = True
    settled.load({A: 3, B: 5, C: 0}, {A: 9, B: 5, C: 4}, {}, unread=[A, B, C])
    assert holds.held == {A, B, C} and reader.asked == [(A, 3), (C, 0)]
    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = {A: (8, [rec(6), rec(7)])}
    assert settled.drop(stored) == 1, "the re-read leaves out what is settled meanwhile"
    settled.forget({C})
    assert holds.held == {A, B}
    settled.settle_held()
    assert holds.held == {A, B} and store.settled == []
    store.down = False
    store.points = {A: ResumePoint(6, 7, False, None), B: ResumePoint(4, 5, False, 1_000)}
    settled.settle_held()
    assert holds.held == set() and store.leased == [False, False], "the take-over's to look up"
    assert [(s, [o for o, _, _ in e]) for s, e in store.settled] == [(A, [1, 2, 6]), (B, [1])]
    assert reader.asked[-2:] == [(A, 3), (B, 5)] and reader.since[-1] == 4_000


def point(written: int) -> ResumePoint:
    """A resume point at offset 3, the watermark 2, Redis's last write at ``written``."""
    return ResumePoint(2, 3, False, written)


def test_an_assignment_reads_the_journal_for_what_was_put_back_only_while_records_due_wait() -> (
    None
):
    """A partition whose last write Redis kept is days old (nothing came since) would have the
    journal read from then at each assignment: minutes of it, on a busy journal. What a rollback
    put back waits due (delivered records were due), so with no record due waiting a partition
    read from its end is not looked up, one read again is looked up from its start's record, and
    otherwise the journal is read from the later of the last write and the oldest due time."""
    idle, reader = FakeStore(oldest_due_ms=None), FakeReader({A: frozenset({1}), B: frozenset()})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, idle))
    settled.load({A: 5, B: 3}, {A: 5, B: 9}, {A: ResumePoint(4, 5, False, 1_000), B: point(1_000)})
    assert (reader.asked, reader.since) == ([(B, 3)], [None]) and idle.settled == []
    due, reader = FakeStore(oldest_due_ms=4_000), FakeReader({A: frozenset({1})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, due))
    settled.load({A: 5}, {A: 5}, {A: ResumePoint(4, 5, False, 1_000)})
    assert (reader.asked, reader.since) == ([(A, 5)], [4_000]) and len(due.settled) == 1
    settled.load({A: 5}, {A: 5}, {A: ResumePoint(4, 5, False, 9_000)})
    assert reader.since[-1] == 9_000


class ReplacedReader(FakeReader):
    """A journal whose entries say which record replaced which (``replaced``: offset -> by)."""

    def __init__(self, replaced: dict[int, str], delivered: frozenset[int] = frozenset()):
        super().__init__({A: delivered})
        self._replaced = replaced

    def fates(
        self, shard: Shard, start: int, topic_id: str = "", **_: int | bool | None
    ) -> list[Entry]:
        return super().fates(shard, start, topic_id) + [
            Entry(Fate.REPLACED, o, f"id-{o}", 10 * o, 1, by=by) for o, by in self._replaced.items()
        ]


def exact(offset: int, replaces: int) -> Scheduled:
    return Scheduled(
        offset,
        1_800_000_000_000,
        "orders",
        b"k",
        b"v",
        [(H_REPLACES, f"delay:0:{replaces}".encode())],
        "m1",
    )


@pytest.mark.parametrize("start", [0, 3], ids=["re-read", "rolled-back"])
def test_a_record_that_replaced_exactly_one_left_out_stands(start: int) -> None:
    """The journal says offset 2 was replaced by offset 4, and 1 was delivered before offset 5
    (which names it exactly) came: 4 loses its ``delay-replaces`` (it is not too late for a
    record it replaced itself), 5 is left out (it was: add.lua would have written nothing of
    it, had Redis known 1 had left), whether 2 is re-read (left out) or was before the start (a
    rollback forgot it in Redis)."""
    reader = ReplacedReader({2: "delay:0:4"}, delivered=frozenset({1}))
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: start})
    records: list[Scheduled | Cancel] = [rec(3), exact(4, replaces=2), exact(5, replaces=1)]
    stored = {A: (5, records)}
    settled.drop(stored)
    kept = {r.offset: r.headers for r in stored[A][1] if isinstance(r, Scheduled)}
    assert kept[4] == [] and 5 not in kept and kept[3] == []


@pytest.mark.parametrize("first_delivered", [False, True], ids=["waiting", "delivered"])
def test_of_exact_copies_of_a_record_before_the_start_with_no_fate_the_first_stands(
    first_delivered: bool,
) -> None:
    """Offset 1 (before the start, 3) has no fate in the journal: its entry never reached it.
    Three operators' copies of it (each made while they saw it waiting) are read again: the
    first took it (stored, or left out as delivered), and the later two came after it and are
    nothing. Stored all three as replacements by their id, each was delivered once the one
    before it was claimed (the adversary with references, seed 4: one record three times)."""
    reader = FakeReader({A: frozenset({4} if first_delivered else {9})})
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: 3})
    records: list[Scheduled | Cancel] = [rec(3), exact(4, 1), exact(6, 1), exact(8, 1)]
    stored = {A: (8, records)}
    settled.drop(stored)
    assert [r.offset for r in stored[A][1]] == ([3] if first_delivered else [3, 4])


def test_an_exact_copy_left_out_as_delivered_withdraws_its_record_read_again_with_no_fate() -> None:
    """Offset 2 is read again with no fate in the journal (its withdrawal's entry never reached
    it), and offset 4, which replaced it exactly, is left out as delivered: in its place a
    cancel of 2's default id that withdraws it, journaled as replaced; 6, a copy of 1 (before
    the start: not read again), leaves nothing."""
    reader = FakeReader({A: frozenset({4, 6})})
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: 2})
    records: list[Scheduled | Cancel] = [rec(2), exact(4, 2), exact(6, 1)]
    stored = {A: (6, records)}
    settled.drop(stored)
    [kept, marker] = stored[A][1]
    assert kept.offset == 2
    assert isinstance(marker, Cancel) and marker.replaces
    assert (marker.offset, marker.delay_id) == (4, origin("delay", 0, 2))


def test_a_record_left_out_as_delivered_withdraws_one_read_again_that_held_its_id() -> None:
    """Offset 2 (id "order-1") is read again with no fate in the journal, and offset 4 with the
    same id, which replaced it when it was read, is left out as delivered: in its place a cancel
    of "order-1" that withdraws 2 again, journaled as replaced. Offset 8 (id "order-2") left out
    leaves nothing: no record read again holds its id (6 had it, and a cancel withdrew it); nor
    does 12, produced less than LIVE_MARGIN_MS before 10 with its id fell due: 10 may have been
    in flight when 12 came, and both owed."""
    reader = FakeReader({A: frozenset({4, 8, 12})})
    settled = Settled(lambda: cast(JournalReader, reader))
    settled.load({A: 2})
    due = 1_800_000_000_000

    def own(offset: int, delay_id: str, stamped: int = 0) -> Scheduled:
        return Scheduled(offset, due, "orders", b"k", b"v", [], delay_id, timestamp_ms=stamped)

    records: list[Scheduled | Cancel] = [
        own(2, "id-4"),
        own(4, "id-4"),
        own(6, "id-8"),
        Cancel(7, "id-8"),
        own(8, "id-8"),
        own(10, "id-12"),
        own(12, "id-12", stamped=due - LIVE_MARGIN_MS + 1),
    ]
    stored = {A: (12, records)}
    assert settled.drop(stored) == 3
    [kept, marker, other, cancel, last] = stored[A][1]
    assert (kept.offset, other.offset, cancel.offset, last.offset) == (2, 6, 7, 10)
    assert isinstance(marker, Cancel) and marker.replaces
    assert (marker.offset, marker.delay_id) == (4, "id-4")


def test_a_partition_read_again_before_redis_answered_still_has_its_watermark_looked_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition assigned while Redis did not answer, read again (its journal waited for)
    while Redis still does not: the forget that fails then does not take the place of the look
    at Redis's watermark once it answers, which finds what lies up to it too."""
    monkeypatch.setattr(put_back, "RETRY_S", 0.0)
    store, holds = FakeStore(), Holds()
    reader = FakeReader({A: frozenset({1, 2, 6, 8})})
    settled = Settled(lambda: cast(JournalReader, reader), cast(Store, store), hold=holds)
    store.down = True
    settled.load({A: 3}, {A: 9}, {}, unread=[A])
    settled.load({A: 3}, {A: 9}, {})  # read again: the same partition, Redis still loading
    store.down = False
    store.points = {A: ResumePoint(6, 7, False, None)}
    settled.settle_held()
    assert holds.held == set()
    assert [o for _, e in store.settled for o, _, _ in e] == [1, 2, 6], "up to the watermark"
