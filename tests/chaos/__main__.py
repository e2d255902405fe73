"""``python -m tests.chaos [--quick] [--exactly-once] [--seed N] [SCENARIO ...]``: run scenarios.

Starts the harness's own Kafka and Redis (127.0.0.1:19192 and :16479, state in
``$DELAY_BRIDGE_STATE_DIR/chaos``), runs each scenario, prints a Markdown table (docs/reliability.md's
Reliability section) and writes ``build/chaos/results.json``. Exits 1 if any scenario lost a
record, delivered early or failed a check; with ``--exactly-once`` (bridges with
``egress.exactly_once``), a duplicate fails a scenario too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from testbed import run as runs
from testbed.run import HEADER, Result
from testbed.scenarios import SCENARIOS, run_scenario
from testbed.servers import STATE_DIR, Servers
from tests.conftest import ROOT


def table(results: list[Result]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.row()) + " |" for r in results]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument(
        "scenarios",
        nargs="*",
        choices=[[], *SCENARIOS],
        metavar="SCENARIO",
        help=f"default: all of {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--quick", action="store_true", help="the short sizes `make test` runs")
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the servers running, and each run's topics and Redis keys "
        "(to trace its records)",
    )
    parser.add_argument(
        "--exactly-once",
        action="store_true",
        help="bridges with egress.exactly_once: a duplicate fails a scenario",
    )
    parser.add_argument(
        "--producer-debug",
        default="",
        metavar="CONTEXTS",
        help="librdkafka debug contexts for the bridges' producers (eos,topic,…), "
        "logged in their logs",
    )
    args = parser.parse_args()
    runs.EXACTLY_ONCE = args.exactly_once
    runs.PRODUCER_DEBUG = args.producer_debug
    runs.KEEP = args.keep
    names = args.scenarios or [
        n for n, (_, quick, _) in SCENARIOS.items() if quick or not args.quick
    ]
    out = ROOT / "build" / "chaos"
    out.mkdir(parents=True, exist_ok=True)
    servers = Servers(STATE_DIR / "chaos")
    servers.up()
    results: list[Result] = []
    try:
        for i, name in enumerate(names):
            _, quick, full = SCENARIOS[name]
            size = quick if args.quick and quick else full
            started = time.monotonic()
            print(f"== {name}: {size}", file=sys.stderr, flush=True)
            result = run_scenario(servers, out / "runs", name, size, args.seed + i)
            results.append(result)
            failed = [k for k, v in result.checks.items() if not v]
            print(
                f"   {'ok' if result.ok else 'FAILED'} in {time.monotonic() - started:.0f}s: "
                f"{' | '.join(result.row()[3:])}{' failed: ' + ', '.join(failed) if failed else ''}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if not args.keep:
            servers.down()
    print(table(results))
    command = "make chaos" if not args.quick else "python -m tests.chaos --quick"
    if args.exactly_once:
        command += " --exactly-once" if args.quick else " CHAOS_ARGS=--exactly-once"
    name = "results-exactly-once.json" if args.exactly_once else "results.json"
    (out / name).write_text(
        json.dumps(
            {
                "command": command,
                "seed": args.seed,
                "scenarios": [
                    {
                        "name": r.scenario,
                        "faults": r.faults,
                        "records": r.account.records,
                        "lost": r.account.lost[:20],
                        "duplicates": r.account.duplicates,
                        "twice": r.account.twice[:20],
                        "stray": r.account.stray[:20],
                        "early": r.account.early[:20],
                        "misrouted": r.account.misrouted[:20],
                        "max_lateness_ms": r.account.max_lateness_ms,
                        "recovery_ms": r.account.recovery_ms if r.account.faults_timed else None,
                        "max_lateness_during_fault_ms": r.account.max_during_fault_ms,
                        "slowest_after_fault": r.account.slowest,
                        "p99_lateness_ms": r.account.quantile_ms(0.99),
                        "checks": r.checks,
                        "notes": r.notes,
                        "seconds": round(r.seconds, 1),
                        "ok": r.ok,
                    }
                    for r in results
                ],
            },
            indent=2,
        )
    )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
