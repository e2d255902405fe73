"""Recurring schedules under load: many schedules firing beside a steady one-shot load.

``python -m bench recurring``: N schedules, each every E seconds, their first occurrences spread
evenly over one interval (so N / E occurrences fall due each second), produced before the bridge
starts, exactly once on; beside them 2,000 one-shot records a second. Over the measured window (S
seconds, from the second interval on), each occurrence expected is looked for on the target topic
by a ``read_committed`` consumer: lateness at the acknowledgement (the target's ``LogAppendTime``
less the occurrence's instant), occurrences missed, early and delivered twice. The one-shot records
go through the chaos harness's checker as every scenario's do.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.scenarios import (
    ACK_STAMPS,
    Report,
    finished,
    lateness_figures,
    produce,
    read_expected,
    ready_bridge,
    settled,
)
from testbed.checker import wait_seen
from testbed.recurring import expected_spread, produce_schedules, read_occurrences, spread
from testbed.run import Run
from testbed.servers import Servers
from testbed.workload import now_ms, steady

ONE_SHOT_RATE = 2000.0
SETTLE_MS = 30_000  # how long after the window the last occurrences may still come in


def recurring(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    schedules: int,
    every_s: int,
    seconds: float,
    max_delay_ms: int,
) -> None:
    """The scenario (see the module); figures ``recurring <N> every <E>s``."""
    name = f"recurring {schedules:,} every {every_s}s"
    run = Run(
        servers,
        workdir,
        "recurring",
        label="bench",
        target_config=ACK_STAMPS,
        overrides={"egress__exactly_once": True},
    )
    every_ms = every_s * 1000
    try:
        made = time.monotonic()
        first = _produce_schedules(run, schedules, every_ms)
        produced_s = time.monotonic() - made
        ready_bridge(run)
        start, end = first + every_ms, first + every_ms + int(seconds * 1000)
        count = int(ONE_SHOT_RATE * ((end - now_ms()) / 1000 + 1))
        one_shots = produce(run, steady(count, run.target, max_delay_ms, 7, 1000), ONE_SHOT_RATE)
        expected = expected_spread(schedules, first, every_ms, start, end)
        got = read_occurrences(run.servers.bootstrap, run.target, expected, end + SETTLE_MS)
        seen, twice = got.seen, sum(n - 1 for n in got.copies.values())
        finished(one_shots, seconds * 3 + 120)
        shots = read_expected(run)  # the one-shot records produced (all, unless it fell behind)
        # The last were produced as the window closed, due up to max_delay_ms on: each is
        # accounted for once it is due and had SETTLE_MS to come in.
        wait_seen(run.checker, range(len(shots)), (max_delay_ms + SETTLE_MS) / 1000)
        account = settled(run, shots, range(len(shots)), report, name)
        late = [seen[key] - key[1] for key in expected if key in seen]
        missed = sum(1 for key in expected if key not in seen)
        early = sum(1 for key in expected if key in seen and seen[key] < key[1])
        report.figures[name] = {
            "schedules": schedules,
            "every_s": every_s,
            "occurrences_per_s": schedules / every_s,
            "one_shot_per_s": ONE_SHOT_RATE,
            "one_shots": len(shots),
            "produced_schedules_s": round(produced_s, 1),
            "expected": len(expected),
            "delivered": len(expected) - missed,
            "missed": missed,
            "early": early,
            "twice": twice,
            "ack_lateness_ms": lateness_figures(late),
            "one_shot_ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
        }
        for what, n in (("missed", missed), ("early", early), ("twice", twice)):
            if n:
                report.problems.append(f"{name}: {n} occurrences {what}")
    finally:
        run.close()


def _produce_schedules(run: Run, schedules: int, every_ms: int) -> int:
    """Produce the schedules, the first occurrences spread over one interval starting far enough
    ahead that all are stored first; returns that start (epoch ms)."""
    first = (now_ms() + 20_000 + schedules // 10) // 1000 * 1000
    made = spread(schedules, first, every_ms)
    produce_schedules(run.servers.bootstrap, run.delay, run.target, made)
    return first
