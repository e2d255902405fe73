"""Rejected delay-topic records sent to the DLQ with their reason.

Each copy is acknowledged or refused on its own: one too large for the DLQ goes again without its
value, and if even that does not fit, as a stub (the ``delay-error*`` headers and ``delay-origin``
only: the record stays in the delay topic); one the DLQ refuses holds its own partition only
(:class:`~bridge.ingress.holds.Holds`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from enum import Enum

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.ingress.batch import coords, shard_of
from bridge.journal import Entry, Fate, Journal
from bridge.kafka import headers_of, produce
from bridge.message import (
    H_ID,
    Rejected,
    Rules,
    cut,
    dead_letter_headers,
    origin,
    record_size,
    stub_detail,
    wire_headers,
    without_value,
)
from bridge.metrics import Metrics
from bridge.store import Shard

logger = logging.getLogger(__name__)

_TOO_LARGE = KafkaError.MSG_SIZE_TOO_LARGE

DLQ_FLUSH_TIMEOUT_S = 30.0


class Copy(Enum):
    """How much of a rejected record its DLQ copy carries: each form is tried once the one before
    it was refused as too large."""

    WHOLE = "whole"
    NO_VALUE = "no value"  # key and headers
    STUB = "stub"  # the delay-error* headers and delay-origin only


class DeadLetters:
    """The ingress's DLQ producer: a batch's rejected records go out, and Kafka acknowledges
    them, before the batch's valid records of their partitions are stored."""

    def __init__(
        self, producer: Producer, rules: Rules, metrics: Metrics, journal: Journal | None = None
    ) -> None:
        self.producer = producer
        self.rules = rules
        self.metrics = metrics
        self.journal = journal
        # The records of each partition whose copy the DLQ took (offset, timestamp: a topic
        # created again reuses offsets), until the ingress applies a batch past them: a batch
        # read again (Redis refused it) does not send them again.
        self._placed: dict[Shard, set[tuple[int, int]]] = {}

    def send(self, rejected: list[tuple[Message, Rejected]]) -> dict[Shard, tuple[int, str]]:
        """Dead-letter these records and wait for Kafka to take them. A copy the DLQ refuses as
        too large (the bridge's producer or the DLQ topic) goes again without its value, then as
        a stub; what is left out stays in the delay topic at ``delay-origin``. Returns, per
        partition, the lowest offset whose copy the DLQ still refused and why: its partition
        holds from there. A record whose copy the DLQ took before (its batch is read again)
        is not sent again."""
        rejected = [r for r in rejected if not self._was_placed(r[0])]
        failed, placed = self._send(rejected, Copy.WHOLE)
        for form in (Copy.NO_VALUE, Copy.STUB):
            too_large = [i for i, (code, _) in failed.items() if code == _TOO_LARGE]
            if not too_large:
                break
            again, placed_again = self._send([rejected[i] for i in too_large], form)
            for n, i in enumerate(too_large):
                if n in again:
                    failed[i] = again[n]
                else:
                    del failed[i]
                    placed[i] = placed_again[n]
        for i in placed:
            self._placed.setdefault(shard_of(rejected[i][0]), set()).add(_stamp(rejected[i][0]))
        if self.journal is not None:
            self._journal(rejected, placed)
        refused: dict[Shard, tuple[int, str]] = {}
        for i, (_, why) in failed.items():
            msg = rejected[i][0]
            shard, offset = shard_of(msg), coords(msg)[2]
            if shard not in refused or offset < refused[shard][0]:
                refused[shard] = (offset, f"DLQ produce to {self.rules.dead_letter} failed: {why}")
        if failed:
            self.metrics.dlq_errors.inc(len(failed))
        sent = Counter(r.reason for i, (_, r) in enumerate(rejected) if i not in failed)
        for reason, n in sent.items():
            self.metrics.dead_lettered.labels(reason=reason.value).inc(n)
        return refused

    def applied(self, marks: dict[Shard, int]) -> None:
        """The ingress applied each partition up to its offset in ``marks``: what the DLQ took
        up to there is not read again."""
        if not self._placed:
            return
        for shard in list(self._placed):
            offsets = {o for o in self._placed[shard] if o[0] > marks.get(shard, -1)}
            if offsets:
                self._placed[shard] = offsets
            else:
                del self._placed[shard]

    def _was_placed(self, msg: Message) -> bool:
        placed = self._placed.get(shard_of(msg))
        return placed is not None and _stamp(msg) in placed

    def _journal(
        self, rejected: Sequence[tuple[Message, Rejected]], placed: dict[int, tuple[int, int]]
    ) -> None:
        """Journal the fates of the records the DLQ took, by partition."""
        assert self.journal is not None
        at_ms = time.time_ns() // 1_000_000
        by_shard: dict[Shard, list[Entry]] = {}
        for i, (partition, offset) in sorted(placed.items()):
            msg, rejection = rejected[i]
            topic, shard_partition, record_offset = coords(msg)
            given = dict(headers_of(msg)).get(H_ID)
            try:
                delay_id = given.decode() if given else origin(*coords(msg))
            except UnicodeDecodeError:
                delay_id = origin(*coords(msg))
            entry = Entry(
                Fate.DEAD_LETTERED,
                record_offset,
                delay_id,
                -1,
                at_ms,
                self.rules.dead_letter,
                partition,
                offset,
                reason=rejection.reason.value,
            )
            by_shard.setdefault(Shard(topic, shard_partition), []).append(entry)
        for shard, entries in by_shard.items():
            self.journal.write(shard, entries)

    def _send(
        self, rejected: Sequence[tuple[Message, Rejected]], form: Copy
    ) -> tuple[dict[int, tuple[int | None, str]], dict[int, tuple[int, int]]]:
        """Produce the DLQ copies and wait for Kafka; returns the refused ones by index, with the
        error's code (None: no answer in time) and text, and where the DLQ put the others."""
        failed: dict[int, tuple[int | None, str]] = {}
        placed: dict[int, tuple[int, int]] = {}
        waiting: set[int] = set()

        def report(i: int) -> object:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                waiting.discard(i)
                if err is not None:
                    failed[i] = (err.code(), err.str())
                else:
                    placed[i] = (msg.partition() or 0, msg.offset() or 0)

            return on_delivery

        for i, (msg, rejection) in enumerate(rejected):
            where = origin(*coords(msg))
            key, value, headers = msg.key(), msg.value(), headers_of(msg)
            detail = rejection.detail
            if form is Copy.NO_VALUE:
                detail, value = without_value(detail, len(value or b""), where), None
            elif form is Copy.STUB:
                detail = stub_detail(detail, record_size(key, value, headers), where)
                key, value, headers = None, None, []
            logger.info(
                "dead-lettering %s: %s", where, cut(str(rejection), 300), extra={"origin": where}
            )
            headers = dead_letter_headers(headers, rejection.reason, detail, where)
            try:
                produce(
                    self.producer,
                    self.rules.dead_letter,
                    value=value,
                    key=key,
                    headers=wire_headers(headers),
                    on_delivery=report(i),
                )
                waiting.add(i)
            except KafkaException as exc:
                error = exc.args[0]
                failed[i] = (error.code(), error.str())
            self.producer.poll(0)
        self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
        for i in waiting:
            failed[i] = (None, f"not acknowledged within {DLQ_FLUSH_TIMEOUT_S:.0f} s")
        return failed, placed

    def flush(self) -> None:
        """Wait for what is still on its way to the DLQ (shutdown)."""
        self.producer.flush(DLQ_FLUSH_TIMEOUT_S)


def _stamp(msg: Message) -> tuple[int, int]:
    """A delay-topic record's offset and timestamp."""
    return coords(msg)[2], msg.timestamp()[1]
