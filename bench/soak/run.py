"""The soak's hour: the cluster, the load, a bridge killed every few minutes, a row per minute."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.scenarios import ACK_STAMPS
from bench.soak.judge import targets
from bench.soak.load import MIN_DELAY_MS, PRELOAD_RATE, Load, Records
from bench.soak.meters import BridgeMeter, BrokerGC, Machine, Meter, RedisMeter
from bench.soak.tally import Tally, quantile
from testbed.harness import wait_ready
from testbed.run import Run
from testbed.servers import Servers
from testbed.services import ROOT
from testbed.workload import Workload, now_ms

# Ports and state of its own: a soak runs for an hour and must not meet `make test`'s chaos
# servers (19192, 16479 and the cluster on 19292).
KAFKA_PORT, REDIS_PORT = 19392, 16679


def soak(
    servers: Servers,
    out: Path,
    *,
    minutes: float,
    rate: float,
    max_delay_s: float,
    kill_every_min: float,
) -> dict[str, Any]:
    servers.kafka_cluster_up()
    run = Run(
        servers,
        out / "runs",
        "soak",
        label="soak",
        target_config=ACK_STAMPS,
        watch=False,
        # What a user gets: the bridge's own group session and lease.
        overrides={"kafka__consumer": {}, "egress__lease": "30s"},
    )
    redis = servers.redis()
    meter = Meter()
    try:
        max_delay_ms = int(max_delay_s * 1000)
        preload = int(rate * (MIN_DELAY_MS + max_delay_ms) / 2000)
        load = Load(
            run.target, now_ms() + 2000, preload, int(rate * minutes * 60), rate, max_delay_ms
        )
        bridge = run.bridge("pod-0")
        wait_ready(bridge)
        tally = Tally(servers.bootstrap, run.target, run.dlq, load).start()
        time.sleep(max(0.0, (load.start_ms - now_ms()) / 1000))  # the load's start time
        first = Workload(servers.bootstrap, run.delay, Records(load, 0, preload), PRELOAD_RATE)
        steady = Workload(
            servers.bootstrap,
            run.delay,
            Records(load, preload, load.steady),
            rate,
            first_seq=preload,
        )

        def begin() -> None:  # the steady load as soon as the preload is in
            first.join(preload / PRELOAD_RATE * 3 + 60)
            load.steady_start_ms = now_ms()
            steady.start()

        first.start()
        started = time.monotonic()
        starter = threading.Thread(target=begin, name="steady", daemon=True)
        starter.start()
        rows: list[dict[str, Any]] = []
        kills: list[int] = []
        cpu, redis_meter, machine = meter.total(bridge), RedisMeter(redis), Machine()
        own, gc = BridgeMeter(), BrokerGC(servers.broker_gc_logs())
        end_min = int(preload / PRELOAD_RATE / 60 + minutes) + 1
        born = 0  # the minute mark the bridge running now was started at
        for minute in range(1, end_min + 1):
            time.sleep(max(0.0, started + minute * 60 - time.monotonic()))  # the minute mark
            now_cpu = meter.total(bridge)
            rows.append(
                {
                    "minute": minute,
                    "age_min": minute - born,
                    "rss_bytes": bridge.memory(),
                    "anon_bytes": bridge.memory("RssAnon"),
                    "bridge_cpu_s": now_cpu - cpu,
                    **redis_meter.sample(),
                    **machine.sample(),
                    **own.sample(bridge),
                    **gc.sample(),
                }
            )
            cpu = now_cpu
            print(f"   minute {minute}: {rows[-1]}", file=sys.stderr, flush=True)
            if minute % kill_every_min == 0 and minute < end_min:
                meter.kill(bridge)
                kills.append(now_ms())
                bridge, born = run.bridge("pod-0"), minute
        starter.join(60)
        steady.join(600)
        deadline = time.monotonic() + max_delay_s + 120
        while tally.missing() and time.monotonic() < deadline:
            time.sleep(1)  # polling the tally, with a deadline
        time.sleep(2)  # duplicates still in flight
        tally.stop()
        return _results(
            load,
            tally,
            rows,
            kills,
            first.failed + steady.failed,
            minutes=minutes,
            rate=rate,
            max_delay_s=max_delay_s,
            kill_every_min=kill_every_min,
        )
    finally:
        redis.close()
        run.close()
        servers.kafka_cluster_down()


def _results(
    load: Load,
    tally: Tally,
    rows: list[dict[str, Any]],
    kills: list[int],
    failed: list[str],
    **args: float,
) -> dict[str, Any]:
    for row in rows:
        m = row["minute"] - 1  # the minute that ended at the mark
        lateness = tally.lateness.get(m, collections.Counter())
        delivered = tally.delivered_in.get(m, 0)
        row.update(
            delivered=delivered,
            due=sum(lateness.values()),
            p99_ms=quantile(lateness, 0.99),
            max_ms=max(lateness, default=0),
            killed=any(
                load.start_ms + m * 60_000 <= k < load.start_ms + (m + 1) * 60_000 for k in kills
            ),
        )
        for who in ("bridge", "redis"):  # none in the preload's minutes: nothing is due yet
            cpu_ms = row[f"{who}_cpu_s"] * 1000
            row[f"{who}_cpu_ms_per_record"] = cpu_ms / delivered if delivered else None
    overall: collections.Counter[int] = collections.Counter()
    for counts in tally.lateness.values():
        overall.update(counts)
    results = {
        "command": "make soak",
        "args": args,
        "commit": _commit(),
        "records": len(load),
        "preload": load.preload,
        "lost": tally.missing(),
        "early": len(tally.early),
        "early_seqs": tally.early[:20],
        "dead_lettered": tally.dead,
        "wrong_due_header": tally.wrong_due,
        "duplicates": tally.duplicates,
        "workload_failed": failed[:5],
        "kills": len(kills),
        "p99_ms": quantile(overall, 0.99),
        "max_ms": max(overall, default=0),
        "minutes": rows,
    }
    results["targets"] = targets(results)
    return results


def _commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip()
