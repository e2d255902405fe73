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
import time
from collections.abc import Callable

from bridge.egress.failures import Ident, backoff, by_shard
from bridge.egress.outlet import Transactions
from bridge.egress.settle import Deliveries
from bridge.errors import BridgeError, StoreError, WriteRefused
from bridge.health import Readiness
from bridge.journal import Reconcile
from bridge.store import Shard, Store, shard_names

logger = logging.getLogger(__name__)

# A partition whose transactional producer did not start is tried again after this, doubling up
# to the most (each try waits up to the producer's init timeout, on this partition alone).
HELD_RETRY_S, HELD_RETRY_MAX_S = 1.0, 30.0
# A partition whose producer another one with its transactional id fenced while the group still
# has it here waits this long, then is taken over again (a replica whose partitions moved learns
# it from the group within seconds of being fenced: its heartbeat fails, and the revoke comes).
FENCED_RETRY_S = 30.0
# A retired incarnation of a partition this replica delivers from waits up to this long for the
# records it has in flight of it from before the retire, looked at this often.
BEFORE_RETIRE_S, BEFORE_RETIRE_POLL_S = 30.0, 0.1


class TakeOver:
    """The shards assigned since the mover's last step (added from the consumer's thread)."""

    def __init__(
        self,
        store: Store,
        deliveries: Deliveries,
        reconcile: Reconcile | None,
        transactions: Transactions | None,
        *,
        drop_held: Callable[[set[Shard]], list[Ident]] = lambda bases: [],
        wake: Callable[[], None] = lambda: None,
        readiness: Readiness | None = None,
    ) -> None:
        self.store = store
        self.deliveries = deliveries
        self._reconcile = reconcile  # forgets what the journal settled of the leases taken over
        self.transactions = transactions
        self._drop_held = drop_held  # takes the records claimed ahead of partitions out
        self._wake = wake  # the mover
        self._shards: set[Shard] = set()
        self._revoked: set[Shard] = set()  # partitions revoked since the last call began
        # Partitions revoked and not assigned here since: a producer's end reported late (from
        # its thread) does not take them over again, which would fence their next owner.
        self._elsewhere: set[Shard] = set()
        self._gone: set[Shard] = set()  # given up (exactly once): what is in flight is forgotten
        # Partitions about to be rebuilt (exactly once): what is claimed ahead of them is dropped.
        self._rebuilt: list[tuple[set[Shard], threading.Event]] = []
        # A Redis call failed without an answer: it may have run (a claim leasing records whose
        # reply never came, a release never sent); the owned shards' leases this replica does not
        # hold end once Redis answers again, instead of at their deadline.
        self._unsure = False
        self._unanswered = store.scripts.unanswered  # the store's calls sent again, as last seen
        self._lock = threading.Lock()
        # Partitions whose producer did not start: not claimed from (see claimable), tried again
        # at a back-off; the others go on. Partition -> (when to try again, tries, why).
        self._held: dict[Shard, tuple[float, int, str]] = {}
        # Partitions whose producer was fenced while assigned here (see fenced): when each is
        # taken over again. Set on the producer's thread: replaced whole, never changed in place.
        self._fenced: dict[Shard, float] = {}
        self.fenced_retry_s = FENCED_RETRY_S
        # Retired incarnations waiting for the records in flight here from before their retire
        # (see _after_retire): what is left of them, and until when they wait.
        self._retiring: dict[Shard, tuple[set[Ident], float]] = {}
        self._next_look = 0.0
        self.readiness = readiness or Readiness()

    def __bool__(self) -> bool:
        unsure = self._unsure or self.store.scripts.unanswered != self._unanswered
        now = time.monotonic()
        again = any(at <= now for at, _, _ in self._held.values())
        again = again or any(at <= now for at in self._fenced.values())
        again = again or bool(self._retiring and self._next_look <= now)
        return bool(self._shards or self._gone or self._rebuilt or unsure or again)

    def claimable(self, owned: frozenset[Shard]) -> frozenset[Shard]:
        """``owned`` less the partitions whose take-over failed, until it succeeds, and those
        whose producer was fenced, until they are taken over again."""
        held, fenced = self._held, self._fenced
        if not (held or fenced):
            return owned
        return frozenset(s for s in owned if s.base() not in held and s.base() not in fenced)

    def failed(self, exc: Exception) -> None:
        """A step of the mover failed: a Redis call without an answer may have run (``_unsure``);
        one Redis refused (read-only, out of memory) did not."""
        if isinstance(exc, StoreError) and not isinstance(exc, WriteRefused):
            self._unsure = True

    def before_rebuild(self, shards: set[Shard], timeout_s: float) -> None:
        """Exactly once, before a rebuild of these partitions reads the journal (the ingress's
        thread): the records claimed ahead of them are dropped (read again from the delay topic,
        their copies are delivered instead), and what their transactions hold commits, so the
        read finds it. Waits up to ``timeout_s`` for both."""
        if self.transactions is None or not shards:
            return
        self.transactions.fence(shards)  # those it has not taken over yet: their earlier owners
        bases, dropped = {s.base() for s in shards}, threading.Event()
        with self._lock:
            self._rebuilt.append((bases, dropped))
        self._wake()
        deadline = time.monotonic() + timeout_s
        if not (
            dropped.wait(timeout_s)
            and self.transactions.commit_now(bases, deadline - time.monotonic())
        ):
            logger.warning(
                "records in flight of %s not settled within %.0fs before their rebuild reads the "
                "journal: some may be delivered again",
                shard_names(bases),
                timeout_s,
            )

    def add(self, shards: set[Shard]) -> None:
        with self._lock:
            self._shards |= shards
            self._elsewhere -= {s.base() for s in shards}

    def discard(self, bases: set[Shard]) -> None:
        """Forget the shards of these partitions (revoked before they were taken over)."""
        with self._lock:
            self._shards = {s for s in self._shards if s.base() not in bases}
            self._revoked |= bases
            self._elsewhere |= bases
            self._fenced = {s: at for s, at in self._fenced.items() if s not in bases}
        for base in bases:
            self._held.pop(base, None)
        self._retiring = {s: w for s, w in self._retiring.items() if s.base() not in bases}
        self._say_held()

    def give_up(self, shards: set[Shard], *, close: bool = True) -> None:
        """Exactly once: these partitions are another replica's (revoked, or their producer was
        fenced: ``close`` False). Their transactions end (``close``), and at the next call what
        this replica has in flight of them is forgotten, leased in Redis for their next owner,
        who reconciles it with the journal — this replica too, should they come back."""
        if self.transactions is None:
            return
        if close:
            self.transactions.close(shards)
        with self._lock:
            self._gone |= {s.base() for s in shards}

    def ended(self, shard: Shard, fenced: bool) -> None:
        """Exactly once: the shard's producer ended (on its thread), and the group has not
        revoked the shard: what is in flight of it is given up. Its state lost (an abort Kafka
        refused), it is taken over again at once, with a new producer. Fenced by a newer one
        with its transactional id, it is not claimed from until it is taken over again, in
        ``fenced_retry_s`` if the group still has it here then: another replica's producer
        fenced it, and the revoke is on its way; or that one is no live replica's (one frozen
        past its session, say), and the partition is this replica's to deliver. Revoked before
        the end is reported, it is left to its next owner."""
        self.give_up({shard}, close=False)
        with self._lock:
            if shard.base() in self._elsewhere:  # revoked before its end was reported
                return
            if fenced:
                retry_at = time.monotonic() + self.fenced_retry_s
                self._fenced = {**self._fenced, shard.base(): retry_at}
            else:
                self._shards.add(shard)
        if not fenced:
            self._wake()
            return
        logger.warning(
            "%s: its records wait until the group revokes it, or for %.0fs, then it is taken "
            "over again with a new producer",
            shard.base(),
            self.fenced_retry_s,
        )

    def __call__(self, owned: frozenset[Shard]) -> set[Shard]:
        """Forget what is in flight of the shards given up; take over the shards added (those
        still ``owned``, and not revoked while their producers start); returns them. On a
        failure they are taken over at the next call."""
        with self._lock:
            shards, self._shards = self._shards, set()
            gone, self._gone = self._gone, set()
            rebuilt, self._rebuilt = self._rebuilt, []
            self._revoked = set()
        for bases, dropped in rebuilt:
            self.deliveries.forget(by_shard(self._drop_held(bases)))
            dropped.set()
        if gone:  # their producers' last reports first (abandoned, or committed after all)
            self.deliveries.apply_reports()
            self.deliveries.forget(
                by_shard(i for i in self.deliveries.in_flight if i[0].base() in gone)
            )
        if self.store.scripts.unanswered != self._unanswered:
            self._unanswered, self._unsure = self.store.scripts.unanswered, True
        now = time.monotonic()
        shards |= {s for s in owned if self._held.get(s.base(), (now + 1, 0, ""))[0] <= now}
        if any(at <= now for at in self._fenced.values()):  # taken over again if still owned
            shards |= {s for s in owned if self._fenced.get(s.base(), now + 1) <= now}
            with self._lock:
                self._fenced = {s: at for s, at in self._fenced.items() if at > now}
        shards = self._after_retire(shards | set(self._retiring), owned, now)
        if not shards:
            return self._own_leases(owned) if self._unsure else shards
        failed = self.transactions.open(shards) if self.transactions is not None else {}
        with self._lock:
            revoked = {s for s in shards if s.base() in self._revoked}
        if revoked:  # while their producers started: the revoke's close found none to close
            shards -= revoked
            if self.transactions is not None:
                self.transactions.close(revoked)
        self._hold(shards, failed, now)
        shards = {s for s in shards if s.base() not in failed}
        try:
            ended = self._end_leases(shards)
        except BridgeError:
            self.add(shards & owned)
            raise
        if ended:
            logger.info(
                "took back %d leases an earlier owner of %s left",
                ended,
                shard_names(shards),
            )
        return shards

    def _after_retire(self, shards: set[Shard], owned: frozenset[Shard], now: float) -> set[Shard]:
        """``shards`` less the retired incarnations that wait: the records this replica claimed
        of their partition before the retire (another epoch than the label) moved with them,
        leased. Taken over now, those in flight would be delivered again: their transaction has
        not committed, their journal entries are not there to read. So it waits until they are
        settled (committed and journaled, or given up), up to BEFORE_RETIRE_S."""
        in_flight = self.deliveries.in_flight
        for shard in [s for s in shards if s.incarnation and s not in self._retiring]:
            base, label = shard.base(), shard.incarnation
            before = {i for i, p in in_flight.items() if i[0] == base and p.claimed.epoch != label}
            self._retiring[shard] = (before, now + BEFORE_RETIRE_S)
        for shard, (before, until) in list(self._retiring.items()):
            before.intersection_update(in_flight)
            if shard not in owned:  # revoked meanwhile: its next owner takes it over
                shards.discard(shard)
                del self._retiring[shard]
            elif before and now < until:  # waits on
                shards.discard(shard)
            else:  # taken over now
                del self._retiring[shard]
                if before:
                    logger.warning(
                        "%d records of %s claimed before its retire still in flight after "
                        "%.0fs: taken over now, some may be delivered again",
                        len(before),
                        shard,
                        BEFORE_RETIRE_S,
                    )
        self._next_look = now + BEFORE_RETIRE_POLL_S
        return shards

    def _hold(self, tried: set[Shard], failed: dict[Shard, str], now: float) -> None:
        """Hold the partitions whose producer did not start (``failed``) until a later try,
        after a back-off; forget those ``tried`` that started."""
        for shard in tried:
            base = shard.base()
            if base in failed:
                tries = self._held.get(base, (0.0, 0, ""))[1] + 1
                wait = backoff(HELD_RETRY_S, HELD_RETRY_MAX_S, tries)
                self._held[base] = (now + wait, tries, failed[base])
                logger.warning(
                    "%s: the transactional producer did not start (%s); its records wait, the "
                    "other partitions go on; trying again in %.0fs",
                    base,
                    failed[base],
                    wait,
                )
            else:
                self._held.pop(base, None)
        self._say_held()

    def _say_held(self) -> None:
        """/readyz names the partitions held and why (the others are delivered meanwhile)."""
        if self._held:
            held = sorted(self._held.items())
            why = "; ".join(
                f"{s}: the transactional producer did not start: {w}" for s, (_, _, w) in held
            )
            self.readiness.fail("take-over", why)
        else:
            self.readiness.ok("take-over")

    def _end_leases(self, shards: set[Shard]) -> int:
        """End the leases of the records of ``shards`` not in flight here, those the journal
        says were delivered forgotten first; returns how many ended."""
        held = self.deliveries.of_shards(shards)
        if self._reconcile is not None:
            looked_up = self._reconcile(held)
            committed = self.transactions and self.transactions.settings.committed
            if committed:  # what it looked up needs no second look when claimed
                committed.reconciled(looked_up)
        return self.store.take_over(held)

    def _own_leases(self, owned: frozenset[Shard]) -> set[Shard]:
        """End the leases of the owned shards' records not in flight here: what a call whose
        reply Redis lost leased (or failed to release). Returns the owned shards."""
        ended = self._end_leases(set(owned) - set(self._retiring))
        self._unsure = False
        if ended:
            logger.info("ended %d leases left by redis calls that got no answer", ended)
        return set(owned)
