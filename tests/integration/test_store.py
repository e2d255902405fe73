"""The Redis store's scripts, on the real Redis, with explicit times (no sleeping)."""

from __future__ import annotations

import random
import sys
import threading
from typing import Any, cast

import pytest
import redis

from bridge.errors import StoreError
from bridge.message import Cancel, Scheduled, encode
from bridge.store import (
    AckBatch,
    Lost,
    Replica,
    Replicas,
    Shard,
    Store,
    as_store_error,
    offset_bytes,
)
from bridge.store.api import SETTLE_CHUNK
from bridge.store.keys import Keys
from tests.conftest import Services, wait_for

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
LEASE = 30_000


def rec(offset: int, due: int, target: str = "out") -> Scheduled:
    """A record with the default delay-id of SHARD (cancel and replace: test_cancel.py)."""
    return Scheduled(
        offset, due, target, b"k", f"v{offset}".encode(), [("h", b"1")], f"delay:0:{offset}"
    )


SHARD = Shard("delay", 0)


def add(store: Store, *records: Scheduled, shard: Shard = SHARD, high: int | None = None) -> int:
    top = max(r.offset for r in records) if high is None else high
    return store.add({shard: (top, list(records))}).count


def offsets(claimed: list) -> list[int]:  # type: ignore[type-arg]
    return [c.record.offset for c in claimed]


def test_keys_share_one_hash_tag(store: Store) -> None:
    shard = Shard("delay", 3)
    names = [*store.keys(shard).all(), Keys(store.prefix).wait(shard, "orders")]
    assert len(set(names)) == 14
    assert {k.split("}")[0] for k in names} == {f"{store.prefix}:{{delay:3"}
    assert all(k.startswith(f"{store.prefix}:") for k in names)  # one ACL pattern covers them


def test_never_early(store: Store) -> None:
    add(store, rec(0, T0 + 1000), rec(1, T0 + 1001))
    assert store.claim([SHARD], 10, LEASE, now_ms=T0 + 999) == []
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0 + 1000)) == [0]
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0 + 1001)) == [1]


def test_batch_bound_is_respected(store: Store) -> None:
    add(store, *(rec(i, T0) for i in range(25)))
    first = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert offsets(first) == list(range(10))
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0)) == list(range(10, 20))
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0)) == list(range(20, 25))
    assert store.claim([SHARD], 10, LEASE, now_ms=T0) == []


def test_same_due_comes_out_in_offset_order(store: Store) -> None:
    # 9 < 10 < 256 numerically but not as decimal strings: members are big-endian binary.
    add(store, rec(256, T0), rec(10, T0), rec(9, T0), rec(300, T0 - 1))
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0)) == [300, 9, 10, 256]


def test_settle_forgets_more_records_than_one_call_takes_waiting_and_leased_as_asked(
    store: Store,
) -> None:
    """A re-read's journal may name more records than one settle.lua call takes (SETTLE_CHUNK):
    each is forgotten, those in flight only when asked (an assignment leaves them leased)."""
    count = SETTLE_CHUNK + 500
    add(store, *(rec(i, T0 + i % 7) for i in range(count)))
    leased = offsets(store.claim([SHARD], 100, LEASE, now_ms=T0 + 10))
    fates = [(i, T0 + i % 7, "") for i in range(count)]
    assert store.settle(SHARD, fates, leased=False) == count - len(leased)
    assert store.claim([SHARD], 100, LEASE, now_ms=T0 + 10) == [], "none waits"
    assert store.settle(SHARD, fates) == len(leased)
    assert offsets(store.claim([SHARD], 100, LEASE, now_ms=T0 + LEASE + 20)) == []


def test_lease_expiry_makes_a_record_claimable_again(store: Store) -> None:
    add(store, rec(0, T0))
    first = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert [c.redelivery for c in first] == [False]
    assert store.claim([SHARD], 10, LEASE, now_ms=T0 + LEASE - 1) == []
    again = store.claim([SHARD], 10, LEASE, now_ms=T0 + LEASE)
    assert offsets(again) == [0] and again[0].redelivery is True
    assert again[0].record == first[0].record


def test_ack_removes_and_release_hands_out_again(store: Store) -> None:
    add(store, rec(0, T0), rec(1, T0))
    claimed = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert store.ack({SHARD: AckBatch(members=[claimed[0].member])}) == 1
    assert store.ack({SHARD: AckBatch(members=[claimed[0].member])}) == 0  # idempotent
    assert store.release({SHARD: [claimed[1].member, offset_bytes(99)]}) == 1
    again = store.claim([SHARD], 10, LEASE, now_ms=T0 + 1)
    assert offsets(again) == [1] and again[0].redelivery
    store.ack({SHARD: AckBatch(members=[again[0].member])})
    assert store.backlog([SHARD]).inflight == 0
    assert store.client.exists(*store.keys(SHARD).all()) == 1  # only the watermark is left


def test_re_adding_is_a_no_op(store: Store) -> None:
    assert add(store, rec(0, T0), rec(1, T0 + 5)) == 2
    claimed = store.claim([SHARD], 1, LEASE, now_ms=T0)
    store.ack({SHARD: AckBatch(members=[claimed[0].member])})
    # The same records read again (e.g. after a crash before the offset commit): nothing comes
    # back, not even the one already delivered.
    assert add(store, rec(0, T0), rec(1, T0 + 5)) == 0
    assert (store.backlog([SHARD], now_ms=T0).scheduled, store.backlog([SHARD]).inflight) == (1, 0)
    assert add(store, rec(1, T0 + 5), rec(2, T0)) == 1
    assert store.inventory.watermarks([SHARD, Shard("delay", 7)]) == {SHARD: 2}


def test_watermark_moves_past_dead_lettered_offsets(store: Store) -> None:
    assert add(store, rec(3, T0), high=5) == 1
    assert store.inventory.watermarks([SHARD]) == {SHARD: 5}
    assert add(store, rec(4, T0), high=4) == 0  # watermark never goes back
    assert store.inventory.watermarks([SHARD]) == {SHARD: 5}


def test_shards_are_independent_and_pipelined(store: Store) -> None:
    other = Shard("delay", 1)
    store.add({SHARD: (0, [rec(0, T0)]), other: (0, [rec(0, T0 + 1)])})
    claimed = store.claim([SHARD, other], 10, LEASE, now_ms=T0 + 1)
    assert sorted((c.shard.partition, c.record.offset) for c in claimed) == [(0, 0), (1, 0)]


def test_a_claim_says_when_its_shard_next_has_work_by_redis_time(store: Store) -> None:
    """The mover plans its sleep from the claim's reply alone: Redis's clock, and the earliest
    due time or lease deadline left in each shard claimed from."""
    empty = store.claim([SHARD], 10, LEASE)
    assert empty == [] and empty.next_ms == {SHARD: None}
    now = store.time_ms()
    add(store, rec(0, now - 10), rec(1, now + 60_000), rec(2, now + 120_000))
    claims = store.claim([SHARD], 10, 1_000)
    assert offsets(claims) == [0]
    assert abs(claims.now_ms - now) < 5_000
    # The lease of record 0 ends (claims.now_ms + 1 s) before record 1 is due.
    assert claims.next_ms == {SHARD: claims.now_ms + 1_000}
    store.ack({SHARD: AckBatch(members=[claims[0].member])})
    assert store.claim([SHARD], 10, 1_000).next_ms == {SHARD: now + 60_000}


def test_claim_uses_redis_time_when_no_time_is_given(store: Store) -> None:
    now = store.time_ms()
    add(store, rec(0, now - 1), rec(1, now + 3_600_000))
    assert offsets(store.claim([SHARD], 10, LEASE)) == [0]


def test_backlog_counts(store: Store) -> None:
    other = Shard("delay", 1)
    store.add({SHARD: (3, [rec(0, T0 - 5000), rec(1, T0 - 10), rec(2, T0 + 10), rec(3, T0 + 99)])})
    store.add({other: (1, [rec(0, T0 - 2000), rec(1, T0 + 1)])})
    store.claim([SHARD], 1, LEASE, now_ms=T0)  # takes the oldest one of SHARD
    b = store.backlog([SHARD, other], now_ms=T0)
    assert (b.now_ms, b.scheduled, b.overdue, b.inflight) == (T0, 3, 2, 1)
    assert b.oldest_due_ms == T0 - 2000
    assert store.backlog([], now_ms=T0) == type(b)(T0, 0, 0, 0, None)


# ---------------------------------------------------------------- lost writes and the low offset


def test_add_refuses_a_shard_whose_state_redis_lost(store: Store) -> None:
    assert add(store, rec(0, T0), rec(1, T0)) == 2
    store.client.delete(*store.keys(SHARD).all())  # Redis wiped
    added = store.add({SHARD: (2, [rec(2, T0)])}, expected={SHARD: 1})
    assert (added.count, added.lost) == (0, {SHARD: Lost(None)})
    assert store.inventory.watermarks([SHARD]) == {}  # nothing written
    # Without an expectation (a new owner that found no state) the shard is simply created.
    assert store.add({SHARD: (2, [rec(2, T0)])}).count == 1


def test_add_refuses_a_shard_whose_watermark_went_back(store: Store) -> None:
    add(store, rec(0, T0), high=3)
    added = store.add({SHARD: (9, [rec(9, T0)])}, expected={SHARD: 7})
    assert (added.count, added.lost) == (0, {SHARD: Lost(3)})
    added = store.add({SHARD: (9, [rec(9, T0)])}, expected={SHARD: 3})
    assert (added.count, added.lost) == (1, {})


def test_low_is_the_lowest_pending_offset(store: Store) -> None:
    assert store.lows({SHARD: None}).offsets == {}  # nothing known, nothing to commit
    add(store, rec(5, T0 + 50), rec(6, T0), rec(7, T0 + 10), high=9)
    assert store.lows({SHARD: 9}).offsets == {SHARD: 5}
    # Delivered out of offset order: the low offset waits for the oldest pending record.
    claimed = store.claim([SHARD], 2, LEASE, now_ms=T0 + 10)
    assert offsets(claimed) == [6, 7]
    assert store.lows({SHARD: 9}).offsets == {SHARD: 5}  # in flight still counts as pending
    store.ack({SHARD: AckBatch(members=[c.member for c in claimed])})
    assert store.lows({SHARD: 9}).offsets == {SHARD: 5}
    store.ack(
        {
            SHARD: AckBatch(
                members=[c.member for c in store.claim([SHARD], 5, LEASE, now_ms=T0 + 50)]
            )
        }
    )
    assert store.lows({SHARD: 9}).offsets == {SHARD: 10}  # nothing pending: watermark + 1


def test_low_index_keeps_only_buckets_with_pending_offsets(store: Store) -> None:
    records = [rec(i, T0 if i < 1000 else T0 + 1) for i in range(1100)]
    for start in range(0, 1100, 100):
        add(store, *records[start : start + 100])
    keys = store.keys(SHARD)
    assert store.client.zcard(keys.low) == 5  # buckets 0..4 (offsets 0..1279)
    while claimed := store.claim([SHARD], 500, LEASE, now_ms=T0):
        store.ack({SHARD: AckBatch(members=[c.member for c in claimed])})
    # Offsets 0..999 are gone, 1000.. pending: buckets 0-2 emptied and left the index at once.
    assert store.client.zcard(keys.low) == store.client.hlen(keys.pending) == 2
    assert store.lows({SHARD: 1099}, max_buckets=1).offsets == {SHARD: 1000}
    assert [store.inventory.is_pending(SHARD, o) for o in (999, 1000, 1099, 1100)] == [
        False,
        True,
        True,
        False,
    ]


def test_pending_offsets_follow_records_falling_due_out_of_offset_order(store: Store) -> None:
    # A steady load with random delays: records fall due, and are acknowledged, in another order
    # than their offsets, so most acknowledgements touch a bucket for one offset or a few.
    rng = random.Random(7)
    count = 1300  # six buckets, the last one partly used
    add(store, *(rec(o, T0 + rng.randrange(10_000)) for o in range(count)))
    keys, pending, now = store.keys(SHARD), set(range(count)), T0
    while pending:
        now += rng.randrange(200, 900)
        claimed = store.claim([SHARD], 300, LEASE, now_ms=now)
        members = [c.member for c in claimed]
        # Some rounds leave half their claim in flight and release it: still pending.
        acked = len(claimed) // 2 if rng.random() < 0.3 else len(claimed)
        store.ack({SHARD: AckBatch(members=members[:acked])})
        store.release({SHARD: members[acked:]})
        pending -= set(offsets(claimed)[:acked])
        low = min(pending) if pending else count
        assert store.lows({SHARD: count - 1}).offsets == {SHARD: low}
        assert [o for o in range(count) if store.inventory.is_pending(SHARD, o)] == sorted(pending)
        maps = cast(dict[bytes, bytes], store.client.hgetall(keys.pending))
        assert set(maps) == set(cast(list[bytes], store.client.zrange(keys.low, 0, -1)))
        assert all(len(m) == 32 and any(m) for m in maps.values())
        assert set(maps) == {offset_bytes(o)[:7] for o in pending}


def test_low_drops_buckets_without_pending_offsets_and_stays_conservative_when_bounded(
    store: Store,
) -> None:
    add(store, rec(1000, T0))
    keys = store.keys(SHARD)
    # Buckets 0-2 listed with nothing pending, as the earlier layout's low index leaves them.
    store.client.zadd(keys.low, {offset_bytes(o)[:7]: 0 for o in (0, 256, 512)})
    assert store.lows({SHARD: 1000}, max_buckets=1).offsets == {SHARD: 256}
    assert store.lows({SHARD: 1000}, max_buckets=1).offsets == {SHARD: 512}
    assert store.lows({SHARD: 1000}).offsets == {SHARD: 1000}
    assert store.client.zcard(keys.low) == 1


def test_a_record_is_one_entry_holding_the_record(store: Store) -> None:
    add(store, *(rec(i, T0) for i in range(300)))
    keys = store.keys(SHARD)
    members = cast(list[bytes], store.client.zrange(keys.due, 0, -1))
    assert store.client.zcard(keys.due) == 300 and store.client.type(keys.low) == b"zset"
    assert members[7] == offset_bytes(7) + encode(rec(7, T0), SHARD.topic, SHARD.partition)
    assert store.client.hlen(keys.pending) == 2  # two buckets, 32 bytes each
    assert {len(v) for v in cast(list[bytes], store.client.hvals(keys.pending))} == {32}


def test_low_reports_lost_state_only_when_expected(store: Store) -> None:
    add(store, rec(0, T0), high=4)
    other = Shard("delay", 5)
    lows = store.lows({SHARD: 6, other: None})
    assert (lows.offsets, lows.lost) == ({}, {SHARD: Lost(4)})
    lows = store.lows({SHARD: 4, other: 2})
    assert (lows.offsets, lows.lost) == ({SHARD: 0}, {other: Lost(None)})


def test_scripts_are_loaded_again_when_redis_forgot_them(
    store: Store, redis_client: redis.Redis
) -> None:
    add(store, rec(0, T0))
    redis_client.script_flush()  # what a restarted Redis without the scripts looks like
    assert add(store, rec(1, T0)) == 1
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0)) == [0, 1]


def test_records_falling_due_share_each_claim_with_an_overdue_backlog(store: Store) -> None:
    # 20 records an hour overdue (a stopped bridge), then 4 falling due now.
    add(store, *(rec(i, T0 - 3_600_000) for i in range(20)), *(rec(20 + i, T0) for i in range(4)))
    first = offsets(store.claim([SHARD], 6, LEASE, now_ms=T0))
    assert sorted(first) == [0, 1, 2, 20, 21, 22]  # half on time, half of the backlog, in order
    assert offsets(store.claim([SHARD], 6, LEASE, now_ms=T0)) == [3, 4, 5, 6, 7, 23]
    rest = store.claim([SHARD], 100, LEASE, now_ms=T0)
    assert offsets(rest) == list(range(8, 20))  # the on-time lane is empty: the backlog fills it


def test_many_records_move_in_one_claim(store: Store) -> None:
    # More than one slice of the scripts' variadic calls (1000 arguments).
    add(store, *(rec(i, T0) for i in range(2500)))
    claimed = store.claim([SHARD], 2400, LEASE, now_ms=T0)
    assert offsets(claimed) == list(range(2400))
    assert store.ack({SHARD: AckBatch(members=[c.member for c in claimed])}) == 2400
    assert offsets(store.claim([SHARD], 2400, LEASE, now_ms=T0)) == list(range(2400, 2500))


def test_a_claim_reads_redis_clock_again_at_its_end(scratch_redis: str) -> None:
    # The mover carries Redis's clock on from a claim's reply; a claim of many records runs
    # for ms, and a clock read at its start would put the mover that far behind. On a Redis of
    # its own: the SLOWLOG that times the claim is the server's, and make test's other pytest
    # run empties it and sets its threshold for its own scenarios.
    with redis.Redis.from_url(scratch_redis) as client:
        store = Store(client, "clock")
        now = store.time_ms()
        add(store, *(rec(i, now - 1) for i in range(5000)))
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
        claimed = store.claim([SHARD], 5000, LEASE)
        log = cast(list[dict[str, Any]], client.slowlog_get(128))
        [ran_us] = [e["duration"] for e in log if e["command"].startswith(b"EVALSHA")]
        assert len(claimed) == 5000 and ran_us >= 2000  # long enough to tell start from end
        assert claimed.now_ms <= claimed.clock_ms <= store.time_ms()
        # Read at the start, the two would be equal. The slowlog's duration counts more than the
        # script's run between its two reads (its arguments, its 5,000-record reply, a Lua GC
        # step: 3.4 of 33.4 ms once in CI), so half of it is what the reads must be apart.
        assert claimed.clock_ms - claimed.now_ms >= ran_us // 2000
        # A time given by a test is the clock at both ends.
        assert store.claim([SHARD], 10, LEASE, now_ms=T0).clock_ms == T0


def test_a_new_topic_incarnation_retires_the_old_state(store: Store) -> None:
    assert store.layout.bind({SHARD: "id-1"})[SHARD].replaced is False  # adopted
    add(store, rec(0, T0), rec(1, T0 + 5000), rec(2, T0))
    [leased] = store.claim([SHARD], 1, LEASE, now_ms=T0)
    assert store.layout.bind({SHARD: "id-1"})[SHARD].replaced is False
    bound = store.layout.bind({SHARD: "id-2"})[SHARD]
    assert (bound.replaced, bound.stored_id, bound.records, bound.watermark) == (True, "id-1", 3, 2)
    old = bound.retired
    assert old is not None and old.base() == SHARD and store.layout.retired([SHARD]) == {old}
    # The live shard starts empty: no watermark, nothing to claim; offsets 0.. are new records.
    assert (
        store.inventory.watermarks([SHARD]) == {}
        and store.claim([SHARD], 10, LEASE, now_ms=T0) == []
    )
    assert add(store, rec(0, T0)) == 1
    # The old incarnation's records are still delivered, its in-flight one after its lease.
    assert offsets(store.claim([old], 10, LEASE, now_ms=T0 + 5000)) == [2, 1]
    assert offsets(store.claim([old], 10, LEASE, now_ms=T0 + LEASE)) == [leased.record.offset]
    assert store.layout.forget_retired(old) is False  # still in flight
    assert store.ack({old: AckBatch(members=[offset_bytes(i) for i in range(3)])}) == 3
    assert store.layout.forget_retired(old) is True and store.layout.retired([SHARD]) == set()
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0)) == [0]


def test_an_acknowledgement_from_before_a_retire_leaves_the_new_incarnation_alone(
    store: Store,
) -> None:
    """A delivery report of the old incarnation's record, applied after the retire, must not end
    the lease of the new record in flight at the same offset: its delivery fails and is released,
    and it is claimed again."""
    store.layout.bind({SHARD: "id-1"})
    add(store, rec(0, T0))
    [old] = store.claim([SHARD], 1, LEASE, now_ms=T0)
    store.layout.bind({SHARD: "id-2"})
    add(store, rec(0, T0 + 1))
    [new] = store.claim([SHARD], 1, LEASE, now_ms=T0 + 1)
    assert new.epoch != old.epoch
    assert store.ack({SHARD: AckBatch(old.epoch, [old.member])}) == 0
    assert store.release({SHARD: [new.member]}) == 1
    [again] = store.claim([SHARD], 10, LEASE, now_ms=T0 + 1)
    assert (again.record.offset, again.record.due_ms, again.epoch) == (0, T0 + 1, new.epoch)
    # Acknowledged in the epoch it was claimed in, it goes; the old one is the retired shard's.
    assert store.ack({SHARD: AckBatch(again.epoch, [again.member])}) == 1
    assert not store.inventory.is_pending(SHARD, 0)


def test_offsets_that_went_back_retire_the_state_under_the_same_id(store: Store) -> None:
    store.layout.bind({SHARD: "id-1"})
    add(store, rec(0, T0), high=9)
    bound = store.layout.bind({SHARD: ""}, force=[SHARD])[SHARD]  # id unknown: the stored one stays
    assert bound.replaced and bound.records == 1 and bound.watermark == 9
    assert store.layout.bind({SHARD: "id-1"})[SHARD].replaced is False
    empty = Shard("delay", 1)
    assert store.layout.bind({empty: "x"}, force=[empty])[empty].retired is None  # nothing to keep


def test_a_connection_closed_under_a_read_is_a_store_error(
    services: Services, redis_client: redis.Redis, unique: str
) -> None:
    # redis-py's cluster client closes the connections of a node it gives up on, also one another
    # thread is reading; its hiredis parser then reads through a reader the closing thread has
    # dropped and raises AttributeError (redis-py #4003), which once crashed the probe loop, and
    # with it the bridge, during a Redis Cluster failover. It is a failed call to retry.
    key = f"test-{unique}:blocked"
    client = redis.Redis.from_url(services.redis_url)
    conn = client.connection_pool.get_connection()
    conn.send_command("BLPOP", key, 10)  # type: ignore[no-untyped-call]
    reader = threading.get_ident()

    def close_under_the_read() -> None:
        wait_for(lambda: _reading(reader), 10, "the reply awaited")
        conn._parser.on_disconnect()  # what disconnect() does first
        redis_client.lpush(key, b"x")  # the reply arrives; the read goes on without a reader

    closer = threading.Thread(target=close_under_the_read)
    closer.start()
    try:
        with pytest.raises(StoreError, match="closed under the call"), as_store_error():
            conn.read_response()  # type: ignore[no-untyped-call]
    finally:
        closer.join()
        conn.disconnect()  # type: ignore[no-untyped-call]
        client.close()


def _reading(thread: int) -> bool:
    """Whether ``thread`` waits in redis-py's socket read."""
    frame = sys._current_frames().get(thread)
    return frame is not None and frame.f_code.co_name == "read_from_socket"


def test_the_replicas_word_on_their_partitions_lasts_a_session_or_until_they_stop(
    redis_client: redis.Redis, unique: str
) -> None:
    """What bridge.ingress.unowned reads: each replica's last word, a silent one's for as long as
    a group session, a malformed one's not at all."""
    replicas = Replicas(redis_client, f"test-{unique}", Store(redis_client, "").time_ms, "g")
    others = Replicas(redis_client, f"test-{unique}", Store(redis_client, "").time_ms, "other")
    others.say("pod-9:1", True, {Shard("delay", 2)})  # another deployment's group: not seen
    replicas.say("pod-0:7", True, {Shard("delay", 1), Shard("delay", 0)})
    replicas.say("pod-1:8", False, set())
    redis_client.hset(f"test-{unique}:replicas:g", "junk", "{not json")
    assert replicas.alive(60_000) == {
        "pod-0:7": Replica(True, frozenset({Shard("delay", 0), Shard("delay", 1)})),
        "pod-1:8": Replica(False, frozenset()),
    }
    assert redis_client.hexists(f"test-{unique}:replicas:g", "junk") == 0
    replicas.forget("pod-1:8")
    assert set(replicas.alive(60_000)) == {"pod-0:7"}
    wait_for(lambda: replicas.alive(1) == {}, 5, "a silent replica's word to lapse")
    assert redis_client.hlen(f"test-{unique}:replicas:g") == 0


def test_records_stored_before_the_counts_leave_no_count_below_zero(store: Store) -> None:
    """Records stored by a version that kept no per-target counts (here: the HASH deleted after
    they were stored) are acknowledged without taking their target's count below 0; the ones
    stored after count from 0, with or without the targets named in the acknowledgement."""
    targets = store.keys(SHARD).targets
    add(store, rec(0, T0), rec(1, T0), rec(2, T0))
    assert store.client.hgetall(targets) == {b"out": b"3"}
    store.client.delete(targets)
    old = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert store.ack({SHARD: AckBatch(members=[c.member for c in old[:2]], targets=["out"] * 2)})
    assert store.ack({SHARD: AckBatch(members=[old[2].member])}) == 1
    assert store.client.hgetall(targets) == {}
    add(store, rec(3, T0, "late"), rec(4, T0, "late"), high=4)
    assert store.client.hgetall(targets) == {b"late": b"2"}
    new = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert store.ack({SHARD: AckBatch(members=[new[0].member], targets=["late"])}) == 1
    assert store.client.hgetall(targets) == {b"late": b"1"}


def test_a_record_cancelled_in_the_batch_that_stores_it_is_not_counted(store: Store) -> None:
    """A record with a delay-id and a cancel of that id in one add call: the record is written
    (the cancel finds it among those held back) and withdrawn. Its count was written at the end
    of the call, after the withdrawal had taken it away (and found nothing to take): 1 stayed."""
    targets = store.keys(SHARD).targets
    kept = rec(0, T0 + 5000)
    given = Scheduled(1, T0, "out", b"k", b"v", [], "order-7")
    assert store.add({SHARD: (2, [kept, given, Cancel(2, "order-7")])}).cancelled == 1
    assert store.client.hgetall(targets) == {b"out": b"1"}


def test_a_record_that_does_not_decode_is_acknowledged_and_counted_nowhere(store: Store) -> None:
    """A claimed record whose bytes do not read as a stored record (corrupted in Redis): its
    acknowledgement, with the targets read by the script or named "" by the egress (it knows no
    target for it), removes it and counts nothing — it stopped every call of its shard with a
    Lua error (the claims carry the acknowledgements along)."""
    add(store, rec(0, T0), rec(1, T0))
    k = store.keys(SHARD)
    claimed = store.claim([SHARD], 10, LEASE, now_ms=T0)
    for c in claimed:
        store.client.hset(k.claimed, mapping={c.member[:8]: c.member[:8] + b"\x09not a record"})
    assert store.ack({SHARD: AckBatch(members=[claimed[0].member])}) == 1
    assert store.ack({SHARD: AckBatch(members=[claimed[1].member], targets=[""])}) == 1
    assert store.client.hgetall(k.targets) == {b"out": b"2"}  # counted when stored, left so
