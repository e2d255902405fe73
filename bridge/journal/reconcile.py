"""A shard taken over is reconciled with the journal before its earlier owner's leases end.

A replica that crashed (or was stopped past its wait for acknowledgements, or lost its partitions
with its group session) leaves records leased in Redis that it had delivered and journaled but not
yet acknowledged there. The new owner ends those leases so they are delivered at once
(take_over.lua); before that, it reads the shard's journal from when the oldest of them was
claimed (its lease deadline less ``egress.lease``: the earlier owner's lease is taken to be this
one's), and the records the journal holds a fate for are forgotten in Redis (settle.lua) instead
of delivered again. What is left is what the earlier owner delivered and had not journaled yet,
and, should its lease have been longer than this replica's, what it journaled before the read
starts: duplicates, never a loss.

One journal reader serves every reconciliation, connected at start-up (:meth:`Reconcile.warm`):
a new client's first request also looks up the leaders and connects to them, which on a busy
machine outlasted the 2 s a request may take, and the first take-over of a replica replacing
another then delivered its records again after waiting for nothing (``make chaos``, rollout).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from bridge.config import Config
from bridge.errors import BridgeError
from bridge.journal.entries import Entry
from bridge.journal.reader import JournalReader
from bridge.metrics import Metrics
from bridge.store import Shard, Store, offset_of, shard_names

logger = logging.getLogger(__name__)

# Lease deadlines are Redis's clock, journal timestamps the writing bridge's: read from this much
# before the oldest orphaned claim. A skew past it costs duplicates, never a record.
CLOCK_SLACK_MS = 10_000
# Each journal request of a reconciliation waits this long: the mover waits on it, and a journal
# Kafka does not serve at once costs duplicates (at-least-once) or a retried take-over (exactly
# once), not the other partitions' deliveries.
TIMEOUT_S = 2.0


class Reconcile:
    """Called by the mover with the shards it takes over and the records it holds itself."""

    def __init__(
        self,
        store: Store,
        reader: Callable[[], JournalReader],
        lease_ms: int,
        topic_ids: Callable[[], Mapping[str, str]] = dict,
        *,
        strict: bool = False,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics  # counts what it forgets (delay_bridge_redeliveries_avoided)
        # Exactly once: a journal not read stops the take-over (raises), tried again at the
        # mover's next step; else the records are delivered again.
        self.strict = strict
        self._new_reader = reader
        self._made: JournalReader | None = None
        self._lock = threading.Lock()  # start-up warms the reader, the mover uses it
        self.lease_ms = lease_ms
        self._topic_ids = topic_ids

    @classmethod
    def of(
        cls,
        config: Config,
        store: Store,
        topic_ids: Callable[[], Mapping[str, str]],
        metrics: Metrics | None = None,
    ) -> Reconcile | None:
        """The reconciliation ``config`` calls for (None: no journal)."""
        if not config.topics.journal:
            return None
        return cls(
            store,
            lambda: JournalReader(config, timeout_s=TIMEOUT_S),
            config.egress.lease,
            topic_ids,
            strict=config.egress.exactly_once,
            metrics=metrics,
        )

    def _reader(self) -> JournalReader:
        with self._lock:
            if self._made is None:
                self._made = self._new_reader()
            else:
                self._made.refresh()
            return self._made

    def warm(self) -> None:
        """Connect the reader to the journal's partition leaders now, before a take-over waits
        on it (at start-up, beside the other questions to Kafka)."""
        try:
            self._reader().warm()
        except BridgeError as exc:  # the take-over asks again, and says so if it must
            logger.debug("journal reader not connected at start-up: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._made is not None:
                self._made.close()
                self._made = None

    def journaled(self, shard: Shard, since_ms: int, offsets: Collection[int]) -> dict[int, Entry]:
        """The journal's entries for these offsets of ``shard``, written from ``since_ms`` on
        (less the clock slack); raises BridgeError if the journal cannot be read."""
        reads = {shard: (since_ms - CLOCK_SLACK_MS, offsets)}
        found = self._reader().scan_shards(reads, self._incarnations(reads))
        return {e.offset: e for e in found[shard]}

    def _incarnations(self, shards: Collection[Shard]) -> dict[Shard, str]:
        """The topic id each shard's journal entries name: its topic's as last heard, a retired
        shard's the one Redis keeps for it (a retire before it kept one: the topic's)."""
        known = self._topic_ids()
        ids = {s: known.get(s.topic, "") for s in shards}
        retired = [s for s in shards if s.incarnation]
        if retired:
            ids.update((s, i) for s, i in self.store.layout.topic_ids(retired).items() if i)
        return ids

    def __call__(self, held: Mapping[Shard, Sequence[bytes]]) -> dict[Shard, set[int]]:
        """Forget the records leased by an earlier owner of these shards (not in ``held``) that
        the journal says were settled; returns the offsets of the others, each shard's (the
        journal was read for them and holds no fate: their next claim needs no second look).
        One forgotten that comes back (Redis lost the forget: a rollback) is looked up again."""
        orphans: dict[Shard, dict[int, int]] = {}
        for shard, members in held.items():
            mine = set(members)
            leases = self.store.inventory.leases(shard)
            theirs = {offset_of(m): d for m, d in leases.items() if m not in mine}
            if theirs:
                orphans[shard] = theirs
        looked_up = {s: set(left) for s, left in orphans.items()}
        if not orphans:
            return looked_up
        reads = {
            shard: (min(left.values()) - self.lease_ms - CLOCK_SLACK_MS, left.keys())
            for shard, left in orphans.items()
        }
        try:  # every shard's journal partition at once: the mover waits
            found = self._reader().scan_shards(reads, self._incarnations(reads))
        except BridgeError as exc:
            if self.strict:
                raise BridgeError(
                    f"journal not read for the records an earlier owner of {shard_names(orphans)} "
                    f"left in flight: {exc}"
                ) from None
            for shard, left in orphans.items():
                logger.warning(
                    "journal not read for the %d records an earlier owner of %s left in "
                    "flight (%s): they are delivered again",
                    len(left),
                    shard,
                    exc,
                )
            return looked_up
        for shard, entries in found.items():
            settled = {e.offset: e for e in entries}
            if settled:
                self._forget(shard, len(orphans[shard]), settled.values())
                looked_up[shard].difference_update(settled)
        return looked_up

    def _forget(self, shard: Shard, left: int, settled: Iterable[Entry]) -> int:
        n = self.store.settle(shard, [(e.offset, e.due_ms, e.delay_id) for e in settled])
        if self.metrics is not None:
            self.metrics.avoided(shard, "take-over", n)
        logger.info(
            "%s: %d of the %d records an earlier owner left in flight were delivered or settled "
            "by it (the journal says): forgotten, not delivered again",
            shard,
            n,
            left,
        )
        return n
