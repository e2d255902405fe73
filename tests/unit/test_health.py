"""The ``fetching`` readiness check, fed with librdkafka statistics documents; the watch for
partitions a stable consumer group leaves to no member."""

from __future__ import annotations

from typing import Any

from bridge.health import UNFETCHED_S, FetchWatch, Readiness
from bridge.ingress.unowned import REJOIN_EVERY_S, UNOWNED_S, Group, Unowned
from bridge.store import Shard
from tests.conftest import Clock


def stats(**partitions: tuple[int, int]) -> dict[str, Any]:
    """A statistics document of topic ``delay``: partition → (leader, broker fetched from)."""
    parts = {
        pid.removeprefix("p"): {"leader": leader, "broker": broker}
        for pid, (leader, broker) in partitions.items()
    }
    parts["-1"] = {"leader": -1, "broker": -1}  # librdkafka's unassigned-partition entry
    return {"topics": {"delay": {"partitions": parts}}}


def test_a_partition_with_a_leader_fetched_from_no_broker_fails_readiness_once_it_lasts() -> None:
    readiness, clock = Readiness(), Clock()
    watch = FetchWatch(readiness, clock)
    owned = {Shard("delay", 0), Shard("delay", 1)}
    assert watch.update(stats(p0=(3, -1), p1=(2, 2)), owned) == []
    clock.now += UNFETCHED_S - 1
    assert watch.update(stats(p0=(3, -1), p1=(2, 2)), owned) == []  # a leader move takes this
    assert readiness.problems() == []
    clock.now += 1
    assert watch.update(stats(p0=(3, -1), p1=(2, 2)), owned) == [Shard("delay", 0)]
    [problem] = readiness.problems()
    assert f"delay[0] (leader 3) from no broker for {UNFETCHED_S:.0f}s" in problem
    assert watch.update(stats(p0=(3, 3), p1=(2, 2)), owned) == []  # fetched again
    assert readiness.problems() == []
    watch.update(stats(p0=(3, -1)), owned)
    clock.now += UNFETCHED_S
    watch.reset()  # the consumer started again: its wait starts again
    assert watch.update(stats(p0=(3, -1)), owned) == []


def test_no_leader_a_partition_not_owned_and_a_gap_in_the_wait_do_not_count() -> None:
    readiness, clock = Readiness(), Clock()
    watch = FetchWatch(readiness, clock)
    owned = {Shard("delay", 0)}
    for _ in range(3):
        # no leader (every replica down: Kafka's fault, not a stuck client); p1 is not ours
        assert watch.update(stats(p0=(-1, -1), p1=(3, -1)), owned) == []
        clock.now += UNFETCHED_S
    watch.update(stats(p0=(3, -1)), owned)
    clock.now += UNFETCHED_S - 1
    watch.update(stats(p0=(3, 3)), owned)  # fetched in between: the wait starts again
    clock.now += 2
    assert watch.update(stats(p0=(3, -1)), owned) == []
    assert readiness.problems() == []


def test_what_a_stage_gives_to_try_again_runs_on_each_round_of_the_probe_loop() -> None:
    readiness, tried = Readiness(), []
    readiness.fail("journal-writes", "refused")
    readiness.try_with(lambda: tried.append(1))
    readiness.try_with(lambda: readiness.ok("journal-writes"))
    readiness.try_again()
    assert tried == [1] and readiness.problems() == []


def group(stable: bool = True, **members: list[int]) -> Group:
    """A group of topic ``delay``: member id -> its partitions."""
    return Group(stable, {m: frozenset(Shard("delay", p) for p in ps) for m, ps in members.items()})


def test_a_partition_a_stable_group_leaves_unowned_has_its_least_loaded_member_rejoin() -> None:
    clock, said = Clock(), []
    answers: list[Group | None] = [group(a=[1, 2], b=[])]
    watch = Unowned(
        lambda: answers[-1], lambda: {"delay": 3}, lambda m, why: said.append((m, why)), clock
    )
    watch.check()
    clock.now += UNOWNED_S - 1  # a live member between the two steps of a move takes this
    watch.check()
    answers.append(None)  # Kafka did not answer: the wait so far stands
    clock.now += 1
    watch.check()
    answers.append(group(a=[1, 2], b=[]))
    watch.check()
    [(member, why)] = said
    assert member == "b"
    assert why.startswith("delay[0] owned by no member of the consumer group for 15s")
    clock.now += UNOWNED_S  # asked again at most every REJOIN_EVERY_S
    watch.check()
    assert len(said) == 1
    # Still unowned after the rejoin: its owner is in the group and silent in Redis (its
    # heartbeat fails); the sticky assignor keeps it there, so no rejoin asks again for it.
    clock.now += REJOIN_EVERY_S
    watch.check()
    assert len(said) == 1
    answers.append(group(a=[1], b=[]))  # one more unowned: a rejoin may assign that one
    watch.check()
    assert len(said) == 1  # once it waited UNOWNED_S itself
    clock.now += UNOWNED_S
    watch.check()
    assert [m for m, _ in said] == ["b", "b"]


def test_a_rebalance_or_every_partition_owned_asks_for_no_rejoin() -> None:
    clock, said = Clock(), []
    answers = iter(
        [
            group(a=[1, 2], b=[]),
            group(False, a=[1, 2], b=[]),
            group(a=[1, 2], b=[]),
            group(a=[1, 2], b=[0]),
        ]
    )
    watch = Unowned(lambda: next(answers), lambda: {"delay": 3}, lambda m, w: said.append(m), clock)
    for _ in range(4):  # the rebalance started the wait again; then the partition was assigned
        watch.check()
        clock.now += UNOWNED_S - 1
    assert said == []


def test_the_member_that_rejoins_owns_the_fewest_partitions_then_has_the_lowest_id() -> None:
    assert group(c=[0], a=[1, 2], b=[3]).least_loaded() == "b"
    assert group(c=[0, 1], a=[4], b=[]).unowned({"delay": 5}) == {
        Shard("delay", 2),
        Shard("delay", 3),
    }
