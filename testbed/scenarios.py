"""The scenarios: each schedules a bounded number of records, injects faults at random moments
within a bounded time, and settles every delay-topic offset with the checker."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from confluent_kafka.admin import AdminClient
from redis.cluster import ClusterNode, RedisCluster

from bridge.message import H_AFTER, H_CANCEL, H_DELIVER_AT, H_ID, H_TARGET_TOPIC
from bridge.store import Shard, Store
from testbed import run as runs
from testbed.brokers import (
    IN_SYNC_S,
    broker_fault,
    broker_roll,
    check_recovery_of_stored,
    in_sync,
    isr_shrink,
)
from testbed.checker import (
    Expected,
)
from testbed.clock import build_shim
from testbed.harness import Bridge, cli_of, metric, wait_ready
from testbed.recurring import (
    Cancelling,
    check_occurrences,
    counted_schedules,
    recurring_sigkill,
)
from testbed.run import PARTITIONS, RECOVERY, RECOVERY_CHECK, Result, Run, Size, Topics
from testbed.servers import Servers
from testbed.services import wait_for
from testbed.workload import (
    CLIENT_LOG_LEVEL,
    Record,
    TransactionScene,
    Workload,
    adversarial,
    hostile,
    now_ms,
    prioritised,
    steady,
)

MAX_DELAY_MS = 5000
# read-back-sigkill: delays of records kept as references (store.payload_horizon 6 s).
READ_BACK_MIN_MS, READ_BACK_MAX_MS = 8_000, 20_000
# A bridge SIGKILLed and restarted at once delivers again within this: a restart, not a timeout.
RECOVERY_BOUND_MS = 10_000
REJOIN_BOUND_MS = 5_000  # a static member back in its group after Kafka was away past the session


Scenario = Callable[[Run, Size, random.Random], Result]
# What an adversary's restarted bridge finds its host clock at: right, ahead by 20 s or an hour
# (an NTP step), behind by 3 s.
CLOCK_SHIFTS_MS = (0, 20_000, 3_600_000, -3_000)
REDIS_SHIFTS_MS = (1_800_000, 20_000, -3_000)  # the Redis clock's, after its restart
# How long an adversary's bridge stands still (SIGSTOP: a GC pause, a stalled VM): past the
# harness's group session (6 s), and past the lease (30 s) too — its records claimed again while
# it still holds them.
FREEZE_S = (8.0, 12.0, 33.0)
REDIS_FREEZE_S = (2.0, 5.0, 9.0)  # Redis stands still: a network partition, a stalled host
# The broker stands still: produce requests and transactions hang; past the group session, its
# members are expired when it wakes (its clock went on).
KAFKA_FREEZE_S = (4.0, 15.0)
# The adversary's faults other than a bridge restart, each once from this many faults on, and
# how its row names them (the Redis restart by its rollback and clock).
ONCE_EACH = {
    "redis": (1, ""),
    "wipe": (3, "Redis lost"),
    "kafka": (4, "a broker restart"),
    "freeze": (5, "a bridge standing still"),
    "redis-freeze": (6, "Redis standing still"),
    "kafka-freeze": (7, "the broker standing still"),
}
READ_BOUND_S = 30.0  # the longest one read of the API may take
# Query strings anyone on the HTTP port may send: past every bound, other scripts' digits.
HOSTILE_READS = [
    "/api/records?limit=1000000000",
    "/api/records?limit=%C2%B2",
    "/api/records?skip=" + "9" * 5000,
    "/api/records?id={delay}:0:%C2%B2",
    "/api/records?id={delay}:1:0",
    "/api/records?partition=-1",
    "/api/records?due_before=" + "9" * 5000,
    "/api/records?help=1",
    "/api/trace?id={delay}:0:0",
    "/api/trace?id=%00",
    "/api/trace?id=x&since=3000d",
    "/api/trace?origin={delay}:9:9",
    "/api/status",
    "/api/dlq?limit=5000",
    "/api/due?span=%C2%B2",
    "/ui/records?limit=%C2%B2",
]


def moments(rng: random.Random, count: int, start: float, end: float) -> list[float]:
    return sorted(rng.uniform(start, end) for _ in range(count))


# ---------------------------------------------------------------- the scenarios


def bridge_sigkill(run: Run, size: Size, rng: random.Random) -> Result:
    """One bridge (a static group member, with the default 30 s lease), SIGKILLed at random
    moments and started again at once under the same instance id: it is back with its partitions
    and the leases its previous life held within seconds, not after the lease or the session."""
    bridge = run.bridge("pod-0")
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    for moment in moments(rng, size.faults, 1.0, size.seconds + 3):
        run.at(moment)
        bridge.kill()
        bridge = run.bridge("pod-0")
        run.fault_over()
    result = run.finish(
        workload, "bridge SIGKILL", f"{size.faults} x SIGKILL of the bridge and restart"
    )
    # Far below the 30 s lease: what a restart costs, not a timeout.
    result.checks[f"back within {RECOVERY_BOUND_MS // 1000} s"] = (
        result.account.max_lateness_ms <= RECOVERY_BOUND_MS
    )
    return result


def read_back_sigkill(run: Run, size: Size, rng: random.Random) -> Result:
    """Every record far enough out to be kept as a reference (store.payload_horizon 6 s, read back
    3-5.25 s before it is due), the bridge SIGKILLed while references are being read back and
    promoted, and started again at once: a chunk read but not promoted is read again, one promoted
    is not stored twice."""
    bridge = run.bridge("pod-0")
    records = steady(
        size.records,
        run.target,
        READ_BACK_MAX_MS,
        rng.randrange(1 << 30),
        min_delay_ms=READ_BACK_MIN_MS,
    )
    workload = run.workload(records, size.seconds)
    waiting = 0
    # Read-back runs from ~4 s after the first record to ~4 s before the last one falls due.
    for moment in moments(
        rng, size.faults, READ_BACK_MIN_MS / 1000 - 4, size.seconds + READ_BACK_MAX_MS / 1000 - 4
    ):
        run.at(moment)
        waiting = max(waiting, _references(run))
        bridge.kill()
        bridge = run.bridge("pod-0")
        run.fault_over()
    result = run.finish(
        workload,
        "read-back SIGKILL",
        f"{size.faults} x SIGKILL of the bridge while it reads references back, and restart",
    )
    result.checks["records kept as references"] = waiting > 0
    result.checks["none reported gone"] = run.log_count("payload-missing") == 0
    result.notes.append(f"up to {waiting:,} references waiting at a kill")
    return result


def priority_drain_sigkill(run: Run, size: Size, rng: random.Random) -> Result:
    """A backlog of mixed priorities (10% high, 30% low), all due at one instant, produced before
    the bridge starts; drained at egress.max_rate (the records over ``size.seconds``), the bridge
    SIGKILLed at random moments of the drain and started again at once as the same static member.
    Records claimed from the backlog and in flight at a kill are delivered again, no more."""
    due = str(now_ms() + 1000).encode()
    workload = run.workload(prioritised(size.records, run.target, due), 0)
    workload.join(120)
    bridge = run.bridge("pod-0")
    for moment in moments(rng, size.faults, 2.0, size.seconds):
        run.at(moment)
        bridge.kill()
        bridge = run.bridge("pod-0")
        run.fault_over()
    result = run.finish(
        workload,
        "priority drain SIGKILL",
        f"{size.faults} x SIGKILL of the "
        "bridge during a rate-limited drain of mixed priorities, and restart",
    )
    rate = run.overrides["egress__max_rate"]
    result.notes.append(f"egress.max_rate {rate}/s")
    return result


def references_waiting(store: Store, topic: str) -> int:
    """References waiting in ``topic``'s shards."""
    shards = [Shard(topic, p) for p in range(PARTITIONS)]
    return sum(store.references.counts(shards).values())


def _references(run: Run) -> int:
    client = run.servers.redis()
    try:
        return references_waiting(Store(client, run.prefix), run.delay)
    finally:
        client.close()


def redis_restart(fsync: str) -> Scenario:
    def scenario(run: Run, size: Size, rng: random.Random) -> Result:
        run.servers.set_appendfsync(fsync)
        run.bridge()
        workload = run.workload(
            steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
        )
        try:
            cut = 0
            for moment in moments(rng, size.faults, 2.0, size.seconds):
                run.at(moment)
                run.fault_began()
                run.servers.kill("redis")
                if fsync == "everysec":
                    cut += run.servers.drop_aof_tail(rng.randint(16_384, 131_072))
                run.servers.up("redis")
                run.fault_over()
            faults = f"{size.faults} x kill -9 of redis-server, restarted from its AOF"
            if cut:
                faults += f" minus its last {cut // size.faults // 1024} KiB (un-fsynced)"
            result = run.finish(workload, f"Redis restart (appendfsync {fsync})", faults)
            if fsync == "everysec":
                result.checks["lost writes noticed"] = run.log_count("redis lost") > 0
            return result
        finally:
            run.servers.set_appendfsync("everysec")

    scenario.__doc__ = f"Redis killed and restarted from its AOF with appendfsync {fsync}."
    return scenario


def kafka_restart(run: Run, size: Size, rng: random.Random) -> Result:
    """The broker SIGKILLed and restarted mid-run (a static member, as the chart deploys it)."""
    bridge = run.bridge("pod-0")
    wait_ready(bridge)
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    for moment in moments(rng, size.faults, 2.0, size.seconds):
        run.at(moment)
        run.fault_began()
        run.servers.kill("kafka")
        run.servers.up("kafka")
        run.fault_over()
    result = run.finish(workload, "Kafka broker restart", f"{size.faults} x kill -9 of the broker")
    # What the workload produced while the broker restarted (16-17 s, 10 of them waiting for its
    # earlier registration to expire) reaches Kafka when it is back, as one burst. A restart
    # that outlasts the group session (20 s) loses the partitions: the group forms again first.
    result.checks.pop(RECOVERY_CHECK)
    check_recovery_of_stored(run, result, run.faults, workload.acked_ms, bridge)
    # What librdkafka says of a restart it rides out is not the operator's concern: no warning
    # that the restarted broker's coordinator is still loading, no connection refused by the
    # killed broker logged while the bridge shuts down afterwards.
    stopped = bridge.stop() == 0
    log = bridge.output()
    shutdown = log[log.rfind("stopping") :] if "stopping" in log else ""
    loud = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
    noise = [line for line in loud if "GETPID" in line]
    noise += [line for line in loud if "Connection refused" in line and line in shutdown]
    result.checks.update({"stopped cleanly": stopped, "no librdkafka noise": not noise})
    if noise:
        result.notes.append(f"noise: {len(noise)}: " + " | ".join(n[:160] for n in noise[:4]))
    return result


def kafka_outage(run: Run, size: Size, rng: random.Random) -> Result:
    """The broker down for ``size.outage_s``, longer than the group session, so the bridge loses
    its partitions while records fall due: the gauges keep saying what is overdue (from Redis),
    ``status`` answers from Redis alone, /readyz names Kafka; all is delivered once it is back.
    The bridge runs with its own configuration (no instance id given: it names its static member
    after its host and port): it rejoins at once, where a new member waits for the coordinator
    to expire its lost self (docs/reliability.md)."""
    bridge = run.bridge()
    ready_before = wait_ready(bridge)
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    run.at(size.seconds / 3)
    run.fault_began()
    run.servers.kill("kafka")
    down = time.monotonic()
    overdue = oldest = 0.0
    readyz = ""
    status: subprocess.CompletedProcess[str] | None = None
    while time.monotonic() - down < size.outage_s:
        time.sleep(0.5)  # sampling the gauges over the outage, not waiting on a condition
        if bridge.output().count("lost ") == 0:
            continue  # the group session has not run out yet
        # The last reading counts: seconds after the partitions were lost, at the outage's end.
        overdue = metric(bridge, "delay_bridge_overdue_messages")
        oldest = metric(bridge, "delay_bridge_oldest_overdue_seconds")
        readyz = bridge.get("/readyz")[1]
        if status is None and time.monotonic() - down > size.outage_s / 2:
            status = cli_of(bridge)("status", "--json")
    run.servers.up("kafka")
    run.fault_over()
    recovered = wait_ready(bridge, 90)
    result = run.finish(
        workload, "Kafka outage", f"broker down for {size.outage_s:.0f} s (partitions lost)"
    )
    rows = json.loads(status.stdout)["partitions"] if status and status.returncode == 0 else []
    result.checks.update(
        {
            "ready before": ready_before,
            "partitions lost": bridge.output().count("lost ") > 0,
            "overdue gauge > 0 at the outage's end": overdue > 0,
            "oldest overdue > 5 s at the outage's end": oldest > 5,
            "/readyz names kafka": "kafka" in readyz,
            "status from Redis alone": len(rows) == PARTITIONS
            and all(r["log_end"] is None and r["waiting"] >= 0 for r in rows),
            "recovered by itself": recovered,
        }
    )
    result.notes.append(f"at the outage's end: {overdue:,.0f} overdue, oldest {oldest:.1f} s")
    # The group forms again once librdkafka finds the coordinator, which it asks at most once a
    # second (the broker's log: the static member rejoins 1-2 s after the broker is unfenced):
    # the bridge's own share of the recovery counts from its assignment. What the workload
    # produced during the outage reaches Kafka at its end, as one burst (check_recovery_of_stored).
    result.checks.pop(RECOVERY_CHECK)
    rejoin_ms = check_recovery_of_stored(run, result, run.faults, workload.acked_ms, bridge)
    result.checks["the group formed again"] = rejoin_ms is not None
    # As itself: a new member would wait a session more (6 s here, 20 s by default) for the
    # coordinator to expire the member it was (2.41 s in the full run; 20.5 s when dynamic).
    rejoined = rejoin_ms is not None and rejoin_ms <= REJOIN_BOUND_MS
    result.checks[f"the group formed again within {REJOIN_BOUND_MS / 1000:.0f} s"] = rejoined
    if status is not None and status.returncode != 0:
        result.notes.append(f"status: {status.stderr.strip()[:200]}")
    return result


def redis_unreachable(run: Run, size: Size, rng: random.Random) -> Result:
    """Redis frozen (SIGSTOP) for ``size.outage_s``: the bridge must stay up and say not ready."""
    bridge = run.bridge()
    ready_before = wait_ready(bridge)
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    run.at(size.seconds / 3)
    run.fault_began()
    run.servers.signal("redis", signal.SIGSTOP)
    frozen = time.monotonic()
    not_ready_after: float | None = None
    healthy = True
    try:
        while time.monotonic() - frozen < size.outage_s:
            status, _ = bridge.get("/readyz")
            if status == 503 and not_ready_after is None:
                not_ready_after = time.monotonic() - frozen
            healthy = healthy and bridge.get("/healthz")[0] == 200
            time.sleep(0.5)
    finally:
        run.servers.signal("redis", signal.SIGCONT)
    run.fault_over()
    thawed = time.monotonic()
    recovered = wait_ready(bridge, 60)
    recovery = time.monotonic() - thawed
    assert bridge.proc is not None
    result = run.finish(
        workload, "Redis unreachable", f"Redis frozen (SIGSTOP) for {size.outage_s:.0f} s"
    )
    result.checks.update(
        {
            "ready before": ready_before,
            "/readyz 503 during the outage": not_ready_after is not None,
            "/healthz 200 throughout": healthy,
            "recovered by itself": recovered,
            "process stayed up": bridge.proc.poll() is None,
        }
    )
    result.notes.append(
        f"/readyz 503 after {not_ready_after or 0:.1f} s, ready again {recovery:.1f} s after"
    )
    return result


def rebalance_storm(run: Run, size: Size, rng: random.Random) -> Result:
    """Three bridges in one group (static members, the default 30 s lease), stopped (SIGTERM or
    SIGKILL) and started again repeatedly under the same instance id."""
    live = [run.bridge(f"pod-{i}") for i in range(3)]
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    kills = terms = 0
    for moment in moments(rng, size.faults, 2.0, size.seconds + 3):
        run.at(moment)
        i = rng.randrange(len(live))
        if rng.random() < 0.3:
            live[i].kill()
            kills += 1
        else:
            live[i].signal(signal.SIGTERM)
            live[i].wait(60)
            terms += 1
        live[i] = run.bridge(f"pod-{i}")
        run.fault_over()
    return run.finish(
        workload, "rebalance storm", f"3 bridges, {terms} x SIGTERM + {kills} x SIGKILL and restart"
    )


def zombie(run: Run, size: Size, rng: random.Random) -> Result:
    """Two bridges (dynamic members); one frozen (SIGSTOP) while records fall due, past its group
    session, its partitions taken over by the other, then woken (SIGCONT) with what it had in
    flight: with exactly-once delivery its next owner fenced it and nothing it still tries to
    commit gets through."""
    live = [run.bridge(), run.bridge()]
    assert wait_spread(live), "the two bridges did not share the partitions"
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    # Each fault: frozen for the 6 s session and 3 s more, then 6 s to rejoin before the next.
    for n, moment in enumerate(moments(rng, size.faults, 1.0, max(1.0, size.seconds - 9))):
        run.at(max(moment, n * 15.0 + 1.0))
        frozen = live[rng.randrange(2)]
        run.fault_began()
        frozen.signal(signal.SIGSTOP)
        try:
            time.sleep(9.0)  # fault timing: past the session (6 s), the other owns all three
        finally:
            frozen.signal(signal.SIGCONT)
            run.fault_over()
    result = run.finish(
        workload, "zombie replica", f"{size.faults} x SIGSTOP past the session and SIGCONT"
    )
    fenced = run.log_count("producer fenced")
    if fenced:  # a replica frozen between two transactions has nothing to be fenced in
        result.notes.append(f"{fenced} shard producers of a woken replica fenced")
    return result


def wait_spread(bridges: list[Bridge], timeout: float = 60) -> bool:
    """Wait until every delay partition is owned and each bridge owns one at least: the group has
    settled, so a fault's effect is not mixed with the first assignment's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            owned = [metric(b, "delay_bridge_owned_partitions") for b in bridges]
            if sum(owned) == PARTITIONS and min(owned) >= 1:
                return True
        time.sleep(0.2)
    return False


def rollout(how: str) -> Scenario:
    """Three replicas (static group members, the bridge's own session and heartbeat) replaced one
    after the other under steady load, as Kubernetes rolls the chart's workload: a
    ``statefulset`` stops a pod and then starts its replacement under the same name (the same
    member, back with the same partitions without a rebalance); a ``deployment`` starts a pod
    under a new name (the chart names no member: the bridge names its own after its host and
    port), waits for it to be ready, then stops an old one, which leaves the group as it stops,
    so its partitions move on in one rebalance, not after a session. A StatefulSet's replica is
    away from its SIGTERM until its replacement is ready (the fault, as long as the process takes
    to stop and start); records due meanwhile reach their targets within the recovery bound of
    its return, not after a session."""

    def scenario(run: Run, size: Size, rng: random.Random) -> Result:
        names = [f"pod-{i}" if how == "statefulset" else "" for i in range(3)]
        live = [run.bridge(name) for name in names]
        settled = all(wait_ready(b) for b in live) and wait_spread(live)
        workload = run.workload(
            steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
        )
        run.at(3.0)
        ready, stopped = True, []
        for _ in range(size.faults):
            for i, old in enumerate(list(live)):
                run.fault_began()
                if how == "deployment":  # the chart names no member: the bridge's own name
                    live[i] = run.bridge()
                    ready = wait_ready(live[i]) and ready
                old.signal(signal.SIGTERM)
                stopped.append(old.wait(60))
                if how == "statefulset":
                    live[i] = run.bridge(names[i])
                    ready = wait_ready(live[i]) and ready
                run.fault_over()
        result = run.finish(
            workload,
            f"rollout ({how})",
            f"3 replicas replaced one by one, {size.faults} time{'s' if size.faults > 1 else ''}",
        )
        result.checks.update(
            {
                "group settled before": settled,
                "each replacement ready": ready,
                "each replica stopped cleanly": stopped == [0] * len(stopped),
            }
        )
        return result

    scenario.__doc__ = f"A rolling update of three replicas, as a {how} does it."
    return scenario


def _flood(count: int, target: str, seed: int, bad_every: int = 2) -> list[Record]:
    """Malformed records of every kind the contract names, one in ``bad_every`` among valid
    ones."""
    rng = random.Random(seed)
    t = (H_TARGET_TOPIC, target.encode())
    kinds = [
        [(H_AFTER, b"1s")],  # missing-target
        [t],  # missing-due-time
        [t, (H_AFTER, b"1s"), (H_DELIVER_AT, b"0")],  # conflicting-due-time
        [t, (H_AFTER, b"soon")],  # bad-due-time
        [t, (H_AFTER, b"400d")],  # delay-too-long
        [(H_TARGET_TOPIC, b"elsewhere"), (H_AFTER, b"1s")],  # target-not-allowed
        [t, (H_AFTER, b"1s"), ("pad", b"p" * 120_000)],  # too-large
        [t, (H_AFTER, b"1s"), (H_AFTER, b"2s")],  # bad-header (twice)
    ]
    out = []
    for i in range(count):
        if i % bad_every == 1:
            out.append(Record(list(rng.choice(kinds)), key=b"bad"))
        else:
            out.append(Record([t], key=b"ok", delay_ms=rng.randint(0, 3000)))
    return out


def hostile_input(run: Run, size: Size, rng: random.Random) -> Result:
    """Hypothesis-generated control headers, then a flood of malformed records among valid ones."""
    bridge = run.bridge()
    records = hostile(size.faults, run.target, rng.randrange(1 << 30))
    records += _flood(size.records, run.target, rng.randrange(1 << 30))
    workload = run.workload(records, size.seconds)
    workload.join(600)
    horizon = now_ms() + 10_000  # generated valid delays are seconds or days: nothing between
    result = run.finish(
        workload,
        "hostile input",
        f"{size.faults} hypothesis-generated header sets + {size.records // 2:,} "
        f"malformed among {size.records - size.records // 2:,} valid",
        horizon_ms=horizon,
    )
    assert bridge.proc is not None
    result.checks["process stayed up"] = bridge.proc.poll() is None
    return result


def _fault_kinds(rng: random.Random, faults: int) -> list[str]:
    """The adversary's faults in a random order: a Redis restart, Redis losing everything with
    three faults or more, a broker restart with four or more, a bridge standing still with five
    or more, Redis standing still with six or more, the broker standing still with seven or more,
    and bridge restarts for the rest."""
    kinds = [kind for kind, (least, _) in ONCE_EACH.items() if faults >= least]
    kinds += ["bridge"] * (faults - len(kinds))
    rng.shuffle(kinds)
    return kinds


def _shift(rng: random.Random, choices: tuple[int, ...], other: int) -> int:
    """A clock's offset: ahead only while the other clock is not. Both ahead is beyond the
    guarantee (DESIGN: never early, whatever ONE clock says): the earlier one decides."""
    return rng.choice([c for c in choices if c <= 0 or other <= 0])


class _Faults:
    """The adversary's faults, and the clocks they leave the bridge and Redis on. Redis comes
    back from a restart on a host whose clock is off (a failover to a replica whose clock is):
    testbed/clock/shift.c, its offset in a file of the run, back to 0 when the run ends."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.shim, self.shifted = build_shim(run.dir), run.dir / "redis-clock.offset"
        self.rolled_back, self.redis_shift = 0, 0
        self.bridge_shifts: list[int] = []  # each replica's, in the order of the bridges

    @property
    def bridge_shift(self) -> int:
        """The clock furthest ahead of the replicas'."""
        return max(self.bridge_shifts, default=0)

    def inject(self, kind: str, bridges: list[Bridge], rng: random.Random) -> None:
        """One fault of ``kind`` (:func:`_fault_kinds`); a bridge killed is replaced in
        ``bridges`` (one of them, at random) by the one started after it."""
        run = self.run
        run.fault_began()
        self.bridge_shifts += [0] * (len(bridges) - len(self.bridge_shifts))
        shifted = 0
        if kind == "redis":
            run.servers.kill("redis")
            self.rolled_back += run.servers.drop_aof_tail(rng.randint(1_024, 65_536))
            self.redis_shift = shifted = _shift(rng, REDIS_SHIFTS_MS, self.bridge_shift)
            self.shifted.write_text(str(self.redis_shift))
            env = {"LD_PRELOAD": str(self.shim), "CLOCK_SHIFT_FILE": str(self.shifted)}
            run.servers.up("redis", env=env)
        elif kind == "kafka":
            run.servers.kill("kafka")
            run.servers.up("kafka")
        elif kind == "wipe":  # its volume lost: everything is rebuilt from Kafka
            client = run.servers.redis()
            client.flushall()
            client.close()
        elif kind == "freeze":  # woken with what it had in flight, whoever owns it now
            i, seconds = rng.randrange(len(bridges)), rng.choice(FREEZE_S)
            _stand_still(bridges[i].signal, seconds)
            kind += f"{f' {i}' if len(bridges) > 1 else ''} for {seconds:.0f} s"
        elif kind in ("redis-freeze", "kafka-freeze"):
            server = kind.split("-")[0]
            seconds = rng.choice(REDIS_FREEZE_S if server == "redis" else KAFKA_FREEZE_S)
            _stand_still(functools.partial(run.servers.signal, server), seconds)
            kind += f" for {seconds:.0f} s"
        else:
            i = rng.randrange(len(bridges))
            bridges[i].kill()
            self.bridge_shifts[i] = shifted = _shift(rng, CLOCK_SHIFTS_MS, self.redis_shift)
            bridges[i] = run.bridge(clock_shift_ms=shifted)
            kind += f" {i}" if len(bridges) > 1 else ""
        run.fault_over(f"{kind}, its clock {shifted / 1000:+,.0f} s" if shifted else kind)


def _stand_still(send: Callable[[signal.Signals], None], seconds: float) -> None:
    """A process stands still for ``seconds`` (SIGSTOP, then SIGCONT): a GC pause, a stalled
    host, a network partition — it keeps its connections and its state."""
    send(signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the fault's length, not a wait on a condition
    finally:
        send(signal.SIGCONT)


# The adversary's target's rate with lanes (adversary-lanes): about twice the mean rate its
# records fall due at, so the backlogs its faults leave drain through the rate limit's waits.
LANES_RATE = 500


def adversary(replicas: int, lanes: bool = False) -> Scenario:
    """:func:`_adversary` against ``replicas`` bridges sharing the delay topic's partitions
    (dynamic group members: a replica killed has its partitions taken over by the others
    until it is back and the group rebalances again). ``lanes``: its records in priority lanes,
    and its target rate-limited (``egress.max_rate_per_target``: LANES_RATE a second)."""
    return functools.partial(_adversary, replicas=replicas, lanes=lanes)


def _adversary(
    run: Run, size: Size, rng: random.Random, *, replicas: int = 1, lanes: bool = False
) -> Result:
    """A seeded adversary of the whole bridge: producers drawing from the whole header space
    (:func:`~testbed.workload.adversarial`: ids and default ids of every partition with other
    scripts' digits and numbers past every limit, cancels with hints, sizes around the limit,
    hypothesis's header sets), and at each fault a burst of records with a cancel behind it
    some 300 ms before its record is due (:func:`_burst_scene`); operators cancelling, firing
    and rescheduling by id and in bulk,
    replaying the DLQ and reading the API with hostile query strings; and faults at random
    moments: SIGKILLs, the bridge back on a host whose clock is off (ahead by seconds or an hour,
    behind), a Redis restart that rolls back what it had not fsynced onto a clock that is off
    (30 minutes or 20 s ahead, 3 s behind), (with three faults or more) Redis losing everything,
    (four or more) a broker restart, (five or more) a bridge standing still (SIGSTOP) past its
    group session or its lease and woken with what it had in flight, (six or more) Redis
    standing still for seconds and (seven or more) the broker too; then, quiet, a cancel behind
    another producer's transaction held open past its record's due time
    (:class:`~testbed.workload.TransactionScene`). The checker's oracle (the
    parser, every cancel and replacement by delay-id or origin, an operator's copies of a record
    by its seq) settles every offset:
    nothing lost, early or misrouted; every partition caught up; the bridge ready again."""
    max_bytes = int(str(run.overrides["limits__max_record_bytes"]))
    records = adversarial(
        size.records,
        run.target,
        run.delay,
        PARTITIONS,
        seed=rng.randrange(1 << 30),
        max_bytes=max_bytes,
        priorities=lanes,
    )
    if lanes:
        run.configure("egress__max_rate_per_target", {run.target: LANES_RATE})
    bridges = [run.bridge() for _ in range(replicas)]
    # Recurring schedules beside them, each occurrence checked (testbed.recurring).
    every_ms = 2000
    expected = counted_schedules(
        run, 20, every_ms, max(3, int(size.seconds * 1000) // every_ms - 1), now_ms() + 3000
    )
    # And ten with no end, cancelled one by one at the faults (the rest at the end).
    cancelling = Cancelling.start(run, 10, every_ms, now_ms() + 3000)
    workload = run.workload(records, size.seconds)
    answers: list[str] = []  # what an operator's command or read got that it must not
    faults = moments(rng, size.faults, 1.0, size.seconds)
    kinds = _fault_kinds(rng, len(faults))
    injected = _Faults(run)
    scenes: list[Workload] = []
    try:
        for n, (kind, moment) in enumerate(zip(kinds, faults, strict=True)):
            run.at(moment)
            answers += _operate(run, rng.choice(bridges), rng)
            cancelling.cancel(rng)
            scenes.append(_burst_scene(run, rng, n, 10_000))
            injected.inject(kind, bridges, rng)
        workload.join(600)
        for scene in scenes:  # their cancels' acknowledgements are the oracle's too
            scene.join(600)
            workload.acked_ms.update(scene.acked_ms)
        answers += _operate(run, rng.choice(bridges), rng)
        cancelling.cancel(rng, every=True)
        # Quiet now: a cancel behind another producer's transaction held open past its
        # record's due time, the partition standing still for seconds before and after it.
        quiet = TransactionScene(
            run.servers.bootstrap,
            run.delay,
            run.target,
            rng.randrange(PARTITIONS),
            runs.TRANSACTION_SEQS,
            open_past_due_ms=rng.randint(2_000, 3_500),
            commit=rng.random() < 0.5,
        ).play()
        workload.acked_ms.update(quiet.acked_ms)
    finally:
        injected.shifted.write_text("0")
    for bridge in bridges:
        bridge.kill()
    bridge = run.bridge()  # the clocks right again: /readyz names no skew
    horizon = now_ms() + 10_000  # valid delays are seconds (or days: hypothesis's)
    result = run.finish(
        workload,
        "adversary",
        f"{size.records:,} adversarial records{f', {replicas} replicas' * (replicas > 1)}, "
        f"{size.faults} faults (SIGKILLs with clock steps, a Redis restart "
        f"rolled back {injected.rolled_back:,} bytes of AOF, its clock off by "
        f"{injected.redis_shift / 1000:+,.0f} s"
        f"{''.join(f', {n}' for k, (_, n) in ONCE_EACH.items() if n and k in kinds)})",
        horizon_ms=horizon,
    )
    result.checks["ready again at the end"] = wait_ready(bridge, 60)
    result.checks["operators answered in one line, reads never 5xx"] = not answers
    check_occurrences(run, result, expected, "20 schedules")
    cancelling.check(result)
    result.notes += quiet.notes
    if answers:
        result.notes += answers[:5]
    return result


def _burst_scene(run: Run, rng: random.Random, n: int, burst: int) -> Workload:
    """A record with its own delay-id due in 400 ms and a ms for every twenty records of the
    burst; right behind it ``burst`` records with ids of their own due in an hour, in its
    partition or another, as fast as they go; then its cancel, in its partition: produced some
    300 ms before its due time, behind a burst the ingress takes longer to store than a quiet
    read, on the eve of a fault. The oracle holds the cancel to its margin
    (:func:`testbed.checker.cancels_lost`). Seqs from SCENE_SEQS on."""
    key = f"scene-{n}".encode()
    other = key if rng.random() < 0.5 else f"burst-{n}".encode()
    sid = f"scene-{n}".encode()
    records = [
        Record(
            [(H_TARGET_TOPIC, run.target.encode()), (H_ID, sid)],
            key=key,
            delay_ms=400 + burst // 20,
        ),
        *[
            Record(
                [(H_TARGET_TOPIC, run.target.encode()), (H_ID, b"burst-%d-%d" % (n, i))],
                key=other,
                delay_ms=3_600_000,
            )
            for i in range(burst)
        ],
        Record([(H_CANCEL, sid)], key=key),
    ]
    return run.workload(records, 0, first_seq=runs.SCENE_SEQS + n * (burst + 2))


# What an operator does now and then: by id (the adversary's ids, default ids of early offsets,
# one with another script's digit, one past every bound), in bulk (by key prefix: "customer-1"
# and "k" are the adversary's keys; a recurring schedule is keyed by its id, "c<i>" and "x<i>":
# a bulk fire or reschedule that matches schedules leaves them as they are), and a replay of
# what the DLQ holds for reasons a replay meets again (the record is refused again, as it was).
BULK = [
    ["fire", "--key-prefix", "customer", "--yes"],
    ["fire", "--key-prefix", "c", "--yes"],
    ["reschedule", "--key-prefix", "x", "--shift", "2s", "--yes"],
    ["reschedule", "--key-prefix", "k", "--shift", "2s", "--yes"],
    ["cancel", "--key-prefix", "customer", "--due-after", "2s", "--yes"],
    [
        "dlq",
        "replay",
        "--reason",
        "bad-due-time",
        "--reason",
        "missing-target",
        "--reason",
        "bad-header",
        "--limit",
        "50",
    ],
]


def _operate(run: Run, bridge: Bridge, rng: random.Random) -> list[str]:
    """An operator's commands by id and in bulk, and a few hostile reads of the API; what went
    wrong (a traceback, an exit code of none of 0, 1, 2, a read that failed or took too long)."""
    wrong = []
    ids = [
        f"{run.delay}:{rng.randrange(PARTITIONS)}:{rng.randrange(50)}",
        "order-1",
        "order-2",
        f"{run.delay}:0:\u00b2",
        "9" * 300,
    ]
    by_id = [["cancel"], ["fire"], ["reschedule", "--after", "2s"]]  # one of them, and a bulk one
    commands = [[*rng.choice(by_id), "--id", rng.choice(ids)], rng.choice(BULK)]
    for args in commands:
        done = subprocess.run(
            [sys.executable, "-m", "bridge", *args],
            env=run.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if "Traceback" in done.stderr or done.returncode not in (0, 1, 2):
            wrong.append(f"{' '.join(args[:2])} exit {done.returncode}: {done.stderr[-300:]}")
    # Not waiting for /readyz: a bridge whose clock is off is not ready (it names the skew), and
    # its reads must hold all the same.
    port = bridge.http_port()
    for path in rng.sample(HOSTILE_READS, 4):
        started = time.monotonic()
        status, body = _get(f"http://127.0.0.1:{port}{path.format(delay=run.delay)}")
        took = time.monotonic() - started
        if not status:  # nothing listens: the bridge stopped (every fault is over by now)
            code = None if bridge.proc is None else bridge.proc.poll()
            wrong.append(f"GET {path}: {body}; the bridge's exit code: {code}")
            break
        if status >= 500 or "Traceback" in body or took > READ_BOUND_S:
            wrong.append(f"GET {path}: {status} in {took:.1f} s: {body[:200]}")
    return wrong


def _get(url: str) -> tuple[int, str]:
    """GET ``url``: its status and body (a read of the journal or of Kafka takes seconds); 0
    when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2 * READ_BOUND_S) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except urllib.error.URLError as err:  # refused: status 0
        return 0, f"unreachable ({err.reason})"


def _delays(references: bool) -> tuple[int, int]:
    """(min, max) delay: records kept as references (store.payload_horizon 6 s), or not."""
    return (READ_BACK_MIN_MS, READ_BACK_MAX_MS) if references else (0, MAX_DELAY_MS)


def redis_lost(references: bool) -> Scenario:
    """Redis wiped (FLUSHALL) while records are scheduled (``references``: waiting as references,
    their payload in Kafka): rebuilt from the delay topic."""
    low, high = _delays(references)

    def scenario(run: Run, size: Size, rng: random.Random) -> Result:
        run.bridge()
        records = steady(size.records, run.target, high, rng.randrange(1 << 30), min_delay_ms=low)
        workload = run.workload(records, size.seconds)
        waiting = 0
        for moment in moments(rng, size.faults, 3.0, size.seconds):
            run.at(moment)
            waiting = max(waiting, _references(run))
            client = run.servers.redis()
            client.flushall()
            client.close()
            run.fault_over()
        result = run.finish(
            workload,
            "Redis lost entirely" + (", references waiting" * references),
            f"{size.faults} x FLUSHALL mid-run",
        )
        result.checks["rebuilt"] = run.log_count("redis lost") > 0
        if references:
            result.checks["references waiting at a FLUSHALL"] = waiting > 0
            result.checks["none reported gone"] = run.log_count("payload-missing") == 0
            result.notes.append(f"up to {waiting:,} references waiting at a FLUSHALL")
        return result

    return scenario


def topic_recreated(references: bool) -> Scenario:
    """The delay topic deleted and created again under the same name, with records still waiting
    in Redis (``references``: as references, so their payload goes with the topic and they are
    dead-lettered as payload-missing at their due times): while the bridge is stopped, then
    (second fault) while it runs."""
    low, high = _delays(references)

    def scenario(run: Run, size: Size, rng: random.Random) -> Result:
        bridge = run.bridge()
        per = size.records // (size.faults + 1)
        earlier: dict[int, Expected] = {}
        seconds = size.seconds / (size.faults + 1)
        waiting = 0
        for fault in range(size.faults):
            records = steady(per, run.target, high, rng.randrange(1 << 30), min_delay_ms=low)
            workload = run.workload(records, seconds, first_seq=fault * per)
            workload.join(600)
            gone = run.expected()  # this incarnation's records, before it is gone
            if references:
                waiting = max(waiting, _references(run))
                gone = {s: dataclasses.replace(e, payload_may_go=True) for s, e in gone.items()}
                run.checker.add_origins(gone)
            earlier.update(gone)
            run.fault_began()
            if fault % 2 == 0:
                bridge.signal(signal.SIGTERM)
                bridge.wait(60)
                run.recreate(run.delay, {"retention.ms": "-1"})
                bridge = run.bridge()
            else:
                run.recreate(run.delay, {"retention.ms": "-1"})
            run.fault_over()
        last = size.records - per * size.faults
        records = steady(last, run.target, high, rng.randrange(1 << 30), min_delay_ms=low)
        workload = run.workload(records, seconds, first_seq=size.faults * per)
        stopped = (size.faults + 1) // 2
        result = run.finish(
            workload,
            "delay topic recreated" + (", references waiting" * references),
            f"{size.faults} x delete and create the delay topic "
            f"({stopped} with the bridge stopped, {size.faults - stopped} running)",
            earlier=earlier,
        )
        noticed = run.log_count("was deleted and created again") + run.log_count("went back")
        result.checks["every recreation noticed"] = noticed >= size.faults * PARTITIONS
        result.notes.append(f"{noticed} partition resets logged")
        if references:
            result.checks["references of the deleted topic dead-lettered"] = (
                result.account.dead_lettered > 0
            )
            result.notes.append(f"up to {waiting:,} references waiting at a deletion")
        return result

    return scenario


def dlq_missing(run: Run, size: Size, rng: random.Random) -> Result:
    """No DLQ topic while invalid records arrive among valid ones: /readyz names the DLQ, the
    invalid records wait (holding up their partitions) and nothing is lost once it exists."""
    run.fault_began()
    run.admin.delete_topics([run.dlq])[run.dlq].result(timeout=30)
    bridge = run.bridge()
    records = _flood(size.records, run.target, rng.randrange(1 << 30), bad_every=10)
    workload = run.workload(records, size.seconds)
    not_ready: str | None = None
    deadline = time.monotonic() + size.outage_s
    while time.monotonic() < deadline:
        status, body = bridge.get("/readyz")
        if status == 503 and f"DLQ topic {run.dlq}" in body:
            not_ready = not_ready or body
        time.sleep(0.5)
    run.recreate(run.dlq)
    run.fault_over()
    run.checker.start()  # reads the outputs from their beginning, the DLQ now included
    recovered = wait_ready(bridge, 60)
    result = run.finish(
        workload, "DLQ topic missing", f"no DLQ topic for {size.outage_s:.0f} s, then created"
    )
    result.checks.update(
        {"/readyz 503 naming the DLQ": not_ready is not None, "ready once it exists": recovered}
    )
    result.notes.append("/readyz named the DLQ while it was missing")
    return result


def redis_readonly(run: Run, size: Size, rng: random.Random) -> Result:
    """Redis turned into a replica (of a master that is gone) for ``size.outage_s``, as a stale
    address after a failover would leave it: read-only; /readyz says READONLY."""
    bridge = run.bridge()
    ready_before = wait_ready(bridge)
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    run.at(size.seconds / 3)
    client = run.servers.redis()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = s.getsockname()[1]
    run.fault_began()
    client.replicaof("127.0.0.1", gone)
    started = time.monotonic()
    said: float | None = None
    try:
        while time.monotonic() - started < size.outage_s:
            status, body = bridge.get("/readyz")
            if status == 503 and "READONLY" in body and said is None:
                said = time.monotonic() - started
            time.sleep(0.5)
    finally:
        client.replicaof("NO", "ONE")
        client.close()
    run.fault_over()
    writable = time.monotonic()
    recovered = wait_ready(bridge, 60)
    recovery = time.monotonic() - writable
    result = run.finish(
        workload, "Redis read-only", f"Redis a replica (read-only) for {size.outage_s:.0f} s"
    )
    result.checks.update(
        {
            "ready before": ready_before,
            "/readyz 503 saying READONLY": said is not None,
            "recovered by itself": recovered,
        }
    )
    result.notes.append(
        f"/readyz READONLY after {said or 0:.1f} s, ready again {recovery:.1f} s after"
    )
    return result


def _stall_after(run: Run, moment_ms: int, window_ms: int = 60_000) -> float:
    """The longest time, in seconds, without any record arriving in the minute after
    ``moment_ms`` (records flow all along, so a gap is the bridge waiting on the fault)."""
    seen = sorted(
        e.seen_ms
        for got in run.checker.delivered.values()
        for e in got
        if moment_ms <= e.seen_ms <= moment_ms + window_ms
    )
    marks = [moment_ms, *seen]
    return max((b - a for a, b in itertools.pairwise(marks)), default=0) / 1000


def _failover_result(
    run: Run, result: Result, bridge: Bridge, ready_before: bool, faults: list[int]
) -> Result:
    """The checks and notes both failover scenarios add: ready before and after, and the longest
    pause in deliveries after each fault."""
    stalls = [_stall_after(run, t) for t in faults]
    result.checks.update({"ready before": ready_before, "ready after": wait_ready(bridge, 60)})
    result.notes.append(
        "longest pause in deliveries after each fault: " + ", ".join(f"{x:.1f} s" for x in stalls)
    )
    return result


def sentinel_master(sentinels: str) -> int:
    """The master's port as the first of ``sentinels`` (host:port, comma-separated) tells it
    (redis-cli: redis-py's parser of this reply does not take the arguments it is given)."""
    host, port = sentinels.split(",", maxsplit=1)[0].split(":")
    reply = subprocess.run(
        ["redis-cli", "-h", host, "-p", port, "sentinel", "get-master-addr-by-name", "mymaster"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(reply[1])


def sentinel_failover(run: Run, size: Size, rng: random.Random) -> Result:
    """The bridge on a Sentinel set; its master fails over (SENTINEL FAILOVER, and the last time
    kill -9, then restarted to rejoin as a replica) while records flow."""
    sentinel = run.overrides["redis__sentinel"]["nodes"][0]  # type: ignore[index]
    bridge = run.bridge()
    ready_before = wait_ready(bridge)
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    faults: list[int] = []
    kinds: list[str] = []
    for i, moment in enumerate(moments(rng, size.faults, 2.0, size.seconds)):
        run.at(moment)
        before = sentinel_master(sentinel)
        run.fault_began()
        faults.append(now_ms())
        if i == size.faults - 1:
            os.kill(run.servers.pid_on(before), signal.SIGKILL)
            kinds.append("kill -9")
        else:
            host, port = sentinel.split(":")
            subprocess.run(
                ["redis-cli", "-h", host, "-p", port, "sentinel", "failover", "mymaster"],
                capture_output=True,
                check=True,
            )
            kinds.append("SENTINEL FAILOVER")
        deadline = time.monotonic() + 60
        while sentinel_master(sentinel) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        run.fault_over()
        if kinds[-1] == "kill -9":
            run.servers.up_set("sentinel")  # the old master comes back, as a replica
    result = run.finish(
        workload,
        "Sentinel failover",
        f"{kinds.count('SENTINEL FAILOVER')} x SENTINEL FAILOVER + "
        f"{kinds.count('kill -9')} x kill -9 of the master",
    )
    return _failover_result(run, result, bridge, ready_before, faults)


def cluster_failover(run: Run, size: Size, rng: random.Random) -> Result:
    """The bridge on a 3-master Redis Cluster; a master holding shards is killed (-9), its
    replica takes over, and it is restarted to rejoin as a replica."""
    bridge = run.bridge()
    ready_before = wait_ready(bridge)
    workload = run.workload(
        steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30)), size.seconds
    )
    nodes = run.ha_nodes
    faults: list[int] = []
    for moment in moments(rng, size.faults, 2.0, size.seconds):
        run.at(moment)
        cluster = _cluster(nodes)
        meta = next(iter(cluster.scan_iter(match=f"{run.prefix}:*:meta")))
        port = int(cluster.get_node_from_key(meta).port)
        cluster.close()
        run.fault_began()
        faults.append(now_ms())
        os.kill(run.servers.pid_on(port), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _slot_served(nodes, meta):
            time.sleep(0.2)
        run.fault_over()
        run.servers.up_set("redis-cluster")  # restarted, it rejoins as a replica
    result = run.finish(
        workload, "Redis Cluster failover", f"{size.faults} x kill -9 of a master holding shards"
    )
    return _failover_result(run, result, bridge, ready_before, faults)


def _cluster(nodes: list[str]) -> Any:
    """A cluster client that starts from any live node of ``nodes`` (host:port)."""
    startup = [ClusterNode(host, int(port)) for host, port in (n.split(":") for n in nodes)]  # type: ignore[no-untyped-call]
    return cast(Any, RedisCluster)(startup_nodes=startup, socket_timeout=2)


def _slot_served(nodes: list[str], key: bytes) -> bool:
    """Whether a master serves the slot of ``key`` again (its replica took over)."""
    try:
        cluster = _cluster(nodes)
    except Exception:
        return False
    try:
        cluster.hget(key, "ingested")
        return True
    except Exception:
        return False
    finally:
        cluster.close()


# name → (scenario, quick size for `make test` (None: only in `make chaos`), full size)
SCENARIOS: dict[str, tuple[Scenario, Size | None, Size]] = {
    "bridge-sigkill": (bridge_sigkill, Size(3000, 8, 3), Size(100_000, 60, 20)),
    "read-back-sigkill": (read_back_sigkill, Size(2000, 6, 3), Size(50_000, 60, 12)),
    # Short only with everysec, the fsync that can lose the last second (the one to rebuild).
    "redis-restart-always": (redis_restart("always"), None, Size(50_000, 30, 3)),
    "redis-restart-everysec": (redis_restart("everysec"), Size(2000, 7, 1), Size(50_000, 30, 3)),
    "kafka-restart": (kafka_restart, Size(2000, 7, 1), Size(50_000, 30, 2)),
    "kafka-outage": (
        kafka_outage,
        Size(2000, 12, 1, outage_s=12),
        Size(30_000, 60, 1, outage_s=40),
    ),
    "redis-unreachable": (
        redis_unreachable,
        Size(2000, 12, 1, outage_s=10),
        Size(30_000, 60, 1, outage_s=30),
    ),
    "rebalance-storm": (rebalance_storm, Size(3000, 8, 4), Size(100_000, 60, 20)),
    "zombie": (zombie, Size(3000, 12, 1), Size(30_000, 60, 3)),
    # Its short version's contract is the bench harness's priority test and test_priority.py's.
    "priority-drain-sigkill": (priority_drain_sigkill, None, Size(100_000, 50, 10)),
    "rollout": (rollout("statefulset"), Size(3000, 16, 1), Size(30_000, 120, 3)),
    "rollout-deployment": (rollout("deployment"), None, Size(30_000, 120, 2)),
    "hostile-input": (hostile_input, Size(1000, 5, 300), Size(20_000, 20, 2000)),
    "adversary": (adversary(1), Size(1000, 10, 3), Size(20_000, 90, 12)),
    # Two replicas: each fault that kills a bridge kills one of them, the other takes its
    # partitions over meanwhile. Long only: make test's time is spent.
    "adversary-replicas": (adversary(2), None, Size(20_000, 90, 12)),
    # Records due further out than 2 s kept as references (half the adversary's delays) and read
    # back a second before due, through the same faults, cancels and operators. Long only.
    "adversary-references": (adversary(1), None, Size(20_000, 90, 12)),
    # Its records in priority lanes, its target's rate limited: claims from the rate's wait
    # index, lanes held back, through the same faults. Long only.
    "adversary-lanes": (adversary(1, lanes=True), None, Size(20_000, 90, 12)),
    # Their short versions: test_recovery.py's test_redis_wiped_while_running_is_rebuilt_from_the_
    # delay_topic and test_incarnation.py's test_a_recreated_delay_topic_is_read_from_its_beginning.
    "redis-lost": (redis_lost(False), None, Size(50_000, 30, 2)),
    "topic-recreated": (topic_recreated(False), None, Size(50_000, 30, 2)),
    # Their short versions are integration tests (tests/integration/test_read_back.py).
    "redis-lost-references": (redis_lost(True), None, Size(50_000, 30, 2)),
    "topic-recreated-references": (topic_recreated(True), None, Size(30_000, 30, 2)),
    # Its short version: test_faults.py's test_a_missing_dlq_turns_readyz_red_until_it_is_created.
    "dlq-missing": (dlq_missing, None, Size(30_000, 40, 1, outage_s=20)),
    "sentinel-failover": (sentinel_failover, Size(2000, 10, 2), Size(50_000, 60, 3)),
    "cluster-failover": (cluster_failover, Size(2000, 10, 1), Size(50_000, 60, 1)),
    # Its short version: test_faults.py's test_a_read_only_redis_turns_readyz_red_and_names_it.
    "redis-readonly": (
        redis_readonly,
        None,
        Size(30_000, 60, 1, outage_s=20),
    ),
    # On the three-broker cluster (testbed/brokers.py), 600 records/s. The short versions
    # run in tests/integration/test_kafka_cluster.py, on its cluster; isr-shrink's is
    # test_with_two_brokers_of_three_down_nothing_is_acknowledged_and_readyz_says_why there.
    "leader-kill": (
        broker_fault("kill"),
        Size(2000, 16, 1, outage_s=10),
        Size(60_000, 100, 1, outage_s=30),
    ),
    "broker-freeze": (
        broker_fault("freeze"),
        Size(2000, 16, 1, outage_s=10),
        Size(60_000, 100, 1, outage_s=30),
    ),
    "isr-shrink": (isr_shrink, None, Size(60_000, 100, 1, outage_s=30)),
    "broker-roll": (broker_roll, Size(2000, 20, 1), Size(60_000, 100, 1)),
    # Its short version: test_recurring.py's test_exactly_once_each_occurrence_through_sigkills_
    # and_a_redis_that_lost_its_data (twelve seconds, twenty schedules every second).
    "recurring-sigkill": (recurring_sigkill, None, Size(60_000, 630, 10)),
}
KAFKA_CLUSTER_SCENARIOS = frozenset({"leader-kill", "broker-freeze", "isr-shrink", "broker-roll"})


def run_scenario(servers: Servers, workdir: Path, name: str, size: Size, seed: int) -> Result:
    scenario = SCENARIOS[name][0]
    overrides: dict[str, object] = {}
    if name == "hostile-input" or name.startswith("adversary"):
        overrides["limits__max_record_bytes"] = 100_000
    if name.startswith("adversary"):  # a burst read in one batch (see _burst_scene)
        overrides["ingress__batch_size"] = 20_000
    # What a user gets, not the harness's faster settings: the bridge's own group session and
    # heartbeat, and the default lease (recovery must not wait for it; it also sets the
    # producer's delivery.timeout.ms).
    users = name.startswith("rollout") or name in KAFKA_CLUSTER_SCENARIOS or name in RECOVERY
    if users:
        overrides["kafka__consumer"] = {}
    if name == "kafka-outage" and size.outage_s < 20:  # the short one: past the harness's session
        overrides.pop("kafka__consumer")
    if name in ("bridge-sigkill", "rebalance-storm") or users:
        overrides["egress__lease"] = "30s"
    if runs.PRODUCER_DEBUG:
        overrides.update(kafka__producer={"debug": runs.PRODUCER_DEBUG}, logging__level="DEBUG")
    if name == "priority-drain-sigkill":  # the drain takes the run's seconds
        overrides["egress__max_rate"] = max(1, int(size.records / size.seconds))
    if name == "adversary-references":
        overrides.update(store__payload_horizon="2s", store__fetch_ahead="1s")
    elif name == "read-back-sigkill" or name.endswith("-references"):
        overrides.update(store__payload_horizon="6s", store__fetch_ahead="3s")
    ha_set = {"sentinel-failover": "sentinel", "cluster-failover": "redis-cluster"}.get(name)
    if ha_set == "sentinel":
        info = servers.up_set(ha_set)
        overrides["redis__sentinel"] = {"nodes": info["sentinels"].split(","), "master": "mymaster"}
    elif ha_set == "redis-cluster":
        info = servers.up_set(ha_set)
        overrides.update(redis__url=info["url"], redis__cluster=True)
    delay_config = target_config = None
    if name in KAFKA_CLUSTER_SCENARIOS:
        servers.kafka_cluster_up()  # or its stopped brokers started again; it stays up after
        admin = AdminClient({"bootstrap.servers": servers.bootstrap, "log_level": CLIENT_LOG_LEVEL})
        wait_for(lambda: in_sync(admin), IN_SYNC_S, "every partition of the cluster in sync")
        # The brokers' append times (see testbed/brokers.py).
        delay_config = target_config = {"message.timestamp.type": "LogAppendTime"}
    elif name in ("kafka-outage", "kafka-restart", "recurring-sigkill") or name.startswith(
        "adversary"
    ):
        # The recovery after the broker is back counts to the append: the checker's own
        # consumer rejoins its group after the outage too.
        target_config = {"message.timestamp.type": "LogAppendTime"}
    run = Run(
        servers,
        workdir,
        name,
        overrides=overrides,
        watch=name != "dlq-missing",
        topics=Topics(delay_config=delay_config or {}),
        target_config=target_config,
    )
    if ha_set:
        run.ha_nodes = info["nodes"].split(",")
    try:
        return scenario(run, size, random.Random(seed))
    finally:
        run.close()
        if ha_set:
            servers.down_set(ha_set)
        servers.cluster_bootstrap = None  # the next run is on the single broker unless told


def assert_kept(result: Result, run_dir: Path) -> None:
    """What every short run in ``make test`` asserts: nothing lost, early or misrouted, every
    duplicate with its delay-id, every record accounted for, and every check of the scenario."""
    account = result.account
    print(f"{result.scenario}: {result.row()}")
    assert account.lost == [], f"lost: {account.lost[:10]}\n{_lost_story(account.lost, run_dir)}"
    assert account.early == [], f"early: {account.early[:10]}"
    assert account.misrouted == [], f"misrouted: {account.misrouted[:10]}"
    assert account.duplicate_ids_differ == 0, "a duplicate carried another delay-id"
    assert (
        account.delivered + account.dead_lettered + account.scheduled + account.replaced
        == account.records
    )
    failed = [check for check, kept in result.checks.items() if not kept]
    assert failed == [], _why(failed, result, run_dir)


def _why(failed: list[str], result: Result, run_dir: Path) -> str:
    """The ``failed`` checks and their context for the message (CI keeps no files): the run's
    notes, its fault windows' slowest records (recovery ms, origin, due and arrival epoch ms),
    the bridges' warnings and errors (a turn that ran long names what it waited on) and any
    crash."""
    slowest = "\n".join(
        f"  {ms} ms: {origin} due {due} arrived {at}"
        for ms, origin, due, at in result.account.slowest[:5]
    )
    notes = "; ".join(result.notes)
    return (
        f"failed: {'; '.join(failed)}\nnotes: {notes}\nslowest after a fault:\n{slowest}\n"
        f"{_said(run_dir)}\n{_crashes(run_dir)}"
    )


def _lost_story(lost: list[str], run_dir: Path, traced: int = 3) -> str:
    """What is known of records lost, for the failure message (CI keeps no files): the trace of
    the first few (``TOPIC:PARTITION:OFFSET``, the text before a space) and the bridges' warnings
    and errors."""
    parts = []
    config = next(iter(sorted(run_dir.rglob("bridge.yaml"))), None)
    for where in [x.split(" ")[0] for x in lost[:traced]]:
        if config is None:
            break
        traced_out = subprocess.run(
            [sys.executable, "-m", "bridge", "trace", "-c", str(config), "--origin", where],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        parts.append(f"trace {where}:\n{traced_out.stdout}{traced_out.stderr}")
    parts.append(_said(run_dir))
    return "\n".join(parts)


def _said(run_dir: Path, most: int = 40) -> str:
    """The first ``most`` warnings and errors of each bridge's log of the run."""
    parts = []
    for log in sorted(run_dir.rglob("bridge-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        said = [x for x in lines if " WARNING " in x or " ERROR " in x]
        parts.append(f"{log.name}: {len(said)} warnings and errors\n" + "\n".join(said[:most]))
    return "\n".join(parts)


def _crashes(run_dir: Path) -> str:
    """What the bridges' logs say of a crash, for the failure message (CI keeps no files)."""
    found = []
    for log in sorted(run_dir.rglob("bridge-*.log")):
        text = log.read_text(errors="replace")
        at = text.find("Traceback")
        if at >= 0:
            found.append(f"{log.name}:\n{text[max(0, at - 300) : at + 3000]}")
    return "\n".join(found)
