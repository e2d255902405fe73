"""References (far-future records) in the real Redis: what they cost, cancels and replacements that
reach them, promotion once and only once, and retired incarnations."""

from __future__ import annotations

from typing import cast
from urllib.parse import urlparse

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bridge.errors import StoreError
from bridge.message import Cancel, Scheduled
from bridge.store import AckBatch, Shard, Store, id_hash, offset_bytes
from bridge.store.ids import read_index
from bridge.store.keys import member
from tests.conftest import Services, confirm_from
from tests.integration.wire import LossyRelay

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
BUCKET = 60_000
SHARD = Shard("delay", 0)


def rec(offset: int, due: int, delay_id: str = "", value: bytes = b"v" * 1000) -> Scheduled:
    return Scheduled(
        offset, due, "out", b"k", value, [("h", b"1")], delay_id or f"delay:0:{offset}"
    )


def add(store: Store, *records: Scheduled | Cancel, horizon: int = T0) -> int:
    top = max(r.offset for r in records)
    return store.add({SHARD: (top, list(records))}, refer_after_ms=horizon, bucket_ms=BUCKET).count


def promote_all(store: Store, until: int, records: dict[int, Scheduled]) -> int:
    """Read back what is due by ``until`` from ``records`` (standing in for the delay topic)."""
    stored = 0
    while chunks := store.references.due([SHARD], until):
        for chunk in chunks:
            members = [(due, member(records[o], "delay", 0)) for o, due in chunk.references()]
            n = store.references.promote(chunk, members)
            assert n is not None
            stored += n
    return stored


def test_a_far_future_record_is_a_reference_until_read_back(store: Store) -> None:
    near, far = rec(0, T0 - 1), rec(1, T0 + 5 * BUCKET + 7)
    assert add(store, near, far) == 2
    assert store.client.zcard(store.keys(SHARD).due) == 1  # only the near one is whole
    assert store.references.counts([SHARD]) == {SHARD: 1}
    assert store.inventory.is_pending(SHARD, 1)  # held, so its offset is not committed past
    assert store.references.due([SHARD], T0 + 5 * BUCKET - 1) == []  # its bucket starts later
    assert promote_all(store, T0 + 5 * BUCKET, {1: far}) == 1
    assert store.references.counts([SHARD]) == {SHARD: 0}
    assert store.references.due([SHARD], T0 + 10 * BUCKET) == []
    claimed = store.claim([SHARD], 10, 30_000, now_ms=T0 + 5 * BUCKET + 7)
    assert [(c.record.offset, c.record.value) for c in claimed] == [(0, near.value), (1, far.value)]


def test_a_reference_costs_redis_16_bytes_and_a_share_of_its_chunk(store: Store) -> None:
    n = 20_000
    records = [rec(i, T0 + 3_600_000 + i * 10) for i in range(n)]  # 200 s: four buckets
    for first in range(0, n, 500):
        add(store, *records[first : first + 500])
    k = store.keys(SHARD)
    used = sum(
        int(cast(int | None, store.client.memory_usage(key, samples=0)) or 0)
        for key in (k.refs, k.refs_due, k.pending, k.low)
    )
    assert used / n <= 18, f"{used / n:.1f} bytes per reference"
    assert store.client.zcard(k.due) == 0
    assert store.references.counts([SHARD]) == {SHARD: n}
    assert promote_all(store, T0 + 3_600_000 + 200_000, dict(enumerate(records))) == n
    assert store.client.zcard(k.due) == n


def test_cancel_and_replace_reach_references(store: Store) -> None:
    far = T0 + 10 * BUCKET
    add(store, rec(0, far, "a"), rec(1, far, "b"), rec(2, far + 1))
    # The index keeps hashes of the ids: its candidates, references, are read in the delay topic.
    log = [rec(0, far, "a"), rec(1, far, "b"), rec(2, far + 1)]
    added = store.add(
        {SHARD: (4, [Cancel(3, "a"), rec(4, far + 2, "b", b"new")])},
        refer_after_ms=T0,
        bucket_ms=BUCKET,
        confirm=confirm_from(log),
    )
    assert (added.cancelled, added.replaced, added.not_found) == (1, 1, 0)
    assert store.references.counts([SHARD]) == {SHARD: 2}  # 2 and the replacement 4
    assert not store.inventory.is_pending(SHARD, 0) and not store.inventory.is_pending(SHARD, 1)
    index = read_index(store.client.hgetall(store.keys(SHARD).ids))  # type: ignore[arg-type]
    assert index == [(id_hash(SHARD.topic, "b"), offset_bytes(4), far + 2)]
    records = {
        0: rec(0, far, "a"),
        1: rec(1, far, "b"),
        2: rec(2, far + 1),
        4: rec(4, far + 2, "b", b"new"),
    }
    assert promote_all(store, far, records) == 2  # the cancelled and the replaced are skipped
    claimed = store.claim([SHARD], 10, 30_000, now_ms=far + 2)
    assert [(c.record.offset, c.record.value) for c in claimed] == [
        (2, records[2].value),
        (4, b"new"),
    ]


def test_a_cancel_in_the_same_batch_reaches_a_reference(store: Store) -> None:
    far = T0 + 10 * BUCKET
    added = store.add(
        {SHARD: (1, [rec(0, far, "a"), Cancel(1, "a")])}, refer_after_ms=T0, bucket_ms=BUCKET
    )
    assert added.cancelled == 1
    assert store.references.counts([SHARD]) == {SHARD: 0}
    assert promote_all(store, far, {0: rec(0, far, "a")}) == 0


def test_a_chunk_is_promoted_once(store: Store) -> None:
    far = T0 + 10 * BUCKET
    records = {i: rec(i, far + i) for i in range(3)}
    add(store, *records.values())
    (chunk,) = store.references.due([SHARD], far)
    members = [(due, member(records[o], "delay", 0)) for o, due in chunk.references()]
    assert store.references.promote(chunk, members) == 3
    assert store.references.promote(chunk, members) is None  # a second read-back: nothing
    assert store.client.zcard(store.keys(SHARD).due) == 3
    assert store.references.counts([SHARD]) == {SHARD: 0}


def test_references_added_while_a_chunk_is_read_back_wait_for_the_next_read(store: Store) -> None:
    far = T0 + 10 * BUCKET
    records = {i: rec(i, far + i) for i in range(4)}
    add(store, records[0], records[1])
    (chunk,) = store.references.due([SHARD], far)
    add(store, records[2], records[3])  # appended to the same chunk meanwhile
    members = [(due, member(records[o], "delay", 0)) for o, due in chunk.references()]
    assert store.references.promote(chunk, members) == 2
    assert store.references.counts([SHARD]) == {SHARD: 2}
    assert promote_all(store, far, records) == 2
    assert store.client.zcard(store.keys(SHARD).due) == 4


def test_a_full_chunk_moves_aside_and_a_stale_read_of_it_stores_nothing(store: Store) -> None:
    far = T0 + 10 * BUCKET
    records = {i: rec(i, far) for i in range(1500)}  # 1,023 references fill a chunk
    add(store, *(records[i] for i in range(1000)))
    (stale,) = store.references.due([SHARD], far)
    add(store, *(records[i] for i in range(1000, 1500)))
    stale_members = [(d, member(records[o], "delay", 0)) for o, d in stale.references()]
    assert store.references.promote(stale, stale_members) is None
    assert len(store.references.due([SHARD], far)) == 2
    assert promote_all(store, far, records) == 1500


def test_a_retired_incarnation_keeps_its_references(store: Store) -> None:
    far = T0 + 10 * BUCKET
    add(store, rec(0, far), rec(1, far + 1))
    store.layout.bind({SHARD: "first"})
    bound = store.layout.bind({SHARD: "second"})[SHARD]
    assert bound.replaced and bound.records == 2 and bound.retired is not None
    retired = bound.retired
    assert store.references.counts([SHARD, retired]) == {SHARD: 0, retired: 2}
    assert not store.layout.forget_retired(retired)  # references left to read back
    (chunk,) = store.references.due([retired], far)
    assert [o for o, _ in chunk.references()] == [0, 1]
    # The old topic is gone: what the read-back stores in their place goes to the DLQ.
    assert (
        store.references.promote(
            chunk,
            [
                (far, member(rec(0, far), "delay", 0)),
                (far + 1, member(rec(1, far + 1), "delay", 0)),
            ],
        )
        == 2
    )
    assert len(store.claim([retired], 10, 30_000, now_ms=far + 1)) == 2


def test_an_acknowledgement_from_before_a_retire_leaves_the_new_incarnation_alone(
    store: Store,
) -> None:
    """The topic recreated while a record of the old one was in flight: its delivery report, applied
    after the retire, must not clear the pending bit of the new record at the same offset (a
    reference with its bit clear is taken for cancelled and never read back)."""
    far = T0 + 10 * BUCKET
    store.layout.bind({SHARD: "first"})
    add(store, rec(0, T0))
    [old] = store.claim([SHARD], 10, 30_000, now_ms=T0)
    store.layout.bind({SHARD: "second"})
    new = rec(0, far, value=b"new")
    add(store, new)  # offset 0 again, far out: a reference
    store.ack({SHARD: AckBatch(old.epoch, [old.member])})
    assert store.inventory.is_pending(SHARD, 0)
    assert promote_all(store, far, {0: new}) == 1
    assert [c.record.value for c in store.claim([SHARD], 10, 30_000, now_ms=far)] == [b"new"]


def test_a_reference_cancelled_before_a_retire_stays_cancelled(store: Store) -> None:
    """The topic recreated after a far-future record was cancelled: the retired references were
    all stored (payload-missing, to the DLQ) as if none had been cancelled, and the references
    gauge went below zero (the cancel had counted it out already)."""
    far = T0 + 10 * BUCKET
    store.layout.bind({SHARD: "first"})
    add(store, rec(0, far, "a"), rec(1, far + 1), Cancel(2, "a"))
    bound = store.layout.bind({SHARD: "second"})[SHARD]
    retired = bound.retired
    assert retired is not None and bound.records == 1
    assert store.references.counts([retired]) == {retired: 1}
    (chunk,) = store.references.due([retired], far + 1)
    members = [(due, member(rec(o, due), "delay", 0)) for o, due in chunk.references()]
    assert store.references.promote(chunk, members) == 1
    assert store.references.counts([retired]) == {retired: 0}
    [claimed] = store.claim([retired], 10, 30_000, now_ms=far + 1)
    assert claimed.record.offset == 1
    store.ack({retired: AckBatch(claimed.epoch, [claimed.member])})
    assert store.layout.forget_retired(retired)  # nothing of it left behind
    assert not [k for k in store.client.scan_iter(f"{store.prefix}:*retired*")]


def test_a_retire_whose_reply_was_lost_is_answered_when_asked_again(
    store: Store, services: Services
) -> None:
    """The connection broke after the retire ran and before its reply arrived. Asked again, the
    shard was bound already, so the retired incarnation and its records were never handed to the
    mover (until the partition's next assignment), nor the partition read from its beginning."""
    store.layout.bind({SHARD: "first"})
    add(store, rec(0, T0), rec(1, T0 + 10 * BUCKET))
    url = urlparse(services.redis_url)
    relay = LossyRelay((url.hostname or "127.0.0.1", url.port or 6379))
    client = redis.Redis(port=relay.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    lossy = Store(client, store.prefix)
    try:
        lossy.probe()
        relay.lose_replies = True
        with pytest.raises(StoreError):
            lossy.layout.bind({SHARD: "second"})
        assert store.client.smembers(store.layout.keys.retired_set(SHARD))  # it ran
        relay.lose_replies = False
        bound = lossy.layout.bind({SHARD: "second"})[SHARD]  # asked again after the failure
    finally:
        client.close()
        relay.close()
    assert bound.replaced and bound.records == 2 and bound.retired is not None
    assert store.layout.retired([SHARD]) == {bound.retired}
    assert not store.layout.bind({SHARD: "second"})[SHARD].replaced  # once only


@pytest.mark.parametrize("hinted", [True, False], ids=["with-its-due-time", "without"])
def test_a_reference_promoted_while_its_cancel_is_looked_up_is_still_cancelled(
    store: Store, monkeypatch: pytest.MonkeyPatch, hinted: bool
) -> None:
    """The ingress looks for the record a default delay-id names before its script runs when
    the cancel gives no due time; the read-back may promote that reference in between. The
    cancel still withdraws it. One with its due time is looked up by add.lua itself, in the
    script that withdraws it: nothing is looked up before, so nothing can move in between."""
    far = T0 + 10 * BUCKET
    records = {0: rec(0, far), 1: rec(1, far + 1)}
    add(store, *records.values())
    wholes = type(store.inventory).wholes
    looked: list[dict[int, int]] = []

    def then_promoted(self: object, shard: Shard, offsets: list[int]) -> dict[int, int]:
        found = wholes(store.inventory, shard, offsets)  # a reference: in no index yet
        if not looked:
            assert promote_all(store, far, records) == 2  # the read-back, meanwhile
        looked.append(found)
        return found

    monkeypatch.setattr(type(store.inventory), "wholes", then_promoted)
    if hinted:
        assert promote_all(store, far, records) == 2  # before: its hint finds it whole
    cancel = Cancel(2, "delay:0:0", due_ms=far if hinted else None)
    read = confirm_from(records.values())  # a reference's own delay-id, read in the delay topic
    added = store.add({SHARD: (2, [cancel])}, refer_after_ms=T0, bucket_ms=BUCKET, confirm=read)
    monkeypatch.undo()
    assert (added.cancelled, added.not_found) == (1, 0)
    assert looked == ([] if hinted else [{0: -1}, {0: far}])  # looked for again, found whole
    claimed = store.claim([SHARD], 10, 30_000, now_ms=far + 1)
    assert [c.record.offset for c in claimed] == [1]  # 0 was cancelled: never delivered
    assert not store.inventory.is_pending(SHARD, 0)
