"""Faults of a three-broker Kafka cluster (replication factor 3, min.insync.replicas 2).

The runs of these scenarios use ``scripts/services up kafka-cluster`` instead of the single broker
(see :func:`tests.chaos.scenarios.run_scenario`), and their delay topic stamps records with the
broker's append time: lateness counts from the later of the due time and the append, so a
producer the fault held up is not the bridge's lateness.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient

from tests.chaos.checker import quantile
from tests.chaos.workload import now_ms, steady
from tests.integration.harness import Bridge, wait_ready

if TYPE_CHECKING:
    from tests.chaos.scenarios import Result, Run, Size

MAX_DELAY_MS = 5000
READYZ_EVERY_S = 0.25


def leader_of_most(admin: AdminClient, topic: str) -> int:
    """The id of the broker leading most partitions of ``topic``."""
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
    counts = collections.Counter(p.leader for p in partitions if p.leader >= 0)
    return counts.most_common(1)[0][0]


@dataclass
class Readyz:
    """/readyz sampled in a thread every 0.25 s: (epoch ms, status, body)."""

    bridge: Bridge
    samples: list[tuple[int, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Readyz:
        self._thread = threading.Thread(target=self._run, name="readyz", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(READYZ_EVERY_S):
            try:
                status, body = self.bridge.get("/readyz")
            except OSError as exc:
                status, body = 0, str(exc)
            self.samples.append((now_ms(), status, body))

    def not_ready(self) -> list[tuple[int, int, str]]:
        return [s for s in self.samples if s[1] != 200]


def lateness(run: Run, windows: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The lateness (ms) of the records run.finish() settled that were due within the ``windows``
    (epoch ms, start to end), and of those due after the first of them began."""
    during, after = [], []
    first = min(start for start, _ in windows)
    for seq, exp in run.settled.items():
        got = run.checker.delivered.get(seq)
        if not got or exp.due_ms is None:
            continue
        due = max(exp.due_ms, exp.produced_ms)
        late = max(0, min(g.seen_ms for g in got) - due)
        if any(start <= due < end for start, end in windows):
            during.append(late)
        elif due >= first:
            after.append(late)
    return during, after


def _seconds(values: list[int]) -> str:
    return f"p99 {quantile(values, 0.99) / 1000:.2f} s, max {max(values, default=0) / 1000:.2f} s"


def broker_fault(kind: str) -> Callable[[Run, Size, random.Random], Result]:
    """``kill``: the broker leading most delay-topic partitions SIGKILLed, started again after
    ``size.outage_s``; ``freeze``: it stops answering (SIGSTOP) for ``size.outage_s``, then goes
    on (SIGCONT) — a long GC pause or a network partition."""

    def scenario(run: Run, size: Size, rng: random.Random) -> Result:
        bridge = run.bridge()
        ready_before = wait_ready(bridge)
        readyz = Readyz(bridge).start()
        records = steady(size.records, run.target, MAX_DELAY_MS, rng.randrange(1 << 30))
        workload = run.workload(records, size.seconds)
        windows: list[tuple[int, int]] = []
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
            windows.append((start, now_ms()))
        what = "kill -9 of" if kind == "kill" else "SIGSTOP for"
        result = run.finish(
            workload,
            "partition leader killed" if kind == "kill" else "partition leader frozen",
            f"{size.faults} x {what} the broker leading most delay partitions "
            f"({size.outage_s:.0f} s, three brokers)",
        )
        readyz.stop()
        during, after = lateness(run, windows)
        result.notes.append(f"due during the fault: {_seconds(during)}; after: {_seconds(after)}")
        not_ready = readyz.not_ready()
        if not_ready:
            seconds = len(not_ready) * READYZ_EVERY_S
            result.notes.append(f"/readyz 503 for ~{seconds:.1f} s: {not_ready[0][2][:120]}")
        result.checks["ready before"] = ready_before
        result.checks["ready at the end"] = bool(readyz.samples) and readyz.samples[-1][1] == 200
        return result

    return scenario
