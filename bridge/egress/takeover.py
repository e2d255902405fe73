"""Shards assigned to this replica, taken over before their first claim.

Their earlier owner may have left records leased: delivered and not yet acknowledged, or not
delivered at all. With exactly-once delivery the shard's transactional producer starts first, so
Kafka fences that owner and aborts what it left open; then the journal says which of those records
were delivered (bridge.journal.reconcile), and those are forgotten; the leases left end, and the
records are claimed at once (take_over.lua).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from bridge.egress.settle import Deliveries
from bridge.egress.transactions import Transactions
from bridge.errors import BridgeError
from bridge.store import Shard, Store

logger = logging.getLogger(__name__)


class TakeOver:
    """The shards assigned since the mover's last step (added from the consumer's thread)."""

    def __init__(
        self,
        store: Store,
        deliveries: Deliveries,
        reconcile: Callable[[Mapping[Shard, Sequence[bytes]]], int] | None,
        transactions: Transactions | None,
    ) -> None:
        self.store = store
        self.deliveries = deliveries
        self._reconcile = reconcile  # forgets what the journal settled of the leases taken over
        self.transactions = transactions
        self._shards: set[Shard] = set()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._shards)

    def add(self, shards: set[Shard]) -> None:
        with self._lock:
            self._shards |= shards

    def discard(self, bases: set[Shard]) -> None:
        """Forget the shards of these partitions (revoked before they were taken over)."""
        with self._lock:
            self._shards = {s for s in self._shards if s.base() not in bases}

    def __call__(self, owned: frozenset[Shard]) -> set[Shard]:
        """Take over the shards added (those still ``owned``); returns them. On a failure they
        are taken over at the next call."""
        with self._lock:
            shards, self._shards = self._shards, set()
        try:
            if self.transactions is not None:
                self.transactions.open(shards)
            held = self.deliveries.of_shards(shards)
            if self._reconcile is not None:
                self._reconcile(held)
            ended = self.store.take_over(held)
        except BridgeError:
            self.add(shards & owned)
            raise
        if ended:
            logger.info(
                "took back %d leases an earlier owner of %s left",
                ended,
                ", ".join(str(s) for s in sorted(shards)),
            )
        return shards
