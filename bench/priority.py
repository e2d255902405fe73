"""The priority scenario: a backlog of mixed priorities, all due at one instant, that came due while
the bridge was stopped — drained without a rate limit, then again with ``egress.max_rate`` while
live high-priority records arrive.

Order is measured by the broker's clock: the target topic stamps each record with its append time
(``LogAppendTime``, in ms), so "every high record before the first low one" means the latest high
stamp is not after the earliest low one (one replica: every partition is its own).
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.scenarios import (
    ACK_STAMPS,
    Progress,
    Report,
    finished,
    lateness_figures,
    produce,
    read_expected,
    ready_bridge,
    settled,
    wait_delivered,
)
from bridge.message import H_AFTER, H_PRIORITY, H_TARGET_TOPIC, Headers, Priority
from bridge.store import Store
from testbed.checker import settle
from testbed.run import Run
from testbed.servers import Servers
from testbed.workload import PRIORITY_MIX, Record, now_ms, prioritised

LIVE_S = 5.0  # live high records arrive over this long from the restart (the rate-limited run)


def priority(
    servers: Servers, workdir: Path, count: int, report: Report, *, max_rate: int, live_rate: float
) -> None:
    """The two drains: without a limit (how fast, in what order), and at ``max_rate`` with live
    high records (how long, and whether the live ones go before the backlog's lower ones)."""
    figures = report.figures
    figures["priority"] = _drain(servers, workdir, count, report, max_rate=0, live_rate=0)
    figures["priority, rate-limited"] = _drain(
        servers, workdir, count, report, max_rate=max_rate, live_rate=live_rate
    )


def _drain(
    servers: Servers, workdir: Path, count: int, report: Report, *, max_rate: int, live_rate: float
) -> dict[str, object]:
    name = "priority-limited" if max_rate else "priority"
    overrides: dict[str, object] = {"egress__max_rate": max_rate} if max_rate else {}
    run = Run(servers, workdir, name, label="bench", target_config=ACK_STAMPS, overrides=overrides)
    store = Store(servers.redis(), run.prefix)
    try:
        bridge = ready_bridge(run)
        due_ms = now_ms() + 3000 + count // 10  # time to produce and store them all first
        records = prioritised(count, run.target, str(due_ms).encode())
        progress = Progress(store, run.delay).start()
        finished(produce(run, records, float("inf")), 600)
        progress.wait(lambda i, s: s >= count, 600, f"{name}: backlog stored")
        progress.stop()
        if now_ms() > due_ms:
            report.problems.append(f"{name}: storing the backlog took longer than its lead")
        bridge.stop()
        time.sleep(max(0.0, (due_ms + 1000 - now_ms()) / 1000))  # all come due while stopped
        restarted_ms = now_ms()
        bridge = ready_bridge(run)
        live: list[Record] = []
        if live_rate:
            high: Headers = [
                (H_TARGET_TOPIC, run.target.encode()),
                (H_AFTER, b"0ms"),
                (H_PRIORITY, b"high"),
            ]
            live = [Record(high, key=b"live%d" % i) for i in range(int(live_rate * LIVE_S))]
            finished(produce(run, live, live_rate, first_seq=count), LIVE_S * 3 + 60)
        wait_delivered(run, range(count + len(live)), 600)
        bridge.stop()
        expected = read_expected(run)
        settled(run, expected, range(count), report, f"{name} backlog")
        stamps = {
            s: min(g.timestamp_ms for g in run.checker.delivered[s])
            for s in range(count + len(live))
        }
        mix = PRIORITY_MIX
        by = {p: [stamps[s] for s in range(count) if mix[s % len(mix)] is p] for p in Priority}
        last_of = {p: max(by[p]) for p in Priority}
        first, last = min(stamps[s] for s in range(count)), max(stamps[s] for s in range(count))
        figures: dict[str, object] = {
            "records": count,
            "max_rate": max_rate,
            "drain_s": round((last - first) / 1000, 2),
            "drain_s_from_start": round((last - restarted_ms) / 1000, 2),
            "drain_per_s": round(count / max(1e-3, (last - first) / 1000)),
            # Records of a lower priority stamped before the last one of a higher: 0 is the
            # contract on one replica.
            "low_before_last_high": sum(1 for t in by[Priority.LOW] if t < last_of[Priority.HIGH]),
            "normal_before_last_high": sum(
                1 for t in by[Priority.NORMAL] if t < last_of[Priority.HIGH]
            ),
            "low_before_last_normal": sum(
                1 for t in by[Priority.LOW] if t < last_of[Priority.NORMAL]
            ),
            "lateness_ms": {
                p.label: lateness_figures([t - due_ms for t in by[p]]) for p in Priority
            },
        }
        if live:
            during = {s: e for s, e in expected.items() if s >= count}
            account = settle(run.checker, during, horizon_ms=now_ms())
            figures["live"] = len(live)
            figures["live_lateness_ms"] = lateness_figures(account.stamp_lateness_ms)
            # Backlog records of lower priority still waiting when the live ones went out.
            last_live = max(stamps[s] for s in during)
            figures["live_overtook"] = sum(1 for s in range(count) if stamps[s] > last_live)
        return figures
    finally:
        store.client.close()
        run.close()
