"""``python -m bench.ab BASE [--rounds N] [SCENARIO ...]``: this checkout against a commit.

    make bench-ab BASE=<commit> [BENCH_ARGS="--rounds 3 throughput"]

The same harness measures both bridges: ``BASE`` is checked out beside (a git worktree under
``$DELAY_BRIDGE_STATE_DIR/ab``) and its ``python -m bridge`` runs in place of this one's
(``testbed.harness.CODE_UNDER_TEST``). Runs alternate — base, this, A/A, A/A, this, base, … — so a
machine whose speed drifts over the hour weighs on every side alike. The A/A side runs the base's
code again (``--no-aa`` leaves it out): its ratios are the harness's spread in that run, which a
head's ratio must clear to mean anything. It runs last in each round's list, so the middle of each
pair of rounds, where a dip of the machine weighs on the heads and not on the base, weighs on it
as well. Scenarios:

* ``throughput``: 50,000 records of 100 B due at once, produced before the bridge starts:
  end-to-end records/s and the bridge's and Redis's CPU per record over the drain;
* ``steady``: 2,000 records/s for 20 s with the defaults: CPU per record and lateness p99 at the
  acknowledgement;
* ``exactly-once``: the same with ``egress.exactly_once``, at the recurring scenario's whole
  delivery rate (3,667 records/s): CPU per record, lateness p99 at the acknowledgement and as a
  read_committed consumer sees it (a cycle per record once tripled both p99s unnoticed).

Prints each run's figures and, per figure, the ratio of this checkout's mean to the base's; writes
``build/bench/ab.json``. Ratios, never absolute figures, are what a change is judged by here: the
machine's speed varies by 2x from one hour to the next (docs/bench/history.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import bench.scenarios
from bench.local import local_servers
from bench.scenarios import QUICK, Report, steady_load, throughput
from testbed.harness import CODE_UNDER_TEST
from testbed.servers import STATE_DIR
from testbed.services import ROOT

SCENARIOS = ("throughput", "steady", "exactly-once")
THROUGHPUT_RECORDS, STEADY_S = 50_000, 20.0
# Each scenario's figures: name -> whether more is better.
FIGURES: dict[str, dict[str, bool]] = {
    "throughput": {"end_to_end_per_s": True, "cpu_ms_per_record": False},
    "steady": {"cpu_ms_per_record": False, "ack_p99_ms": False},
    "exactly-once": {"cpu_ms_per_record": False, "ack_p99_ms": False, "seen_p99_ms": False},
}
EXACTLY_ONCE_RATE = 3667.0  # records/s: 2,000 one-shot and 1,667 occurrences (bench recurring)


@dataclass
class Side:
    """One checkout's runs: its label, where its bridge runs from, and each run's figures."""

    label: str
    code: Path
    runs: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def mean(self, scenario: str, figure: str) -> float:
        return statistics.fmean(r[figure] for r in self.runs.get(scenario, []))


def order(rounds: int, sides: int = 2) -> list[int]:
    """Which side runs when (0: base, 1: this checkout or the first of ``--heads``, …): each
    round runs every side once, every other round in reverse, so no side always runs first or
    last in a round (two sides: base, this, this, base, …)."""
    out: list[int] = []
    for r in range(rounds):
        out += range(sides) if r % 2 == 0 else reversed(range(sides))
    return out


def ratios(base: Side, head: Side, scenarios: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per scenario and figure: ``head``'s mean over the base's."""
    return {
        s: {f: head.mean(s, f) / max(1e-9, base.mean(s, f)) for f in FIGURES[s]} for s in scenarios
    }


def table(sides: Sequence[Side], scenarios: Sequence[str]) -> str:
    """Markdown: each figure's runs on every side, and each later side's ratio to the first
    (the base); the figure's name says which way is better."""
    base, heads = sides[0], sides[1:]
    head_columns = " | ".join(f"{h.label} | ratio" for h in heads)
    lines = [
        f"| scenario | figure | {base.label} | {head_columns} |",
        "|---|---|---|" + "---|---|" * len(heads),
    ]
    got = [ratios(base, h, scenarios) for h in heads]
    for s in scenarios:
        for f, more in FIGURES[s].items():
            cells = [" · ".join(_figure(r[f]) for r in base.runs.get(s, []))]
            for head, their in zip(heads, got, strict=True):
                cells.append(" · ".join(_figure(r[f]) for r in head.runs.get(s, [])))
                cells.append(f"{their[s][f]:.3f}")
            better = "higher is better" if more else "lower is better"
            lines.append(f"| {s} | {f} ({better}) | {' | '.join(cells)} |")
    return "\n".join(lines)


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def worktree(commit: str) -> Path:
    """A checkout of ``commit`` beside this one (made once, kept for the next comparison)."""
    sha = _git("rev-parse", "--verify", f"{commit}^{{commit}}").strip()
    path = STATE_DIR / "ab" / sha[:12]
    if not (path / "bridge").is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--force", "--detach", str(path), sha)
    return path


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"git {' '.join(args)}: {exc.stderr.strip()}") from None


def leg(scenario: str, code: Path, *, records: int, seconds: float) -> dict[str, float]:
    """One run of ``scenario`` by this harness, the bridge run from ``code`` (a process of its
    own, as every run starts afresh); its figures."""
    env = {**os.environ, CODE_UNDER_TEST: str(code)}
    args = [
        sys.executable,
        "-m",
        "bench.ab",
        "--leg",
        scenario,
        "--records",
        str(records),
        "--seconds",
        str(seconds),
    ]
    out = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"{scenario} with the bridge of {code} failed:\n{out.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def run_leg(scenario: str, records: int, seconds: float) -> dict[str, float]:
    """In the leg's own process: run the scenario on the local services."""
    servers = local_servers()
    servers.up()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        if scenario == "throughput":
            throughput(servers, Path(tmp), records, 100, report, ceilings=False)
            f = report.figures["throughput-100"]
            got = {k: float(f[k]) for k in FIGURES["throughput"]}
        else:
            overrides: dict[str, object] = {}
            if scenario == "exactly-once":
                overrides["egress__exactly_once"] = True
                bench.scenarios.STEADY_RATE = EXACTLY_ONCE_RATE  # the leg's own process
            steady_load(
                servers,
                Path(tmp),
                report,
                "steady",
                overrides,
                seconds=seconds,
                max_delay_ms=QUICK.max_delay_ms,
            )
            f = report.figures["steady"]
            got = {
                "cpu_ms_per_record": float(f["cpu_ms_per_record"]),
                "ack_p99_ms": float(f["ack_lateness_ms"]["p99"]),
                **(
                    {"seen_p99_ms": float(f["seen_lateness_ms"]["p99"])}
                    if scenario == "exactly-once"
                    else {}
                ),
                # Printed with each run, in no ratio: threads the code under test names apart
                # (db-*, from 2026-12-03 on; earlier code's Python threads are one "python").
                **{f"us {t}": float(us) for t, us in f["threads_us_per_record"].items()},
            }
    if report.problems:
        raise SystemExit(f"the contract broke: {report.problems}")
    return got


def compare(
    base_commit: str,
    scenarios: Sequence[str],
    rounds: int,
    *,
    heads: Sequence[str] = (),
    aa: bool = True,
    records: int = THROUGHPUT_RECORDS,
    seconds: float = STEADY_S,
    say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
) -> list[Side]:
    """Run ``scenarios`` ``rounds`` times on each side, in turn (``order``): the base, then
    this checkout, or a checkout of each of ``heads`` (a bisect's commits), and with ``aa`` the
    base again; every side's runs."""
    sides = [Side(f"base {base_commit}", worktree(base_commit))]
    sides += [Side(c, worktree(c)) for c in heads] or [Side("this checkout", ROOT)]
    if aa:
        sides.append(Side(f"A/A: base {base_commit} again", sides[0].code))
    turns = order(rounds, len(sides))
    for i, which in enumerate(turns):
        side = sides[which]
        for scenario in scenarios:
            say(f"[{i + 1}/{len(turns)}] {scenario}: {side.label}")
            got = leg(scenario, side.code, records=records, seconds=seconds)
            side.runs.setdefault(scenario, []).append(got)
            say(f"    {got}")
    return sides


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("base", nargs="?", help="the commit to compare with (e.g. a tag)")
    parser.add_argument(
        "scenarios",
        nargs="*",
        choices=[[], *SCENARIOS],
        metavar="SCENARIO",
        help=f"default: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument(
        "--heads",
        nargs="+",
        default=[],
        metavar="COMMIT",
        help="compare these commits with the base instead of this checkout "
        "(a bisect: each in turn, every ratio against the base)",
    )
    parser.add_argument(
        "--no-aa",
        dest="aa",
        action="store_false",
        help="leave out the A/A side (the base run again, its ratios the harness's spread)",
    )
    parser.add_argument("--records", type=int, default=THROUGHPUT_RECORDS, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=STEADY_S, help=argparse.SUPPRESS)
    parser.add_argument("--leg", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.leg:
        print(json.dumps(run_leg(args.leg, args.records, args.seconds)))
        return 0
    if not args.base:
        parser.error("name the commit to compare with: make bench-ab BASE=<commit>")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    scenarios = args.scenarios or list(SCENARIOS)
    sides = compare(
        args.base,
        scenarios,
        args.rounds,
        heads=args.heads,
        aa=args.aa,
        records=args.records,
        seconds=args.seconds,
    )
    print(table(sides, scenarios))
    if args.aa:
        print(
            "\nThe A/A side is the base run again: its ratios are this run's spread, and a"
            " head's ratio nearer 1 than the A/A's distance from it tells nothing."
        )
    out = ROOT / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(
        json.dumps(
            {
                "command": f"make bench-ab BASE={args.base}",
                "base": args.base,
                "rounds": args.rounds,
                "heads": args.heads,
                "aa": args.aa,
                "runs": {side.label: side.runs for side in sides},
                "ratios": {side.label: ratios(sides[0], side, scenarios) for side in sides[1:]},
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
