"""Priority lanes without Redis: scores keep due times exact, and the mover's cut across shards."""

from __future__ import annotations

import pytest

from bridge.egress.lanes import Lanes
from bridge.egress.plan import Plan
from bridge.message import MIN_EPOCH_MS, Priority, Scheduled
from bridge.store import Claims, Shard, due_of, score

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
A, B = Shard("delay", 0), Shard("delay", 1)
NOW = 1_800_000_000_000


@pytest.mark.parametrize("due", [0, MIN_EPOCH_MS, NOW, 253_402_300_799_999])  # to the year 9999
def test_a_score_stands_for_its_due_time_in_its_lane(due: int) -> None:
    scores = {}
    for priority in Priority:
        rec = Scheduled(1, due, "t", None, None, [], "i", priority=priority)
        scores[priority] = score(rec)
        assert due_of(float(scores[priority])) == due  # exact as a double (Redis's score)
        assert float(scores[priority]) == scores[priority]
    assert scores[HIGH] < 0 <= scores[NORMAL] < scores[LOW]
    assert scores[NORMAL] == due  # a normal record is scored as before lanes existed


def claims(due: dict[Shard, frozenset[Priority]], *shards: Shard) -> Claims:
    return Claims([], NOW, dict.fromkeys(shards or tuple(due), NOW), 0.0, NOW, due_lanes=due)


def test_nothing_is_cut_while_the_bridge_keeps_up() -> None:
    lanes, plan = Lanes(set), Plan(0, 0)
    assert lanes.claimed(claims({}, A, B), plan).overdue_before_ms is None  # not a backlog
    assert lanes.cut() is None and lanes.limits([A, B]) is None


def test_high_records_due_anywhere_hold_the_lower_lanes_of_every_shard() -> None:
    draining: set[Priority] = set()  # the priorities of records in flight from a backlog
    lanes, plan = Lanes(lambda: draining), Plan(0, 0)
    assert lanes.claimed(claims({A: frozenset({HIGH, LOW}), B: frozenset({LOW})}), plan).lanes
    assert lanes.limits([A, B]) == {A: HIGH, B: HIGH}
    assert plan.claim_at(B) > NOW and plan.claim_at(A) == 0.0  # B has nothing to give: held
    # A's high records are claimed; while they are in flight, B's low ones still wait.
    draining.add(HIGH)
    lanes.claimed(claims({A: frozenset({LOW})}, A), plan)
    lanes.release(frozenset({A, B}), plan)
    assert lanes.cut() is HIGH and plan.claim_at(B) > NOW
    draining.clear()  # delivered: B is claimed at once, every lane open
    lanes.release(frozenset({A, B}), plan)
    assert lanes.cut() is None and plan.claim_at(B) == 0.0


def test_normal_records_due_hold_only_the_low_lane() -> None:
    lanes, plan = Lanes(set), Plan(0, 0)
    lanes.claimed(claims({A: frozenset({NORMAL}), B: frozenset({LOW})}), plan)
    assert lanes.limits([A, B]) == {A: NORMAL, B: NORMAL}


def test_a_shard_no_longer_owned_holds_nothing() -> None:
    lanes, plan = Lanes(set), Plan(0, 0)
    lanes.claimed(claims({A: frozenset({HIGH}), B: frozenset({LOW})}), plan)
    lanes.release(frozenset({B}), plan)  # A was revoked
    assert lanes.cut() is None and plan.claim_at(B) == 0.0


def test_a_lane_is_claimed_ahead_only_while_no_higher_one_falls_due_within_the_window() -> None:
    lanes, plan = Lanes(set), Plan(0, 0)
    assert lanes.ahead([A, B], NOW + 100) is None  # nothing known yet
    lanes.claimed(
        Claims(
            [],
            NOW,
            {A: None, B: None},
            0.0,
            NOW,
            earliest={A: (-1, NOW + 50, -1), B: (-1, -1, NOW + 10)},
        ),
        plan,
    )
    assert lanes.ahead([A, B], NOW + 100) is NORMAL  # A's normal ones are due within it
    assert lanes.ahead([A, B], NOW + 40) is None  # not yet
    lanes.claimed(Claims([], NOW, {B: None}, 0.0, NOW, earliest={B: (NOW + 90, -1, -1)}), plan)
    assert lanes.ahead([A, B], NOW + 100) is HIGH


def test_stored_lanes_with_no_time_in_any_lane_plan_nothing() -> None:
    """A batch whose lanes hold no due time (-1 each, or a value below zero from a store that took
    a pre-1970 due time) crashed the egress loop with ``min() arg is an empty sequence``."""
    lanes = Lanes(set)
    assert lanes.stored({A: (-1, -1, -1), B: (-1, NOW, -5)}) == {B: NOW}
