"""The chaos checker's split of lateness at the end of a fault (pure logic: no servers)."""

from __future__ import annotations

from tests.chaos.checker import Checker, Expected, Seen, settle


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
