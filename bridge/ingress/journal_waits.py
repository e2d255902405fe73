"""Exactly once, a partition read again stores and claims nothing before the journal is read.

A re-read (bridge.ingress.settled) leaves out what the journal holds as delivered, cancelled,
replaced or dead-lettered; a journal that cannot be read then (a journal partition without a
leader for longer than the reader waits) used to be logged and the re-read gone on without it,
delivering those records again. With ``egress.exactly_once`` the partition waits instead: its
claims are held, what the consumer reads of it is dropped, and every RETRY_S it is read again
from the same offset, the journal first, until the journal answers; /readyz names it meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.catchup import JOURNAL, CatchUp
from bridge.health import Readiness
from bridge.store import ResumePoint, Shard, shard_names

logger = logging.getLogger(__name__)

# Membership.reading_again: partitions read from these offsets, those read again after Redis
# lost them, and Redis's resume points at an assignment.
ReadingAgain = Callable[
    [Mapping[Shard, int], Collection[Shard], Mapping[Shard, ResumePoint] | None], None
]

RETRY_S = 1.0  # how often a partition waiting for the journal reads it again
CHECK = "ingress-journal"  # /readyz while any waits


@dataclass(frozen=True)
class Waiting:
    """Where a partition waiting for the journal is read again from, and as what: ``again``,
    after Redis lost what it stored; ``points``, Redis's resume point of it at its assignment
    (None: it was no assignment)."""

    start: int
    again: bool
    points: Mapping[Shard, ResumePoint] | None


class JournalWaits:
    """The partitions read again that wait for the journal."""

    def __init__(self, catch_up: CatchUp, readiness: Readiness | None = None) -> None:
        self._catch_up = catch_up
        self._readiness = readiness  # /readyz names the partitions waiting (CHECK)
        self._waiting: dict[Shard, Waiting] = {}
        self._next_try = 0.0

    def wait(
        self,
        shards: Mapping[Shard, str],
        starts: Mapping[Shard, int],
        again: Collection[Shard],
        points: Mapping[Shard, ResumePoint] | None,
    ) -> None:
        """These partitions, read again from ``starts``, wait for the journal (``shards``: why
        it was not read)."""
        new = sorted(s for s in shards if s not in self._waiting)
        if new:
            logger.warning(
                "%s: nothing is stored or claimed until the journal can be read (exactly once: "
                "what it holds as settled must not be delivered again): %s",
                shard_names(new),
                shards[new[0]],
            )
        for shard in sorted(shards):
            mine = None if points is None else {s: p for s, p in points.items() if s == shard}
            self._waiting[shard] = Waiting(starts[shard], shard in again, mine)
            self._catch_up.hold(shard, True, JOURNAL)
        if shards:
            self._next_try = time.monotonic() + RETRY_S
        if new and self._readiness is not None:
            self._readiness.fail(
                CHECK,
                f"{shard_names(self._waiting)} read again, waiting for the journal: "
                f"{shards[new[0]]}",
            )

    def done(self, shards: Collection[Shard]) -> None:
        """These partitions' re-reads have the journal now (or are not read here any more)."""
        gone = [s for s in shards if s in self._waiting]
        for shard in gone:
            del self._waiting[shard]
            self._catch_up.hold(shard, False, JOURNAL)
        if gone:
            logger.info("%s: the journal is read, and so are they again", shard_names(gone))
            if not self._waiting and self._readiness is not None:
                self._readiness.ok(CHECK)

    def read_again(self, consumer: Consumer, reading_again: ReadingAgain) -> None:
        """``consumer`` reads the waiting partitions again from where each waits, at most once
        a RETRY_S, and ``reading_again`` (Membership.reading_again) reads the journal first."""
        if not self._waiting or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + RETRY_S
        for shard, waiting in sorted(self._waiting.items()):
            try:
                consumer.seek(TopicPartition(shard.topic, shard.partition, waiting.start))
            except KafkaException as exc:
                logger.warning("%s not read again yet: %s", shard, exc)
                continue
            reading_again({shard: waiting.start}, [shard] if waiting.again else [], waiting.points)

    def waiting(self) -> set[Shard]:
        """The partitions whose records are dropped as read."""
        return set(self._waiting)
