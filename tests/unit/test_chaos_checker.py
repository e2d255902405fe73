"""The chaos checker's split of lateness at the end of a fault, and its oracle of a record an
operator fired, rescheduled or replayed (pure logic: no servers)."""

from __future__ import annotations

import dataclasses

from confluent_kafka import Message

from bridge.config import from_mapping
from bridge.message import H_CANCEL, H_DELIVER_AT, H_ID, H_TARGET_TOPIC, Headers
from testbed.checker import (
    IN_FLIGHT_MS,
    Checker,
    Expected,
    Seen,
    cancels_lost,
    expectations,
    met_again,
    settle,
)
from testbed.recurring import Occurrences
from testbed.workload import value_of
from tests.unit.fake_message import message


def _seen(seen_ms: int, appended_ms: int | None = None) -> Seen:
    stamp = seen_ms if appended_ms is None else appended_ms
    return Seen(seen_ms, stamp, "", None, None, None)


def _checker(arrivals: dict[int, list[Seen]]) -> Checker:
    checker = Checker("127.0.0.1:1", ["out", "dlq"], "g")  # never started
    checker.delivered.update(arrivals)
    return checker


def test_lateness_splits_at_the_end_of_the_last_fault_before_the_arrival() -> None:
    expected = {
        1: Expected("d:0:1", produced_ms=0, due_ms=1_000),  # due in the fault, 2 s after its end
        2: Expected("d:0:2", produced_ms=0, due_ms=10_500),  # due after it: all its own
        3: Expected("d:0:3", produced_ms=0, due_ms=500),  # delivered before the fault
    }
    checker = _checker({1: [_seen(12_000)], 2: [_seen(10_800)], 3: [_seen(600)]})
    account = settle(checker, expected, horizon_ms=10_000, faults=[(5_000, 10_000)])
    assert account.faults_timed
    assert account.during_fault_ms == [9_000, 0, 0]
    assert account.after_fault_ms == [2_000, 300, 100]
    assert account.recovery_ms == 2_000 and account.max_during_fault_ms == 9_000
    assert account.slowest[0] == (2_000, "d:0:1", 1_000, 12_000)


def test_recovery_counts_to_the_append_when_asked() -> None:
    """The checker's own consumer may be the one that waits after a Kafka fault."""
    expected = {1: Expected("d:0:1", produced_ms=0, due_ms=1_000)}
    checker = _checker({1: [_seen(40_000, appended_ms=11_000)]})
    by_append = settle(checker, expected, 10_000, faults=[(5_000, 10_000)], by_append=True)
    as_seen = settle(checker, expected, 10_000, faults=[(5_000, 10_000)])
    assert (by_append.recovery_ms, as_seen.recovery_ms) == (1_000, 30_000)


def test_a_record_that_arrived_while_the_fault_lasted_was_late_for_the_fault_alone() -> None:
    """The end a scenario records comes after the fault is over (a broker counted back once it
    is registered): what arrived before that moment is not the recovery's."""
    expected = {
        1: Expected("d:0:1", produced_ms=0, due_ms=1_000),  # due before the fault, in flight
        2: Expected("d:0:2", produced_ms=0, due_ms=7_000),  # due in it, arrived before its end
    }
    checker = _checker({1: [_seen(9_000)], 2: [_seen(9_500)]})
    account = settle(checker, expected, 10_000, faults=[(5_000, 10_000)])
    assert account.during_fault_ms == [8_000, 2_500]
    assert account.after_fault_ms == [0, 0]


def test_without_faults_all_lateness_is_after() -> None:
    expected = {1: Expected("d:0:1", produced_ms=0, due_ms=1_000)}
    account = settle(_checker({1: [_seen(1_250)]}), expected, 10_000)
    assert not account.faults_timed
    assert (account.recovery_ms, account.max_during_fault_ms) == (250, 0)


def _due(seen_ms: int, due_ms: int) -> Seen:
    return Seen(seen_ms, seen_ms, "", due_ms, None, None)


def test_a_fired_record_arrives_once_at_its_new_due_time_or_its_first() -> None:
    """``fire`` is the record again with a new due time (its value, so its seq), replacing the
    first exactly while it waits: the copy arrives, or the first did when it was claimed before
    the copy was read (the copy then schedules nothing); both is a duplicate, neither a loss."""
    first = Expected("d:0:1", produced_ms=0, due_ms=5_000)
    fired = met_again(first, Expected("d:0:9", produced_ms=1_000, due_ms=1_000))
    assert fired.earlier_dues == (5_000,) and fired.due_ms == 1_000
    both = settle(_checker({1: [_due(1_100, 1_000), _due(5_050, 5_000)]}), {1: fired}, 10_000)
    assert (both.delivered, both.lost, both.early, both.duplicates) == (1, [], [], 1)
    only_first = settle(_checker({1: [_due(5_050, 5_000)]}), {1: fired}, 10_000)
    assert (only_first.delivered, only_first.lost, only_first.duplicates) == (1, [], 0)
    neither = settle(_checker({}), {1: fired}, 10_000)
    assert neither.lost == ["d:0:9 (seq 1)"]
    early = settle(_checker({1: [_due(1_100, 1_000), _due(4_000, 5_000)]}), {1: fired}, 10_000)
    assert len(early.early) == 1
    twice = [_due(5_050, 5_000), _due(5_060, 5_000)]
    assert settle(_checker({1: twice}), {1: fired}, 10_000).duplicates == 1


def test_a_refused_copy_of_a_valid_record_may_be_dead_lettered_beside_it() -> None:
    valid = Expected("d:0:1", produced_ms=0, due_ms=5_000)
    again = met_again(valid, Expected("d:0:9", produced_ms=1_000, reason="too-large"))
    assert again == dataclasses.replace(valid, also_dead=frozenset({"too-large"}))
    checker = _checker({1: [_due(5_050, 5_000)]})
    checker.dead[1].append(Seen(1_100, 1_100, "", None, "too-large", "d:0:9"))
    account = settle(checker, {1: again}, 10_000)
    assert (account.delivered, account.misrouted) == (1, [])


def test_a_dlq_replay_refused_again_is_one_record_dead_lettered() -> None:
    refused = Expected("d:0:1", produced_ms=0, reason="bad-due-time")
    again = met_again(refused, Expected("d:0:7", produced_ms=9_000, reason="bad-due-time"))
    checker = _checker({})
    checker.dead[1] += [Seen(t, t, "", None, "bad-due-time", "d:0:1") for t in (10, 9_010)]
    account = settle(checker, {1: again}, 10_000)
    assert (account.dead_lettered, account.misrouted, account.lost) == (1, [], [])


def test_a_record_twice_is_stray_unless_its_first_copy_came_near_a_fault() -> None:
    """At least once, a copy again is one the fault caught in flight: its first copy delivered
    within IN_FLIGHT_MS of a fault (before it, its acknowledgement lost; during it, its lease
    run out). Twice anywhere else is a bug the run must report."""
    expected = {
        1: Expected("d:0:1", produced_ms=0, due_ms=1_000),  # first copy 14 s before the fault
        2: Expected("d:0:2", produced_ms=0, due_ms=30_000),  # first copy 14 s after its end
        3: Expected("d:0:3", produced_ms=0, due_ms=60_000),  # far from it
    }
    copies = {
        1: [_seen(1_000), _seen(16_000)],
        2: [_seen(34_000), _seen(40_000)],
        3: [_seen(60_000), _seen(60_500)],
    }
    account = settle(_checker(copies), expected, 100_000, faults=[(15_000, 20_000)])
    assert (account.duplicates, len(account.twice)) == (3, 3)
    assert account.stray == ["d:0:3: 2 copies, the first at 60000"]
    assert IN_FLIGHT_MS == 15_000  # the distances above are drawn against it


def test_an_occurrence_twice_is_in_flight_by_when_it_came_not_when_it_was_due() -> None:
    """As CI saw it: occurrences due at 16.7 s, held up until 42.5 s, then a Redis restart that
    rolled back their acknowledgements (the fault from 43 s to 48 s) — in flight at it, however
    long before its end they were due. One that came twice far from every fault is stray."""
    got = Occurrences()
    for occurrence, first in ((("c2", 16_700), 42_500), (("c9", 16_700), 16_800)):
        got.seen[occurrence] = first
        got.copies[occurrence] = 2
    got.seen[("c3", 16_800)], got.copies[("c3", 16_800)] = 42_500, 1
    assert got.twice() == [("c2", 16_700), ("c9", 16_700)]
    assert got.stray([(43_000, 48_000)]) == [("c9", 16_700)]
    assert got.stray([]) == got.twice()


def test_an_operators_copy_twice_is_stray_away_from_faults() -> None:
    fired = Expected("d:0:1", produced_ms=0, due_ms=5_000, earlier_dues=(1_000,))
    twice = [_due(1_100, 1_000), _due(1_200, 1_000), _due(5_050, 5_000)]
    account = settle(_checker({1: twice}), {1: fired}, 100_000, faults=[(40_000, 41_000)])
    assert account.duplicates == 2 and len(account.stray) == 1
    near = settle(_checker({1: twice}), {1: fired}, 100_000, faults=[(10_000, 11_000)])
    assert near.duplicates == 2 and near.stray == []


def _msg(partition: int, offset: int, ts: int, seq: int, headers: Headers) -> Message:
    """What expectations() reads of a consumed delay-topic record: ``seq`` in its value."""
    return message("d", partition, offset, ts, value_of(seq), headers)


def test_a_cancel_kafka_took_100_ms_before_due_must_win_in_its_partition() -> None:
    """README: a cancel produced at least 100 ms before its record's due time always wins in the
    record's partition (a record with a caller-given delay-id). By when Kafka acknowledged it:
    one taken later, or in another partition, or of a default id, may lose."""
    due = 1_800_000_000_000
    at: Headers = [(H_TARGET_TOPIC, b"out"), (H_DELIVER_AT, str(due).encode())]
    messages = [
        _msg(0, 0, due - 9_000, 0, [*at, (H_ID, b"job-1")]),
        _msg(0, 1, due - 2_000, 1, [(H_CANCEL, b"job-1")]),  # acknowledged 150 ms before
        _msg(0, 2, due - 9_000, 2, [*at, (H_ID, b"job-2")]),
        # Stamped 2 s before due, acknowledged 50 ms before: it may lose.
        _msg(0, 3, due - 2_000, 3, [(H_CANCEL, b"job-2")]),
        _msg(0, 4, due - 9_000, 4, [*at, (H_ID, b"job-3")]),
        _msg(1, 0, due - 2_000, 5, [(H_CANCEL, b"job-3")]),  # another partition
        _msg(0, 5, due - 9_000, 6, at),
        _msg(0, 6, due - 2_000, 7, [(H_CANCEL, b"d:0:5")]),  # a default id: claimed ahead
    ]
    expected = expectations(messages, from_mapping({}, env={}).rules())
    assert [expected[s].withdrawn_by for s in (0, 2, 4, 6)] == [(1,), (3,), (), ()]
    delivered = {s: [_due(due + 10, due)] for s in (0, 2, 4, 6)}
    acked = {1: due - 150, 3: due - 50, 5: due - 2_000, 7: due - 2_000}
    covered, [(seq, lost)] = cancels_lost(_checker(delivered), expected, acked)
    assert covered == 1 and seq == 0
    assert lost.startswith("d:0:0 (seq 0): delivered") and "150 ms before" in lost
    assert cancels_lost(_checker({2: delivered[2]}), expected, acked) == (1, [])
