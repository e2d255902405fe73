"""egress.max_rate's token bucket and egress.max_rate_per_target's choices, on a clock the test
moves (the Redis side is tests/integration/test_rate_per_target.py)."""

from __future__ import annotations

from typing import cast

import pytest

from bridge.egress.rate import RateLimit, TargetLimits
from bridge.message import Scheduled
from bridge.metrics import Metrics
from bridge.store import Claimed, Claims, Shard, Store
from tests.conftest import Clock

A, B = Shard("delay", 0), Shard("delay", 1)
T0 = 1_800_000_000_000


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


def claimed(target: str, offset: int, shard: Shard = A) -> Claimed:
    record = Scheduled(offset, T0, target, b"k", b"v", [], f"delay:0:{offset}")
    return Claimed(shard, offset.to_bytes(8, "big"), record, False)


def limits(rates: dict[str, int], clock: Clock) -> TargetLimits:
    """The choices only: nothing here reaches the store or the metrics."""
    return TargetLimits(cast(Store, None), cast(Metrics, None), rates, 30_000, clock)


def test_a_targets_records_beyond_its_allowance_wait_and_other_targets_pass() -> None:
    targets = limits({"slow": 100}, Clock())  # a burst of 10
    claims = [claimed("slow", i) for i in range(15)] + [claimed("fast", i) for i in range(15, 20)]
    over = targets._over(claims, set(), set())
    assert [c.record.offset for c in over] == [10, 11, 12, 13, 14]
    assert targets.waiting == {"slow": {A: -1}}


def test_while_a_targets_records_wait_its_new_ones_join_them() -> None:
    clock = Clock()
    targets = limits({"slow": 100}, clock)
    targets.learn({A: {"slow"}})
    clock.now += 1  # the bucket is full again, but records wait before these
    assert len(targets._over([claimed("slow", i, B) for i in range(3)], set(), set())) == 3
    assert targets.waiting == {"slow": {A: -1, B: -1}}


def test_records_in_flight_or_put_back_never_wait() -> None:
    targets = limits({"slow": 100}, Clock())
    targets.learn({A: {"slow"}})
    again, back = claimed("slow", 1), claimed("slow", 2)
    assert targets._over([again, back], {(A, again.member)}, {(A, back.member)}) == []


def test_a_targets_allowance_is_shared_among_its_shards_with_records_due() -> None:
    clock = Clock()
    targets = limits({"slow": 100}, clock)
    targets.learn({A: {"slow", "gone"}, B: {"slow"}})
    assert targets._limits(T0, 1000, 500) == {(A, "slow"): 5, (B, "slow"): 5, (A, "gone"): 500}
    targets = limits({"slow": 100}, clock)
    targets.learn({A: {"slow"}, B: {"slow"}})
    assert targets._limits(T0, 4, 500) == {(A, "slow"): 2, (B, "slow"): 2}  # the room left


def test_a_claim_from_the_wait_indexes_plans_the_next_and_forgets_empty_ones() -> None:
    clock = Clock()
    targets = limits({"slow": 100}, clock)
    targets.learn({A: {"slow"}, B: {"slow"}})
    claims = Claims(
        [claimed("slow", 0)],
        T0,
        {A: None, B: T0 + 500},
        0.0,
        T0,
        due_lanes={},
        earliest={A: (-1, -1, -1), B: (-1, T0 + 500, -1)},
    )
    targets._claimed({"slow": claims})
    assert targets.waiting == {"slow": {B: T0 + 500}}
    assert targets._limits(T0, 1000, 500) == {}  # B's first record is not due yet
    assert targets.wait_s(T0) == pytest.approx(0.5)
    # Due records the claim did not take (a horizon): tried again 50 ms on, not in a busy loop.
    targets._claimed(
        {
            "slow": Claims(
                [], T0 + 500, {B: T0 + 500}, 0.0, T0 + 500, earliest={B: (-1, T0 + 500, -1)}
            )
        }
    )
    assert targets.waiting == {"slow": {B: T0 + 550}}
    targets._claimed({"slow": Claims([], T0, {B: None}, 0.0, T0, earliest={B: (-1, -1, -1)})})
    assert targets.waiting == {} and targets.wait_s(T0) is None
