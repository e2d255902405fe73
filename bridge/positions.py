"""Where each owned delay-topic partition resumes, and the rebuilds when that no longer holds.

What happens when Redis or the topic no longer matches what was stored.

Two positions per partition: the **watermark** in Redis (highest offset handled), where a consumer
resumes after a restart or a rebalance; and the **rebuild point**, the lowest offset still pending
in Redis (``low.lua``), below which everything was delivered. Both go to Kafka with the group's
commit (every second, on revocation and on close): the committed offset is the watermark + 1, so
Kafka's own consumer-group lag (kafka-consumer-groups, Burrow, a lag exporter) is the ingest lag,
not every waiting record; the rebuild point rides in the commit's metadata (:func:`commit_of`).

* Redis lost a shard's state or writes (its watermark is missing or went back while this process
  owns it): :meth:`Positions.rebuild` re-reads the delay topic from the rebuild point, or from
  Redis's older watermark. What the journal says was settled since is not scheduled again, and
  what a rollback put back is forgotten first (bridge.ingress.settled); without a journal,
  records delivered since are delivered again, same ``delay-id``.
* The topic is another incarnation (Kafka's topic id changed: deleted and created again) or its
  offsets went back below the watermark (a truncated or restored log): :meth:`Positions.bind`
  retires the shard's Redis state to a shard the mover drains, and the partition is read from its
  beginning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from bridge.errors import KafkaFault, StoreError
from bridge.metrics import Metrics
from bridge.store import Bound, Lost, Shard, Store

logger = logging.getLogger(__name__)

COMMITTED_TIMEOUT_S = 10.0
REBUILD_FROM = "rebuild-from="  # the commit metadata's prefix: the lowest pending offset follows


def commit_of(shard: Shard, end: int, low: int) -> TopicPartition:
    """The commit of a shard read up to ``end`` (watermark + 1) whose lowest pending offset is
    ``low``."""
    return TopicPartition(shard.topic, shard.partition, end, metadata=f"{REBUILD_FROM}{low}")


def rebuild_point(committed: TopicPartition) -> int:
    """Where a shard's rebuild starts, from its committed offset: the lowest pending offset its
    metadata names; else the offset itself (committed by an earlier version of the bridge, which
    committed the lowest pending offset, or reset by an operator); negative: never committed."""
    metadata = committed.metadata or ""
    if metadata.startswith(REBUILD_FROM):
        low = metadata[len(REBUILD_FROM) :]
        if low.isascii() and low.isdigit():
            return int(low)
    return int(committed.offset)


def committed(
    consumer: Consumer, shards: Sequence[Shard], timeout_s: float
) -> dict[Shard, TopicPartition]:
    """Each shard's committed offset (and its metadata: :func:`commit_of`), in one request
    (KafkaException when it fails)."""
    tps = [TopicPartition(s.topic, s.partition) for s in shards]
    return {Shard(tp.topic, tp.partition): tp for tp in consumer.committed(tps, timeout_s)}


def rebuild_points(
    consumer: Consumer, shards: Sequence[Shard], timeout_s: float
) -> dict[Shard, int]:
    """:func:`rebuild_point` of each shard, in one request (KafkaException when it fails)."""
    return {s: rebuild_point(tp) for s, tp in committed(consumer, shards, timeout_s).items()}


def writes_lost(marks: Mapping[Shard, int], ends: Mapping[Shard, int]) -> set[Shard]:
    """The shards whose watermark in Redis (``marks``) is below the one the group committed
    (``ends``, watermark + 1; negative or absent: never committed)."""
    return {s for s, mark in marks.items() if ends.get(s, -1) > mark + 1}


class Positions:
    """The owned shards, their watermarks as last read or written by this process, and the
    rebuilds and incarnation checks that keep them true."""

    def __init__(
        self,
        consumer: Consumer,
        store: Store,
        metrics: Metrics,
        topic_ids: Callable[[Sequence[str]], dict[str, str]],
        *,
        on_retired: Callable[[set[Shard]], None],
        known_ids: Callable[[], Mapping[str, str]] = dict,
        on_reread: Callable[[Mapping[Shard, int], set[Shard]], None] = lambda starts, rb: None,
        marks: dict[Shard, int] | None = None,
    ) -> None:
        self.consumer = consumer
        self.store = store
        self.metrics = metrics
        self._topic_ids = topic_ids  # asks Kafka
        self._known_ids = known_ids  # what was last heard, without asking (see check_incarnations)
        self._on_retired = on_retired
        # Shards sought back, with the offset each is read from, and those rolled back (Redis
        # lost writes it had taken: their watermark went back).
        self._on_reread = on_reread
        self.assigned: set[Shard] = set()
        # The Redis watermark of each owned shard as last read or written by this process (the
        # mover reads it too: CatchUp.marks).
        self.marks: dict[Shard, int] = {} if marks is None else marks
        # Shards resumed below their watermark on purpose, from this offset: what add.lua keeps
        # to look for in other partitions (bridge.store.across). Offsets read from there up to
        # the watermark are expected, not a log that went back.
        self.resumed: dict[Shard, int] = {}
        # The commit each shard's offsets were last stored with (end, low), or found committed
        # at its assignment. librdkafka commits a stored offset only when it differs from the
        # committed one, whatever its metadata: a rebuild point that moved while the end did not
        # (deliveries, nothing new read) is committed explicitly.
        self._stored: dict[Shard, tuple[int, int]] = {}

    def store_lows(self, shards: set[Shard], *, rebuild: bool = True) -> None:
        """Store each shard's watermark + 1 and lowest pending offset for the next commit (auto
        or explicit; :func:`commit_of`)."""
        shards &= self.assigned
        if not shards:
            return
        try:
            lows = self.store.lows({s: self.marks.get(s) for s in sorted(shards)})
            if lows.offsets:
                now = {s: (lows.ends[s], low) for s, low in lows.offsets.items()}
                self.consumer.store_offsets(offsets=[commit_of(s, *c) for s, c in now.items()])
                # What the auto-commit leaves out: a rebuild point that moved while the end did
                # not.
                before = self._stored
                unsent = [
                    commit_of(s, *c)
                    for s, c in now.items()
                    if s in before and before[s][0] == c[0] and before[s] != c
                ]
                self._stored.update(now)
                if unsent:
                    self.consumer.commit(offsets=unsent, asynchronous=True)
            if lows.lost and rebuild:
                self.rebuild(lows.lost)
        except StoreError as exc:
            self.metrics.redis_errors.labels(stage="ingress").inc()
            logger.warning("lowest pending offsets not read, commit skipped: %s", exc)
        except (KafkaException, KafkaFault) as exc:
            logger.warning("storing offsets failed: %s", exc)

    def found_committed(self, commits: Mapping[Shard, TopicPartition]) -> None:
        """The group's commits of shards just assigned: what the next stored offsets are
        compared with."""
        for shard, tp in commits.items():
            if tp.offset >= 0:
                self._stored[shard] = (int(tp.offset), rebuild_point(tp))

    def dropped(self, shards: set[Shard]) -> None:
        """These shards are no longer owned here (revoked, lost, released)."""
        self.assigned.difference_update(shards)
        for shard in shards:
            self.marks.pop(shard, None)
            self._stored.pop(shard, None)

    def lost_while_away(
        self, marks: Mapping[Shard, int], ends: Mapping[Shard, int], starts: Mapping[Shard, int]
    ) -> set[Shard]:
        """The shards whose watermark in Redis (``marks``) is below the one a replica stored
        for the group's commit (``ends``: watermark + 1, :func:`commit_of`): Redis lost writes
        it had taken while no replica read the shard — a restart from an AOF missing its tail,
        a failover, between one replica's end and the next one's start — so no claim's check
        of the watermark saw it go back (claim.lua ARGV[10]). They are read again from
        ``starts`` as rolled back (what the journal holds is left out or forgotten)."""
        lost = writes_lost(marks, ends)
        for shard in sorted(lost):
            logger.error(
                "redis lost writes to %s[%d] while no replica read it (watermark %d, the "
                "group's committed offset %d; or the offset was moved): re-reading from %d",
                shard.topic,
                shard.partition,
                marks[shard],
                ends[shard],
                starts[shard],
            )
            self.metrics.rebuilds.labels(delay_topic=shard.topic, cause="redis-lost-writes").inc()
        return lost

    def rebuild(self, lost: dict[Shard, Lost]) -> None:
        """Re-read lost shards from a point Redis still covers, or from the rebuild point."""
        where: dict[Shard, int] = {}
        missing = [s for s, loss in lost.items() if loss.watermark is None and s in self.assigned]
        if missing:
            try:
                where = rebuild_points(self.consumer, missing, COMMITTED_TIMEOUT_S)
                for shard in [s for s, offset in where.items() if offset < 0]:
                    # Never committed: from where the log starts, read again all the same (the
                    # journal says what of it is settled), not as a new incarnation's first read.
                    where[shard], _ = self.consumer.get_watermark_offsets(
                        TopicPartition(shard.topic, shard.partition),
                        COMMITTED_TIMEOUT_S,
                        cached=False,
                    )
            except KafkaException as exc:
                raise KafkaFault(f"reading committed offsets for a rebuild failed: {exc}") from exc
        starts: dict[Shard, int] = {}
        rolled_back: dict[Shard, int] = {}
        for shard, loss in lost.items():
            if shard not in self.assigned:
                continue
            name = f"{shard.topic}[{shard.partition}]"
            # A rolled-back shard keeps its mark, which holds its claims back (claim.lua), until
            # the records Redis put back are forgotten (on_reread).
            had = self.marks.pop(shard, None) if loss.watermark is None else self.marks.get(shard)
            if loss.watermark is None:
                offset = where[shard]
                logger.error(
                    "redis lost the state of %s (watermark %s): rebuilding it from offset %s "
                    "(the lowest pending one committed); records delivered since then are "
                    "delivered again",
                    name,
                    had,
                    offset if offset >= 0 else "earliest",
                )
            else:
                offset = loss.watermark + 1
                logger.error(
                    "redis lost writes to %s (watermark back from %s to %d): re-reading from %d",
                    name,
                    had,
                    loss.watermark,
                    offset,
                )
                rolled_back[shard] = loss.watermark
            self.consumer.seek(TopicPartition(shard.topic, shard.partition, offset))
            starts[shard] = offset
            cause = "redis-lost-state" if loss.watermark is None else "redis-lost-writes"
            self.metrics.rebuilds.labels(delay_topic=shard.topic, cause=cause).inc()
        try:
            self._on_reread(starts, set(rolled_back))
        finally:
            self.marks.update(rolled_back)

    def bind(
        self,
        shards: Sequence[Shard],
        went_back: Sequence[Shard] = (),
        ids: Mapping[str, str] | None = None,
    ) -> dict[Shard, Bound]:
        """Bind shards to their topic's current id; returns the ones whose Redis state belonged
        to an earlier incarnation (or whose offsets went back) and was retired. Their waiting
        records move to a retired shard the mover drains; the caller reads them from the log's
        beginning."""
        if ids is None:
            ids = self._topic_ids(sorted({s.topic for s in shards}))
        bind = {s: ids.get(s.topic, "") for s in shards if s.topic in ids or s in went_back}
        if not bind:
            return {}
        replaced = {s: b for s, b in self.store.layout.bind(bind, went_back).items() if b.replaced}
        for shard, bound in replaced.items():
            topic_id = ids.get(shard.topic, "")
            if bound.stored_id and topic_id and bound.stored_id != topic_id:
                cause = "topic-recreated"
                what = f"was deleted and created again (topic id {bound.stored_id} -> {topic_id})"
            else:
                cause = "offsets-went-back"
                what = (
                    f"went back: its log holds offsets Redis had already handled (watermark "
                    f"{bound.watermark}); the log was truncated, restored or replaced"
                )
            logger.error(
                "delay topic %s %s: reading it again from its beginning; the %d records Redis "
                "held from before are still delivered, records delivered before may be "
                "delivered again",
                shard,
                what,
                bound.records,
            )
            self.metrics.rebuilds.labels(delay_topic=shard.topic, cause=cause).inc()
            self.marks.pop(shard, None)
        return replaced

    def went_back(self, read: Iterable[tuple[Shard, int]]) -> set[Shard]:
        """Shards of which an offset at or below the watermark was read: their offsets went back
        (the topic was recreated, or its log truncated). Their state is retired and they are read
        from the start; the caller drops what it read of them."""
        read = list(read)
        back = {
            s
            for s, offset in read
            if offset <= self.marks.get(s, offset - 1) and offset < self.resumed.get(s, offset + 1)
        }
        for s, offset in read:  # past the watermark: what was resumed below it is read again
            if s in self.resumed and offset > self.marks.get(s, offset):
                del self.resumed[s]
        if back:
            self.restart(self.bind(sorted(back), sorted(back)))
        return back

    def check_incarnations(self) -> None:
        """A topic deleted and created again while the bridge runs (see :meth:`bind`), by the
        topic ids last heard from Kafka: the ingress loop never waits on Kafka for it (when Kafka
        is down that wait would hold up every batch)."""
        try:
            self.restart(self.bind(sorted(self.assigned), ids=self._known_ids()))
        except StoreError as exc:
            logger.warning("delay topic incarnations not checked: %s", exc)

    def restart(self, replaced: dict[Shard, Bound]) -> None:
        for shard in replaced:
            self.consumer.seek(TopicPartition(shard.topic, shard.partition, OFFSET_BEGINNING))
        self._on_reread(dict.fromkeys(replaced, OFFSET_BEGINNING), set())
        retired = {b.retired for b in replaced.values() if b.retired is not None}
        if retired:
            self._on_retired(retired)
