"""add.lua's schedule registry on the real Redis, with explicit times: a record carrying a schedule
on is stored only while the schedule is still at the record it continues — whatever came between
(a cancel or a record with its id read while the occurrence was in flight, or after it was
acknowledged; the same record carried on twice)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import pytest
from confluent_kafka import Message

from bridge.ingress.batch import Batch
from bridge.ingress.quotas import Quotas
from bridge.message import Cancel, Scheduled, origin
from bridge.store import AckBatch, Shard, Store, Withdrawn
from bridge.store import ids as id_index
from bridge.store.registry import KEEP_ENDED_MS, field_of
from testbed.services import confirm_from

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
LEASE = 30_000
SHARD = Shard("delay", 0)


def schedule(offset: int, due: int, continues: int | None = None, sid: str = "poll") -> Scheduled:
    """A recurring schedule's record (its headers do not matter to the store)."""
    return Scheduled(
        offset,
        due,
        "out",
        b"k",
        f"v{offset}".encode(),
        [("delay-every", b"1s"), ("delay-id", sid.encode())],
        sid,
        recurring=True,
        continues=continues,
    )


def one_shot(offset: int, due: int, sid: str = "poll") -> Scheduled:
    return Scheduled(offset, due, "out", b"k", b"one", [("delay-id", sid.encode())], sid)


def add(store: Store, *records: Scheduled | Cancel) -> tuple[int, tuple[Withdrawn, ...]]:
    added = store.add({SHARD: (max(r.offset for r in records), list(records))})
    return added.count, added.withdrawn


def delivered(store: Store, now: int) -> list[int]:
    """Claim what is due at ``now`` and acknowledge it; the offsets."""
    claimed = store.claim([SHARD], 10, LEASE, now_ms=now)
    store.ack({SHARD: AckBatch(members=[c.member for c in claimed])})
    return [c.record.offset for c in claimed]


def test_a_schedule_is_carried_on_record_by_record(store: Store) -> None:
    assert add(store, schedule(0, T0)) == (1, ())
    claimed = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert [c.record.offset for c in claimed] == [0]
    assert add(store, schedule(5, T0 + 1000, continues=0)) == (1, ())  # while 0 is in flight
    store.ack({SHARD: AckBatch(members=[c.member for c in claimed])})
    assert delivered(store, T0 + 1000) == [5]
    assert add(store, schedule(9, T0 + 2000, continues=5)) == (1, ())  # after 5 was acknowledged
    assert delivered(store, T0 + 2000) == [9]


def test_a_cancel_read_while_the_occurrence_is_in_flight_ends_the_schedule(store: Store) -> None:
    """The cancel finds nothing waiting (the record is in flight, or acknowledged and its next
    not read yet): the record carrying the schedule on, read after it, is not stored, and says
    so as a withdrawal (the journal's entry keeps a rebuild from storing it)."""
    for in_flight in (True, False):
        prefix = store.prefix
        store = Store(store.client, f"{prefix}-{in_flight}")
        add(store, schedule(0, T0))
        claimed = store.claim([SHARD], 10, LEASE, now_ms=T0)
        if not in_flight:
            store.ack({SHARD: AckBatch(members=[c.member for c in claimed])})
        count, _ = add(store, Cancel(3, "poll"))
        assert count == 0
        count, withdrawn = add(store, schedule(4, T0 + 1000, continues=0))
        assert count == 0
        assert [(w.offset, w.by_offset, w.cancelled) for w in withdrawn] == [(4, 3, True)]
        assert store.claim([SHARD], 10, LEASE, now_ms=T0 + 5000) == []


def test_a_record_carried_on_twice_is_stored_once(store: Store) -> None:
    """Delivered again after its lease ran out, the record is carried on a second time: the
    second copy finds the schedule moved on to the first, and is not stored — even while the
    first is in flight itself."""
    add(store, schedule(0, T0))
    store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert add(store, schedule(4, T0 + 1000, continues=0))[0] == 1
    store.claim([SHARD], 10, LEASE, now_ms=T0 + 1000)  # the first copy in flight
    count, withdrawn = add(store, schedule(6, T0 + 1000, continues=0))
    assert count == 0
    assert [(w.offset, w.by_offset, w.cancelled) for w in withdrawn] == [(6, 4, False)]


def test_a_record_with_the_schedules_id_ends_it_or_replaces_it(store: Store) -> None:
    """A producer's new schedule with the same id takes over (what carries the old one on is
    not stored); a one-shot record with it ends the schedule, and is delivered itself."""
    add(store, schedule(0, T0))
    store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert add(store, schedule(2, T0 + 500))[0] == 1  # a producer's: registered at 2
    assert add(store, schedule(3, T0 + 1000, continues=0))[0] == 0
    assert delivered(store, T0 + 500) == [2]
    assert add(store, one_shot(5, T0 + 700))[0] == 1  # ends the schedule at 2
    assert add(store, schedule(6, T0 + 1500, continues=2))[0] == 0
    assert delivered(store, T0 + 2000) == [5]


def test_a_registry_that_knows_nothing_takes_the_record(store: Store) -> None:
    """A rebuilt state (or one from before the registry) has no word of the schedule: the
    record carrying it on is stored, so no schedule is lost to a Redis that lost its data."""
    assert add(store, schedule(7, T0 + 1000, continues=3))[0] == 1
    assert delivered(store, T0 + 1000) == [7]


def test_a_pause_holds_the_schedule_wherever_it_is_and_goes_on_with_it(store: Store) -> None:
    """Paused while its occurrence is in flight: the record carrying it on is claimed paused, and
    so is the next; resumed, the one after is not. A registry that has no word of a schedule
    goes by the record's own delay-paused."""
    add(store, schedule(0, T0))
    store.claim([SHARD], 10, LEASE, now_ms=T0)
    add(store, Cancel(1, "poll", hold=True))
    add(store, schedule(2, T0 + 1000, continues=0))
    [first] = store.claim([SHARD], 10, LEASE, now_ms=T0 + 1000)
    assert first.record.offset == 2 and first.paused
    add(store, schedule(3, T0 + 2000, continues=2))
    add(store, Cancel(4, "poll", hold=False))
    [second] = store.claim([SHARD], 10, LEASE, now_ms=T0 + 2000)
    assert second.record.offset == 3 and not second.paused
    other = Store(store.client, f"{store.prefix}-rebuilt")
    carried = schedule(8, T0 + 3000, continues=7)
    carried.headers.append(("delay-paused", b"1"))
    add(other, carried)
    [third] = other.claim([SHARD], 10, LEASE, now_ms=T0 + 3000)
    assert third.paused


def counts(store: Store) -> tuple[int, int]:
    return store.registry.counts([SHARD])


def test_the_registry_counts_running_and_paused_schedules_and_forgets_one_that_ended(
    store: Store,
) -> None:
    """Two schedules: one paused and resumed, one ended by the record the bridge writes with its
    last occurrence (and an end that comes after the schedule moved on ends nothing)."""
    add(store, schedule(0, T0, sid="a"), schedule(1, T0, sid="b"))
    assert counts(store) == (2, 0)
    add(store, Cancel(2, "a", hold=True))
    assert counts(store) == (2, 1)
    add(store, Cancel(3, "a", hold=True))  # paused again: counted once
    assert counts(store) == (2, 1)
    add(store, Cancel(4, "a", hold=False))
    assert counts(store) == (2, 0)
    add(store, Cancel(5, "b", ends=0))  # not where b is (1): nothing ends
    assert counts(store) == (2, 0)
    add(store, Cancel(6, "b", ends=1))
    assert counts(store) == (1, 0)
    assert sorted(store.registry.at([SHARD])[SHARD]) == [0]
    add(store, Cancel(7, "a"))  # a cancel ends the other
    assert counts(store) == (0, 0) and store.registry.at([SHARD])[SHARD] == {}
    assert add(store, schedule(8, T0 + 1000, continues=1, sid="b"))[0] == 0  # b ended at 6


def test_the_record_carrying_a_schedule_on_passes_its_targets_quota(store: Store) -> None:
    """Quota 1: the schedule's record was acknowledged and a one-shot record took the place
    before the record carrying the schedule on was read. That record is not refused — the
    schedule was admitted when it came in — while a new schedule is."""
    add(store, schedule(0, T0))
    assert delivered(store, T0) == [0]
    add(store, one_shot(1, T0 + 60_000, sid="other"))  # the target's one place
    quotas = Quotas({"out": 1}, store)
    carried, new = schedule(2, T0 + 1000, continues=0), schedule(3, T0, sid="new")
    batch = Batch(stored={SHARD: (3, [carried, new])})

    def find(shard: Shard, offset: int) -> Message:
        return cast(Message, ("message", offset))

    assert quotas.apply(batch, {}, {"delay": 1}, find) == 1
    assert [r.offset for r in batch.stored[SHARD][1]] == [2]
    refused = [(cast(object, m), r.reason.value) for m, r in batch.rejected]
    assert refused == [(("message", 3), "quota-exceeded")]


def test_the_marker_of_an_ended_schedule_is_forgotten_a_day_on(store: Store) -> None:
    """The committer's low.lua sweeps the registry a few entries a call: a marker older than a
    day goes; a newer one, and a live schedule, stay — and the counts with them."""
    add(store, schedule(0, T0, sid="old"), schedule(1, T0, sid="new"), schedule(2, T0, sid="live"))
    add(store, Cancel(3, "old"), Cancel(4, "new"))
    key = store.keys(SHARD).schedules
    old = field_of("old")
    now = store.time_ms()
    store.client.hset(key, cast(str, old), f"-3:{now - KEEP_ENDED_MS - 1000}")
    for _ in range(3):  # a whole pass of the cursor, whatever it starts at
        store.lows({SHARD: None})
    left = cast(dict[bytes, bytes], store.client.hgetall(key))
    assert old not in left
    assert field_of("new") in left and field_of("live") in left
    assert counts(store) == (1, 0)


def test_a_cancel_that_finds_nothing_in_a_shard_read_again_ends_a_schedule_unknown_there(
    store: Store,
) -> None:
    """Read again after Redis lost its state, a cancel finds no record and the registry has no
    word of its id (the journal left the schedule's record out): it ends the schedule all the
    same, so a record carrying it on from before the cancel is not stored. Read live, a cancel
    that finds nothing writes nothing (a one-shot record's id, most likely)."""
    batch: list[Scheduled | Cancel] = [Cancel(3, "poll"), schedule(4, T0 + 1000, continues=0)]
    added = store.add({SHARD: (4, batch)}, reread={SHARD: 5})
    assert added.count == 0
    assert [(w.offset, w.by_offset, w.cancelled) for w in added.withdrawn] == [(4, 3, True)]
    assert counts(store) == (0, 0)
    other = Store(store.client, f"{store.prefix}-live")
    assert other.add({SHARD: (3, [Cancel(3, "poll")])}).count == 0
    assert other.client.exists(other.keys(SHARD).schedules) == 0


def test_a_shard_read_again_stays_so_for_the_next_owner_until_it_reaches_the_end(
    store: Store,
) -> None:
    """The replica rebuilding the shard dies before it reaches the cancel; the next owner
    resumes from what Redis holds, which is not a re-read to it. Redis keeps where the re-read
    ends (offset 10 here), so the cancel, read by the next owner, still ends the schedule the
    registry has no word of; past that end, a cancel that finds nothing writes nothing."""
    store.add({SHARD: (1, [one_shot(1, T0, sid="other")])}, reread={SHARD: 10})
    batch: list[Scheduled | Cancel] = [Cancel(3, "poll"), schedule(4, T0 + 1000, continues=0)]
    added = store.add({SHARD: (4, batch)})
    assert added.count == 0
    assert [(w.offset, w.by_offset) for w in added.withdrawn] == [(4, 3)]
    store.add({SHARD: (11, [Cancel(11, "nobody")])})
    entries = cast(dict[bytes, bytes], store.client.hgetall(store.keys(SHARD).schedules))
    assert field_of("nobody") not in entries and field_of("poll") in entries


def test_a_registry_rolled_back_behind_the_record_carried_on_takes_it(store: Store) -> None:
    """Redis restarts from an AOF missing its last writes: the registry is back at record 0
    while the schedule went on to record 5 and its next, record 9 (continuing 5), is what the
    ingress reads again from its committed offset. The registry is behind it, not ahead: a
    cancel or a replacement since would be read again after it (and the journal settles one
    read before). Record 9 is stored, the schedule goes on, and nothing is counted ended."""
    add(store, schedule(0, T0))
    dumped = {
        name: cast(bytes, store.client.dump(name))
        for name in store.client.scan_iter(match=f"{store.prefix}:*")
    }
    assert delivered(store, T0) == [0]
    assert add(store, schedule(5, T0 + 1000, continues=0)) == (1, ())
    assert delivered(store, T0 + 1000) == [5]
    for name in list(store.client.scan_iter(match=f"{store.prefix}:*")):
        store.client.delete(name)
    for name, value in dumped.items():  # the restart: what was written since is gone
        store.client.restore(name, 0, value, replace=True)
    assert delivered(store, T0) == [0]  # its lease back as it was: at least once
    assert add(store, schedule(9, T0 + 2000, continues=5)) == (1, ())
    assert delivered(store, T0 + 2000) == [9]
    assert store.registry.counts([SHARD]) == (1, 0)
    # Still: a record carrying it on from before the registry's own is too late (replaced).
    count, withdrawn = add(store, schedule(12, T0 + 3000, continues=5))
    assert count == 0 and [(w.offset, w.by_offset) for w in withdrawn] == [(12, 9)]


def test_a_cancel_by_the_default_id_of_a_schedules_record_ends_the_schedule(store: Store) -> None:
    """A cancel naming the schedule's record by its default id (``<topic>:<p>:<offset>``, as a
    bulk cancel names what it matched) ends the schedule whether the record waits or its
    occurrence is in flight: the registry forgets it, and the record carrying it on is not
    stored."""
    for in_flight in (False, True):
        each = Store(store.client, f"{store.prefix}-{in_flight}")
        add(each, schedule(0, T0))
        if in_flight:
            assert [c.record.offset for c in each.claim([SHARD], 10, LEASE, now_ms=T0)] == [0]
        add(each, Cancel(3, origin(SHARD.topic, SHARD.partition, 0), due_ms=T0))
        assert counts(each) == (0, 0), in_flight
        count, withdrawn = add(each, schedule(4, T0 + 1000, continues=0))
        assert count == 0 and [(w.offset, w.cancelled) for w in withdrawn] == [(4, True)]
        assert each.claim([SHARD], 10, LEASE, now_ms=T0 + 5000) == []


@pytest.mark.parametrize("partition", [1, 0], ids=["another partition", "its own"])
def test_a_cancel_read_in_another_partition_ends_the_schedule(store: Store, partition: int) -> None:
    """The schedule's id cancelled with another key (read in partition 1), or in its own
    partition: the record it finds in partition 0 — waiting, its occurrence in flight, or
    acknowledged with the record carrying it on not read yet — ends the schedule there. Either
    way the journal is told: the record withdrawn, or the one the schedule ended at (a rebuild
    that does not read the cancel again ends it there too)."""
    other = Shard(SHARD.topic, partition)
    for state in ("waiting", "in flight", "acknowledged"):
        each = Store(store.client, f"{store.prefix}-{state}-{partition}")
        first = schedule(0, T0)
        add(each, first)
        if state != "waiting":
            claimed = each.claim([SHARD], 10, LEASE, now_ms=T0)
            assert [c.record.offset for c in claimed] == [0]
        if state == "acknowledged":
            each.ack({SHARD: AckBatch(members=[c.member for c in claimed], with_ids=1)})
        at = 1 - partition  # after the schedule's record in its own partition
        cancel = Cancel(at, "poll", timestamp_ms=T0)
        elsewhere = each.add(
            {other: (at, [cancel])}, partitions={"delay": 2}, confirm=confirm_from([first])
        )
        assert elsewhere.cancelled == (1 if state == "waiting" else 0)
        assert [(w.shard, w.offset, w.cancelled) for w in elsewhere.withdrawn] == [
            (SHARD, 0, True)
        ], state
        assert counts(each) == (0, 0), state
        assert add(each, schedule(4, T0 + 1000, continues=0))[0] == 0
        assert each.claim([SHARD], 10, LEASE, now_ms=T0 + 5000) == []


def test_schedules_whose_ids_hash_alike_keep_registry_entries_of_their_own(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one bit of the id hash kept, two of three ids share their hash: a cancel of one ends
    that one only, and the other is carried on."""
    monkeypatch.setattr(id_index, "HASH_BITS", 1)
    by_hash: dict[bytes, list[str]] = {}
    for sid in ("a", "b", "c"):
        by_hash.setdefault(id_index.id_hash(SHARD.topic, sid), []).append(sid)
    one, other = next(ids for ids in by_hash.values() if len(ids) > 1)[:2]
    add(store, schedule(0, T0, sid=one), schedule(1, T0, sid=other))
    assert counts(store) == (2, 0)
    add(store, Cancel(2, one))
    assert counts(store) == (1, 0)
    assert delivered(store, T0) == [1]
    assert add(store, schedule(3, T0 + 1000, continues=1, sid=other))[0] == 1


@pytest.mark.parametrize("hint", [0, 1, None], ids=["its-due-time", "a-wrong-one", "none"])
def test_a_cancel_by_the_default_id_of_a_schedules_reference_ends_the_schedule(
    store: Store, hint: int | None
) -> None:
    """A daily schedule's record far enough out is kept as a reference (16 bytes, no delay-id in
    Redis). A cancel naming it by its default id withdraws the reference, and the registry
    forgets the schedule as it does one stored whole: the reference's own id is read in the
    delay topic first — whatever due time the cancel gives, or none (it stayed live, a schedule
    counted that no record held, without its record's due time)."""
    sched = schedule(0, T0 + 86_400_000)
    store.add({SHARD: (0, [sched])}, refer_after_ms=T0)
    assert counts(store) == (1, 0)
    due = None if hint is None else sched.due_ms + hint
    cancel = Cancel(3, origin(SHARD.topic, SHARD.partition, 0), due_ms=due)
    added = store.add(
        {SHARD: (3, [cancel])},
        refer_after_ms=T0,
        confirm=confirm_from([sched]),
    )
    assert added.cancelled == 1
    assert [(w.offset, w.delay_id) for w in added.withdrawn] == [(0, "poll")]
    assert counts(store) == (0, 0)


def test_a_schedule_with_an_ended_ones_id_goes_on_when_its_record_was_left_out(
    store: Store,
) -> None:
    """The id ``poll`` ended at a cancel (offset 3); a new schedule with it (5) was delivered and
    the journal holds it, so a rebuild leaves it out. The record carrying the new one on (7,
    continuing 5) comes after the end the registry knows: it is stored, not taken for a copy
    of the ended schedule."""
    add(store, schedule(0, T0))
    add(store, Cancel(3, "poll"))
    assert add(store, schedule(7, T0 + 1000, continues=5))[0] == 1
    assert delivered(store, T0 + 1000) == [7]
    assert counts(store) == (1, 0)


def test_a_schedules_record_left_out_by_a_rebuild_is_where_the_schedule_is(store: Store) -> None:
    """A rebuilt state: the schedule's record at 2 was left out (its step delivered, the journal
    says so) and stands as a marker. The registry has the schedule there, paused as its record
    was carried on, so a cancel read in another partition ends it, and the record carrying it
    on is nothing; without the cancel, that record is stored."""
    other = Shard(SHARD.topic, 1)
    for cancelled in (True, False):
        each = Store(store.client, f"{store.prefix}-{cancelled}")
        add(each, one_shot(0, T0 + 3_600_000, sid="pin"))
        assert add(each, Cancel(2, "poll", left_out=True)) == (0, ())
        assert counts(each) == (1, 1)
        if cancelled:
            cancel = Cancel(0, "poll", timestamp_ms=T0)
            each.add(
                {other: (0, [cancel])},
                partitions={"delay": 2},
                confirm=confirm_from([schedule(2, T0)]),
            )
            assert counts(each) == (0, 0)
        assert add(each, schedule(4, T0 + 1000, continues=2))[0] == (0 if cancelled else 1)
        assert delivered(each, T0 + 1000) == ([] if cancelled else [4])
    # The record carrying it on was left out too, cancelled (by its default id): the schedule
    # ended there, and nothing of it is left in the registry.
    ended = Store(store.client, f"{store.prefix}-ended")
    add(ended, one_shot(0, T0 + 3_600_000, sid="pin"))
    add(ended, Cancel(2, "poll", left_out=False))
    assert counts(ended) == (1, 0)
    add(ended, Cancel(4, "poll", left_withdrawn=True))
    assert counts(ended) == (0, 0)
    assert add(ended, schedule(6, T0 + 2000, continues=4))[0] == 0


def test_a_cancel_from_another_partition_ends_a_schedule_that_moved_on_while_it_looked(
    store: Store,
) -> None:
    """The cancel, read in partition 1, finds the schedule's record in partition 0 in flight and
    reads it in the delay topic; meanwhile another replica, which owns partition 0, has the
    occurrence acknowledged and stores the record carrying the schedule on. The cancel ends the
    schedule where it is now. Before, it found the record it read gone and the schedule at
    another, and was done with nothing ended (the adversary with two replicas, seed 13: a
    schedule went on to the end of the run after its cancel)."""
    other = Shard(SHARD.topic, 1)
    first, moved_on = schedule(0, T0), schedule(4, T0 + 1000, continues=0)
    add(store, first)
    claimed = store.claim([SHARD], 10, LEASE, now_ms=T0)
    confirm, looked = confirm_from([first, moved_on]), list[Shard]()

    def meanwhile(shard: Shard, asked: Sequence[tuple[int, int]]) -> Mapping[int, tuple[str, int]]:
        if not looked:  # the other replica, between the cancel's look and its withdrawal
            store.ack({SHARD: AckBatch(members=[c.member for c in claimed], with_ids=1)})
            assert add(store, moved_on)[0] == 1
        looked.append(shard)
        return confirm(shard, asked)

    store.add(
        {other: (0, [Cancel(0, "poll", timestamp_ms=T0)])},
        partitions={"delay": 2},
        confirm=meanwhile,
    )
    assert looked == [SHARD, SHARD]  # where it was, then where it is now
    assert counts(store) == (0, 0)
    assert add(store, schedule(6, T0 + 2000, continues=4))[0] == 0
    assert store.claim([SHARD], 10, LEASE, now_ms=T0 + 5000) == []
