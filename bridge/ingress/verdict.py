"""The ingress's verdict: which partitions it reads behind their end, told to the catch-up.

Said after each batch, while none comes, and between the slices of a hold (bridge.catchup says
what the mover makes of it). The ends are librdkafka's cached high watermarks: no request. A
partition whose read position and end stood still is asked its last stable offset, one per
verdict at most (:meth:`bridge.catchup.CatchUp.standing_still`).
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.catchup import CatchUp
from bridge.positions import Positions
from bridge.store import Shard

logger = logging.getLogger(__name__)

ASK_TIMEOUT_S = 0.5  # a partition's leader answers its last stable offset within this


class Verdict:
    """Tells the catch-up which of the assigned partitions are read behind their end."""

    def __init__(self, positions: Positions, catch_up: CatchUp) -> None:
        self.positions = positions
        self.catch_up = catch_up

    @property
    def consumer(self) -> Consumer:
        """The ingress's consumer, as now: it is started again after a fatal error."""
        return self.positions.consumer

    def __call__(self, *, reach: bool = False) -> list[Shard]:
        """Tell which shards are read behind the end their last fetch saw. ``reach``: also
        release the shards whose read position reached the end they were held to; returns those
        that ended a re-read after a loss. A hold gives it alone between its slices: what it
        holds can withdraw nothing."""
        assigned = self.positions.assigned
        if not assigned:
            return []
        consumer = self.consumer
        ends = self.catch_up.ends() if reach else {}
        behind: dict[Shard, tuple[int, int]] = {}
        over: list[Shard] = []  # re-reads after a loss that reached their end now
        tps = [TopicPartition(s.topic, s.partition) for s in assigned]
        for tp in consumer.position(tps):
            shard, position = Shard(tp.topic, tp.partition), tp.offset
            if shard in ends and self.catch_up.reached(shard, position):
                over.append(shard)
            end = consumer.get_watermark_offsets(tp, cached=True)[1]
            if position >= 0 and position < end:
                behind[shard] = (position, end)
        self.catch_up.behind(behind)
        if (still := self.catch_up.standing_still()) is not None:
            self._ask(consumer, *still)
        return over

    def _ask(self, consumer: Consumer, shard: Shard, seen: tuple[int, int]) -> None:
        """Ask ``shard``'s last stable offset: a read_committed consumer's ListOffsets for the
        latest offset answers it, where the cached watermark is the high one."""
        tp = TopicPartition(shard.topic, shard.partition)
        try:
            stable: int | None = consumer.get_watermark_offsets(tp, ASK_TIMEOUT_S, cached=False)[1]
        except KafkaException as exc:
            logger.debug(
                "%s[%d]: last stable offset not answered: %s", shard.topic, shard.partition, exc
            )
            stable = None
        self.catch_up.stable(shard, seen, stable)
