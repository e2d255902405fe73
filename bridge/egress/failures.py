"""Failed deliveries: what is retried at once, what waits out a back-off, what goes to the DLQ.

A record leaves Redis only from a successful delivery report. Permanent failures (unknown topic,
too large, not authorized) are retried ``max_attempts`` times, then the record goes to the DLQ as
``delivery-failed`` and is acknowledged once the DLQ has it; a copy the DLQ refuses as too large
goes again without its value (it stays in the delay topic at ``delay-origin``), and a record the
DLQ refuses otherwise stays bound for it when it is claimed again. Transient failures end the
lease so the record is claimed again after a back-off. A record stored bound for the DLQ (a
far-future record whose payload was gone when it was read back) goes there at its due time. A
record produced later than its due time + its ``delay-max-lateness`` (else ``egress.max_lateness``)
goes to the DLQ as ``expired`` instead of its target, with its payload (:meth:`InFlight.expire`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError

from bridge.config import EgressConfig
from bridge.health import Readiness
from bridge.journal import delivered_entry
from bridge.message import (
    H_ERROR,
    H_ERROR_DETAIL,
    H_ORIGIN,
    Reason,
    dead_letter_headers,
    dead_letter_reason,
    format_duration_ms,
    format_time_ms,
    origin,
    record_size,
    stub_detail,
    without_value,
)
from bridge.metrics import Metrics
from bridge.store import Claimed, Shard

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger(__name__)

PERMANENT_ERRORS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_ARG,
    }
)
TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# A record whose delivery failed is claimable again after this long, doubling per failure.
RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS = 500, 5_000
RETRIES_KEPT = 100_000  # failure counts remembered (records another replica took are forgotten)

Ident = tuple[Shard, bytes]  # a claimed record: its shard and member


def backoff(base: float, cap: float, failures: int) -> float:
    """``base`` doubled per failure after the first, at most ``cap``."""
    return float(min(cap, base * 2 ** min(max(failures - 1, 0), 30)))


def by_shard(idents: Iterable[Ident]) -> dict[Shard, list[bytes]]:
    """Records (shard, member) grouped by shard, as the store's calls take them."""
    grouped: dict[Shard, list[bytes]] = defaultdict(list)
    for shard, member in idents:
        grouped[shard].append(member)
    return grouped


@dataclass(slots=True)
class InFlight:
    """A claimed record produced (or about to be) and not yet acknowledged."""

    claimed: Claimed
    attempts: int = 0
    dead_letter: bool = False
    error: str = ""  # Kafka's last refusal, for the DLQ's delay-error-detail
    sent_s: float = 0.0  # monotonic, when last produced; 0 once Kafka acknowledged it
    draining: bool = False  # claimed from a backlog: counts in Deliveries.draining
    value_left_out: bool = False  # its DLQ copy goes without its value (too large with it)
    stub: bool = False  # ... and then as a stub: too large even without its value
    placed: tuple[int, int] = (-1, -1)  # where Kafka put it: partition, offset
    expired: str = ""  # why it expired (its DLQ copy's delay-error-detail); "": it did not
    span: Span | None = None  # its delivery's send span, while one is open (bridge.tracing)
    # A recurring schedule's record carrying it on (topic and Producer.produce's fields),
    # produced with the occurrence and reported as one with it (bridge.egress.recurring).
    onward: tuple[str, dict[str, Any]] | None = None
    # The instant of the occurrence a recurring schedule's record delivers (None: it delivers
    # none, carried on alone): its lateness counts from there.
    occurrence_ms: int | None = None

    def expire(self, now_ms: int, default_ms: int) -> bool:
        """Whether it is too late to deliver at ``now_ms`` (see :meth:`Scheduled.expires_ms`):
        if so it is bound for the DLQ from now on, as ``expired``."""
        record = self.claimed.record
        if self.dead_letter or record.recurring:  # a schedule's delay-missed says instead
            return False
        expires_ms = record.expires_ms(default_ms)
        if expires_ms is None or now_ms <= expires_ms:
            return False
        self.dead_letter = True
        self.expired = (
            f"{format_duration_ms(now_ms - record.due_ms)} past its due time "
            f"{format_time_ms(record.due_ms)}: later than its max lateness "
            f"({format_duration_ms(expires_ms - record.due_ms)}) allows; bound for {record.target}"
        )
        return True

    def dlq_reason(self) -> str:
        """Its DLQ copy's ``delay-error``: the one it was stored with, expired, else
        delivery-failed."""
        record = self.claimed.record
        if self.expired:
            return Reason.EXPIRED.value
        reason = dead_letter_reason(record.headers) if record.dead_letter else ""
        return reason or Reason.DELIVERY_FAILED.value

    def fate(self, at_ms: int, dead_letter: str) -> str:
        """Its journal entry (JSON text) once Kafka took it (``at_ms``) where :attr:`placed`
        says: delivered, or dead-lettered to ``dead_letter``; delivered with no target for a
        recurring schedule's step that delivered no occurrence (``trace`` says carried-on)."""
        record = self.claimed.record
        if self.dead_letter:
            return delivered_entry(record, at_ms, dead_letter, self.placed, self.dlq_reason())
        if record.recurring and self.occurrence_ms is None:
            # A schedule's step that delivered nothing (skipped, paused, or carried on between
            # occurrences): no target, no place (what it produced went to the delay topic).
            return delivered_entry(record, at_ms, "", (-1, -1))
        return delivered_entry(record, at_ms, record.target, self.placed)

    def dlq_headers(self) -> list[tuple[str, bytes | None]]:
        """The headers of its DLQ copy."""
        record = self.claimed.record
        shard = self.claimed.shard
        where = origin(shard.topic, shard.partition, record.offset)
        if record.dead_letter:  # bound for the DLQ when it was stored, with its headers
            if not self.stub:
                return record.headers
            # The last of each is the bridge's own (a producer may have sent its own too).
            ours = {k: v or b"" for k, v in record.headers if k in (H_ERROR, H_ERROR_DETAIL)}
            size = record_size(record.key, record.value, record.headers)
            told = stub_detail(ours.get(H_ERROR_DETAIL, b"").decode(errors="replace"), size, where)
            return [
                (H_ERROR, ours.get(H_ERROR, b"")),
                (H_ERROR_DETAIL, told.encode()),
                (H_ORIGIN, where.encode()),
            ]
        reason, detail = Reason.EXPIRED, self.expired
        if not detail:
            reason = Reason.DELIVERY_FAILED
            detail = f"delivery to {record.target} failed {self.attempts} times: {self.error}"
        if self.stub:
            size = record_size(record.key, record.value, record.headers)
            return dead_letter_headers([], reason, stub_detail(detail, size, where), where)
        if self.value_left_out:
            detail = without_value(detail, len(record.value or b""), where)
        return dead_letter_headers(record.headers, reason, detail, where)


class Failures:
    """The decisions on failed delivery reports, and what they remember between claims: failures
    in a row per record (its back-off), records given up on whose DLQ copy failed, and the topics
    whose last report was a failure (/readyz)."""

    def __init__(
        self, metrics: Metrics, readiness: Readiness, *, dead_letter: str, config: EgressConfig
    ) -> None:
        self.metrics = metrics
        self.readiness = readiness
        self.dead_letter = dead_letter
        self.max_attempts = config.max_attempts
        self.max_lateness_ms = config.max_lateness  # the default of InFlight.expire
        self.failing: dict[str, str] = {}  # topic: the error of its last report, a failure
        self._retries: dict[Ident, int] = {}  # dropped when the record is delivered
        self._given_up: dict[Ident, InFlight] = {}  # claimed again, they go to the DLQ at once
        self._errors: Counter[str] = Counter()  # since the last report_batch, by error name
        self._failed: Counter[tuple[str, str, int]] = Counter()  # (topic, error, back-off ms)

    def topic(self, inflight: InFlight) -> str:
        """Where ``inflight`` is produced: its target, or the DLQ."""
        return self.dead_letter if inflight.dead_letter else inflight.claimed.record.target

    def resume(self, ident: Ident, inflight: InFlight) -> None:
        """A record claimed again whose DLQ copy failed: its attempts are spent, the DLQ's turn."""
        given_up = self._given_up.get(ident)
        if given_up is not None:
            inflight.dead_letter, inflight.attempts = True, given_up.attempts
            inflight.error, inflight.value_left_out = given_up.error, given_up.value_left_out
            inflight.stub = given_up.stub
            inflight.expired = given_up.expired

    def delivered(self, ident: Ident, inflight: InFlight) -> None:
        if self.failing:
            self.failing.pop(self.topic(inflight), None)
        self._retries.pop(ident, None)
        self._given_up.pop(ident, None)

    def failed(self, ident: Ident, inflight: InFlight, err: KafkaError) -> int | None:
        """A failed report: None to produce the record again at once (a permanent refusal with
        attempts left, or its DLQ copy without its value), else the back-off (ms) after which it
        is claimed again."""
        self._errors[err.name()] += 1
        if inflight.dead_letter and err.code() in TOO_LARGE and not inflight.stub:
            if inflight.value_left_out:
                inflight.stub = True  # too large even without its value
            inflight.value_left_out = True
            return None
        if err.code() in PERMANENT_ERRORS and not inflight.dead_letter:
            inflight.attempts += 1
            inflight.error = f"{err.name()}: {err.str()}"
            if inflight.attempts >= self.max_attempts:
                inflight.dead_letter = True
                logger.warning(
                    "delivery of %s to %s failed %d times (%s); dead-lettering",
                    inflight.claimed.record.delay_id,
                    inflight.claimed.record.target,
                    inflight.attempts,
                    err.str(),
                )
            return None
        topic = self.topic(inflight)
        self.failing[topic] = err.str()
        if len(self._retries) >= RETRIES_KEPT:
            self._retries.clear()
            self._given_up.clear()
        if inflight.dead_letter and not inflight.claimed.record.dead_letter:
            self._given_up[ident] = inflight
        tries = self._retries[ident] = self._retries.get(ident, 0) + 1
        wait_ms = int(backoff(RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS, tries))
        self._failed[(topic, err.str(), wait_ms)] += 1
        return wait_ms

    def report_batch(self) -> None:
        """Count the failures of a batch of reports; one line per topic and error, and a DLQ
        that refuses records fails /readyz."""
        for name, n in self._errors.items():
            self.metrics.delivery_errors.labels(error=name).inc(n)
        for (topic, error, wait_ms), n in sorted(self._failed.items()):
            if topic == self.dead_letter:
                self.metrics.dlq_errors.inc(n)
                self.readiness.fail("dlq-writes", f"DLQ produce to {topic} failed: {error}")
            logger.warning(
                "%d deliveries to %s failed (%s); retrying in %.1fs",
                n,
                topic,
                error,
                wait_ms / 1000,
            )
        self._errors.clear()
        self._failed.clear()
