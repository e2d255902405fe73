"""Reading the records the id index gives as candidates (:data:`bridge.store.Confirm`).

The id index keeps a hash of each delay-id: a candidate the scripts cannot confirm from Redis (a
reference, whose payload stays in Kafka; any record a cancel read in another partition names, its
timestamp deciding too) is read in the delay topic here, by the ingress, before add.lua or
withdraw.lua acts on it. One consumer, never a group member, made at the first read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from bridge.message import Rules
from bridge.readback.loop import parse_read_back
from bridge.readback.reader import Reader
from bridge.store import Shard


class IdReader:
    """The delay-id and timestamp of the records at given offsets of the delay topic."""

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

    def __call__(
        self, shard: Shard, asked: Sequence[tuple[int, int]]
    ) -> Mapping[int, tuple[str, int]]:
        """For each (offset, due ms) asked, the delay-id and timestamp of the schedule read there;
        an offset gone from the log, or holding another record than one due then, is left out.
        Raises :class:`bridge.errors.KafkaFault` when Kafka does not answer."""
        if self._reader is None:
            self._reader = self._new_reader()
        due = dict(asked)
        try:
            messages = self._reader.read(shard, sorted(due))
        finally:
            self._reader.release()
        out: dict[int, tuple[str, int]] = {}
        now_ms = self._clock_ms()
        for offset, msg in messages.items():
            if msg is not None:
                record, outcome = parse_read_back(
                    self.rules, shard, (offset, due[offset]), msg, now_ms
                )
                if outcome == "stored":
                    out[offset] = (record.delay_id, record.timestamp_ms)
        return out

    def close(self) -> None:
        """Close the consumer, if one was made."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
