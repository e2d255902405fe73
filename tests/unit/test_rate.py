"""egress.max_rate's token bucket, on a clock the test moves."""

from __future__ import annotations

import pytest

from bridge.egress.rate import RateLimit
from tests.conftest import Clock


def test_a_quiet_bucket_holds_a_tenth_of_a_second() -> None:
    clock = Clock()
    rate = RateLimit(20_000, clock)
    clock.now += 60
    assert rate.allowance() == 2000


def test_claims_at_the_limit_come_a_step_at_a_time() -> None:
    clock = Clock()
    rate = RateLimit(20_000, clock)
    rate.take(rate.allowance())
    assert rate.allowance() == 0
    assert rate.wait_s() == pytest.approx(0.01)  # a step: 200 records
    clock.now += 0.005
    assert rate.allowance() == 0  # half a step is not worth a claim
    clock.now += 0.005
    assert rate.allowance() == 200


def test_an_overdrawn_bucket_waits_the_longer() -> None:
    clock = Clock()
    rate = RateLimit(100, clock)  # a step of 1 record
    rate.take(rate.allowance() + 5)  # a claim of one record per shard took more than allowed
    assert rate.wait_s() == pytest.approx(0.06)
    clock.now += 0.06
    assert rate.allowance() == 1


def test_over_a_long_run_the_rate_is_kept() -> None:
    clock = Clock()
    rate = RateLimit(20_000, clock)
    claimed = 0
    for _ in range(3000):  # 3 s of a loop that claims whatever it may every millisecond
        clock.now += 0.001
        n = rate.allowance()
        rate.take(n)
        claimed += n
    assert 60_000 <= claimed <= 60_000 + 2000  # the rate, plus the first burst
