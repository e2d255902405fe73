"""The sender: records claimed ahead of their due time, held in memory and produced when it comes.

The sender thread (:meth:`Sender.run`) produces them about SEND_BATCH at a time, so a claim's
round trip — tens of ms at high rates, with the decoding of what it returns — does not hold up
records falling due meanwhile. Every wake-up costs librdkafka a produce request per target
partition it touches, so the sender waits up to the claim tick when records fall due slowly (20 a
tick at 2,000/s) and as little as the send tick when they come fast (every 2 ms at 10,000/s).
"""

from __future__ import annotations

import bisect
import logging
import operator
import threading
import time
from collections.abc import Callable, Collection, Container, Iterable, Sequence

from bridge.claiming import Held, TakeBack
from bridge.config import EgressConfig
from bridge.egress.committed import Committed
from bridge.egress.failures import Ident, by_shard
from bridge.egress.lanes import Backlog
from bridge.egress.plan import IDLE_WAIT_S, DecisionClock
from bridge.egress.settle import Deliveries
from bridge.errors import StoreError, log_failed_turn
from bridge.store import Claims, Shard, offset_of
from bridge.turns import Turns

logger = logging.getLogger(__name__)

FAILED_WAIT_S = 1.0  # after a turn that failed (a bug): no busy loop of tracebacks

SEND_BATCH = 20  # records produced about this many at a time while they keep falling due
_DUE = operator.itemgetter(0)  # of a held record: (due ms, record)
_PRIORITY = operator.attrgetter("record.priority")  # of a claimed record: its lane, high first


class Sender:
    """Records claimed ahead: (due ms, record), sorted by due time, earlier claims first among
    equals. A claim's records come in runs already sorted, so a stable sort merges them in, and
    the due ones leave as one slice — not a heap operation per record. Both the mover (after a
    claim) and the sender thread send the due ones."""

    def __init__(
        self,
        config: EgressConfig,
        clock: DecisionClock,
        deliveries: Deliveries,
        committed: Committed | None = None,
    ) -> None:
        self.clock = clock
        self.deliveries = deliveries
        self.committed = committed  # exactly once: a claim of a record committed lately is none
        self.last_loop = time.monotonic()
        # Produced at most once per send tick, and at most once per _every_ms: SEND_BATCH
        # records' worth at the rate they fall due.
        self.send_tick_ms = config.send_tick
        self._every_max_ms = float(max(config.tick, config.send_tick))
        self._every_ms = self._every_max_ms
        self._held: list[Held] = []
        self._sent_ms = 0.0  # Redis ms: when held records were last taken
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # from taking records to producing them (send_due)
        self.wake = threading.Event()  # a record earlier than the sender's plan was held

    def __len__(self) -> int:
        return len(self._held)

    def dispatch(self, claimed: Claims, skip: Container[Ident], backlog: Backlog | None) -> None:
        """A claim's records: those due are produced now, the rest held until due, those in
        ``skip`` (put back) left; what ``backlog`` holds counts as draining (Lanes)."""
        redelivered = 0
        held: list[tuple[int, Ident]] = []
        due: list[Ident] = []
        inflight_of = self.deliveries.in_flight.get
        again = set()
        if self.committed is not None:
            again = self.committed.again(claimed, self.deliveries.in_flight)
        # One call claims from several shards side by side, each shard's records in lane order:
        # a shard's low records would go before another's normal ones (when nothing told the
        # mover what was due: the first claim after a burst fell due). Across the shards too,
        # priority first (a stable sort: each shard's order stands within a lane).
        for item in sorted(claimed, key=_PRIORITY):
            ident = (item.shard, item.member)
            if ident in skip or ident in again:
                continue
            redelivered += item.redelivery
            # A record still in flight here, claimed again (its lease expired), is the same one.
            # So is, for now, a new incarnation's record at the offset of one in flight from
            # before a retire: its lease ends and it is claimed again once that one is settled.
            if inflight_of(ident) is None:
                draining = backlog is not None and backlog.holds(item)
                self.deliveries.track(ident, item, draining)
            if item.record.due_ms > claimed.now_ms:
                held.append((item.record.due_ms, ident))
            else:
                due.append(ident)
        self.hold(held)
        if due:
            self.send_due(claimed.now_ms, due)
        if redelivered:
            self.deliveries.metrics.redelivered.inc(redelivered)

    def hold(self, held: list[tuple[int, Ident]]) -> None:
        """Keep records until their due time; wake the sender if one is due before what it
        waits for."""
        if not held:
            return
        with self._lock:
            first = self._held[0][0] if self._held else float("inf")
            self._held.extend(held)
            self._held.sort(key=_DUE)
            sooner = self._held[0][0] < first
        if sooner:
            self.wake.set()

    def run(self, stop: threading.Event) -> None:
        """The sender thread: produce records claimed ahead at their due time until ``stop`` is
        set, serving delivery reports as it goes."""
        turns = Turns("sender")
        while not stop.is_set():
            turns.begin()
            self.last_loop = time.monotonic()
            self.wake.clear()  # before looking: a record held from here on wakes it
            if self.clock.known:  # nothing is held before a claim
                try:
                    self.send_due(self.clock.now_ms())
                except Exception as exc:  # a bug: what it held is leased, claimed again later
                    log_failed_turn(logger, exc, "sender: %s", exc)
                    stop.wait(turns.waits(FAILED_WAIT_S))
            turns.mark("producing due records")
            self.deliveries.poll(0)
            turns.mark("serving delivery reports")
            self.wake.wait(turns.waits(self._seconds_to_next()))

    def send_due(self, now_ms: float, claimed: Sequence[Ident] = ()) -> None:
        """Produce the records held whose due time has come (by Redis's clock), then
        ``claimed``: the due records of a claim just made, in its order (claim.lua's: a lane's
        due records before the next lane's). Both threads send, the mover and the sender, and
        one lock spans taking records and producing them: a slice one thread took is not
        overtaken by what the other takes meanwhile, so Kafka appends records in the order they
        were claimed — whichever thread sends them, however long one is held up."""
        inflight = self.deliveries.in_flight
        with self._sending:
            sent: list[int] = []  # from when each counts as late
            # A claim's own records do not count for the sender's pace (see _take_due).
            for ident in (*self._take_due(now_ms, pace=not claimed), *claimed):
                one = inflight.get(ident)
                if one is not None:
                    self.deliveries.produce(ident, one)
                    sent.append(one.claimed.record.late_from_ms())
            if sent and self.clock.known:
                handed = self.clock.now_ms()
                self.deliveries.metrics.send_lateness.observe_many(
                    max(0.0, handed - late) / 1000 for late in sent
                )

    def _seconds_to_next(self) -> float:
        """Until the held records are next to be sent; at most IDLE_WAIT_S."""
        at = self._next_send_ms()
        if at is None or not self.clock.known:
            return IDLE_WAIT_S
        return min(IDLE_WAIT_S, max(0.0, (at - self.clock.now_ms()) / 1000))

    def release(self) -> None:
        """End the leases of records held and not produced (shutdown): the next owner claims
        them at once."""
        inflight = self.deliveries.in_flight  # not those forgotten since (given up: exactly once)
        with self._lock:
            released = by_shard(ident for _, ident in self._held if ident in inflight)
            self._held.clear()
        if not released:
            return
        try:
            self.deliveries.release(released)
        except StoreError as exc:  # their leases run out instead; the in-flight rest still drains
            logger.warning("records claimed ahead not released (%s); their leases will expire", exc)

    def drop(self, bases: set[Shard]) -> list[Ident]:
        """Take the records held of these partitions out, once no send is in progress; returns
        them (still in flight: the caller forgets them)."""
        return [ident for _, ident in self._take_out(lambda ident: ident[0].base() in bases)]

    def take_back(self, asks: Iterable[TakeBack]) -> None:
        """Put the records that ``asks`` took out of those held (:meth:`take_out`) back among
        the waiting ones, answering each with their due times: a cancel or replacement of a
        default id read in time withdraws them then (:meth:`bridge.catchup.CatchUp.take_back`).
        One that Redis does not put back (an error, raised) goes when its lease runs out,
        claimed again."""
        for ask in asks:
            dues: dict[int, int] = {}
            try:
                dues = self._put_back([ident for _, ident in ask.taken])
            finally:
                ask.answer(dues)

    def take_out(self, shard: Shard, offsets: Collection[int]) -> list[Held]:
        """Take the records of ``shard`` at one of ``offsets`` out of those held (claimed ahead,
        not produced yet), once no send is in progress: none of them is produced from here on."""
        return self._take_out(lambda ident: ident[0] == shard and offset_of(ident[1]) in offsets)

    def _put_back(self, taken: Sequence[Ident]) -> dict[int, int]:
        """Records ``taken`` out of those held go back among the waiting ones, as if never
        claimed, and their claim is planned again; returns the due ms of each (by offset)."""
        deliveries = self.deliveries
        claims = [p.claimed for i in taken if (p := deliveries.in_flight.get(i)) is not None]
        if not claims:
            return {}
        deliveries.store.unclaim(claims)
        members = by_shard(taken)
        deliveries.forget(members)
        deliveries.claim_again(members, 0)
        return {offset_of(c.member): c.record.due_ms for c in claims}

    def _take_out(self, which: Callable[[Ident], bool]) -> list[Held]:
        with self._sending, self._lock:
            out = [(d, i) for d, i in self._held if which(i)]
            if out:
                self._held = [(d, i) for d, i in self._held if not which(i)]
        return out

    def _take_due(self, now_ms: float, pace: bool = True) -> list[Ident]:
        """The records whose due time has come by ``now_ms`` (Redis's clock), in due order.
        ``pace``: they set when the next are taken (not when a claim sends its own)."""
        with self._lock:
            count = bisect.bisect_right(self._held, now_ms, key=_DUE)
            if not count:
                return []
            due = self._held[:count]
            del self._held[:count]
            if not pace:
                return [ident for _, ident in due]
            gap = now_ms - self._sent_ms
            if gap > 2 * self._every_max_ms:  # after a quiet spell: no rate to go by
                self._every_ms = self.send_tick_ms
            else:
                every = gap * SEND_BATCH / len(due)
                self._every_ms = min(self._every_max_ms, max(self.send_tick_ms, every))
            self._sent_ms = now_ms
        return [ident for _, ident in due]

    def _next_send_ms(self) -> float | None:
        """When the next records are to be taken (Redis ms): the first due time, but no sooner
        than SEND_BATCH records' worth (at least a send tick, at most a tick) after the last were
        taken. None: nothing held."""
        with self._lock:  # the mover may take the last of them meanwhile
            if not self._held:
                return None
            return max(self._held[0][0], self._sent_ms + self._every_ms)

    def not_due(self, now_ms: int) -> int:
        """Records held that are not due by ``now_ms`` (read by the metrics thread)."""
        held = list(self._held)
        return len(held) - bisect.bisect_right(held, now_ms, key=_DUE)
