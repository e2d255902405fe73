"""Faults of a three-broker Kafka cluster (replication factor 3, min.insync.replicas 2).

The runs of these scenarios use ``scripts/services up kafka-cluster`` instead of the single broker
(see :func:`testbed.scenarios.run_scenario`), and their delay and target topics stamp records
with the broker's append time. Lateness counts from the later of the due time and the append to
the delay topic (a producer the fault held up is not the bridge's lateness) to the append to the
target topic: when the record was in Kafka for its consumers. When the checker's own consumer
saw it is reported beside (a consumer of the faulty cluster, it can wait on the fault itself).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka.admin import AdminClient

from bridge.egress.settle import STALL_S
from bridge.store.scripts import script_names
from testbed import run as runs
from testbed.background import Background
from testbed.checker import RECOVERY_BOUND_AFTER_FAULT_MS, quantile
from testbed.harness import Bridge, cli_of, metric, wait_ready
from testbed.run import Result, Run, Size
from testbed.services import wait_for
from testbed.workload import Workload, now_ms, steady

MAX_DELAY_MS = 5000
MIN_INSYNC = 2  # the cluster's min.insync.replicas (scripts/services)
SLOW_REDIS_MS = 100  # Redis calls of the bridge longer than this are named in the notes
READYZ_EVERY_S = 0.25
BROKER_STOP_S = 120.0  # a broker's controlled shutdown moves its leaderships first
IN_SYNC_S = 120.0  # a restarted broker catches up and rejoins every ISR
# A leader killed or frozen costs at most the cluster's fencing time (broker.session.timeout.ms,
# 9 s by default) + 3 s of lateness.
FENCED_LATENESS_S = 9.0 + 3.0


def leader_of_most(admin: AdminClient, topic: str) -> int:
    """The id of the broker leading most partitions of ``topic``."""
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
    counts = collections.Counter(p.leader for p in partitions if p.leader >= 0)
    return counts.most_common(1)[0][0]


@dataclass
class Readyz(Background):
    """/readyz sampled in a thread every 0.25 s: (epoch ms, status, body)."""

    bridge: Bridge
    samples: list[tuple[int, int, str]] = field(default_factory=list)
    thread_name = "readyz"

    def _run(self) -> None:
        while not self._stop.wait(READYZ_EVERY_S):
            try:
                status, body = self.bridge.get("/readyz")
            except OSError as exc:
                status, body = 0, str(exc)
            self.samples.append((now_ms(), status, body))

    def not_ready(self) -> list[tuple[int, int, str]]:
        return [s for s in self.samples if s[1] != 200]

    def named(self, what: str, windows: list[tuple[int, int]]) -> bool:
        """Whether a 503 within one of the ``windows`` named ``what``."""
        return any(
            status != 200 and what in body and any(a <= at <= b for a, b in windows)
            for at, status, body in self.samples
        )

    def note(self, result: Result) -> None:
        """How long /readyz said 503, and the first reason it gave."""
        not_ready = self.not_ready()
        if not_ready:
            seconds = len(not_ready) * READYZ_EVERY_S
            result.notes.append(f"/readyz 503 for ~{seconds:.1f} s: {not_ready[0][2][:120]}")
        result.checks["ready at the end"] = bool(self.samples) and self.samples[-1][1] == 200


def lateness(
    run: Run, windows: list[tuple[int, int]], *, seen: bool = False
) -> tuple[list[int], list[int]]:
    """The lateness (ms) of the records run.finish() settled that were due within the ``windows``
    (epoch ms, start to end), and of those due after the first of them began: to their append to
    the target topic, or to when the checker saw them (``seen``)."""
    during, after = [], []
    first = min(start for start, _ in windows)
    for seq, exp in run.settled.items():
        got = run.checker.delivered.get(seq)
        if not got or exp.due_ms is None:
            continue
        due = max(exp.due_ms, exp.produced_ms)
        late = max(0, min(g.seen_ms if seen else g.timestamp_ms for g in got) - due)
        if any(start <= due < end for start, end in windows):
            during.append(late)
        elif due >= first:
            after.append(late)
    return during, after


def recovery_split(
    run: Run, windows: list[tuple[int, int]], acked_ms: dict[int, int]
) -> tuple[dict[str, int], list[int]]:
    """The recovery (ms from the end of the last fault before its arrival) of the records due
    within the ``windows``: of those in the delay topic before the fault began (Kafka had
    acknowledged them: ``acked_ms``, by seq), and of those the workload's producers held through
    a fault (produced during it, or before it but not yet acknowledged) and appended once Kafka
    took writes again (the bridge reads those as a burst at the fault's end), counted from their
    acknowledgement: appended, a record is readable only once its replicas have it. A
    record that arrived during a fault recovered in 0. Arrival is the append to the target where
    it stamps LogAppendTime, else when the checker saw it. The records in the delay topic before
    the fault are keyed by their place in it (``topic:partition:offset``)."""
    stored: dict[str, int] = {}
    held: list[int] = []
    for seq, exp in run.settled.items():
        got = run.checker.delivered.get(seq)
        if not got or exp.due_ms is None:
            continue
        began = next((start for start, end in windows if start <= exp.due_ms < end), None)
        if began is None:
            continue
        first = min(g.timestamp_ms if run.append_times else g.seen_ms for g in got)
        ended = max((end for start, end in windows if end <= first), default=0)
        during = any(start <= first < end for start, end in windows)
        readable = max(exp.produced_ms, acked_ms.get(seq, 0))
        late = 0 if during else max(0, first - max(exp.due_ms, readable, ended))
        if readable >= began:  # not acknowledged before the fault: the producer held it
            held.append(late)
        else:
            stored[exp.offset] = late
    return stored, held


def assigned_after(bridge: Bridge, since_ms: int) -> int | None:
    """When (epoch ms) the bridge's log first says it was assigned partitions from ``since_ms``."""
    for line in bridge.output().splitlines():
        if "bridge.ingress.membership: assigned" in line:
            at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at * 1000 >= since_ms:
                return int(at * 1000)
    return None


def check_recovery_of_stored(
    run: Run,
    result: Result,
    windows: list[tuple[int, int]],
    acked_ms: dict[int, int],
    bridge: Bridge,
) -> int | None:
    """Check the recovery of the records due during the faults that were in Kafka before them
    (RECOVERY_BOUND_AFTER_FAULT_MS), and note it beside that of the records the workload's
    producers held through them: those arrive at the fault's end as one burst, read at the
    ingest's rate, so their recovery grows with the fault's length and the machine's speed, not
    with what the bridge does after a fault (recovery_split). A ``bridge`` that lost its
    partitions (its group session ran out during the last fault) gets them back once the group
    forms again after it: that wait is Kafka's share (the coordinator loads, or persists the
    rejoin only once its partition of ``__consumer_offsets`` is in sync again; librdkafka asks
    for it at most once a second), and the bridge's own share, counted from its assignment, is
    what is checked. Returns how long after the last fault's end the group formed again (ms, 0
    if before it; None: the bridge kept its partitions through it). Its end is when the harness
    saw the broker answer, seconds after clients may (a loaded machine starts its readiness
    probe late): an assignment from the fault's start counts."""
    stored, held = recovery_split(run, windows, acked_ms)
    result.notes.append(
        f"recovery of the records due during it: {_seconds(list(stored.values()))}"
        f" for those in Kafka before it, {_seconds(held)} for the {len(held):,} "
        "the producers held, from their acknowledgement"
    )
    bound = RECOVERY_BOUND_AFTER_FAULT_MS
    back = windows[-1][1]
    slowest = max(stored.values(), default=0)
    assigned = assigned_after(bridge, windows[-1][0])
    rejoin_ms = None if assigned is None else max(0, assigned - back)
    if rejoin_ms is None:
        check = f"recovery of the records in Kafka before it within {bound // 1000} s"
        result.checks[check] = within = slowest <= bound
    else:
        own_ms = slowest - rejoin_ms
        result.notes.append(
            f"group formed {rejoin_ms / 1000:.2f} s after the fault's "
            f"end; the bridge's own share {own_ms / 1000:.2f} s"
        )
        check = (
            f"the bridge's share of the recovery of the records in Kafka before it within "
            f"{bound // 1000} s"
        )
        result.checks[check] = within = own_ms <= bound
    if not within:
        result.notes.append(trace_slowest(run, bridge, stored))
    return rejoin_ms


def trace_slowest(run: Run, bridge: Bridge, recovery_ms: dict[str, int], count: int = 3) -> str:
    """Write what the journal says of the ``count`` slowest records (by ``recovery_ms``, keyed
    by place in the delay topic) to the run's directory, for the operator's ``delay-bridge trace
    --origin``; returns a note naming them and the file."""
    slowest = sorted(recovery_ms, key=lambda origin: -recovery_ms[origin])[:count]
    path = run.dir / "slowest-traces.txt"
    with path.open("w") as out:
        for origin in slowest:
            traced = cli_of(bridge, timeout=120)("trace", "--origin", origin)
            out.write(
                f"== {origin}: {recovery_ms[origin] / 1000:.2f} s after the fault's end\n"
                f"{traced.stdout}{traced.stderr}\n"
            )
    shown = ", ".join(f"{o} {recovery_ms[o] / 1000:.2f} s" for o in slowest)
    return f"slowest: {shown} (their traces: {path})"


def slow_redis_calls(run: Run) -> str:
    """The bridge's Redis calls that ran longer than SLOW_REDIS_MS (Redis's SLOWLOG, see
    Run.log_slow_calls; the longest first, its scripts by name)."""
    client = run.servers.redis()
    try:
        log = cast(list[dict[str, Any]], client.slowlog_get(128))
    finally:
        client.close()
    names = script_names()

    def what(command: bytes) -> str:
        words = command.split()
        if words and words[0].upper() == b"EVALSHA" and len(words) > 1:
            return names.get(words[1].decode(errors="replace"), "a script")
        return (words[0] if words else b"?").decode(errors="replace").lower()

    calls = sorted(log, key=lambda e: -int(e["duration"]))
    shown = [
        f"{what(e['command'])} {int(e['duration']) / 1e6:.2f} s at "
        f"{time.strftime('%H:%M:%S', time.localtime(int(e['start_time'])))}"
        for e in calls[:5]
    ]
    return f"{len(calls)}, the longest {', '.join(shown)}" if calls else ""


def _seconds(values: list[int]) -> str:
    return f"p99 {quantile(values, 0.99) / 1000:.2f} s, max {max(values, default=0) / 1000:.2f} s"


@dataclass
class Faulted:
    """What every broker scenario runs: one bridge, /readyz sampled, the steady load, and the
    windows (epoch ms) its faults lasted."""

    run: Run
    bridge: Bridge
    ready_before: bool
    readyz: Readyz
    workload: Workload
    windows: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def start(cls, run: Run, size: Size, rng: random.Random) -> Faulted:
        run.log_slow_calls(SLOW_REDIS_MS)  # which of the bridge's calls ran long (finish says)
        bridge = run.bridge("pod-0")  # a static member, as the chart deploys it
        ready_before = wait_ready(bridge)
        readyz = Readyz(bridge).start()
        records = steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30))
        return cls(run, bridge, ready_before, readyz, run.workload(records, size.seconds))

    def finish(self, scenario: str, faults: str) -> Result:
        """Settle the run; the lateness due during the faults and after, and /readyz."""
        self.run.faults += self.windows
        result = self.run.finish(self.workload, scenario, faults)
        self.readyz.stop()
        result.account.lateness_ms = result.account.stamp_lateness_ms  # to the append
        during, after = lateness(self.run, self.windows)
        result.notes.append(f"due during the fault: {_seconds(during)}; after: {_seconds(after)}")
        seen, _ = lateness(self.run, self.windows, seen=True)
        result.notes.append(f"the checker's consumer saw those due during it: {_seconds(seen)}")
        self.readyz.note(result)
        result.checks["ready before"] = self.ready_before
        slow = slow_redis_calls(self.run)
        if slow:
            result.notes.append(f"Redis calls over {SLOW_REDIS_MS} ms: {slow}")
        return result


def broker_fault(kind: str) -> Callable[[Run, Size, random.Random], Result]:
    """``kill``: the broker leading most delay-topic partitions SIGKILLed, started again after
    ``size.outage_s``; ``freeze``: it stops answering (SIGSTOP) for ``size.outage_s``, then goes
    on (SIGCONT) — a long GC pause or a network partition."""

    def scenario(run: Run, size: Size, rng: random.Random) -> Result:
        f = Faulted.start(run, size, rng)
        gap = size.seconds / (size.faults + 1)
        for i in range(size.faults):
            run.at(gap * (i + 1) - size.outage_s / 2)
            broker = run.servers.brokers()[leader_of_most(run.admin, run.delay)]
            start = now_ms()
            os.kill(broker.pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            time.sleep(size.outage_s)  # the fault's length, not a wait on a condition
            if kind == "kill":
                run.servers.kafka_cluster_up()
            else:
                os.kill(broker.pid, signal.SIGCONT)
            f.windows.append((start, now_ms()))
        what = "kill -9 of" if kind == "kill" else "SIGSTOP for"
        result = f.finish(
            "partition leader killed" if kind == "kill" else "partition leader frozen",
            f"{size.faults} x {what} the broker leading most delay partitions "
            f"({size.outage_s:.0f} s, three brokers)",
        )
        if f.readyz.named("from no broker", [(0, now_ms())]):
            result.notes.append("/readyz named a delay partition fetched from no broker")
        if size.outage_s >= 30:  # the full run: the short one's faults are barely fenced
            # Exactly once, a commit needs the transaction coordinator too: when the broker was
            # that as well, its partition of the transaction log moves after another fencing.

            bound = FENCED_LATENESS_S + (9.0 if runs.EXACTLY_ONCE else 0.0)
            within = result.account.max_lateness_ms <= bound * 1000
            result.checks[f"lateness <= fencing + 3 s ({bound:.0f} s)"] = within
        return result

    return scenario


def isr_shrink(run: Run, size: Size, rng: random.Random) -> Result:
    """Two of the three brokers SIGKILLed at once (the one leading most delay partitions and
    another), started again after ``size.outage_s``: no partition keeps min.insync.replicas (2),
    so Kafka takes no write. The bridge stops delivering and acknowledging (nothing leaves Redis
    that Kafka did not take), says so in /readyz (``deliveries``) and in
    ``delay_bridge_oldest_inflight_seconds``, and resumes by itself. The fault ends when Kafka
    takes writes again: every partition has MIN_INSYNC replicas in sync, some seconds after the
    restarted brokers answer (they catch up first)."""
    f = Faulted.start(run, size, rng)
    stalled_s, writable_s = [], []
    gap = size.seconds / (size.faults + 1)
    for i in range(size.faults):
        run.at(gap * (i + 1) - size.outage_s / 2)
        brokers = run.servers.brokers()
        leader = leader_of_most(run.admin, run.delay)
        other = rng.choice(sorted(set(brokers) - {leader}))
        start = now_ms()
        for victim in (leader, other):
            os.kill(brokers[victim].pid, signal.SIGKILL)
        peak, end = 0.0, time.monotonic() + size.outage_s
        while time.monotonic() < end:  # the fault's length, the metric sampled meanwhile
            time.sleep(1.0)
            with contextlib.suppress(OSError):
                peak = max(peak, metric(f.bridge, "delay_bridge_oldest_inflight_seconds"))
        stalled_s.append(peak)
        run.servers.kafka_cluster_up()
        answered = time.monotonic()
        wait_for(lambda: writable(run.admin), IN_SYNC_S, "every partition takes writes again")
        writable_s.append(time.monotonic() - answered)
        f.windows.append((start, now_ms()))
    result = f.finish(
        "min.insync.replicas lost",
        f"{size.faults} x kill -9 of two of the three brokers ({size.outage_s:.0f} s)",
    )
    result.notes.append(
        "delay_bridge_oldest_inflight_seconds peaked at "
        + ", ".join(f"{s:.0f} s" for s in stalled_s)
    )
    result.notes.append(
        "Kafka took writes again (min.insync.replicas in sync everywhere) "
        + ", ".join(f"{s:.1f} s" for s in writable_s)
        + " after the brokers answered"
    )
    check_recovery_of_stored(run, result, f.windows, f.workload.acked_ms, f.bridge)
    result.checks["/readyz named the deliveries"] = f.readyz.named("deliveries", f.windows)
    result.checks["the metric showed them waiting"] = all(s > STALL_S for s in stalled_s)
    return result


def broker_roll(run: Run, size: Size, rng: random.Random) -> Result:
    """A rolling restart, as an upgrade does it: each broker in turn stopped (SIGTERM: a
    controlled shutdown moves its leaderships away first), started again, and waited for until
    every partition is fully in sync before the next one goes."""
    f = Faulted.start(run, size, rng)
    for i in range(size.faults):
        run.at(size.seconds * i / size.faults + 2)
        start = now_ms()
        for broker in sorted(run.servers.brokers()):
            pid = run.servers.brokers()[broker].pid
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, f"broker {broker}")
            run.servers.kafka_cluster_up()
            wait_for(lambda: in_sync(run.admin), IN_SYNC_S, "every partition in sync")
        f.windows.append((start, now_ms()))
    return f.finish("brokers rolled", f"{size.faults} x a rolling restart of the three brokers")


def proc_state(stat: Path) -> str | None:
    """The state letter of a /proc/PID/stat or /proc/PID/task/TID/stat (None: gone)."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _wait_gone(pid: int, what: str) -> None:
    def gone() -> bool:  # exited (a zombie not reaped yet counts)
        return proc_state(Path(f"/proc/{pid}/stat")) in (None, "Z")

    wait_for(gone, BROKER_STOP_S, f"{what} to stop")


def writable(admin: AdminClient) -> bool:
    """Whether every partition of every topic has a leader and MIN_INSYNC replicas in sync."""
    return _every_partition(admin, lambda p: len(p.isrs) >= MIN_INSYNC)


def in_sync(admin: AdminClient) -> bool:
    """Whether every partition of every topic has all its replicas in sync."""
    return _every_partition(admin, lambda p: len(p.isrs) == len(p.replicas))


def _every_partition(admin: AdminClient, holds: Callable[[Any], bool]) -> bool:
    """Whether every partition of every topic has a leader and ``holds`` (False while the
    cluster does not answer)."""
    try:
        topics = admin.list_topics(timeout=5).topics.values()
    except Exception:
        return False
    return all(p.leader >= 0 and holds(p) for t in topics for p in t.partitions.values())
