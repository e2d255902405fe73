"""The read-back loop: references falling due soon, read from the delay topic and stored whole.

What falls due soon is stored whole, at least ``store.fetch_ahead`` before it is due, so the mover
delivers it as any record.

Each pass asks Redis for the chunks of references whose time bucket starts within
``store.fetch_ahead`` and the time to read them (``StoreConfig.read_ahead_ms``) in the shards this
replica owns, reads their records (:class:`Reader`),
and promotes each chunk in one script call (promote.lua), which stores a chunk once whatever
happens: a crash before it leaves the chunk to be read again, a chunk another replica promoted
meanwhile is left alone. A record no longer in the topic, or one the rules refuse by now, is
stored bound for the DLQ at its due time; a retired incarnation's references have no topic left
to read: all of them are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import Message

from bridge.dialects import parse_message
from bridge.errors import StoreError, log_failed_turn
from bridge.kafka import headers_of
from bridge.message import (
    Reason,
    Rejected,
    Rules,
    Scheduled,
    dead_letter_when_due,
    format_time_ms,
)
from bridge.metrics import Metrics
from bridge.readback.reader import Reader
from bridge.store import Chunk, PerLane, Shard, Store, lane_firsts, lane_of, member, score

logger = logging.getLogger(__name__)

RETRY_S = (0.5, 1.0)  # back-off after a failed pass (short: resumes soon after a fault ends)


class ReadBack:
    """Promotes the owned shards' references whose bucket starts within ``read_ahead_ms``."""

    def __init__(
        self,
        store: Store,
        reader: Reader,
        rules: Rules,
        metrics: Metrics,
        *,
        owned: Callable[[], frozenset[Shard]],
        read_ahead_ms: int,
        on_stored: Callable[[Mapping[Shard, PerLane]], None] = lambda earliest: None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.store = store
        self.reader = reader
        self.rules = rules
        self.metrics = metrics
        self.owned = owned
        self.read_ahead_ms = read_ahead_ms
        self._on_stored = on_stored
        self._clock_ms = clock_ms  # parsing only (due times come from the references)
        # How often a pass looks for chunks falling due: often enough that a bucket is read
        # back within a few percent of the lead of when it could be.
        self.interval_s = min(1.0, read_ahead_ms / 40_000)
        self.last_loop = time.monotonic()
        self._failures = 0
        self._promoter = ThreadPoolExecutor(1, thread_name_prefix="promote")

    def run(self, stop: threading.Event) -> None:
        """Pass until ``stop`` is set; a failed pass is tried again after a back-off."""
        try:
            while not stop.is_set():
                self.last_loop = time.monotonic()
                try:
                    busy = self.pass_once()
                except Exception as exc:  # Redis or Kafka away, or a bug: read again later
                    wait = RETRY_S[min(self._failures, len(RETRY_S) - 1)]
                    self._failures += 1
                    if isinstance(exc, StoreError):
                        self.metrics.redis_errors.labels(stage="read-back").inc()
                    log_failed_turn(
                        logger,
                        exc,
                        "read-back failed, retrying in %.1fs: %s",
                        wait,
                        exc,
                        level=logging.WARNING,
                        extra={"repeat_key": "read-back-failed"},
                    )
                    stop.wait(wait)
                    continue
                self._failures = 0
                if not busy:
                    stop.wait(self.interval_s)
        finally:
            self._promoter.shutdown()
            self.reader.close()

    def pass_once(self) -> int:
        """Read back and promote the chunks whose bucket starts within ``read_ahead_ms``; returns
        chunks done."""
        owned = self.owned()
        if not owned:
            return 0
        now = self.store.time_ms()
        done = 0
        chunks = self.store.references.due(sorted(owned), now + self.read_ahead_ms)
        # Bucket by bucket; within one, a shard's chunks in offset order (one read on).
        chunks.sort(key=lambda c: (c.start_ms, c.shard, c.data[:8]))
        # A chunk is promoted while the next one is read and parsed: Redis's half of the work
        # overlaps the interpreter's (docs/bench/history.md, far-future records).
        promoting: Future[bool] | None = None
        try:
            for chunk in chunks:
                if chunk.shard not in self.owned():  # revoked meanwhile: its next owner reads it
                    continue
                members = self._members(chunk)
                if promoting is not None:
                    done += promoting.result()
                promoting = self._promoter.submit(self._promote, chunk, members)
        finally:
            if promoting is not None:
                done += promoting.result()
            self.reader.release()
        return done

    def _promote(self, chunk: Chunk, members: list[tuple[int, int, bytes, str]]) -> bool:
        """Promote ``chunk`` with its records read back; whether it was (not: promoted by another
        replica meanwhile, or renamed as it filled, so it is read again)."""
        stored = self.store.references.promote(chunk, [(s, m) for _, s, m, _ in members])
        if stored is None:
            return False
        after = self.store.time_ms()
        self.metrics.read_back_ahead.observe_many(
            max(0.0, (due - after) / 1000) for due, _, _, _ in members
        )
        for result, n in Counter(r for _, _, _, r in members).items():
            self.metrics.read_back.labels(result=result).inc(n)
        self._on_stored({chunk.shard: lane_firsts((lane_of(s), due) for due, s, _, _ in members)})
        return True

    def _members(self, chunk: Chunk) -> list[tuple[int, int, bytes, str]]:
        """(due ms, score, member, result) for each reference of ``chunk``, in its order."""
        shard = chunk.shard
        refs = chunk.references()
        if shard.incarnation:
            messages: dict[int, Message | None] = {}
            gone = (
                "its delay topic was deleted and created again (or its offsets went back) "
                "before it was read back"
            )
        else:
            messages = self.reader.read(shard, [o for o, _ in refs])
            gone = (
                "it was gone from the delay topic when it was read back (retention, "
                "delete-records, or the topic recreated)"
            )
        out, missing = [], []
        now_ms = self._clock_ms()  # one reading a chunk: its records were read together
        for offset, due in refs:
            msg = messages.get(offset)
            if msg is None:
                detail = f"offset {offset} of {shard} (due {format_time_ms(due)}): {gone}"
                record, result = missing_record(shard, offset, due, detail), "missing"
                missing.append(offset)
            else:
                record, result = parse_read_back(self.rules, shard, (offset, due), msg, now_ms)
            out.append((due, score(record), member(record, shard.topic, shard.partition), result))
        if missing:  # one line a chunk, not a record
            logger.warning(
                "%d records of %s (offsets %d..%d): %s; dead-lettered as "
                "payload-missing at their due times",
                len(missing),
                shard,
                missing[0],
                missing[-1],
                gone,
                extra={"repeat_key": "payload-missing"},
            )
        return out


def parse_read_back(
    rules: Rules, shard: Shard, reference: tuple[int, int], msg: Message, now_ms: int
) -> tuple[Scheduled, str]:
    """The record a reference (``offset``, ``due``) stands for, read back as ``msg``, as it is
    stored: itself, or bound for the DLQ when the rules refuse it now or ``msg`` is another
    record than the one referenced; with the read-back result (``stored``, ``refused``,
    ``missing``)."""
    offset, due = reference
    stamped = msg.timestamp()[0] != 0
    try:
        record = parse_message(rules, (shard.topic, shard.partition, offset), msg, now_ms)
    except Rejected as refused:
        logger.warning(
            "offset %d of %s, read back, is refused now: %s; dead-lettered at its due time",
            offset,
            shard,
            refused,
            extra={"repeat_key": "read-back-refused"},
        )
        detail = f"read back: {refused.detail}"
        original = (msg.key(), msg.value(), headers_of(msg))
        return dead_letter_when_due(
            shard.topic,
            shard.partition,
            offset,
            due,
            reason=refused.reason,
            detail=detail,
            message=original,
        ), "refused"
    # The reference says when it is due; a record due at another time (with a timestamp, its
    # due time is the same however often it is read) is not the one referenced.
    if not isinstance(record, Scheduled) or (stamped and record.due_ms != due):
        detail = (
            f"offset {offset} of {shard} holds another record than the one referenced "
            f"(due {format_time_ms(due)}): the topic was recreated?"
        )
        logger.warning(
            "%s; dead-lettered as payload-missing at its due time",
            detail,
            extra={"repeat_key": "payload-missing"},
        )
        return missing_record(shard, offset, due, detail), "missing"
    # Lateness counts from the due time: a reference was never the producer's delay. (The
    # record was parsed just now and is not shared: set in place, dataclasses.replace costs
    # a tenth of a record's read-back.)
    record.due_ms, record.stored_ms = due, None
    return record, "stored"


def missing_record(shard: Shard, offset: int, due: int, detail: str) -> Scheduled:
    """A record to dead-letter as payload-missing at ``due``, in place of one that is gone."""
    return dead_letter_when_due(
        shard.topic, shard.partition, offset, due, reason=Reason.PAYLOAD_MISSING, detail=detail
    )
