"""Priority across the shards one mover claims from (claim.lua orders the lanes of one shard).

Within a shard a claim takes every due high record before a normal one and every normal before a
low one. Across shards the mover keeps the same order: while any shard it owns still has records
of a higher priority due, or records of one in flight from a backlog, it claims only that
priority and above from every shard, so a shard of only low records waits for the others' high
ones to be delivered. The claims of one call are made side by side, so a shard may hand out low
records while another's high ones are still due (at start-up, or when a burst falls due): those
are put back. When the bridge keeps up nothing is held: a claim leaves no record due, and the
records in flight were not claimed from a backlog.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterable, Mapping

from bridge.egress.failures import Ident
from bridge.egress.plan import HOLD_WAIT_S, Plan
from bridge.message import Priority
from bridge.store import ON_TIME_WINDOW_MS, Claimed, Claims, PerLane, Shard


def lanes_min(a: PerLane, b: PerLane) -> PerLane:
    """Lane by lane, the earlier of two earliest due times (-1: none)."""
    high, normal, low = (
        min(i, j) if i >= 0 and j >= 0 else max(i, j) for i, j in zip(a, b, strict=True)
    )
    return high, normal, low


class Stored:
    """The earliest due time of each lane the ingress and read-back threads stored, by shard,
    since the mover last took them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._earliest: dict[Shard, PerLane] = {}

    def __bool__(self) -> bool:
        return bool(self._earliest)

    def add(self, earliest: Mapping[Shard, PerLane]) -> None:
        with self._lock:
            for shard, lanes in earliest.items():
                self._earliest[shard] = lanes_min(lanes, self._earliest.get(shard, lanes))

    def take(self) -> dict[Shard, PerLane]:
        with self._lock:
            taken, self._earliest = self._earliest, {}
        return taken


class Backlog:
    """What a claim took from a backlog: records of the lanes that had records due before or
    after it (``lanes``, by shard), and records overdue by more than the on-time window — not
    a record that fell due just now during another lane's drain. Empty when the claim left
    nothing due and knew of nothing due before (the bridge keeps up)."""

    def __init__(self, lanes: set[tuple[Shard, Priority]], overdue_before_ms: int | None) -> None:
        self.lanes = lanes
        self.overdue_before_ms = overdue_before_ms  # None: nothing counts as overdue

    def holds(self, claimed: Claimed) -> bool:
        """Whether ``claimed`` was taken from a backlog."""
        if self.overdue_before_ms is None:
            return False
        record = claimed.record
        return record.due_ms < self.overdue_before_ms or (claimed.shard, record.priority) in (
            self.lanes
        )


class Lanes:
    """The lowest priority the mover claims now, from what the last claim of each shard said is
    due and the priorities of the backlog's records in flight (``draining``: the deliveries'
    :meth:`Deliveries.draining_lanes`)."""

    def __init__(self, draining: Callable[[], set[Priority]]) -> None:
        self.draining = draining
        self._due: dict[Shard, frozenset[Priority]] = {}  # shards with records due, by priority
        self._held: set[Shard] = set()  # shards with only lower priorities due: held back
        self._earliest: dict[Shard, PerLane] = {}  # per lane, as each claim said

    def cut(self) -> Priority | None:
        """The lowest priority to claim now (None: every one)."""
        due = {p for lanes in self._due.values() for p in lanes}
        due.update(self.draining())
        first = min(due, default=None)
        return None if first is None or first is Priority.LOW else first

    def release(self, owned: frozenset[Shard], plan: Plan) -> None:
        """Before a step's claim: forget shards no longer ``owned``, and plan a claim at once
        from those held back whose records the cut lets through now."""
        if any(s not in owned for s in self._due) or any(s not in owned for s in self._earliest):
            self._due = {s: lanes for s, lanes in self._due.items() if s in owned}
            self._earliest = {s: e for s, e in self._earliest.items() if s in owned}
            self._held &= owned
        if self._held:
            cut = self.cut()
            free = [
                s
                for s in self._held
                if cut is None or s not in self._due or min(self._due[s]) <= cut
            ]
            plan.forget(free)
            self._held.difference_update(free)

    def ahead(self, owned: Iterable[Shard], until_ms: float) -> Priority | None:
        """The lowest priority to claim ahead of its due time (egress.ahead): a lane only while no
        owned shard has records of a higher one due by ``until_ms`` — else a shard of only low
        records would hand them out ahead while another's high ones, due at the same moment,
        wait in Redis (None: every lane). A shard not claimed from yet counts as nothing due."""
        allowed = Priority.LOW
        for shard in owned:
            earliest = self._earliest.get(shard)
            if earliest is None:
                continue
            for lane in range(allowed):  # the lanes above the lowest allowed so far
                if 0 <= earliest[lane] <= until_ms:
                    allowed = Priority(lane)
                    break
            if allowed is Priority.HIGH:
                break
        return None if allowed is Priority.LOW else allowed

    def limits(self, shards: Iterable[Shard]) -> Mapping[Shard, Priority] | None:
        """What each shard may give in the next claim (:meth:`Store.claim`'s ``lanes``)."""
        cut = self.cut()
        return None if cut is None else dict.fromkeys(shards, cut)

    def claimed(self, claims: Claims, plan: Plan) -> Backlog:
        """Take what a claim says is due per shard, and hold back for a moment the shards with
        only lower priorities than the cut due (else the loop would claim them again at once, for
        nothing). Returns what the claim took from a backlog (:class:`Backlog`): those records
        count as draining until they are settled, and a lower lane waits for them. A record
        that falls due during another lane's drain is claimed before the lower lanes' records,
        but they do not wait for its acknowledgement."""
        backlog: set[tuple[Shard, Priority]] = set()
        self._earliest.update(claims.earliest)
        for shard in claims.next_ms:
            lanes = claims.due_lanes.get(shard)
            backlog.update((shard, p) for p in self._due.get(shard, ()))
            if lanes:
                backlog.update((shard, p) for p in lanes)
                self._due[shard] = lanes
            else:
                self._due.pop(shard, None)
        cut = self.cut()
        if cut is not None:
            held = [s for s, lanes in self._due.items() if min(lanes) > cut]
            plan.hold_back(held, claims.now_ms + HOLD_WAIT_S * 1000)
            self._held.update(held)
        active = bool(backlog) or bool(self.draining())
        return Backlog(backlog, claims.now_ms - ON_TIME_WINDOW_MS if active else None)

    def stored(self, earliest: Mapping[Shard, PerLane]) -> dict[Shard, int]:
        """Ingress stored records due from these times on, lane by lane: what :meth:`ahead`
        reads until the shard's next claim says again. Returns each shard's earliest."""
        for shard, lanes in earliest.items():
            known = self._earliest.get(shard)
            self._earliest[shard] = lanes if known is None else lanes_min(known, lanes)
        firsts = {
            s: min((d for d in lanes if d >= 0), default=None) for s, lanes in earliest.items()
        }
        return {s: first for s, first in firsts.items() if first is not None}

    def too_low(
        self, claims: Claims, in_flight: Container[Ident], backlog: Backlog
    ) -> list[Claimed]:
        """The records of ``claims`` to put back: a lower priority waits while a higher one still
        has records due (in any shard: the claims of a call are made side by side, so one shard's
        low records may come with another's high ones), a backlog's records of one in flight, or
        a backlog's records of one claimed in the same call. A record falling due during another
        lane's drain makes nothing wait. Their shards count as having those priorities due."""
        if backlog.overdue_before_ms is None:
            return []
        fresh = [c for c in claims if not c.redelivery and (c.shard, c.member) not in in_flight]
        tops = [c.record.priority for c in fresh if backlog.holds(c)]
        cut = self.cut()
        if cut is not None:
            tops.append(cut)
        if not tops:
            return []
        top = min(tops)
        low = [c for c in fresh if c.record.priority > top]
        for c in low:
            self._due[c.shard] = self._due.get(c.shard, frozenset()) | {c.record.priority}
            self._held.add(c.shard)
        return low
