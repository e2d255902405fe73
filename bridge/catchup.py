"""Catching up: the shards whose delay-topic partition the ingress is reading behind its end.

A cancel or a replacement must be applied before the record it withdraws can be claimed. While
the ingress reads a partition live that holds by itself (a cancel produced before a record's
due time is read before it), but when it reads one again from an earlier offset — a new replica
after a crash or rebalance, a Redis rebuilt from the committed offsets, a topic read from its
beginning — the records read first may already be due while the cancels that withdraw them are
still further on in the log. So until the ingress reaches the partition's end as it was when
reading started, the mover claims from that shard only records due at or before the newest
record timestamp read so far (the *horizon*): nothing produced before a record fell due is
left unread when it is claimed. Records due later wait for the ingress, not the other way
round, and a partition read at its end costs nothing.

A partition read live can fall behind too — a burst, a slow Redis, a busy core — and a cancel
then sits unread while the record it withdraws falls due. So while the ingress's last fetch of a
partition saw records it has not applied yet, a record with its own delay-id (the only ones a
cancel or a replacement can reach) is claimed only once the ingress has applied a record of its
partition stamped at most LIVE_MARGIN_MS before its due time: a cancel produced that long before
the due time always wins, however far behind the ingress reads. A batch the ingress has taken
and not yet applied counts as behind (:meth:`CatchUp.taken`). A partition it said it read at its
end is that as of the saying, no later: what came in since — its cancel waiting in the
consumer's queue while the ingress stores a batch of another partition — is unread. So such a
record is claimed only if due within LIVE_MARGIN_MS, less FETCH_SLACK_MS, of the ingress's last
saying (the claim's now by Redis's clock less the saying's age by the monotonic one: the
bridge's own wall clock may be off), which it gives every SAY_EVERY_S at least while nothing
comes, between the slices of a hold, and after each batch. Keeping up, the ingress reads
records tens of ms after they are produced, so nothing waits; records with the default delay-id
never do (nothing can withdraw them).

A partition whose read position and end have not moved for STALLED_S while the fetch saw more
is asked its last stable offset (:meth:`CatchUp.standing_still`, :meth:`CatchUp.stable`): the
end a read_committed consumer can read to. At or past the end the fetch saw, there is nothing
there the ingress can read yet, and it holds nothing (idle) until its position or end moves
again. Below it, another producer's transaction is open there, and what it holds back — a
cancel produced behind it, in the log before its record's due time — is unread: the partition
stays behind, and is asked again every STALLED_S, until the transaction ends (Kafka aborts one
left open at its transaction.timeout.ms). A partition whose leader does not answer is asked
again after UNANSWERED_S, and no other is asked meanwhile: in a broker's outage every partition
stands still, and the ingress must not spend its turns waiting for answers. A partition the
ingress holds at a record the DLQ refused (bridge.ingress.holds) is behind however long it
waits: what follows that record, cancels included, is unread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping
from typing import NamedTuple

from bridge.claiming import TAKING_BACK, Claiming
from bridge.message import wall_ms
from bridge.store import Claimed, Shard, shard_names

logger = logging.getLogger(__name__)

LIVE_MARGIN_MS = 100  # a cancel produced this long before its record's due time always wins
# A record is fetched this long after it is produced, at most, while the consumer keeps up
# (fetch.wait.max.ms is 10): a partition said to be read at its end holds every record produced
# this long before the saying.
FETCH_SLACK_MS = 20
# The ingress says how far it reads at least this often while nothing comes (its poll's
# timeout) and between the slices of a hold: well within LIVE_MARGIN_MS - FETCH_SLACK_MS.
SAY_EVERY_S = 0.05
STALLED_S = 2.0  # a partition standing still this long behind its end is asked why
UNANSWERED_S = 10.0  # a partition whose leader did not answer is asked again this much later
# A shard read behind is said so at most this often: one written by transactions (a recurring
# schedule carried on, exactly once) is behind whenever one is open, and level again between.
TOLD_AGAIN_S = 60.0
# Why a shard's records wait for the ingress: each a label of delay_bridge_held_partitions.
# Read behind its end after a loss or an assignment; behind a transaction open in its partition;
# held at a record the DLQ refused.
CATCHING_UP, OPEN_TRANSACTION, DLQ_REFUSED = "catching-up", "open-transaction", "dlq-refused"
# Held (CatchUp.hold): its re-read after a loss just ended, and the cancels and replacements read
# in the topic's other partitions and kept until it ended look first (bridge.ingress.adds); what
# the journal holds as settled not yet forgotten in Redis (bridge.ingress.settled); the journal
# not yet read for a re-read (bridge.ingress.journal_waits); a take-back withdrawn (claiming).
KEPT_ELSEWHERE, SETTLE, JOURNAL = "kept-elsewhere", "settle", "journal"
HELD_WHYS = (
    CATCHING_UP,
    OPEN_TRANSACTION,
    DLQ_REFUSED,
    KEPT_ELSEWHERE,
    SETTLE,
    JOURNAL,
    TAKING_BACK,
)


class _Standing(NamedTuple):
    """A shard read live behind its end as the last fetch saw it."""

    position: int
    end: int
    ask_at: float  # when its last stable offset is asked (again)
    idle: bool  # an answer since it last moved: nothing past its position can be read yet
    open_from: int = -1  # else where an open transaction holds what follows (-1: not known)


class CatchUp(Claiming):
    """Shards being read behind their end offset, and how far they are read (thread-safe:
    the ingress writes, the mover reads); and the mover's claims as the ingress sees them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._ends: dict[Shard, int] = {}
        self._again: set[Shard] = set()  # of those, read again after Redis lost their state
        self._horizons: dict[Shard, int] = {}
        self._read: dict[Shard, int] = {}  # the newest record timestamp applied, of every shard
        self._behind: dict[Shard, _Standing] = {}
        self._ask_after = 0.0  # no shard is asked before (a leader did not answer)
        self._told: dict[Shard, float] = {}  # shards read behind: when their holding was logged
        self._blocked: set[Shard] = set()  # held by the ingress at a record: behind, not idle
        # Shards of the batch the ingress took and has not applied yet (a cancel among them is
        # read, not applied): behind until its next verdict (:meth:`behind`).
        self._in_hand: frozenset[Shard] = frozenset()
        # When the ingress last said which shards it reads behind (``clock``; None: never, as
        # for a mover without an ingress): the others were read at their end then, no later.
        self._said: float | None = None
        # Shards none of whose records is claimed new, whatever is read, and why: what the
        # journal holds as settled is not yet forgotten in Redis (bridge.ingress.put_back), or
        # the journal not yet read for a re-read (bridge.ingress.membership).
        self._held: dict[Shard, set[str]] = {}
        # The Redis watermark of each owned shard as the ingress last read or wrote it: written
        # by the ingress's thread (bridge.positions), copied whole by the mover's (one C call
        # under the GIL), which claims nothing new from a shard Redis has rolled back below it.
        self.marks: dict[Shard, int] = {}
        self._kept: dict[str, int] = {}  # see :meth:`kept`
        self._elsewhere: dict[Shard, int] = {}  # see :meth:`kept_elsewhere`
        self._clock = clock
        self._lock = threading.Lock()
        # The decision time (epoch ms): the ingress takes no record stamp after it as how far a
        # partition is read (bridge.ingress.batch). The mover sets its clock's.
        self.stamp_limit: Callable[[], int] = wall_ms

    def start(self, shard: Shard, position: int, end: int, *, again: bool = False) -> None:
        """The ingress reads ``shard`` from offset ``position`` and the partition ends at
        ``end`` (its high watermark): hold its records until it gets there. ``again``: what it
        reads was stored before, and Redis lost it (see :meth:`rereads`)."""
        if end <= position:
            self.stop(shard)
            return
        with self._lock:
            self._ends[shard] = end
            self._horizons[shard] = 0
            if again:
                self._again.add(shard)
            else:
                self._again.discard(shard)
        logger.info(
            "catching up on %s[%d] up to offset %d: records are claimed only once the "
            "records produced before they fell due are read",
            shard.topic,
            shard.partition,
            end,
        )

    def read(self, shard: Shard, timestamp_ms: int) -> None:
        """The ingress applied records of ``shard`` up to one with ``timestamp_ms``."""
        with self._lock:
            self._read[shard] = max(self._read.get(shard, timestamp_ms), timestamp_ms)
            if shard in self._horizons:
                self._horizons[shard] = max(self._horizons[shard], timestamp_ms)

    def behind(self, positions: Mapping[Shard, tuple[int, int]]) -> None:
        """The shards the ingress reads behind their partition's end as its last fetch saw it,
        with its read position in each and that end (every other shard is read at its end)."""
        now = self._clock()
        with self._lock:
            self._in_hand, self._said = frozenset(), now
            was = self._behind
            self._behind = {
                shard: _restart(was.get(shard), seen, now) for shard, seen in positions.items()
            }

    def standing_still(self) -> tuple[Shard, tuple[int, int]] | None:
        """The shard read behind whose read position and end stood still longest, if one did
        for STALLED_S since it was last asked, with both: the ingress asks its last stable
        offset (:meth:`stable`)."""
        now = self._clock()
        with self._lock:
            if now < self._ask_after:
                return None
            due = [
                (st.ask_at, shard)
                for shard, st in self._behind.items()
                if not st.idle and st.ask_at <= now and shard not in self._blocked
            ]
            if not due:
                return None
            shard = min(due)[1]
            return shard, self._behind[shard][:2]

    def stable(self, shard: Shard, seen: tuple[int, int], offset: int | None) -> None:
        """``shard``, standing still at ``seen`` (read position, end), has its last stable
        offset at ``offset`` (None: its leader did not answer). At or past the end, nothing
        there can be read yet: idle until either moves. Below it, a transaction is open there
        and holds back what follows: behind, asked again STALLED_S later."""
        now = self._clock()
        with self._lock:
            known = self._behind.get(shard)
            if known is None or known[:2] != seen:
                return  # it moved meanwhile: asked again once it stands still
            if offset is None:
                self._ask_after = now + UNANSWERED_S
                self._behind[shard] = known._replace(ask_at=now + UNANSWERED_S)
                return
            idle = offset >= known.end
            opened = -1 if idle else offset
            self._behind[shard] = known._replace(
                ask_at=now + STALLED_S, idle=idle, open_from=opened
            )
        if opened not in (-1, known.open_from):  # once per transaction found open
            logger.info(
                "%s[%d] is read to offset %d, and a transaction open from offset %d holds back "
                "what follows: its records with their own delay-id wait until it ends",
                shard.topic,
                shard.partition,
                seen[0],
                offset,
            )

    def taken(self, shards: frozenset[Shard]) -> None:
        """The ingress took a batch of records of ``shards``: until it has applied it and said
        which shards it reads behind (:meth:`behind`), they are read behind. A verdict made
        before the batch came in — read at its end — does not hold for a batch in its hands,
        which may take longer to store than a cancel's margin (a large batch, a busy core, a
        store that failed and waits to be tried again)."""
        self._in_hand = shards

    def block(self, shard: Shard, blocked: bool) -> None:
        """The ingress holds ``shard`` at a record (or no longer does)."""
        with self._lock:
            if blocked:
                self._blocked.add(shard)
            else:
                self._blocked.discard(shard)

    def hold(self, shard: Shard, held: bool, why: str = SETTLE) -> None:
        """Claim no record of ``shard`` that was not claimed before, for ``why`` (or claim again
        once nothing else holds it)."""
        with self._lock:
            if held:
                self._held.setdefault(shard, set()).add(why)
            elif shard in self._held:
                self._held[shard].discard(why)
                if not self._held[shard]:
                    del self._held[shard]

    def reached(self, shard: Shard, position: int) -> bool:
        """The ingress's next offset to read in ``shard`` is ``position``; returns whether that
        ended a re-read after Redis lost the shard (:meth:`rereads`): held then, as while the
        ingress keeps cancels of its topic (:meth:`kept`), until it is let go
        (``KEPT_ELSEWHERE``)."""
        with self._lock:
            end = self._ends.get(shard)
            if end is None or position < end:
                return False
            del self._ends[shard], self._horizons[shard]
            again = shard in self._again
            self._again.discard(shard)
            if again or shard.topic in self._kept:  # bridge.ingress.adds lets it go
                self._held.setdefault(shard, set()).add(KEPT_ELSEWHERE)
        logger.info("caught up on %s[%d]", shard.topic, shard.partition)
        return again

    def stop(self, shard: Shard) -> None:
        """``shard`` is no longer read here (revoked)."""
        with self._lock:
            self._ends.pop(shard, None)
            self._again.discard(shard)
            self._horizons.pop(shard, None)
            self._read.pop(shard, None)
            self._behind.pop(shard, None)
            self._told.pop(shard, None)
            self._blocked.discard(shard)
            self._held.pop(shard, None)

    def ends(self) -> dict[Shard, int]:
        """The shards being caught up on, with the offset each must reach."""
        with self._lock:
            return dict(self._ends)

    def rereads(self) -> dict[Shard, int]:
        """Those of :meth:`ends` read again after Redis lost what they stored, until they reach
        their end: a cancel read there that finds nothing leaves its end (see add.lua)."""
        with self._lock:
            return {s: self._ends[s] for s in self._again}

    def watermarks(self) -> dict[Shard, int]:
        """Shard -> the watermark the ingress last saw in Redis (see :meth:`Store.claim`)."""
        return dict(self.marks)

    def horizons(self) -> dict[Shard, int]:
        """Shard -> the due time up to which its records may be claimed, for shards behind (and
        -1 for those held: none)."""
        with self._lock:
            return self._limits()

    def _limits(self) -> dict[Shard, int]:
        limits = dict(self._horizons)
        if self._kept:  # nothing due after a cancel kept while its record may be read yet
            for shard, horizon in limits.items():
                if (first := self._kept.get(shard.topic)) is not None:
                    limits[shard] = min(horizon, first)
        for shard in self._again.intersection(limits):  # -1 until the ingress first looked
            limits[shard] = min(limits[shard], self._elsewhere.get(shard, -1))
        if self._held:
            limits.update(dict.fromkeys(self._held, -1))
        return limits

    def kept(self, firsts: Mapping[str, int]) -> None:
        """The ingress keeps cancels and replacements read in these delay topics until their
        partitions are whole (bridge.ingress.adds), the earliest stamped at ``firsts``: a
        partition of such a topic read behind its end claims nothing due after that (the
        record one withdraws may be read yet), and one whose catch-up ends is held until it
        is let go (``KEPT_ELSEWHERE``)."""
        with self._lock:
            self._kept = dict(firsts)

    def kept_elsewhere(self, caps: Mapping[Shard, int]) -> None:
        """The shards read again after a loss (:meth:`rereads`) claim nothing due after these
        times: the earliest record timestamp among the cancels and replacements kept in their
        topic's other partitions (by any replica: they wait for this re-read to end), or when
        Redis last said none was kept (bridge.ingress.adds). A cancel kept later was read later:
        a record due before it lost to its due time whatever the re-read did."""
        with self._lock:
            self._elsewhere = dict(caps)

    def held_partitions(self) -> dict[str, int]:
        """How many shards' records wait for the ingress, by why (label values: a shard may
        count under several): re-read behind their end, behind an open transaction, held at a
        record the DLQ refused, and held (:meth:`hold`) for each reason given."""
        with self._lock:
            counts = Counter(why for whys in self._held.values() for why in whys)
            counts[CATCHING_UP] = len(self._ends)
            counts[OPEN_TRANSACTION] = sum(
                not st.idle and st.open_from >= 0 for st in self._behind.values()
            )
            counts[DLQ_REFUSED] = len(self._blocked)
        return dict(counts)

    def holding(self, why: str) -> set[Shard]:
        """The shards held for ``why`` (:meth:`hold`)."""
        with self._lock:
            return {shard for shard, whys in self._held.items() if why in whys}

    def past(
        self, claims: Iterable[Claimed], in_flight: Container[tuple[Shard, bytes]], now_ms: int
    ) -> list[Claimed]:
        """The records of ``claims`` (claimed at ``now_ms`` by Redis's clock) due past the
        horizon of their shard: a catch-up began after the mover read the horizons and before
        Redis ran its claim (the ingress re-reads after Redis lost its state, or a partition is
        assigned), so a cancel of theirs may still be unread; they are put back until the
        horizon passes them. So are the records with their own delay-id of a shard read live
        behind, due more than LIVE_MARGIN_MS after the newest record the ingress applied there —
        or, read at its end, due more than LIVE_MARGIN_MS less FETCH_SLACK_MS after the ingress
        last said so: what came in since may hold their cancels (a batch of another partition
        in its hands, a store tried again). When it said so is ``now_ms`` less how long ago it
        did, by the monotonic clock: the bridge's own wall clock may be off from Redis's. So is
        a record a kept cancel names (:meth:`named`). Not one ``in_flight`` here (being
        produced). A lease that ran out or was taken over is checked as a fresh claim (its owner
        may have claimed it only to put it back), but for a :meth:`hold` (new claims only)."""
        now = self._clock()
        with self._lock:
            horizons = self._limits()
            moving = {s for s, standing in self._behind.items() if not standing.idle}
            moving |= self._blocked | self._in_hand
            live = {s: self._read.get(s, -1) + LIVE_MARGIN_MS for s in moving}
            said, held = self._said, set(self._held)
        trusted = LIVE_MARGIN_MS - FETCH_SLACK_MS
        at_end = math.inf if said is None else now_ms - (now - said) * 1000 + trusted
        past: list[Claimed] = []
        behind: set[Shard] = set()  # shards read live behind with records put back
        for c in claims:
            shard, record = c.shard, c.record
            if (shard, c.member) in in_flight or (c.redelivery and shard in held):
                continue  # being produced here; a lease run out while held (new claims only)
            if self.named(shard, record) or record.due_ms > horizons.get(shard, math.inf):
                past.append(c)
            elif shard in horizons or c.given_id() is None:
                continue
            elif record.due_ms > live.get(shard, at_end):
                past.append(c)
                behind.add(shard)
        with self._lock:  # said once while a shard stays behind, and once a minute at most
            told = self._told
            new = {s for s in behind if now - told.get(s, now - TOLD_AGAIN_S) >= TOLD_AGAIN_S}
            told.update(dict.fromkeys(new, now))
        if new:
            logger.info(
                "the ingress reads %s behind: records with their own delay-id wait until "
                "it has read what was produced before they fell due",
                shard_names(new),
            )
        caught = sum(c.shard not in behind for c in past)
        if caught:
            logger.info("%d records claimed as a catch-up began wait for it", caught)
        return past


def _restart(known: _Standing | None, seen: tuple[int, int], now: float) -> _Standing:
    """A shard read behind at ``seen`` (read position, end) now, ``known`` before: the same
    while neither moved; else standing still from now, a transaction found open kept."""
    if known is None:
        return _Standing(*seen, now + STALLED_S, idle=False)
    if known[:2] == seen:
        return known
    return _Standing(*seen, now + STALLED_S, idle=False, open_from=known.open_from)
