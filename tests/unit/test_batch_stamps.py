"""How far a parsed batch says each partition is read (bridge.ingress.batch.parse_batch's
``newest_ms``): a record stamped after the decision time counts for nothing."""

from __future__ import annotations

import re
import time

from bridge.egress.plan import DecisionClock
from bridge.ingress.batch import parse_batch
from bridge.message import H_AFTER, H_TARGET_TOPIC, Headers, Rules, parse_duration_ms
from bridge.store import Claims, Shard
from tests.unit.fake_message import message

NOW = 1_790_000_000_000
RULES = Rules(
    delay_topics=frozenset({"delay"}),
    default_targets={},
    allowed_targets=(re.compile(".*"),),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("7d"),
    max_record_bytes=10_000,
    dialects={},
)
A, B = Shard("delay", 0), Shard("delay", 1)


def parsed(*records: tuple[int, int, int], limit: int | None = None) -> dict[Shard, int]:
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_AFTER, b"1h")]
    messages = [message("delay", *r, b"v", headers) for r in records]
    return parse_batch(messages, RULES, NOW, limit).newest_ms


def test_the_newest_stamp_of_each_partition_is_how_far_it_is_read() -> None:
    assert parsed((0, 1, NOW - 30), (0, 2, NOW - 20), (1, 7, NOW - 50)) == {
        A: NOW - 20,
        B: NOW - 50,
    }


def test_a_stamp_after_the_decision_time_says_nothing_of_what_came_before_it() -> None:
    """A producer's clock an hour ahead: its record is stored, its stamp not trusted."""
    hour_ahead = NOW + 3_600_000
    assert parsed((0, 1, NOW - 30), (0, 2, hour_ahead), (0, 3, NOW - 10)) == {A: NOW - 10}
    assert parsed((0, 2, hour_ahead), (1, 7, NOW - 50)) == {B: NOW - 50}  # A: none trusted
    # The limit is the decision time given (the lesser of Redis's clock and this host's).
    assert parsed((0, 1, NOW - 30), limit=NOW - 40) == {}
    assert parsed((0, 1, NOW + 5), limit=NOW + 5) == {A: NOW + 5}
    assert parsed((0, 1, NOW - 30), limit=-1) == {}  # before a claim told Redis's time


def test_no_stamp_is_trusted_before_a_claim_told_redis_time() -> None:
    """The host's clock alone may be the one ahead: an hour, and the operator's commands run
    on the same host stamp their records an hour ahead too."""
    clock = DecisionClock(wall=lambda: NOW + 3_600_000)
    assert clock.stamp_limit() == -1
    clock.set(Claims([], NOW, {}, time.monotonic(), NOW))
    assert abs(clock.stamp_limit() - NOW) < 1_000  # Redis's time: the lesser clock
