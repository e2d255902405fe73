"""When the mover claims from a shard next, with claims ahead (egress.ahead, egress.tick)."""

from __future__ import annotations

import pytest

from bridge.egress.plan import CLAIMS_TIMED, Plan, ack_waits, ahead_limit, least_lead_ms
from bridge.message import Scheduled
from bridge.store import Claimed, Claims, Shard

A, B = Shard("delay", 0), Shard("delay", 1)
NOW = 1_800_000_000_000
TICK, AHEAD = 10, 100
LEAD = least_lead_ms(AHEAD)


def claimed(plan: Plan, next_ms: dict[Shard, int | None], now: int = NOW) -> None:
    """A claim at ``now`` that took a few records of each shard (not a full batch) and left
    each one's next due time at ``next_ms``."""
    plan.claimed(Claims([], now, next_ms, 0.0, now), per_shard=100, horizons={})


def test_the_lead_is_a_quarter_window_and_none_without_claims_ahead() -> None:
    assert least_lead_ms(100) == 25 and least_lead_ms(0) == 0


@pytest.mark.parametrize("after", [AHEAD + 1, AHEAD + 30, 5_000])
def test_a_shard_is_claimed_a_lead_before_its_next_record_falls_due(after: int) -> None:
    plan = Plan(TICK, AHEAD)
    claimed(plan, {A: NOW + after})
    assert plan.claim_at(A) == NOW + after - LEAD
    # Claimed then, the record is in the claim's window, a lead before it is due.
    assert plan.claim_at(A) + AHEAD >= NOW + after
    assert plan.to_claim([A], NOW + after - LEAD - 1) == []
    assert plan.to_claim([A], NOW + after - LEAD) == [A]


def test_a_steady_stream_is_claimed_three_quarters_of_a_window_apart() -> None:
    plan = Plan(TICK, AHEAD)
    now = NOW
    for _ in range(10):
        # What is due within the window is claimed; the next record is due just past it.
        claimed(plan, {A: now + AHEAD + 1}, now)
        nxt = plan.claim_at(A)
        assert nxt - now == AHEAD - LEAD + 1
        now = int(nxt)


def test_a_record_due_within_half_a_window_that_was_not_claimed_is_claimed_at_its_due_time() -> (
    None
):
    # A record with its own delay-id stays in Redis until due: the plan comes back to it then,
    # not before half a window (no claim after claim returning nothing meanwhile).
    plan = Plan(TICK, AHEAD)
    claimed(plan, {A: NOW + 30})
    assert plan.claim_at(A) == NOW + 30
    claimed(plan, {A: NOW + 70})
    assert plan.claim_at(A) == NOW + AHEAD / 2


def test_an_earlier_record_stored_moves_the_claim_to_a_lead_before_it() -> None:
    plan = Plan(TICK, AHEAD)
    claimed(plan, {A: NOW + 5_000, B: NOW + 5_000})
    plan.stored({A: NOW + 300}, {})
    assert plan.claim_at(A) == NOW + 300 - LEAD
    assert plan.claim_at(B) == NOW + 5_000 - LEAD  # untouched
    plan.stored({A: NOW + 400}, {})  # later than planned: no change
    assert plan.claim_at(A) == NOW + 300 - LEAD


def test_without_claims_ahead_a_shard_is_claimed_at_its_due_time() -> None:
    plan = Plan(TICK, 0)
    claimed(plan, {A: NOW + 500})
    assert plan.claim_at(A) == NOW + 500
    plan.stored({A: NOW + 200}, {})
    assert plan.claim_at(A) == NOW + 200


@pytest.mark.parametrize(
    ("took", "lead"), [([3.0, 12.0], LEAD), ([40.0, 5.0], 40.0), ([90.0], 50.0)]
)
def test_a_slow_claim_stretches_the_lead_to_its_length_up_to_half_a_window(
    took: list[float], lead: float
) -> None:
    # A claim of many records on a busy machine takes longer than the quarter window: its
    # records would reach memory after the first of them fell due.
    plan = Plan(TICK, AHEAD)
    for ms in took:
        plan.took(ms)
    assert plan.lead_ms == lead
    claimed(plan, {A: NOW + 5_000})
    assert plan.claim_at(A) == NOW + 5_000 - lead
    plan.stored({A: NOW + 300}, {})
    assert plan.claim_at(A) == NOW + 300 - lead


def test_the_lead_follows_the_last_claims_only() -> None:
    plan = Plan(TICK, AHEAD)
    plan.took(45.0)
    for _ in range(CLAIMS_TIMED - 1):
        plan.took(1.0)
    assert plan.lead_ms == 45.0
    plan.took(1.0)  # the slow one is out of the last CLAIMS_TIMED
    assert plan.lead_ms == LEAD


def took(shard: Shard, count: int) -> list[Claimed]:
    """``count`` records claimed from ``shard``."""
    record = Scheduled(0, NOW, "out", None, b"v", [], "delay:0:0")
    return [Claimed(shard, i.to_bytes(8, "big"), record, False) for i in range(count)]


@pytest.mark.parametrize("left_in", [5, 40, 90, 300])
def test_a_claim_the_limit_cut_short_is_followed_a_lead_before_the_first_record_it_left(
    left_in: int,
) -> None:
    # At a high rate the window holds more than the limit: the claim took the limit's records
    # of the window's first part, and what it left is due within the window.
    plan = Plan(TICK, 4 * AHEAD, limit=5)
    left = NOW + left_in
    plan.claimed(Claims([*took(A, 5), *took(B, 4)], NOW, {A: left, B: left}, 0.0, NOW), 100, {})
    assert plan.claim_at(A) == max(left - plan.lead_ms, NOW + TICK)  # a tick apart at least
    # Under the limit the window was whole: what it left there has its own delay-id, claimed at
    # its due time, and no later than half a window after this claim (a tick at the least).
    assert plan.claim_at(B) == max(min(left, NOW + 2 * AHEAD), NOW + TICK)


@pytest.mark.parametrize(("per_ms", "per_claim"), [(0.2, 60), (0.667, 200), (2.333, 250)])
def test_a_steady_stream_is_claimed_a_window_or_the_limit_at_a_time(
    per_ms: float, per_claim: int
) -> None:
    # Records of default delay-ids due every 1/per_ms ms, claimed as claim.lua would: those due,
    # then those due within the window, at most the limit of them.
    window, limit = 400, 250
    plan, now, claimed_to, sizes = Plan(TICK, window, limit=limit), 0.0, 0, []
    while now < 20_000:
        due = int(now * per_ms) + 1  # records 0..due-1 are due by now
        n = max(0, due - claimed_to) + limit
        n = min(n, int((now + window) * per_ms) + 1 - claimed_to)
        claimed_to += n
        sizes.append(n)
        nxt = int(claimed_to / per_ms) + 1  # the first record left
        plan.claimed(Claims(took(A, n), int(now), {A: nxt}, 0.0, int(now)), 500, {})
        assert nxt - plan.claim_at(A) <= plan.lead_ms + 1  # in memory by its due time
        now = plan.claim_at(A)
    steady = sizes[len(sizes) // 2 :]
    # Below the limit a claim takes three quarters of a window (the rest is the lead); above
    # it, the limit — so claims come per_claim / per_ms apart and no claim grows with the rate.
    assert abs(sum(steady) / len(steady) - per_claim) <= per_claim * 0.05 and max(steady) <= limit


def test_a_claim_ahead_takes_half_a_batch_at_most() -> None:
    assert ahead_limit(500) == 250 and Plan(TICK, AHEAD).limit is None


def test_acknowledgements_wait_for_the_next_claim_only_while_records_are_held_ahead() -> None:
    # Held records mean a claim within a window less the lead; without them (a drain's end,
    # records with their own ids) none may come soon, and the acks go alone after 75 ms.
    assert ack_waits(TICK, 400) == (75, 300)
    assert ack_waits(TICK, 100) == (75, 75) and ack_waits(TICK, 0) == (TICK, TICK)
    assert ack_waits(100, 400) == (100, 300)  # a tick at least


def test_a_shard_holding_records_back_is_claimed_again_when_the_hold_ends() -> None:
    """Records a claim took and the mover put back (a catch-up, or a hold the ingress began
    meanwhile) are due: the claim's own plan for their shard (its next record, 30 s out) did not
    count them. Held back 50 ms, the shard is claimed again then — not 30 s later."""
    plan = Plan(TICK, AHEAD)
    claimed(plan, {A: NOW + 30_000})
    plan.hold_back([A], NOW + 50)
    assert plan.to_claim([A], NOW + 49) == []
    assert plan.to_claim([A], NOW + 50) == [A]
