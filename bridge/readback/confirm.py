"""Reading the records the id index gives as candidates (:data:`bridge.store.Confirm`).

The id index keeps a hash of each delay-id: a candidate the scripts cannot confirm from Redis (a
reference, whose payload stays in Kafka; any record a cancel read in another partition names, its
timestamp deciding too) is read in the delay topic here, by the ingress, before add.lua or
withdraw.lua acts on it; and whether a partition's log holds records at all
(:data:`bridge.store.Logged`). One consumer, never a group member, made at the first read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from confluent_kafka import Message

from bridge.dialects import parse_message
from bridge.errors import KafkaFault
from bridge.message import Rejected, Rules, Scheduled
from bridge.readback.loop import parse_read_back
from bridge.readback.reader import Reader
from bridge.store import Shard

logger = logging.getLogger(__name__)

EMPTY_ASKED_AGAIN_S = 1.0  # a partition whose log held no records is asked again after this


class IdReader:
    """The delay-id and timestamp of the records at given offsets of the delay topic
    (:data:`bridge.store.Confirm`), and the schedules read there
    (:data:`bridge.store.Schedules`)."""

    def __init__(
        self,
        new_reader: Callable[[], Reader],
        rules: Rules,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._new_reader = new_reader
        self._reader: Reader | None = None
        self.rules = rules
        self._clock_ms = clock_ms
        self._held: set[Shard] = set()  # partitions whose log was found to hold records
        self._empty: dict[Shard, float] = {}  # found empty: asked again from this monotonic s

    def __call__(
        self, shard: Shard, asked: Sequence[tuple[int, int]]
    ) -> Mapping[int, tuple[str, int]]:
        """For each (offset, due ms) asked, the delay-id and timestamp of the schedule read there;
        an offset gone from the log, or holding another record than one due then, is left out.
        A due of -1 asks for whatever record is there (the one a recurring schedule is at, as
        the registry names it). Raises :class:`bridge.errors.KafkaFault` when Kafka does not
        answer."""
        due = dict(asked)
        messages = self._read(shard, sorted(due))
        out: dict[int, tuple[str, int]] = {}
        now_ms = self._clock_ms()
        anywhen = [o for o, d in due.items() if d < 0]
        for offset, record in self._parsed(shard, messages, anywhen, now_ms).items():
            out[offset] = (record.delay_id, record.produced_ms())
        for offset, msg in messages.items():
            if msg is not None and due[offset] >= 0:
                record, outcome = parse_read_back(
                    self.rules, shard, (offset, due[offset]), msg, now_ms
                )
                if outcome == "stored":
                    out[offset] = (record.delay_id, record.produced_ms())
        return out

    def schedules(self, shard: Shard, offsets: Sequence[int]) -> Mapping[int, Scheduled]:
        """For each offset asked, the schedule read there, as the ingress parsed it (a record's
        due time is the same however often it is read); an offset gone from the log, or holding
        no schedule, is left out. Raises :class:`bridge.errors.KafkaFault`."""
        messages = self._read(shard, sorted(offsets))
        return self._parsed(shard, messages, offsets, self._clock_ms())

    def _parsed(
        self,
        shard: Shard,
        messages: Mapping[int, Message | None],
        offsets: Sequence[int],
        now_ms: int,
    ) -> dict[int, Scheduled]:
        """The schedules among ``messages`` at ``offsets``, as the ingress parsed them."""
        out: dict[int, Scheduled] = {}
        for offset in offsets:
            msg = messages.get(offset)
            if msg is None:
                continue
            try:
                record = parse_message(
                    self.rules, (shard.topic, shard.partition, offset), msg, now_ms
                )
            except Rejected:
                continue
            if isinstance(record, Scheduled):
                out[offset] = record
        return out

    def logged(self, shards: Collection[Shard]) -> set[Shard]:
        """Those of ``shards`` whose log holds records (:data:`bridge.store.Logged`), or that
        Kafka did not say it of: a cancel waits on those. A partition found to hold records is not
        asked again; one found empty is, a second on."""
        now = time.monotonic()
        out = {s for s in shards if s in self._held}
        for shard in [s for s in shards if s not in out and self._empty.get(s, 0.0) <= now]:
            try:
                low, high = self._made().bounds(shard)
            except KafkaFault as exc:
                logger.warning("%s; a cancel that found nothing waits for it", exc)
                out.add(shard)
                continue
            if high > low:
                self._held.add(shard)
                out.add(shard)
            else:
                self._empty[shard] = now + EMPTY_ASKED_AGAIN_S
        return out

    def _made(self) -> Reader:
        """The reader, made at its first use."""
        if self._reader is None:
            self._reader = self._new_reader()
        return self._reader

    def _read(self, shard: Shard, offsets: Sequence[int]) -> Mapping[int, Message | None]:
        reader = self._made()
        try:
            return reader.read(shard, offsets)
        finally:
            reader.release()

    def close(self) -> None:
        """Close the consumer, if one was made."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
