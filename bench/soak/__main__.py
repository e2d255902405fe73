"""``python -m bench.soak``: run the soak, or write its report again from a run's results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench.soak
from bench.soak.judge import targets
from bench.soak.report import plot, report
from bench.soak.run import KAFKA_PORT, REDIS_PORT, soak
from testbed.servers import STATE_DIR, Servers
from testbed.services import ROOT


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=bench.soak.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--max-delay", type=float, default=600, help="seconds")
    parser.add_argument("--kill-every", type=float, default=10, help="minutes")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="RESULTS_JSON",
        help="write report.md and soak.png again from a run's results",
    )
    args = parser.parse_args()
    out = ROOT / "build" / "soak"
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        results = json.loads(args.report.read_text())
        results["targets"] = targets(results)
    else:
        servers = Servers(STATE_DIR / "soak", kafka_port=KAFKA_PORT, redis_port=REDIS_PORT)
        servers.up("redis")
        try:
            results = soak(
                servers,
                out,
                minutes=args.minutes,
                rate=args.rate,
                max_delay_s=args.max_delay,
                kill_every_min=args.kill_every,
            )
        finally:
            servers.down()
        (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "soak.png")
    (out / "report.md").write_text(report(results))
    print(report(results).split("\n\n| minute")[0])
    print(f"{out / 'results.json'}, {out / 'report.md'}, {out / 'soak.png'}")
    return 0 if all(met for _, _, met in results["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
