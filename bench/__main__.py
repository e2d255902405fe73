"""``python -m bench [--full] [SCENARIO ...]``: run the benchmarks on the local services.

Starts the local Kafka and Redis (``scripts/services up``, the ones ``make test`` uses) unless
they run, runs the scenarios with the issue's quick or full sizes, prints Markdown tables and the
targets, and writes ``build/bench/results.json`` and PNG plots next to it. Exits 1 if a record
was lost or delivered early: the figures of a run that broke the contract do not count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench import far_future
from bench import report as rep
from bench.bulk import bulk_cancel
from bench.exactly_once import exactly_once
from bench.local import RECOVERY_RATE, local_servers
from bench.priority import priority
from bench.rebuild import rebuild
from bench.recurring import recurring
from bench.scenarios import (
    FULL,
    QUICK,
    Report,
    Sizes,
    catch_up,
    precision_and_backlog,
    recovery,
    redis_modes,
    replicas,
    steady_cost,
    throughput,
)
from bench.trace_journal import trace
from testbed import run as runs
from testbed.servers import Servers
from testbed.services import ROOT

SCENARIOS = (
    "throughput",
    "precision",
    "catchup",
    "priority",
    "recovery",
    "exactly-once",
    "replicas",
    "cluster",
    "far-future",
    "trace",
    "bulk",
    "rebuild",
    "recurring",
)
# replicas drains three times the throughput scenario's records (two replicas' joining the group,
# one after the other, is a smaller share of a longer drain);
# cluster starts a Redis Cluster of its own; far-future holds ten million records (full) and
# lasts the spread of its scattered case twice; trace writes ten million journal entries (full):
# each asked for by name; bulk cancels a million far-future records (full) under live traffic;
# rebuild loses Redis holding ten million waiting records (full); recurring fires 100,000
# schedules a minute beside 2,000 one-shot records a second for three minutes (full).
DEFAULT = SCENARIOS[:7]
REPLICA_RECORDS_PER_THROUGHPUT = 3
READ_BACK_VALUE = 1024  # bytes: a reminder's payload
ID_BYTES = 31  # a delay-id of its own ("order-…"), as long as #59's far-future figure has it


def run_all(servers: Servers, out: Path, sizes: Sizes, names: list[str]) -> Report:
    """Run the named scenarios at ``sizes``; scratch files go under ``out``."""
    report = Report()
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {text}", file=sys.stderr, flush=True)

    capacity = 0.0
    if "throughput" in names or "precision" in names:
        for size in sizes.values if "throughput" in names else sizes.values[:1]:
            say(f"throughput: {sizes.throughput:,} records of {size} B, and the ceilings")
            rate = throughput(servers, out, sizes.throughput, size, report)
            capacity = capacity or rate
    if "throughput" in names:
        size = sizes.values[0]
        say(
            f"throughput: {sizes.throughput:,} records of {size} B, a {ID_BYTES}-byte delay-id each"
        )
        throughput(servers, out, sizes.throughput, size, report, tag="-ids", id_bytes=ID_BYTES)
        plain, ids = report.figures[f"throughput-{size}"], report.figures[f"throughput-{size}-ids"]
        for leg in ("ingest", "egress", "end_to_end"):
            ids[f"{leg}_vs_no_ids"] = ids[f"{leg}_per_s"] / plain[f"{leg}_per_s"]
    if "precision" in names:
        say(f"precision at {capacity / 2:,.0f}/s, then a backlog of {sizes.backlog:,}")
        precision_and_backlog(
            servers,
            out,
            report,
            rate=capacity / 2,
            seconds=sizes.precision_s,
            backlog=sizes.backlog,
            max_delay_ms=sizes.max_delay_ms,
        )
    if "precision" in names:
        say(f"cost per record at 2,000/s for {sizes.precision_s:.0f} s, coalescing off and on")
        steady_cost(
            servers, out, report, seconds=sizes.precision_s, max_delay_ms=sizes.max_delay_ms
        )
    if "catchup" in names:
        live = max(100.0, (capacity or 5000) / 10)
        say(f"catch-up: {sizes.catchup:,} records due while stopped, live traffic {live:,.0f}/s")
        catch_up(servers, out, sizes.catchup, live, report)
    if "priority" in names:
        say(
            f"priority: {sizes.priority:,} records due while stopped (10% high, 30% low), "
            f"drained without a limit, then at {sizes.max_rate:,}/s with live high records"
        )
        priority(
            servers, out, sizes.priority, report, max_rate=sizes.max_rate, live_rate=sizes.live_rate
        )
    if "recovery" in names:
        say(
            f"recovery: {RECOVERY_RATE:,.0f}/s for {sizes.precision_s:.0f} s, a bridge SIGKILLed "
            "half-way: restarted at once, then (two replicas) taken over"
        )
        recovery(
            servers,
            out,
            report,
            rate=RECOVERY_RATE,
            seconds=sizes.precision_s,
            session_ms=sizes.session_ms,
        )
    if "exactly-once" in names:
        say(
            f"exactly once next to at-least-once, alternating twice: {sizes.throughput:,} "
            f"records of 100 B due at once, then {RECOVERY_RATE:,.0f}/s for "
            f"{sizes.precision_s:.0f} s"
        )
        exactly_once(
            servers,
            out,
            report,
            count=sizes.throughput,
            seconds=sizes.precision_s,
            max_delay_ms=sizes.max_delay_ms,
        )
    if "replicas" in names:
        count = REPLICA_RECORDS_PER_THROUGHPUT * sizes.throughput
        say(
            f"replicas: {count:,} records of 100 B due at once, drained by one bridge, then by "
            "two side by side"
        )
        replicas(servers, out, count, report)
    if "cluster" in names:
        say(
            f"cluster: {sizes.cluster:,} records due at once and {sizes.precision_s:.0f} s of "
            "delays on standalone Redis, then the same on a 3-master Redis Cluster"
        )
        redis_modes(
            servers, out, sizes.cluster, sizes.precision_s, report, max_delay_ms=sizes.max_delay_ms
        )
    if "far-future" in names:
        for count, size in sizes.held:
            say(f"far-future: {count:,} records of {size} B due in 30 days, then a restart")
            far_future.held(servers, out, report, count, size)
        count, size = sizes.held[0]
        say(f"far-future: {count:,} records of {size} B due in 30 days, a 31-byte delay-id each")
        far_future.held(servers, out, report, count, size, id_bytes=31)
        for size in sizes.values:
            say(
                f"far-future: {sizes.contiguous:,} records of {size} B due at one instant, read "
                "back"
            )
            far_future.contiguous(servers, out, report, sizes.contiguous, size)
        say(
            f"far-future: {sizes.scattered:,} records due at random over {sizes.spread_s:.0f} s, "
            "read back"
        )
        far_future.scattered(
            servers,
            out,
            report,
            sizes.scattered,
            spread_s=sizes.spread_s,
            value_size=READ_BACK_VALUE,
        )
    if "bulk" in names:
        say(
            f"bulk: {sizes.bulk:,} far-future records cancelled by a key prefix while live "
            f"traffic arrives at {RECOVERY_RATE:,.0f}/s"
        )
        bulk_cancel(servers, out, report, count=sizes.bulk, rate=RECOVERY_RATE)
    if "rebuild" in names:
        say(
            f"rebuild: {sizes.rebuild:,} records waiting (a tenth whole, the rest references), "
            "then Redis lost"
        )
        rebuild(servers, out, report, sizes.rebuild)
    if "recurring" in names:
        schedules, every_s, seconds = sizes.recurring
        say(
            f"recurring: {schedules:,} schedules every {every_s} s ({schedules / every_s:,.0f} "
            f"occurrences a second) beside 2,000 one-shot records a second, for {seconds:.0f} s"
        )
        recurring(
            servers,
            out,
            report,
            schedules=schedules,
            every_s=every_s,
            seconds=seconds,
            max_delay_ms=sizes.max_delay_ms,
        )
    if "trace" in names:
        say(
            f"trace: a journal of {sizes.journal:,} entries over two days, records delivered a "
            "day ago traced"
        )
        trace(servers, out, report, sizes.journal)
    say("done")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "scenarios",
        nargs="*",
        choices=[[], *SCENARIOS],
        metavar="SCENARIO",
        help=f"default: {', '.join(DEFAULT)}",
    )
    parser.add_argument("--full", action="store_true", help="the full sizes (make bench-full)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench")
    parser.add_argument(
        "--no-journal", action="store_true", help="bridges without a journal (to measure its cost)"
    )
    args = parser.parse_args()
    runs.JOURNAL = not args.no_journal
    args.out.mkdir(parents=True, exist_ok=True)
    servers = local_servers()
    servers.up()
    started = time.monotonic()
    report = run_all(
        servers, args.out / "runs", FULL if args.full else QUICK, args.scenarios or list(DEFAULT)
    )
    command = "make bench-full" if args.full else "make bench"
    print(rep.tables(report))
    held = rep.targets(report)
    print("Targets\n")
    print("\n".join(f"- {'held' if ok else 'MISSED'}: {t} — {m}" for t, m, ok in held))
    for problem in report.problems:
        print(f"CONTRACT BROKEN: {problem}")
    written = rep.plots(report, args.out)
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "command": command,
                "seconds": round(time.monotonic() - started),
                "figures": report.figures,
                "targets": [{"target": t, "measured": m, "held": ok} for t, m, ok in held],
                "problems": report.problems,
                "plots": [p.name for p in written],
            },
            indent=2,
        )
    )
    made = [args.out / "results.json", *written]
    print(f"wrote {', '.join(str(p) for p in made)}", file=sys.stderr)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
