"""Partitions held at a record the DLQ refused: one bad record never blocks another partition.

A rejected record must reach the DLQ before its partition's offset moves past it (nothing is
dropped), so when the DLQ refuses its copy (the DLQ topic missing, not writable by the bridge,
too small even for the copy without its value) its partition stops there: the records before it
are stored, the partition is read again from it after a back-off, and every other partition goes
on. /readyz names each partition held, at which offset and why, until its record goes through.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from bridge.catchup import CatchUp
from bridge.health import Readiness
from bridge.store import Shard

logger = logging.getLogger(__name__)

HOLD_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # between tries of a held partition's record
CHECK = "ingress-dlq"


@dataclass
class Hold:
    """Where a partition waits, why, and when it is read again."""

    offset: int
    why: str
    until: float
    tries: int


class Holds:
    """The partitions the ingress holds at a refused DLQ copy."""

    def __init__(self, readiness: Readiness, catch_up: CatchUp) -> None:
        self.readiness = readiness
        self.catch_up = catch_up
        self._held: dict[Shard, Hold] = {}

    def hold(self, consumer: Consumer, shard: Shard, offset: int, why: str) -> None:
        """``shard`` waits at ``offset`` (its record's DLQ copy was refused): ``consumer`` stops
        reading it there for a back-off that grows with each refusal in a row."""
        where = TopicPartition(shard.topic, shard.partition, offset)
        consumer.pause([where])
        consumer.seek(where)
        now = time.monotonic()
        known = self._held.get(shard)
        tries = known.tries + 1 if known is not None and known.offset == offset else 1
        backoff = HOLD_BACKOFF_S[min(tries, len(HOLD_BACKOFF_S)) - 1]
        self._held[shard] = Hold(offset, why, now + backoff, tries)
        self.catch_up.block(shard, True)
        if tries == 1:
            logger.error(
                "%s waits at offset %d, read again every few seconds while the other "
                "partitions go on: %s",
                shard,
                offset,
                why,
            )
        self._tell()

    def read_again(self, consumer: Consumer, assigned: set[Shard]) -> None:
        """Forget the partitions no longer ``assigned``; ``consumer`` reads again, once each, those
        whose back-off is over (they stay held until their record goes through)."""
        self.keep(assigned)
        now = time.monotonic()
        due = [s for s, h in self._held.items() if h.until <= now]
        for shard in due:
            self._held[shard].until = float("inf")
        if due:
            consumer.resume([TopicPartition(s.topic, s.partition) for s in due])

    def waiting(self) -> set[Shard]:
        """The held partitions not read again yet."""
        return {s for s, h in self._held.items() if h.until != float("inf")}

    def passed(self, shards: set[Shard]) -> None:
        """These partitions' records went through: they are held no more."""
        gone = [s for s in shards if s in self._held]
        for shard in gone:
            logger.info("%s goes on past offset %d", shard, self._held.pop(shard).offset)
            self.catch_up.block(shard, False)
        if gone:
            self._tell()

    def keep(self, assigned: set[Shard]) -> None:
        """Forget the partitions no longer assigned here."""
        gone = [s for s in self._held if s not in assigned]
        for shard in gone:
            del self._held[shard]
            self.catch_up.block(shard, False)
        if gone:
            self._tell()

    def __contains__(self, shard: object) -> bool:
        return shard in self._held

    def _tell(self) -> None:
        if not self._held:
            self.readiness.ok(CHECK)
            return
        held = sorted(self._held.items())
        self.readiness.fail(
            CHECK, "; ".join(f"{s} waits at offset {h.offset}: {h.why}" for s, h in held)
        )
