"""The mover's claims as the ingress sees them: a cancel that met its record in flight.

A cancel or a replacement that add.lua finds nothing for but a record with its id claimed (in
flight) may still be in time: the mover, whose claim was on its way, puts such a record back
when it is not to be produced yet (past a catch-up's horizon, beyond its target's rate), or holds
it in memory until its due time (claimed ahead). :class:`Claiming` lets the ingress wait for the
claims begun by then to end, tells it which shards had records put back since its mark, and
takes records named by their default id back — out of the sender's hands at once, put back by
the mover — or gives the due time the mover put them back at, so that the ingress withdraws them
(bridge.store.flight). :class:`bridge.catchup.CatchUp` is one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping

from bridge.message import Scheduled
from bridge.store import Claimed, Named, Shard, offset_of

# How long a cancel that met its record in flight waits for the mover's claims begun meanwhile to
# end (each puts back what it does not produce yet) before it looks for it again.
CLAIMS_END_S = 1.0
TAKING_BACK = "take-back"  # why a shard's claims are held while a take-back is withdrawn
# A cancel or replacement that met its record in flight and found it neither put back nor taken
# back is kept this long (this many at most) for the record to come back: one a replica killed
# between its claim and its put-back left leased, claimed again by the next owner once it took
# the lease over, is put back while a cancel kept names it, and withdrawn then.
MISSED_KEPT_S, MISSED_KEPT_MAX = 60.0, 10_000
Held = tuple[int, tuple[Shard, bytes]]  # a record claimed ahead: (due ms, (shard, member))


@dataclasses.dataclass(eq=False)
class TakeBack:
    """Records claimed ahead in ``shard`` the ingress took out of those the mover held until due
    (``taken``) and asks it to put back; ``dues``, the due ms of each it put back (by offset),
    once it answered (``done``)."""

    shard: Shard
    taken: tuple[Held, ...]
    dues: dict[int, int] = dataclasses.field(default_factory=dict)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def answer(self, dues: Mapping[int, int]) -> None:
        """The mover took back the records due at ``dues`` (by offset)."""
        self.dues = dict(dues)
        self.done.set()


class Claiming:
    """The mover's claims, put-backs and take-backs, between the ingress's thread and the
    mover's (thread-safe)."""

    def __init__(self) -> None:
        # The mover's claims begun and ended, their put-backs done (:meth:`claiming`), and the
        # put-backs: how many so far, and the count at each shard's last.
        self._claims = threading.Condition()
        self._begun = 0
        self._ended = 0
        self._put_backs = 0
        self._put_back_at: dict[Shard, int] = {}
        # The due ms of each record put back since the ingress's mark, by (shard, offset), while
        # it is marked (None: not): a cancel of a default id withdraws its record by it.
        self._put_back_dues: dict[tuple[Shard, int], int] | None = None
        # Records claimed ahead the ingress asks the mover to take back (:meth:`take_back`), how
        # the mover is woken to do it, and how the ingress takes such records out of those it
        # holds until due (set by the mover).
        self._asks: list[TakeBack] = []
        self.wake: Callable[[], None] = lambda: None
        self.take_out: Callable[[Shard, Collection[int]], list[Held]] = lambda shard, offsets: []
        # The cancels and replacements kept for their record in flight (:meth:`keep_missed`):
        # by (shard, delay-id), until when (monotonic), the put-backs counted when last looked.
        self._missed: dict[tuple[Shard, str], tuple[float, int, Named]] = {}

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """The mover claims, and puts back what it does not produce yet (a catch-up's horizon, a
        target's rate), within this, saying which shards it put back in (:meth:`put_back`): a
        cancel or a replacement the ingress applied meanwhile found such a record in flight, and
        looks for it again (:meth:`put_back_since`)."""
        with self._claims:
            self._begun += 1
        try:
            yield
        finally:
            with self._claims:
                self._ended += 1
                self._claims.notify_all()

    def put_back(self, claims: Iterable[Claimed], which: Container[tuple[Shard, bytes]]) -> None:
        """The mover put those of ``claims`` it names in ``which`` back among the waiting ones
        (or into their target's wait index)."""
        with self._claims:
            self._put_backs += 1
            dues = self._put_back_dues
            for c in claims:
                if (c.shard, c.member) in which:
                    self._put_back_at[c.shard] = self._put_backs
                    if dues is not None:
                        dues[c.shard, offset_of(c.member)] = c.record.due_ms

    def put_backs_mark(self) -> int:
        """Where the put-backs are now: what :meth:`put_back_since` is given. The ingress's, one
        at a time: from here until :meth:`put_backs_unmark`, the due time of each record put
        back is kept for :meth:`take_back`."""
        with self._claims:
            self._put_back_dues = {}
            return self._put_backs

    def put_backs_unmark(self) -> None:
        """The ingress is done with its mark: the due times kept since are forgotten."""
        with self._claims:
            self._put_back_dues = None

    def put_back_since(self, mark: int, timeout_s: float = CLAIMS_END_S) -> frozenset[Shard]:
        """The shards the mover put records back in since ``mark`` (:meth:`put_backs_mark`),
        once every claim it has begun by now has ended (``timeout_s`` at most)."""
        with self._claims:
            begun = self._begun
            self._claims.wait_for(lambda: self._ended >= begun, timeout_s)
            return frozenset(s for s, at in self._put_back_at.items() if at > mark)

    def take_back(
        self, shard: Shard, offsets: Collection[int], timeout_s: float = CLAIMS_END_S
    ) -> dict[int, int]:
        """Have the mover take the records of ``shard`` at ``offsets`` that it claimed ahead and
        has not produced yet back among the waiting ones, holding the shard's claims until
        :meth:`taken_back`: a cancel or replacement of a default id that met its record in
        flight withdraws it then. Returns the due ms of each record taken back (within
        ``timeout_s``: none after it), and of each the mover put back since the mark (a claim
        past a catch-up's horizon, a target's rate). The records are taken out of the mover's
        hands here, at once (once a claim on its way has ended: what it claimed is held or put
        back by then), so none is produced from now on, however late the mover's turn comes;
        the mover is asked only when one was: a cancel met its record in flight after it was
        produced most often."""
        self.hold(shard, True, TAKING_BACK)  # no claim of the shard begins from here on
        with self._claims:
            begun = self._begun
            self._claims.wait_for(lambda: self._ended >= begun, timeout_s)
            dues = self._put_back_dues or {}
            back = {o: dues[shard, o] for o in offsets if (shard, o) in dues}
        taken = tuple(self.take_out(shard, offsets))
        if not taken:
            return back
        ask = TakeBack(shard, taken)
        with self._claims:
            self._asks.append(ask)
        self.wake()
        ask.done.wait(timeout_s)  # too late, they are the mover's to put back all the same:
        return back | ask.dues  # claimed again once the shard is let go: late, never lost

    def taken_back(self, shard: Shard) -> None:
        """The ingress withdrew what it had taken back in ``shard``: its claims go on."""
        self.hold(shard, False, TAKING_BACK)
        self.wake()

    def asked_back(self) -> list[TakeBack]:
        """The mover's: the take-backs asked for since it last looked (each to be answered)."""
        if not self._asks:  # read without the lock: one look per turn
            return []
        with self._claims:
            asks, self._asks = self._asks, []
        return asks

    def keep_missed(self, missed: Iterable[Named], mark: int, now: float) -> None:
        """Cancels and replacements that met their record in flight and found it neither put
        back since ``mark`` nor taken back: kept until MISSED_KEPT_S after ``now`` (monotonic)
        for the mover to put it back (:meth:`named`)."""
        with self._claims:
            for shard, record in missed:
                self._missed[shard, record.delay_id] = (now + MISSED_KEPT_S, mark, (shard, record))
            while len(self._missed) > MISSED_KEPT_MAX:
                del self._missed[next(iter(self._missed))]

    def named(self, shard: Shard, record: Scheduled) -> bool:
        """Whether a cancel or replacement kept (:meth:`keep_missed`) names ``record``: the
        mover puts it back rather than produce it."""
        if not self._missed:  # read without the lock: one look per claimed record
            return False
        kept = self._missed.get((shard, record.delay_id))
        return kept is not None and record.offset < kept[2][1].offset

    def missed_put_back(self, now: float) -> list[Named]:
        """The cancels and replacements kept whose shard the mover put records back in since
        they last looked (forgotten once MISSED_KEPT_S passed): they look there again."""
        if not self._missed:
            return []
        with self._claims:
            due: list[Named] = []
            for key, (until, mark, named) in list(self._missed.items()):
                if until < now:
                    del self._missed[key]
                elif self._put_back_at.get(key[0], 0) > mark:
                    self._missed[key] = (until, self._put_backs, named)
                    due.append(named)
            return due

    def found_missed(self, found: Iterable[Named]) -> None:
        """These kept cancels and replacements found their record: forgotten."""
        with self._claims:
            for shard, record in found:
                self._missed.pop((shard, record.delay_id), None)

    def hold(self, shard: Shard, held: bool, why: str) -> None:
        """Claim no record of ``shard`` that was not claimed before, for ``why`` (or claim again
        once nothing else holds it): :class:`bridge.catchup.CatchUp`'s."""
        raise NotImplementedError
