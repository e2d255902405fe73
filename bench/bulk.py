"""Bulk cancel under load: a customer's far-future records cancelled while live traffic flows.

``count`` records due in 30 days with keys ``bulk-<n>`` (kept as references) are stored; then live
records (delays 1-3 s) are produced at ``rate`` while ``delay-bridge cancel --key-prefix bulk-
--yes --rate <pace>`` runs (by default no rate: it follows the bridge). Measured: how long the
command took (it reads each reference's key in the delay topic and produces a cancel per match),
how long until the store held none of the matched records, and the live records' lateness at the
broker meanwhile. None of the cancelled may be delivered, every live record must be.

    python -m bench.bulk [--records N] [--pace P] [--held H]

runs it alone (``make bench BENCH_ARGS=bulk`` runs it at the command's default pace), with the
command's ``--rate`` at P (0: none; it follows the bridge either way), H records due in 50
minutes held whole in the store meanwhile (a live backlog), and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.scenarios import (
    ACK_STAMPS,
    FAR_FUTURE,
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
from bridge.message import H_AFTER, H_TARGET_TOPIC, Headers
from bridge.ops import DEFAULT_RATE
from bridge.store import Shard, Store
from testbed.run import PARTITIONS, Run
from testbed.servers import Servers
from testbed.services import ROOT
from testbed.workload import Record, steady

PREFIX = b"bulk-"


def bulk_cancel(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    count: int,
    rate: float,
    pace: float = DEFAULT_RATE,
    held: int = 0,
) -> None:
    """See the module docstring; the figures go to ``report`` as ``bulk cancel`` (``pace``: the
    command's ``--rate``, 0 for none; ``held``: records due in 50 minutes, held whole meanwhile,
    stored first)."""
    run = Run(servers, workdir, "bulk", label="bench", target_config=ACK_STAMPS)
    store = Store(servers.redis(), run.prefix)
    shards = [Shard(run.delay, p) for p in range(PARTITIONS)]
    try:
        bridge = ready_bridge(run)
        header: Headers = [(H_TARGET_TOPIC, run.target.encode()), (H_AFTER, FAR_FUTURE)]
        backlog = [Record(header, key=PREFIX + b"%d" % i) for i in range(count)]
        later: Headers = [(H_TARGET_TOPIC, run.target.encode()), (H_AFTER, b"50m")]
        backlog += [Record(later, key=b"held-%d" % i) for i in range(held)]
        progress = Progress(store, run.delay).start()
        finished(produce(run, backlog, float("inf")), 900)
        progress.wait(lambda i, s: i >= count + held, 900, "the records stored")
        progress.stop()
        # The live load runs from before the command until after the store held none of them.
        live_seconds = max(3.0, count / (pace or 7_000))  # followed, they apply at ~8,500/s
        live = steady(int(rate * live_seconds), run.target, 3000, seed=17, min_delay_ms=1000)
        workload = produce(run, live, rate, first_seq=count + held)
        started = time.monotonic()
        command = subprocess.run(
            [
                sys.executable,
                "-m",
                "bridge",
                "cancel",
                "--key-prefix",
                PREFIX.decode(),
                "--yes",
                "--rate",
                str(pace),
            ],
            cwd=ROOT,
            env=bridge.env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        produced_s = time.monotonic() - started
        if command.returncode != 0:
            raise RuntimeError(f"bulk cancel failed: {command.stderr[-2000:]}")
        stalled = "without waiting" in command.stderr  # it stopped following the bridge
        deadline = time.monotonic() + 900
        while _customers(store, shards) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the cancels were not all applied within 900 s")
            time.sleep(0.2)
        applied_s = time.monotonic() - started
        finished(workload, live_seconds * 3 + 60)
        live_seqs = range(count + held, count + held + len(live))
        wait_delivered(run, live_seqs, 300)
        bridge.stop()
        account = settled(run, read_expected(run), live_seqs, report, "bulk cancel live")
        cancelled_delivered = sum(1 for s in range(count) if s in run.checker.delivered)
        if cancelled_delivered:
            report.problems.append(f"bulk cancel: {cancelled_delivered} cancelled delivered")
        report.figures["bulk cancel"] = {
            "records": count,
            "held_whole": held,
            "pace_per_s": pace,
            "command_s": round(produced_s, 1),
            "applied_s": round(applied_s, 1),
            "stalled": stalled,
            "cancelled_delivered": cancelled_delivered,
            "live_rate_per_s": rate,
            "live_records": len(live),
            "live_ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
        }
    finally:
        store.client.close()
        run.close()


def _customers(store: Store, shards: list[Shard]) -> int:
    """How many of the customer's records (due in 30 days) the store holds: not the live ones."""
    soon = store.time_ms() + 86_400_000
    return sum(store.inventory.count(s) - store.inventory.count(s, soon) for s in shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--pace", type=float, default=DEFAULT_RATE)
    parser.add_argument("--held", type=int, default=0)
    args = parser.parse_args()
    from bench.local import RECOVERY_RATE, local_servers

    servers = local_servers()
    servers.up()
    report = Report()
    bulk_cancel(
        servers,
        ROOT / "build" / "bench" / "runs",
        report,
        count=args.records,
        rate=RECOVERY_RATE,
        pace=args.pace,
        held=args.held,
    )
    print(json.dumps(report.figures["bulk cancel"], indent=2))
    for problem in report.problems:
        print(f"CONTRACT BROKEN: {problem}")


if __name__ == "__main__":
    main()
