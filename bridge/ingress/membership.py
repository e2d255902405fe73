"""The consumer's group membership: partitions assigned, revoked or lost, and where each is read.

Where each partition resumes — the Redis watermark, the committed lowest pending offset — and
the rebuilds when Redis or the delay topic no longer matches them are :mod:`bridge.positions`'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from bridge.catchup import CatchUp
from bridge.errors import StoreError
from bridge.ingress.adds import Adds
from bridge.ingress.journal_waits import JournalWaits
from bridge.ingress.settled import Settled
from bridge.ingress.verdict import Verdict
from bridge.metrics import Metrics
from bridge.positions import Positions, committed, rebuild_point
from bridge.store import Bound, PerLane, ResumePoint, Shard, Store

logger = logging.getLogger(__name__)

LEAVE_TIMEOUT_S, LEAVE_POLL_S = 5.0, 0.1  # serving the revocation before the group is left
WATERMARK_TIMEOUT_S = 5.0  # reading a partition's end offset, when it is read again
# An assignment that takes longer (Redis, the group's commits, ends and the journal read in the
# group's callback, every partition's reading held meanwhile) says how long in its log line.
SLOW_ASSIGNMENT_S = 2.0


class TopicFacts(Protocol):
    """What Kafka says of the delay topics (:class:`bridge.topics.Topics` answers it)."""

    def ids(self, topics: Sequence[str]) -> dict[str, str]:
        """Each topic's id, asked now."""

    def known(self) -> Mapping[str, str]:
        """The topic ids last heard, without asking."""

    def partitions(self) -> Mapping[str, int]:
        """Each topic's partition count, as Kafka last said."""


@dataclass(frozen=True)
class Owner:
    """Who is told of the shards the ingress reads: ``assigned`` and ``revoked`` as the group
    hands them over (a retired incarnation found is assigned too), and ``stored``, the earliest
    due time per lane of what each batch stored in each shard."""

    assigned: Callable[[set[Shard]], None]
    revoked: Callable[[set[Shard]], None]
    stored: Callable[[Mapping[Shard, PerLane]], None] = lambda earliest: None


class Membership:
    """Group membership of the delay-topic consumer, and the catch-up it starts on a partition
    read again."""

    def __init__(
        self,
        consumer: Consumer,
        store: Store,
        metrics: Metrics,
        catch_up: CatchUp,
        *,
        topics: Sequence[str],
        facts: TopicFacts,
        owner: Owner,
        paused: Callable[[], bool],
        settled: Settled | None = None,
        adds: Adds | None = None,
        journal_waits: JournalWaits | None = None,
    ) -> None:
        self.consumer = consumer
        self.settled = settled or Settled(None)
        self.adds = adds or Adds(store, catch_up)
        self.journal_waits = journal_waits or JournalWaits(catch_up)
        self.store = store
        self.catch_up = catch_up
        self.topics = list(topics)
        self.owner = owner
        self._paused = paused
        self.positions = Positions(
            consumer,
            store,
            metrics,
            facts.ids,
            on_retired=owner.assigned,
            known_ids=facts.known,
            # A new incarnation is read from its beginning (OFFSET_BEGINNING) as new.
            on_reread=lambda starts, _: self.reading_again(
                starts, again=[s for s, o in starts.items() if o != OFFSET_BEGINNING]
            ),
            marks=catch_up.marks,
        )
        self.verdict = Verdict(self.positions, catch_up)
        metrics.held_partitions.read = catch_up.held_partitions
        self.joined = False
        # Partitions lost with the group session (Kafka unreachable), until the group forms
        # again: nobody else can own them meanwhile, so their backlog is still this replica's
        # to report (bridge.sampler.Sampler).
        self.lost: frozenset[Shard] = frozenset()

    def subscribe(self) -> None:
        """Join the consumer group on the delay topics."""
        self.consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a failed consumer being closed aside (bridge.ingress.restarts)
        began = time.monotonic()
        shards = [Shard(tp.topic, tp.partition) for tp in partitions]
        retired: set[Shard] = set()
        replaced: dict[Shard, Bound] = {}
        unread: list[Shard] = []  # Redis did not say what it holds of these
        try:
            replaced = self.positions.bind(shards)
            points = self.store.inventory.resume_points(shards)
            retired = self.store.layout.retired(shards)
        except StoreError:
            logger.warning("redis unreachable at assignment; resuming from the rebuild points")
            points, unread = {}, shards
        marks = {s: point.mark for s, point in points.items()}
        # Read again after a loss by an earlier owner, part-way.
        unfinished = {s for s, point in points.items() if point.reread}
        unknown, never, ends = self._read_commits([s for s in shards if s not in replaced], marks)
        # Redis knows what it holds: resume right after it, which skips re-reading records
        # already stored (or delivered) when the last commit was lost in a crash — or at what it
        # keeps to look for in other partitions (bridge.store.across). A new incarnation of the
        # topic is read from its beginning.
        for tp, shard in zip(partitions, shards, strict=True):
            if shard in replaced:
                tp.offset = OFFSET_BEGINNING
            elif shard in marks:
                tp.offset = points[shard].start
                self.positions.marks[shard] = marks[shard]
                if tp.offset <= marks[shard]:
                    self.positions.resumed[shard] = tp.offset
                else:
                    self.positions.resumed.pop(shard, None)
            elif shard in unknown:
                tp.offset = unknown[shard]
        consumer.incremental_assign(partitions)
        # Never committed: read from the log's start (as auto.offset.reset has it).
        starts = {
            s: OFFSET_BEGINNING if s in never else tp.offset
            for s, tp in zip(shards, partitions, strict=True)
        }
        # Read with no state in Redis (wiped while stopped), or less than it had: stored
        # before, maybe settled since. One never committed too: a replica that stored and
        # delivered its records may have died before its first commit (the auto-commit is a
        # second apart), and Redis lost them since; the journal says what of them is settled.
        rolled_back = self.positions.lost_while_away(marks, ends, starts)
        stored = [s for s in shards if s not in replaced]
        # A re-read an earlier owner left part-way (meta "reread") goes on as one: what the
        # journal says is settled of the rest is left out, whatever the group's commit says.
        self.reading_again(
            starts,
            again=[s for s in stored if s not in marks or s in rolled_back or s in unfinished],
            points=points,
            unread=unread,
        )
        self.positions.assigned.update(shards)
        self.lost = frozenset()  # the group formed again: what is not ours now is another's
        self.joined = True
        if self._paused():
            consumer.pause(partitions)
        took = time.monotonic() - began
        logger.log(
            logging.WARNING if took > SLOW_ASSIGNMENT_S else logging.INFO,
            "assigned %s%s",
            ", ".join(f"{s.topic}[{s.partition}]" for s in sorted(shards)),
            f" (in {took:.1f} s)" if took > SLOW_ASSIGNMENT_S else "",
            extra={"partitions": len(shards), "seconds": round(took, 3)},
        )
        self.owner.assigned(set(shards) | retired)

    def _read_commits(
        self, shards: list[Shard], marks: Mapping[Shard, int]
    ) -> tuple[dict[Shard, int], set[Shard], dict[Shard, int]]:
        """The group's committed offsets of ``shards``, in one request: where those Redis
        holds nothing for (not in ``marks``) are read from — their rebuild points (the committed
        offset is past what is pending: bridge.positions), and those never committed, left to
        the consumer (auto.offset.reset, the log's start) — and, of those it holds, the offset
        committed (the watermark + 1 a replica stored: a higher one than Redis's tells it lost
        writes). Unreadable: the log's start for the first, read again as stored before (the
        journal says what of it is settled); nothing for the others."""
        if not shards:
            return {}, set(), {}
        try:
            tps = committed(self.consumer, shards, WATERMARK_TIMEOUT_S)
        except KafkaException as exc:
            empty = [s for s in shards if s not in marks]
            if empty:
                logger.error(
                    "rebuild points of %s not read (%s): reading them from the log's start; "
                    "records delivered before are delivered again unless the journal says they "
                    "were settled",
                    ", ".join(f"{s.topic}[{s.partition}]" for s in empty),
                    exc,
                )
            return dict.fromkeys(empty, OFFSET_BEGINNING), set(), {}
        self.positions.found_committed(tps)
        points = {s: rebuild_point(tp) for s, tp in tps.items() if s not in marks}
        return (
            {s: offset for s, offset in points.items() if offset >= 0},
            {s for s, offset in points.items() if offset < 0},
            {s: int(tp.offset) for s, tp in tps.items() if s in marks},
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a failed consumer being closed aside (bridge.ingress.restarts)
        self.positions.store_lows(
            {Shard(tp.topic, tp.partition) for tp in partitions}, rebuild=False
        )
        self.commit()
        self._drop(partitions, "revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a failed consumer being closed aside (bridge.ingress.restarts)
        self.joined = False
        self.lost = self.lost | {Shard(tp.topic, tp.partition) for tp in partitions}
        self._drop(partitions, "lost")

    def release(self, shards: set[Shard]) -> None:
        """Give up these partitions without the group telling (the consumer is closed)."""
        if shards:
            self.joined = False
            self._drop([TopicPartition(s.topic, s.partition) for s in shards], "released")

    def _drop(self, partitions: list[TopicPartition], how: str) -> None:
        shards = {Shard(tp.topic, tp.partition) for tp in partitions}
        self.positions.dropped(shards)
        self.settled.forget(shards)
        self.journal_waits.done(shards)
        self.adds.forget(shards)
        for shard in shards:
            self.catch_up.stop(shard)
        logger.info(
            "%s %s",
            how,
            ", ".join(f"{s.topic}[{s.partition}]" for s in sorted(shards)),
            extra={"partitions": len(shards)},
        )
        self.owner.revoked(shards)

    def reading_again(
        self,
        starts: Mapping[Shard, int],
        again: Collection[Shard] = (),
        points: Mapping[Shard, ResumePoint] | None = None,
        unread: Collection[Shard] = (),
    ) -> None:
        """The consumer reads these shards from these offsets (OFFSET_BEGINNING: the log's
        start): hold their due records until it reaches where each partition ends now (see
        bridge.catchup). Without the end offset the shard is not held: said once, the records
        flow as they would have before. Each leaves out what the journal says is settled from
        its start on, and has what Redis put back forgotten (bridge.ingress.settled): the
        journal is read from its start's record, or from when Redis last took a write of it
        if that is earlier (its resume point's ``written``, at an assignment: ``points``).
        Those read ``again`` (stored before, and Redis lost them) are marked so in Redis until
        they reach their end. Those ``unread`` (Redis did not give their resume points) claim
        nothing until Redis answers and that is done (:meth:`Settled.settle_held`)."""
        reread: dict[Shard, int] = {}
        ends: dict[Shard, int] = {}
        for shard, asked in starts.items():
            tp = TopicPartition(shard.topic, shard.partition)
            try:
                low, end = self.consumer.get_watermark_offsets(
                    tp, WATERMARK_TIMEOUT_S, cached=False
                )
            except KafkaException as exc:
                logger.warning(
                    "end offset of %s[%d] not read, not holding its records while catching up: %s",
                    shard.topic,
                    shard.partition,
                    exc,
                )
                continue
            start = asked if asked >= 0 else low
            self.catch_up.start(shard, start, end, again=shard in again)
            # Read after a loss, or by a new owner where the last one stopped: either way what
            # follows may have been stored and settled by an owner whose writes Redis lost while
            # the group's commit never saw them (it died before its next commit). The journal
            # says. A partition read live from its end has nothing of it, but what Redis put
            # back when it lost the acknowledgements among its last writes: the journal from
            # the last write it kept says.
            point = (points or {}).get(shard)
            if start < end or shard in unread or (point is not None and point.written is not None):
                reread[shard], ends[shard] = start, end
        self.adds.forget(starts.keys())
        unreadable = self.settled.load(reread, ends, points, unread)
        self.journal_waits.done(set(reread) - set(unreadable))
        self.journal_waits.wait(unreadable, reread, again, points)

    def try_held(self) -> None:
        """Try again what holds partitions: the forget in Redis of what a rollback put back,
        and the journal a re-read waits for (each read again from where it waits)."""
        self.settled.settle_held()
        self.journal_waits.read_again(self.consumer, self.reading_again)

    def caught_up(self) -> None:
        """After a batch is applied, or none came: the :class:`Verdict`, its catch-ups
        released."""
        self.adds.caught_up(self.verdict(reach=True))  # past a marker, no record may say so

    def close(self, *, leave: bool = False) -> None:
        """Commit what is stored and close the consumer; ``leave``: leave the group first, which
        the close of a static member does not (Kafka's rule). librdkafka sends the leave once
        the unsubscribe's revocation is served, and not at all once the consumer is closing: the
        revocation is served here first (a record polled meanwhile was not stored: the next
        owner reads it from the watermark)."""
        self.positions.store_lows(set(self.positions.assigned), rebuild=False)
        self.commit()
        if leave:
            self.consumer.unsubscribe()
            deadline = time.monotonic() + LEAVE_TIMEOUT_S
            while True:
                self.consumer.poll(LEAVE_POLL_S)
                if not self.positions.assigned or time.monotonic() > deadline:
                    break
        self.consumer.close()

    def commit(self) -> None:
        """Commit the offsets stored for the auto-commit (the lowest pending ones) now."""
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            # _NO_OFFSET: nothing stored since the last commit, which is fine.
            if exc.args[0].code() != -168:
                logger.warning("offset commit failed: %s", exc)
