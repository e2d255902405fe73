"""What the mover remembers it committed (bridge.egress.committed): kept by shard and epoch,
forgotten after its time."""

from __future__ import annotations

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


class _NoStore:
    """Settles nothing (the records found are what the test reads)."""

    def settle(self, *args: Any) -> None:
        pass
