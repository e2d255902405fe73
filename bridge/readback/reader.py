"""Records read back from a delay topic by offset: runs of nearby offsets read on, gaps sought."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from bridge.errors import KafkaFault
from bridge.readback.runs import MAX_GAP, runs
from bridge.store import Shard

logger = logging.getLogger(__name__)

STALL_S = 30.0  # a run that gets no record for this long fails (the next pass reads it again)
POLL_S = 0.5
BATCH = 500
_GONE = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})


class Reader:
    """One consumer, assigned to one delay-topic partition at a time (no group, no commits)."""

    def __init__(
        self,
        consumer: Consumer,
        *,
        on_fetched: Callable[[int, int], None] = lambda records, size: None,
        stall_s: float = STALL_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.consumer = consumer
        self._on_fetched = on_fetched  # records consumed and their bytes, skipped ones included
        self.stall_s = stall_s
        self.poll_s = poll_s  # the longest one wait for the broker's next answer
        self._assigned: Shard | None = None
        self._next = -1  # the offset the consumer returns next in the assigned partition
        # The consumer reached the log's end since it last moved (and said so, once): read on
        # from there, it would say nothing more — a read seeks, and is told again.
        self._at_end = False
        self._known: set[str] = set()  # topics whose metadata the consumer holds

    def read(self, shard: Shard, offsets: Sequence[int]) -> dict[int, Message | None]:
        """The record at each of ``offsets``, or None where the log no longer holds one (deleted
        by retention or delete-records, or the log ends before it). Raises :class:`KafkaFault`
        when Kafka does not answer: nothing is decided about the offsets then."""
        if shard.topic not in self._known:
            self._learn(shard.topic)
        found: dict[int, Message | None] = {}
        end: int | None = None  # the log's end as its leader gave it in this read
        for run in runs(offsets):
            in_log, end = self._in_log(shard, run, found, end)
            if in_log:
                self._read_run(shard, in_log, found)
        return found

    def bounds(self, shard: Shard, timeout_s: float = 2.0) -> tuple[int, int]:
        """The partition's log start and end offsets, asked of its leader. Raises
        :class:`KafkaFault` when Kafka does not answer."""
        tp = TopicPartition(shard.topic, shard.partition)
        try:
            low, high = self.consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
        except KafkaException as exc:
            raise KafkaFault(f"the log bounds of {shard}: {exc}") from None
        return int(low), int(high)

    def release(self) -> None:
        """Stop fetching until the next read: a consumer left assigned goes on fetching at the
        end of the log (fetches return at once: ~800 a second, a sixth of the broker's core)."""
        if self._assigned is not None:
            try:
                self.consumer.unassign()
            except KafkaException as exc:
                raise KafkaFault(f"read-back consumer: {exc}") from None
            self._assigned = None

    def close(self) -> None:
        """Close the consumer."""
        self.consumer.close()

    def _in_log(
        self, shard: Shard, run: list[int], found: dict[int, Message | None], end: int | None
    ) -> tuple[list[int], int | None]:
        """The offsets of ``run`` before the log's end; those at or past it are None in
        ``found`` (read, no record would come, nor the end-of-partition event a consumer already
        at the end was given). The end as the consumer's fetches last saw it, asked of the leader
        when that does not put the whole run before it — once a read (``end``: its answer so
        far, returned with the offsets): the offsets asked for were read from the log before,
        and its end only grows."""
        if end is not None and run[-1] < end:
            return run, end
        tp = TopicPartition(shard.topic, shard.partition)
        try:
            high = self.consumer.get_watermark_offsets(tp, cached=True)[1]
        except KafkaException:
            high = -1
        if 0 <= run[-1] < high:
            return run, end
        if end is None:
            end = self.bounds(shard)[1]
        for offset in run:
            if offset >= end:
                found[offset] = None
        return [o for o in run if o < end], end

    def _read_run(self, shard: Shard, wanted: list[int], found: dict[int, Message | None]) -> None:
        self._position(shard, wanted[0])
        i, deadline = 0, time.monotonic() + self.stall_s
        while i < len(wanted):
            if time.monotonic() > deadline:
                raise KafkaFault(
                    f"read-back of {shard} offsets {wanted[i]}..{wanted[-1]} got no "
                    f"record for {self.stall_s:.0f}s"
                )
            # Never more than the run needs: what follows it stays unread for the next run.
            want = max(1, min(BATCH, wanted[-1] - self._next + 1))
            messages = self._fetched(want)
            size = 0
            for msg in messages:
                error = msg.error()
                if error is not None:
                    i = self._on_error(shard, error, wanted, i, found)
                    if i >= len(wanted):
                        break
                    continue
                offset = msg.offset()
                assert offset is not None
                self._next, self._at_end = offset + 1, False
                size += len(msg.value() or b"") + len(msg.key() or b"")
                while i < len(wanted) and wanted[i] < offset:  # skipped by the log: gone
                    found[wanted[i]] = None
                    i += 1
                if i < len(wanted) and wanted[i] == offset:
                    found[offset] = msg
                    i += 1
            if messages:
                deadline = time.monotonic() + self.stall_s
                self._on_fetched(len(messages), size)

    def _fetched(self, want: int) -> list[Message]:
        """Up to ``want`` records (or events), as soon as the first is in: consume(n, timeout)
        would wait for all n, and offsets holding no record (a transaction's markers, records
        compacted away) never come — each such run waited out the poll."""
        first = self.consumer.poll(self.poll_s)
        if first is None:
            return []
        return [first, *self.consumer.consume(want - 1, 0)] if want > 1 else [first]

    def _on_error(
        self,
        shard: Shard,
        error: KafkaError,
        wanted: list[int],
        i: int,
        found: dict[int, Message | None],
    ) -> int:
        """Handle a consumer event while reading ``wanted`` from index ``i``; returns the index
        reading goes on from."""
        code = error.code()
        if code == KafkaError._PARTITION_EOF:  # the log ends before the rest of the run
            self._at_end = True
            for offset in wanted[i:]:
                found[offset] = None
            return len(wanted)
        if code in _GONE:  # the offset is outside the log: which ones are still in it?
            low, high = self.bounds(shard, 10)
            while i < len(wanted) and (wanted[i] < low or wanted[i] >= high):
                found[wanted[i]] = None
                i += 1
            if i < len(wanted):
                self._seek(shard, wanted[i])
            return i
        if error.fatal():
            raise KafkaFault(f"read-back consumer: {error}")
        logger.warning("read-back of %s: %s", shard, error, extra={"repeat_key": "read-back"})
        return i

    def _learn(self, topic: str) -> None:
        """Fetch ``topic``'s metadata: assigned a topic it does not know, the consumer waits for
        librdkafka's refresh of unknown topics, once a second, before its first fetch."""
        try:
            self.consumer.list_topics(topic, timeout=10)
        except KafkaException as exc:
            raise KafkaFault(f"read-back of {topic}: {exc}") from None
        self._known.add(topic)

    def _position(self, shard: Shard, offset: int) -> None:
        """Make ``offset`` the next one read: read on when it lies a little ahead, else seek."""
        if (
            shard == self._assigned
            and not self._at_end
            and self._next <= offset <= self._next + MAX_GAP
        ):
            return
        self._seek(shard, offset)

    def _seek(self, shard: Shard, offset: int) -> None:
        self._at_end = False
        tp = TopicPartition(shard.topic, shard.partition, offset)
        if shard == self._assigned:
            try:
                self.consumer.seek(tp)
                self._next = offset
                return
            except KafkaException:  # not fetching yet: assigning again seeks too
                pass
        self.consumer.assign([tp])
        self._assigned = shard
        self._next = offset
