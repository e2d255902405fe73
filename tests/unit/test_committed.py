"""What the mover remembers it committed (bridge.egress.committed): kept by shard and epoch,
forgotten after its time."""

from __future__ import annotations

import gc
from typing import Any, cast

from bridge.egress.committed import Committed
from bridge.message.headers import Scheduled
from bridge.store import Claimed, Shard, Store
from bridge.store.keys import offset_bytes

SHARD = Shard("delay", 0)


def claimed(offset: int, epoch: str = "e1") -> Claimed:
    record = Scheduled(offset, 1_000, "orders", b"k", b"v", [], f"id-{offset}")
    return Claimed(SHARD, offset_bytes(offset), record, False, epoch)


def kept(committed: Committed, records: list[Claimed]) -> set[int]:
    """The offsets among ``records`` a claim of them again would settle, not produce."""
    again = committed.again(records, set())
    return {int.from_bytes(member, "big") for _, member in again}


def test_a_committed_record_claimed_again_is_settled_not_produced_in_its_epoch_only() -> None:
    committed = Committed(cast(Store, _NoStore()), keep_s=60)
    committed.add([claimed(1), claimed(2)])
    assert kept(committed, [claimed(1), claimed(2), claimed(3)]) == {1, 2}
    # A new incarnation of the topic: its records at the same offsets are new ones.
    assert kept(committed, [claimed(1, "e2"), claimed(2, "e2")]) == set()


def test_an_offset_committed_twice_expires_without_an_error() -> None:
    committed = Committed(cast(Store, _NoStore()), keep_s=-1)  # expired as soon as added
    committed.add([claimed(1), claimed(1)])  # the same offset twice in the order kept
    committed.add([claimed(2)])
    assert kept(committed, [claimed(1), claimed(2)]) == set()


def test_what_it_keeps_of_a_transaction_is_not_an_object_per_record_for_the_collector() -> None:
    """Kept for minutes, the committed offsets are no object per record the cycle collector
    follows: a tuple or two a record (200,000 at 3,000 records/s for a minute) filled its young
    generation every 15-30 s, and each collection held the interpreter 20-75 ms."""
    committed = Committed(cast(Store, _NoStore()), keep_s=600)
    records = [claimed(n) for n in range(10_000)]
    gc.collect()
    before = len(gc.get_objects())
    for n in range(0, 10_000, 100):  # a transaction of 100 records at a time
        committed.add(records[n : n + 100])
    gc.collect()
    assert len(gc.get_objects()) - before < 500
    assert kept(committed, [claimed(0), claimed(9_999), claimed(10_000)]) == {0, 9_999}


def test_at_most_max_kept_offsets_are_kept_the_oldest_forgotten_first(monkeypatch: Any) -> None:
    monkeypatch.setattr("bridge.egress.committed.MAX_KEPT", 250)
    committed = Committed(cast(Store, _NoStore()), keep_s=600)
    for n in range(0, 1_000, 100):
        committed.add([claimed(o) for o in range(n, n + 100)])
    left = kept(committed, [claimed(o) for o in range(1_000)])
    assert 100 <= len(left) <= 250 and left == set(range(1_000 - len(left), 1_000))


class _NoStore:
    """Settles nothing (the records found are what the test reads)."""

    def settle(self, *args: Any) -> None:
        pass
