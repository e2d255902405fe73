"""Cancel and replace by delay-id in the store's scripts, on the real Redis, with explicit times:
offset order within a batch, idempotent re-reads, and the id index's life next to the records."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.catchup import CatchUp
from bridge.errors import StoreError
from bridge.ingress.adds import KEPT_WAIT_S, Adds, TopicReads
from bridge.ingress.consumer import partition_counts
from bridge.message import H_DUE_AT, H_REPLACES, Cancel, Priority, Scheduled
from bridge.store import AckBatch, Added, Elsewhere, Shard, Store, id_hash, offset_bytes, offset_of
from bridge.store.ids import read_index
from tests.conftest import Services, confirm_from, delete_keys
from tests.integration.conftest import documented_acl_rules

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
LEASE = 30_000
SHARD = Shard("delay", 0)
EXAMPLES = itertools.count()  # a key prefix per hypothesis example


def resumes_at(store: Store) -> tuple[int, int, bool]:
    """SHARD's resume point: its watermark, where it is read from, whether it is read again; and
    a write Redis took of it is noted (meta "written")."""
    point = store.inventory.resume_points([SHARD])[SHARD]
    assert point.written is not None
    return point.mark, point.start, point.reread


def rec(offset: int, due: int, delay_id: str | None = None, value: bytes = b"v") -> Scheduled:
    """A record with a caller-given ``delay_id``, or with the default one (its origin)."""
    return Scheduled(offset, due, "out", b"k", value, [], delay_id or f"delay:0:{offset}")


def apply(store: Store, *records: Scheduled | Cancel) -> Added:
    return store.add({SHARD: (max(r.offset for r in records), list(records))})


def waiting(store: Store, now: int = T0 + 10**9) -> dict[int, tuple[str, bytes | None]]:
    """offset -> (delay-id, value) of every record claimable by ``now`` (claims them)."""
    return {
        c.record.offset: (c.record.delay_id, c.record.value)
        for c in store.claim([SHARD], 10_000, LEASE, now_ms=now)
    }


def index(store: Store) -> list[tuple[bytes, bytes, int]]:
    """The id index's entries: (id hash, offset, due ms) each."""
    return read_index(store.client.hgetall(store.keys(SHARD).ids))  # type: ignore[arg-type]


def entry(delay_id: str, offset: int, due: int) -> tuple[bytes, bytes, int]:
    return id_hash(SHARD.topic, delay_id), offset_bytes(offset), due


def test_a_later_record_with_the_same_id_replaces_the_waiting_one(store: Store) -> None:
    added = apply(store, rec(0, T0 + 5000, "job-7", b"first"), rec(1, T0 + 100, "other"))
    assert (added.count, added.replaced) == (2, 0)
    added = apply(store, rec(2, T0 + 900, "job-7", b"second"))
    assert (added.count, added.replaced) == (1, 1)
    assert waiting(store) == {1: ("other", b"v"), 2: ("job-7", b"second")}
    # The replaced record's offset is no longer pending: the commit moves past it.
    assert (
        store.inventory.is_pending(SHARD, 0) is False
        and store.inventory.is_pending(SHARD, 2) is True
    )


def test_a_cancel_withdraws_the_waiting_record_and_counts_what_it_found(store: Store) -> None:
    apply(store, rec(0, T0 + 5000, "order-1"), rec(1, T0 + 5000, "order-2"))
    added = apply(store, Cancel(2, "order-1"), Cancel(3, "never-scheduled"))
    assert (added.count, added.cancelled, added.not_found) == (0, 1, 1)
    assert waiting(store) == {1: ("order-2", b"v")}
    assert index(store) == [entry("order-2", 1, T0 + 5000)]
    assert store.lows({SHARD: 3}).offsets == {SHARD: 1}  # 0, 2 and 3 are done


def test_within_a_batch_they_apply_in_offset_order(store: Store) -> None:
    # schedule -> cancel -> schedule again -> replace, all in one batch
    added = apply(
        store,
        rec(0, T0 + 10, "a", b"1"),
        Cancel(1, "a"),
        rec(2, T0 + 20, "a", b"2"),
        rec(3, T0 + 30, "a", b"3"),
    )
    assert (added.count, added.cancelled, added.replaced) == (3, 1, 1)
    assert waiting(store) == {3: ("a", b"3")}
    assert store.lows({SHARD: 3}).offsets == {SHARD: 3}


def test_reading_the_records_again_gives_the_same_state(store: Store) -> None:
    batch: list[Scheduled | Cancel] = [
        rec(0, T0 + 10, "a"),
        rec(1, T0 + 10, "b"),
        Cancel(2, "a"),
        rec(3, T0 + 20, "b", b"new"),
    ]
    apply(store, *batch)
    again = apply(store, *batch)  # at or below the watermark: applied once
    assert (again.count, again.cancelled, again.replaced, again.not_found) == (0, 0, 0, 0)
    first = waiting(store, T0 + 20)
    store.client.delete(*store.keys(SHARD).all())  # Redis lost it all: read from offset 0 again
    apply(store, *batch)
    assert waiting(store, T0 + 20) == first == {3: ("b", b"new")}


def test_a_claimed_record_is_past_cancel_and_replace(store: Store) -> None:
    apply(store, rec(0, T0, "job"))
    [claimed] = store.claim([SHARD], 10, LEASE, now_ms=T0)
    added = apply(store, Cancel(1, "job"))
    assert (added.cancelled, added.not_found) == (0, 1)
    added = apply(store, rec(2, T0 + 1000, "job", b"again"))  # scheduled besides, not replacing
    assert (added.count, added.replaced) == (1, 0)
    # The in-flight one's acknowledgement leaves the index naming the newer record.
    assert store.ack({SHARD: AckBatch(members=[claimed.member], with_ids=1)}) == 1
    assert index(store) == [entry("job", 2, T0 + 1000)]
    added = apply(store, Cancel(3, "job"))
    assert added.cancelled == 1 and waiting(store) == {}
    assert index(store) == []


def test_the_index_lives_and_dies_with_its_records(store: Store) -> None:
    apply(store, *(rec(i, T0) for i in range(50)))  # default ids: no index at all
    assert not store.client.exists(store.keys(SHARD).ids)
    apply(store, rec(50, T0, "x"), rec(51, T0, "y"))
    claimed = store.claim([SHARD], 100, LEASE, now_ms=T0)
    given = [c.given_id() for c in claimed if c.given_id()]
    assert sorted(str(i) for i in given) == ["x", "y"]
    store.ack({SHARD: AckBatch(members=[c.member for c in claimed], with_ids=len(given))})
    assert not store.client.exists(store.keys(SHARD).ids)


def test_a_claim_applies_the_acknowledgements_it_carries_first(store: Store) -> None:
    apply(store, rec(0, T0, "job"), rec(1, T0), rec(2, T0 + 5))
    first = store.claim([SHARD], 2, 1, now_ms=T0)  # leases of 1 ms: both expired at T0 + 5
    assert sorted(c.record.offset for c in first) == [0, 1]
    job = next(c for c in first if c.given_id())
    # Record 0 was delivered (its report came in): acknowledged in the next claim's call, it is
    # not handed out again although its lease has run out, and its id index entry goes with it
    # (nothing else of the shard waits with an id: a sweep).
    again = store.claim(
        [SHARD], 10, LEASE, now_ms=T0 + 5, acks={SHARD: AckBatch(members=[job.member], with_ids=1)}
    )
    assert sorted((c.record.offset, c.redelivery) for c in again) == [(1, True), (2, False)]
    assert index(store) == []
    store.claim(
        [SHARD], 10, LEASE, now_ms=T0 + 6, acks={SHARD: AckBatch(members=[c.member for c in again])}
    )
    assert store.backlog([SHARD]).inflight == 0
    assert store.client.hlen(store.keys(SHARD).pending) == 0  # nothing pending: all acknowledged


def test_only_records_no_cancel_can_reach_are_claimed_ahead(store: Store) -> None:
    apply(
        store,
        rec(0, T0 + 50),
        rec(1, T0 + 50, "job"),
        rec(2, T0 + 100),
        rec(3, T0 + 101),
        rec(4, T0 - 5),
    )
    ahead = store.claim([SHARD], 10, LEASE, now_ms=T0, ahead_ms=100)
    # The due one, then default-id records due within 100 ms; not "job" (a cancel may still come
    # for it) and not the one due just past the window.
    assert [c.record.offset for c in ahead] == [4, 0, 2]
    assert not any(c.redelivery for c in ahead)
    assert ahead.next_ms[SHARD] == T0 + 50  # "job" is claimed when due
    assert apply(store, Cancel(5, "job")).cancelled == 1  # still waiting: the cancel finds it
    assert store.claim([SHARD], 10, LEASE, now_ms=T0 + 101)[0].record.offset == 3
    assert store.backlog([SHARD]).inflight == 4


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    records=st.lists(
        st.tuples(
            st.sampled_from([-5, 0, 1, 40, 99, 100, 101, 400]),  # due, from T0
            st.booleans(),  # its own delay-id
            st.sampled_from(list(Priority)),
        ),
        max_size=14,
    ),
    limit=st.integers(1, 10),
    ahead_limit=st.one_of(st.none(), st.integers(0, 6)),
)
def test_a_claim_ahead_takes_the_earliest_default_id_records_up_to_its_limit(
    redis_client: redis.Redis,
    unique: str,
    records: list[tuple[int, bool, Priority]],
    limit: int,
    ahead_limit: int | None,
) -> None:
    # The mover's limit (bridge.egress.plan.ahead_limit) caps what a claim takes ahead, never
    # what is due; each lane's window is read in order and only default-id records leave it.
    store = Store(redis_client, f"test-{unique}-{next(EXAMPLES)}")
    try:
        scheduled = [
            replace(rec(o, T0 + due, f"id-{o}" if own else None), priority=p)
            for o, (due, own, p) in enumerate(records)
        ]
        if scheduled:
            apply(store, *scheduled)
        got = store.claim([SHARD], limit, LEASE, now_ms=T0, ahead_ms=100, ahead_limit=ahead_limit)
        due = [r for r in scheduled if r.due_ms <= T0]
        expected = {r.offset for r in due} if len(due) <= limit else None
        if expected is not None:  # all due left: the room that is left goes ahead
            room = min(limit - len(due), limit if ahead_limit is None else ahead_limit)
            for lane in sorted(Priority):
                window = sorted(
                    (r.due_ms, r.offset, r.delay_id.startswith("delay:"))
                    for r in scheduled
                    if r.priority == lane and T0 < r.due_ms <= T0 + 100
                )[: max(room, 0)]
                taken = [o for _, o, default in window if default]
                expected |= set(taken)
                room -= len(taken)
            assert {c.record.offset for c in got} == expected
        else:  # more due than the room: the due ones alone (claim.lua's on-time and overdue)
            assert len(got) == limit and all(c.record.due_ms <= T0 for c in got)
        ahead = [c for c in got if c.record.due_ms > T0]
        assert ahead_limit is None or len(ahead) <= ahead_limit
    finally:
        delete_keys(redis_client, store.prefix)


def test_an_entry_whose_record_is_gone_is_dropped_by_the_next_cancel(store: Store) -> None:
    apply(store, rec(0, T0, "job"), rec(1, T0 + 10**6, "later"))
    [claimed] = store.claim([SHARD], 10, LEASE, now_ms=T0)
    store.ack({SHARD: AckBatch(members=[claimed.member])})  # not counted as having an id
    assert entry("job", 0, T0) in index(store)
    assert apply(store, Cancel(2, "job")).not_found == 1
    assert index(store) == [entry("later", 1, T0 + 10**6)]


def test_acknowledged_entries_go_stale_and_are_swept_a_bucket_at_a_time(store: Store) -> None:
    """An acknowledgement leaves its records' entries in the id index, stale, rather than
    rewriting a bucket per record; once more than a quarter of the entries are stale it sweeps
    buckets in turn. The stale stay a bounded share, and the index goes once nothing is pending."""
    n, batch = 4000, 100
    for first in range(0, n, 500):
        apply(store, *(rec(i, T0 + i, f"order-{i}") for i in range(first, first + 500)))
    buckets = store.client.hlen(store.keys(SHARD).ids)  # the state field's and the buckets'

    def stale() -> tuple[int, int]:
        """(entries whose record is no longer pending, entries)."""
        offsets = [offset_of(o) for _, o, _ in index(store)]
        pending = store.inventory.pending(SHARD, offsets)
        return sum(1 for o in offsets if o not in pending), len(offsets)

    claimed = store.claim([SHARD], batch, LEASE, now_ms=T0 + n)
    store.ack({SHARD: AckBatch(members=[c.member for c in claimed], with_ids=batch)})
    assert stale() == (batch, n)  # nothing rewritten: 100 of 4,000 stale
    worst = 0.0
    for _ in range(n // batch // 2 - 1):  # half of them delivered
        claimed = store.claim([SHARD], batch, LEASE, now_ms=T0 + n)
        store.ack({SHARD: AckBatch(members=[c.member for c in claimed], with_ids=batch)})
        gone, entries = stale()
        worst = max(worst, gone / entries)
    assert 0.2 < worst <= 0.3, worst  # swept from a quarter on, at most a call's worth above
    assert store.client.hlen(store.keys(SHARD).ids) == buckets  # none emptied, none added
    # No sweep dropped a live entry: every record still waiting is found by its id.
    cancels = [Cancel(n + i, f"order-{i}") for i in range(n // 2, n * 3 // 4)]
    assert store.add({SHARD: (n + n * 3 // 4, cancels)}).cancelled == len(cancels)
    while claimed := store.claim([SHARD], batch, LEASE, now_ms=T0 + n):
        store.ack({SHARD: AckBatch(members=[c.member for c in claimed], with_ids=len(claimed))})
    assert not store.client.exists(store.keys(SHARD).ids)


def test_an_id_used_again_after_its_record_was_delivered_names_only_the_new_one(
    store: Store,
) -> None:
    """A stale entry (its record acknowledged, not swept yet) is no candidate: a lookup by the
    id, a record with the id in its own partition (it replaces nothing) and a cancel from another
    partition (nothing but the new record is read) meet the new record only."""
    others = [rec(i, T0 + 10**6, f"other-{i}") for i in range(1, 20)]
    apply(store, rec(0, T0, "job"), *others)
    [claimed] = store.claim([SHARD], 10, LEASE, now_ms=T0)
    store.ack({SHARD: AckBatch(members=[claimed.member], with_ids=1)})
    assert entry("job", 0, T0) in index(store)  # 1 of 20 stale: left for a sweep
    assert store.inventory.by_id(SHARD, "job") == []
    again = rec(20, T0 + 5000, "job", b"again")
    assert apply(store, again).replaced == 0
    [(due, member)] = store.inventory.by_id(SHARD, "job")
    assert (due, offset_of(member)) == (T0 + 5000, 20)
    asked: list[int] = []
    confirm = confirm_from([again])

    def reading(shard: Shard, offsets: Sequence[tuple[int, int]]) -> Mapping[int, tuple[str, int]]:
        asked.extend(o for o, _ in offsets)
        return confirm(shard, offsets)

    other = Shard("delay", 1)
    elsewhere = store.add(
        {other: (0, [Cancel(0, "job", T0 + 6000)])}, partitions={"delay": 2}, confirm=reading
    )
    assert (elsewhere.cancelled, asked) == (1, [20])  # the stale entry's offset is not read
    assert waiting(store) == {i: (f"other-{i}", b"v") for i in range(1, 20)}


def test_nothing_new_is_claimed_from_a_shard_redis_rolled_back_until_it_is_read_again(
    store: Store,
) -> None:
    """Redis rolled back (an AOF tail, a failover) to before a cancel: the mover claimed the
    record the lost cancel had withdrawn before the ingress noticed, since claim.lua read no
    watermark. Given the one the ingress last saw, it claims nothing new from that shard."""
    apply(store, rec(0, T0, "x"), rec(1, T0 + 10))
    k = store.keys(SHARD)
    snapshot = {name: store.client.dump(name) for name in k.all() if store.client.exists(name)}
    assert apply(store, Cancel(2, "x")).cancelled == 1
    for name in k.all():  # the rollback: Redis as it was before the cancel
        store.client.delete(name)
    for name, value in snapshot.items():
        store.client.restore(name, 0, value)  # type: ignore[arg-type]
    seen = {SHARD: 2}  # the ingress applied the cancel
    held = store.claim([SHARD], 10, LEASE, now_ms=T0 + 10, watermarks=seen)
    assert held == [] and held.next_ms[SHARD] == T0 + 10 + 250  # asked again in a moment
    assert store.lows(dict(seen)).lost  # what makes the ingress read it again
    assert [c.record.offset for c in store.claim([SHARD], 10, LEASE, now_ms=T0 + 10)] == [0, 1]


def test_a_cancel_finds_its_record_among_many_due_at_the_same_ms(store: Store) -> None:
    """Members of one score are looked through by rank past the first 16 (they sort by offset):
    a cancel reaches the first, a middle and the last of 300 records due at one ms."""
    apply(store, *(rec(i, T0, f"job-{i}") for i in range(300)))
    added = apply(store, Cancel(300, "job-137"), Cancel(301, "job-0"), Cancel(302, "job-299"))
    assert (added.cancelled, added.not_found) == (3, 0)
    added = apply(store, rec(303, T0, "job-200", b"again"))
    assert added.replaced == 1
    left = waiting(store)
    assert sorted(left) == [i for i in range(304) if i not in (0, 137, 200, 299, 300, 301, 302)]
    assert left[303] == ("job-200", b"again")


def test_an_offset_past_the_id_index_is_refused_whole(store: Store) -> None:
    """An id index entry keeps an offset's low 6 bytes: a record with its own id at offset 2^48
    (a partition of 281 trillion records) is refused with a clear error, nothing of its batch
    written, rather than indexed under another offset."""
    with pytest.raises(StoreError, match="offset beyond the id index"):
        apply(store, rec(2**48 - 1, T0), rec(2**48, T0, "job"))
    assert waiting(store) == {}


def _zscans(store: Store) -> int:
    stats = store.client.info("commandstats")
    return int(stats.get("cmdstat_zscan", {}).get("calls", 0))  # type: ignore[union-attr]


def test_cancels_of_default_ids_find_their_records_without_a_scan_each(store: Store) -> None:
    """A bulk cancel: 105 cancels of default delay-ids among 3,000 waiting records, each with the
    due time of its record (``delay-due-at``, as the command line sends it). The hint finds the
    records held whole or as references at once; those it cannot (a wrong hint) are looked for in
    one pass over the shard, not one each: the store's work does not grow with the backlog per
    cancel. A hint is checked, never trusted: a wrong one still cancels its record."""
    whole = [rec(i, T0 + 1000 + i) for i in range(3000)]
    store.add({SHARD: (2999, whole)})
    far = [rec(3000 + i, T0 + 10**10 + i) for i in range(5)]
    store.add({SHARD: (3004, far)}, refer_after_ms=T0 + 10**9)
    cancels = [Cancel(3005 + i, f"delay:0:{2 * i}", due_ms=T0 + 1000 + 2 * i) for i in range(100)]
    cancels += [Cancel(3500 + i, f"delay:0:{3000 + i}", due_ms=T0 + 10**10 + i) for i in range(4)]
    cancels.append(Cancel(3504, "delay:0:999", due_ms=T0 + 7))  # a wrong hint
    cancels.append(Cancel(3505, "delay:0:3004", due_ms=T0 + 10**10 + 3))  # a reference's, wrong
    cancels.append(Cancel(3506, "delay:0:997", due_ms=10**20))  # beyond any due time
    before = _zscans(store)
    # The references' own delay-ids are read in the delay topic (the journal names them by them).
    read = confirm_from(far)
    added = store.add({SHARD: (3506, cancels)}, refer_after_ms=T0 + 10**9, confirm=read)
    assert (added.cancelled, added.not_found) == (107, 0)
    assert _zscans(store) - before <= 4  # one pass over the due index, not 107
    left = waiting(store, T0 + 2 * 10**10)  # the whole records left (references are not due)
    assert set(left) == {i for i in range(3000) if i % 2 or i >= 200} - {997, 999}
    assert [store.inventory.is_pending(SHARD, 3000 + i) for i in range(5)] == [False] * 5


def test_cancels_of_references_at_their_due_times_read_no_whole_record(store: Store) -> None:
    """A bulk cancel of far-future records while the shard holds many near-term ones: each
    cancel's due-time hint finds its reference among its time bucket's references, so no
    batch reads the shard's whole records (a pass over them per batch made a bulk cancel's
    rate fall with the live backlog). A reference cancelled before is not cancelled twice."""
    bucket = 60_000
    due = (T0 + 10**10) // bucket * bucket  # the start of a bucket: all in one, in 3 chunks
    whole = [rec(i, T0 + 1000 + i) for i in range(3000)]
    store.add({SHARD: (2999, whole)})
    far = [rec(3000 + i, due + i // 2) for i in range(2100)]  # chunks of 1,023
    store.add({SHARD: (5099, far)}, refer_after_ms=T0 + 10**9, bucket_ms=bucket)
    named = [0, 1, 1022, 1023, 1500, 2046, 2099]
    first = [Cancel(5100, f"delay:0:{3000 + named[0]}", due_ms=due)]
    read = confirm_from(far)  # the references' own delay-ids, read in the delay topic
    assert store.add({SHARD: (5100, first)}, bucket_ms=bucket, confirm=read).cancelled == 1
    batch: list[Scheduled | Cancel] = [
        Cancel(5101 + k, f"delay:0:{3000 + i}", due_ms=due + i // 2) for k, i in enumerate(named)
    ]
    moved = rec(5108, T0 + 5000, "delay:0:4700", b"now")  # "fire now" of a reference
    moved.headers.append((H_DUE_AT, b"%d" % (due + 850)))
    before = _zscans(store)
    added = store.add({SHARD: (5108, [*batch, moved])}, bucket_ms=bucket, confirm=read)
    assert (added.cancelled, added.not_found) == (len(named) - 1, 1)  # the first one again
    assert added.replaced == 1
    assert _zscans(store) == before
    left = {o for o in range(3000, 5100) if store.inventory.is_pending(SHARD, o)}
    assert left == set(range(3000, 5100)) - {3000 + i for i in named} - {4700}
    assert len(waiting(store)) == 3001  # no whole record touched, the one fired added


def test_a_record_with_a_default_id_as_its_delay_id_replaces_that_record(store: Store) -> None:
    """ "Fire now" and "move by an hour" are replacements: a record whose delay-id is another's
    default id (``delay:0:<offset>``: the delay-id its delivered copy would carry) replaces it,
    whole or a reference, with the due-time hint or without; then it answers to that id."""
    apply(store, rec(0, T0 + 5000, value=b"whole"), rec(1, T0 + 5000, value=b"plain"))
    far = rec(2, T0 + 10**10, value=b"far")
    store.add({SHARD: (2, [far])}, refer_after_ms=T0 + 10**9)
    hinted = rec(3, T0 + 100, "delay:0:0", b"whole now")
    hinted.headers.append((H_DUE_AT, b"%d" % (T0 + 5000)))
    moved = rec(4, T0 + 200, "delay:0:2", b"far now")  # the reference's own id read in the topic
    added = store.add({SHARD: (4, [hinted, moved])}, confirm=confirm_from([far]))
    assert (added.count, added.replaced) == (2, 2)
    assert store.inventory.is_pending(SHARD, 0) is False
    assert store.inventory.is_pending(SHARD, 2) is False
    added = apply(store, rec(5, T0 + 300, "delay:0:0", b"whole again"))  # by the id index now
    assert (added.count, added.replaced) == (1, 1)
    assert waiting(store) == {
        1: ("delay:0:1", b"plain"),
        4: ("delay:0:2", b"far now"),
        5: ("delay:0:0", b"whole again"),
    }


def test_of_exact_copies_of_a_record_below_the_floor_only_the_first_is_stored(
    store: Store,
) -> None:
    """A state rebuilt from offset 10 (its floor) cannot know offset 5, which operators fired
    three times (each saw it waiting: ``delay-replaces`` names it, ``delay-due-at`` its due
    time). The first copy stands for the replacement 5 had, by its id; a later copy of 5 came
    after that one took it, and is nothing. Each replacing by its id, the second and third were
    stored once the one before was claimed, and each was delivered: one record three times (the
    adversary with references, seed 4)."""
    apply(store, rec(10, T0 + 10**9))  # the state's floor

    def copy(offset: int, value: bytes) -> Scheduled:
        fired = rec(offset, T0, "delay:0:5", value)
        fired.headers.extend([(H_REPLACES, b"delay:0:5"), (H_DUE_AT, b"%d" % (T0 + 5000))])
        return fired

    assert apply(store, copy(11, b"first")).count == 1
    assert waiting(store, T0) == {11: ("delay:0:5", b"first")}  # claimed
    for offset, value in ((12, b"second"), (13, b"third")):
        added = apply(store, copy(offset, value))
        assert (added.count, added.not_found) == (0, 1), value
    assert waiting(store, T0) == {}
    # Read again (a re-read below the watermark applies nothing twice), the first stays itself.
    assert apply(store, copy(11, b"first")).count == 0


def test_a_record_with_several_cancels_withdraws_each_record_it_names(store: Store) -> None:
    """One cancel record naming several ids (the command line's bulk cancel): each is applied as
    a cancel of its own, all at the record's offset, here and in the topic's other partitions,
    and what each withdrew is reported with its own delay-id."""
    other = Shard("delay", 1)
    elsewhere = Scheduled(0, T0 + 7000, "out", b"k", b"v", [], "elsewhere")
    store.add({other: (0, [elsewhere])})
    topic = {"partitions": {"delay": 2}, "confirm": confirm_from([elsewhere])}
    apply(store, rec(0, T0 + 5000), rec(1, T0 + 6000, "order-1"), rec(2, T0 + 6500))
    cancels = Cancel(
        3,
        "delay:0:0",
        T0,
        T0 + 5000,
        (("order-1", None), ("gone", None), ("elsewhere", None), ("delay:0:2", 1)),
    )
    added = store.add({SHARD: (3, cancels.each())}, **topic)  # type: ignore[arg-type]
    assert (added.cancelled, added.not_found) == (4, 1)
    assert [(s.partition, r, i) for s, r, i in added.missed] == [(0, 3, "gone")]
    assert sorted(
        (w.shard.partition, w.offset, w.delay_id, w.by_offset, w.cancelled) for w in added.withdrawn
    ) == [
        (0, 0, "delay:0:0", 3, True),
        (0, 1, "order-1", 3, True),
        (0, 2, "delay:0:2", 3, True),
        (1, 0, "elsewhere", 3, True),
    ]
    assert waiting(store) == {}
    assert store.claim([other], 10, LEASE, now_ms=T0 + 10**9) == []
    # Read again (a crash before the commit): nothing more happens.
    again = store.add({SHARD: (3, cancels.each())}, {SHARD: 3}, **topic)  # type: ignore[arg-type]
    assert (again.cancelled, again.not_found) == (0, 0)


def test_a_cancel_kept_while_its_topic_is_not_whole_looks_again_and_holds_its_offset_until(
    store: Store,
) -> None:
    """A cancel read in partition 0 that finds nothing while partition 1 is not whole (``keep``)
    is kept: not counted, its offset held for the commit and the resume point. A later add of
    partition 0 whose own cancel finds nothing forgets only its own entry (it forgot the whole
    field, the kept one with it). Once partition 1 holds the record again, the kept cancel looks
    again, finds it, and partition 0 resumes after its watermark."""
    other, topic = Shard("delay", 1), {"delay": 2}
    kept = store.add(
        {SHARD: (3, [rec(2, T0 + 9000), Cancel(3, "job", T0 + 6000)])},
        partitions=topic,
        keep=lambda shards, unstored: shards,
    )
    assert (kept.not_found, kept.missed, kept.kept) == (0, (), ((SHARD, Cancel(3, "job")),))
    assert resumes_at(store) == (3, 3, False)
    later = store.add(
        {SHARD: (5, [rec(4, T0 + 9000, "filler-2"), Cancel(5, "nobody")])},
        partitions=topic,
    )
    assert (later.not_found, later.kept) == (1, ())
    assert resumes_at(store) == (5, 3, False)
    assert store.lows({SHARD: 5}).offsets[SHARD] == 2  # the filler: the lowest pending
    job = rec(0, T0 + 5000, "job")
    store.add({other: (0, [job])})
    again = store.look_again(kept.kept, topic, confirm=confirm_from([job]))
    assert (again.cancelled, again.not_found) == (1, 0)
    assert resumes_at(store) == (5, 6, False)
    assert store.inventory.by_id(other, "job") == []


def test_what_adds_keep_to_look_for_elsewhere_grows_a_set_no_add_reads_whole(
    store: Store,
) -> None:
    """While another partition of the topic is not whole (a catch-up: every partition read from
    far behind), every record with a delay-id of its own that finds nothing in its partition is
    kept to look again. They were kept as one string in the meta HASH, which each add read,
    parsed and wrote back whole, as did the look that followed: a catch-up of records with
    delay-ids slowed with every batch (16,000 kept per partition after 50,000 records, the
    drain 0.66x as fast at 150,000 as at 50,000). Each add now adds its own to a sorted set and
    reads only those it asks about; the lowest still holds the resume point."""
    topic = {"delay": 2}
    for batch in range(20):
        records = [rec(batch * 50 + i, T0 + 9000, f"order-{batch}-{i}") for i in range(50)]
        added = store.add(
            {SHARD: (batch * 50 + 49, records)},
            partitions=topic,
            keep=lambda shards, looked: shards,
        )
        assert len(added.kept) == 50
    keys = store.keys(SHARD)
    assert store.client.hget(keys.meta, "withdrawing") is None
    assert store.client.zcard(keys.withdrawing) == 1000
    assert store.client.zrange(keys.withdrawing, 0, 0, withscores=True) == [(b"0:0", 0.0)]
    assert resumes_at(store) == (999, 0, False)
    assert store.lows({SHARD: 999}).offsets[SHARD] == 0


def test_kept_entries_are_kept_and_forgotten_by_the_documented_least_privileged_acl_user(
    services: Services, unique: str, acl_user: Callable[..., str]
) -> None:
    """The commands that keep cancels and replacements to look again, and forget them once
    looked for, are the ones docs/redis.md grants its ACL user."""
    prefix = f"test-{unique}"
    client = redis.Redis.from_url(acl_user("least", *documented_acl_rules(prefix)))
    try:
        store = Store(client, prefix)
        topic = {"delay": 2}
        kept = store.add(
            {SHARD: (3, [rec(2, T0 + 9000, "other"), Cancel(3, "job", T0 + 6000)])},
            partitions=topic,
            keep=lambda shards, looked: shards,
        )
        assert len(kept.kept) == 2
        store.add({SHARD: (4, [rec(4, T0 + 9000)])}, partitions=topic)
        assert resumes_at(store) == (4, 2, False)
        store.look_again(kept.kept, topic)
        assert resumes_at(store) == (4, 5, False)
        assert client.exists(store.keys(SHARD).withdrawing) == 0
    finally:
        client.close()


def test_kept_entries_an_earlier_version_left_in_the_meta_hash_hold_the_resume_point_and_move(
    store: Store,
) -> None:
    """A Redis written by the code before kept them in meta "withdrawing": they hold the resume
    point and the offset to commit until the next add moves them to the sorted set."""
    store.add({SHARD: (9, [rec(9, T0 + 9000)])})
    keys = store.keys(SHARD)
    store.client.hset(keys.meta, "withdrawing", "7:0 8:0 8:1")
    assert resumes_at(store) == (9, 7, False)
    assert store.lows({SHARD: 9}).offsets[SHARD] == 7
    store.add({SHARD: (10, [rec(10, T0 + 9000)])}, partitions={"delay": 2})
    assert store.client.hget(keys.meta, "withdrawing") is None
    assert store.client.zrange(keys.withdrawing, 0, -1, withscores=True) == [
        (b"7:0", 7.0),
        (b"8:0", 8.0),
        (b"8:1", 8.0),
    ]
    assert resumes_at(store) == (10, 7, False)


def test_the_ingress_counts_the_cancels_it_keeps_and_asks_redis_once_a_second(
    store: Store,
) -> None:
    """The ingress's :class:`Adds`: a cancel read while partition 1 is read behind its end is
    kept, and the gauge says 1. Partition 1 catches up and holds the record: the cancels look
    again at the next second's turn, not before (each look asks Redis which partitions are
    whole), find it, and the gauge says 0."""
    other, now, told = Shard("delay", 1), [100.0], list[float]()
    catch_up = CatchUp()
    catch_up.start(other, 0, 1)
    adds = Adds(
        store,
        catch_up,
        partitions=lambda: {"delay": 2},
        reads=TopicReads(confirm_from([rec(0, T0 + 5000, "job")])),
        kept=told.append,
        clock=lambda: now[0],
    )
    adds.add({SHARD: (0, [Cancel(0, "job")])}, {}, None, 60_000)
    assert told == [1] and list(adds.by_shard) == [SHARD]
    adds.add({other: (0, [rec(0, T0 + 5000, "job")])}, {}, None, 60_000)
    catch_up.reached(other, 1)
    adds.look_again()  # the first look: partition 1 is whole
    assert told == [1, 0] and not adds.by_shard
    assert store.inventory.by_id(other, "job") == []
    adds.keep([(SHARD, Cancel(1, "late"))])
    now[0] += 0.5
    adds.look_again()
    assert told == [1, 0, 1]  # not yet asked again
    now[0] += 0.6
    adds.look_again()
    assert told == [1, 0, 1, 0]


def test_a_partition_whose_re_read_ended_is_claimed_from_once_the_cancels_kept_elsewhere_looked(
    store: Store,
) -> None:
    """A cancel read in partition 0 while partition 1 is read again after a loss is kept (and
    in Redis: partition 0's resume point stays at it). Partition 1's re-read ends with the
    record: its claims stay held (the record may be due by then) until the kept cancel has
    looked again, at the next second's turn, and withdrawn it — not at the re-read's end."""
    other, now = Shard("delay", 1), [100.0]
    catch_up = CatchUp()
    catch_up.start(other, 0, 1, again=True)
    adds = Adds(
        store,
        catch_up,
        partitions=lambda: {"delay": 2},
        reads=TopicReads(confirm_from([rec(0, T0 + 5000, "job")])),
        clock=lambda: now[0],
    )
    adds.add({SHARD: (0, [Cancel(0, "job")])}, {}, None, 60_000)
    adds.look_again()  # partition 1 is not whole: kept, looked at the next second's turn
    assert list(adds.by_shard) == [SHARD]
    adds.add({other: (0, [rec(0, T0 + 5000, "job")])}, {}, None, 60_000)
    now[0] += 0.5
    assert catch_up.reached(other, 1), "a re-read after a loss"
    adds.caught_up([other])
    assert catch_up.horizons() == {other: -1}, "claimed from before the kept cancel looked"
    assert list(adds.by_shard) == [SHARD]
    now[0] += 0.6
    adds.caught_up([])
    assert not adds.by_shard and store.inventory.by_id(other, "job") == []  # withdrawn
    assert catch_up.horizons() == {}


def test_a_partition_whose_re_read_ended_waits_for_cancels_kept_elsewhere_a_while_at_most(
    store: Store,
) -> None:
    """The same, the kept cancel waiting for a third partition that is never whole (its owner
    gone): partition 1 is claimed from again KEPT_WAIT_S after its re-read ended, not later."""
    other, third, now = Shard("delay", 1), Shard("delay", 2), [100.0]
    catch_up = CatchUp()
    catch_up.start(other, 0, 1, again=True)
    catch_up.start(third, 0, 5)
    adds = Adds(store, catch_up, partitions=lambda: {"delay": 3}, clock=lambda: now[0])
    adds.add({SHARD: (0, [Cancel(0, "job")])}, {}, None, 60_000)
    adds.add({other: (0, [rec(0, T0 + 5000)])}, {}, None, 60_000)
    assert catch_up.reached(other, 1)
    adds.caught_up([other])
    now[0] += KEPT_WAIT_S - 0.1
    adds.caught_up([])
    assert catch_up.horizons() == {other: -1, third: 0} and SHARD in adds.by_shard
    now[0] += 0.2
    adds.caught_up([])
    assert catch_up.horizons() == {third: 0}


def _cancel_of(
    store: Store,
    job: Scheduled,
    told: list[float],
    now: list[float],
    *,
    partitions: Callable[[], Mapping[str, int]],
    counted: Callable[[], Mapping[str, int]] | None = None,
) -> tuple[Adds, Added]:
    """An ingress's :class:`Adds` (its clock ``now[0]``, the cancels it keeps ``told``) that reads
    ``job`` where the id index names it, and what it made of a cancel of ``job`` read in
    partition 0."""
    adds = Adds(
        store,
        CatchUp(),
        partitions=partitions,
        counted=counted,
        reads=TopicReads(confirm_from([job])),
        kept=told.append,
        clock=lambda: now[0],
    )
    return adds, adds.add({SHARD: (0, [Cancel(0, "job")])}, {}, None, 60_000)


def test_a_cancel_read_while_another_replicas_partition_is_read_again_waits_for_it(
    store: Store,
) -> None:
    """Redis lost everything. Partition 1, owned by another replica, is read again up to its end
    (offset 10: its owner's first add says so, meta "reread") and has not reached the record with
    id ``job`` (8) yet. A cancel of ``job`` read here, in partition 0, finds nothing: it is kept
    — this replica knows partition 1 only by what Redis says of it — and looks again once the
    re-read passes its end, and withdraws the record. Done with at once, it was lost: the
    re-read stored the record, and it was delivered."""
    other, now, told = Shard("delay", 1), [100.0], list[float]()
    store.add({other: (3, [rec(i, T0 + 5000) for i in range(4)])}, reread={other: 10})
    job = rec(8, T0 + 6000, "job")
    # This replica reads partition 0 alone.
    adds, added = _cancel_of(store, job, told, now, partitions=lambda: {"delay": 2})
    assert told == [1] and added.not_found == 0
    now[0] += 1.1
    adds.look_again()  # partition 1 is still read again: not yet
    assert told == [1]
    store.add(
        {other: (9, [rec(4, T0 + 5000), job, rec(9, T0 + 5000)])}, {other: 3}, reread={other: 10}
    )
    now[0] += 1.1
    adds.look_again()
    assert told == [1, 0]
    assert store.inventory.by_id(other, "job") == []
    assert not store.inventory.is_pending(other, 8)


def test_a_new_owner_reading_kept_cancels_again_forgets_none_it_has_not_read_yet(
    store: Store,
) -> None:
    """Partition 0's last owner read two cancels that found nothing while partition 1 was not
    whole, kept both in Redis (offsets 0 and 5) and stopped. The next owner reads partition 0
    again from offset 0, a batch at a time. The first batch's cancel looks in partition 1, finds
    nothing and is done with; the one at 5, not read again yet, stays kept. Read in the next
    batch, it looks in partition 1, whole by then, and withdraws the record with id ``job``.
    Before, the first batch forgot every cancel the shard kept: the one at 5, under the
    watermark, was taken for applied when it was read, and its record stayed (the adversary,
    seed 111: a schedule cancelled from another partition went on firing)."""
    other = Shard("delay", 1)
    kept = store.keys(SHARD).withdrawing

    def not_whole(shards: Sequence[Shard], looked: Elsewhere) -> Sequence[Shard]:
        return shards

    store.add(
        {SHARD: (5, [Cancel(0, "gone"), Cancel(5, "job")])},
        partitions={"delay": 2},
        keep=not_whole,
    )
    assert store.client.zrange(kept, 0, -1) == [b"0:0", b"5:0"]
    job = rec(3, T0 + 6000, "job")
    store.add({other: (3, [job])})
    confirm, topic = confirm_from([job]), {"delay": 2}
    first = store.add({SHARD: (2, [Cancel(0, "gone")])}, {SHARD: 5}, partitions=topic)
    assert first.not_found == 1
    assert store.client.zrange(kept, 0, -1) == [b"5:0"]
    second = store.add(
        {SHARD: (5, [Cancel(5, "job")])}, {SHARD: 5}, partitions=topic, confirm=confirm
    )
    assert [(w.shard, w.offset, w.cancelled) for w in second.withdrawn] == [(other, 3, True)]
    assert store.inventory.by_id(other, "job") == []
    assert store.client.zrange(kept, 0, -1) == []


def test_a_cancel_read_before_kafka_counted_its_topics_partitions_waits_for_the_count(
    store: Store,
) -> None:
    """Kafka has not told the ingress how many partitions its delay topic has (its describe at
    the assignment went unanswered): the ingress knows partition 0 alone, the one it reads. The
    record with id ``job`` waits in partition 2. A cancel of it read in partition 0 finds nothing
    in the partitions it can name: it is kept, and looks again once Kafka has said the topic
    has three, and withdraws the record. Done with at once, it was lost: the record was
    delivered, or a schedule went on firing."""
    far, now, told = Shard("delay", 2), [100.0], list[float]()
    job = rec(5, T0 + 6000, "job")
    store.add({far: (5, [job])})
    counted: dict[str, int] = {}
    adds, added = _cancel_of(
        store,
        job,
        told,
        now,
        partitions=lambda: partition_counts(counted, {SHARD}),
        counted=lambda: counted,
    )
    assert told == [1] and added.not_found == 0
    now[0] += 1.1
    adds.look_again()  # still not counted: not yet
    assert told == [1]
    counted["delay"] = 3
    now[0] += 1.1
    adds.look_again()
    assert told == [1, 0]
    assert store.inventory.by_id(far, "job") == []
    assert not store.inventory.is_pending(far, 5)


def test_a_replacement_read_while_another_partition_lost_its_state_replaces_once_it_is_back(
    store: Store,
) -> None:
    """Partition 1 held the record with id ``job``; Redis loses its state. A record replacing it
    by its id is read in partition 0 meanwhile: it is stored, and kept — the add's own look in
    partition 1 saw no state there, so keeping it asks Redis nothing more. Partition 1 is
    rebuilt with the record; the replacement looks again and withdraws it: one ``job`` waits."""
    other, told = Shard("delay", 1), list[float]()
    old, new = rec(5, T0 + 5000, "job", b"old"), rec(0, T0 + 6000, "job", b"new")
    store.add({other: (5, [old])})
    catch_up = CatchUp()
    catch_up.marks[other] = 5
    for key in store.client.scan_iter(match=f"{store.prefix}*"):
        store.client.delete(key)
    adds = Adds(
        store,
        catch_up,
        partitions=lambda: {"delay": 2},
        reads=TopicReads(confirm_from([old])),
        kept=told.append,
    )
    added = adds.add({SHARD: (0, [new])}, {}, None, 60_000)
    assert (added.count, added.kept, told) == (1, ((SHARD, new),), [1])
    store.add({other: (5, [old])})
    adds.look_again()
    assert told == [1, 0] and not adds.by_shard
    assert store.inventory.by_id(other, "job") == []
    assert [due for due, _ in store.inventory.by_id(SHARD, "job")] == [T0 + 6000]


def test_a_cancel_kept_in_one_round_of_a_large_batch_stays_kept_through_the_next(
    store: Store,
) -> None:
    """A batch larger than one call (1,000 entries) is stored in rounds: a cancel kept in the
    first stays kept in Redis when the second round's own cancel, which finds nothing and is not
    kept, is looked for."""
    asked: list[Sequence[Shard]] = []

    def keep_first(shards: Sequence[Shard], looked: Elsewhere) -> Sequence[Shard]:
        asked.append(shards)
        return shards if len(asked) == 1 else ()

    first: list[Scheduled | Cancel] = [Cancel(0, "job", T0)]
    first += [rec(i, T0 + 9000) for i in range(1, 1000)]
    second: list[Scheduled | Cancel] = [rec(i, T0 + 9000) for i in range(1000, 1500)]
    second.append(Cancel(1500, "nobody"))
    added = store.add({SHARD: (1500, [*first, *second])}, partitions={"delay": 2}, keep=keep_first)
    assert (len(asked), added.kept, added.not_found) == (2, ((SHARD, Cancel(0, "job")),), 1)
    assert resumes_at(store) == (1500, 0, False)
