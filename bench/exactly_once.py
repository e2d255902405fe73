"""Exactly-once delivery next to at-least-once, in alternating runs of the same hour.

``python -m bench exactly-once``: for each mode in turn, twice (at-least-once, exactly once,
at-least-once, exactly once): the end-to-end rate of N records due at once (100 B), and the
steady 2,000 records/s load — CPU per record, and lateness as the checker (a read_committed
consumer) saw each record: in exactly-once mode a record is visible when its transaction commits,
not when Kafka appends it.
"""

from __future__ import annotations

from pathlib import Path

from bench.scenarios import Report, steady_load, throughput
from testbed.servers import Servers

MODES = {"at-least-once": False, "exactly-once": True}
ROUNDS = 2


def exactly_once(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    count: int,
    seconds: float,
    max_delay_ms: int,
    rounds: int = ROUNDS,
) -> None:
    """Both modes, alternating ``rounds`` times: figures ``throughput-100-<mode>-<round>``,
    ``steady <mode> <round>``, and a summary ``exactly once``."""
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for n in range(1, rounds + 1):
        for mode, on in MODES.items():
            overrides: dict[str, object] = {"egress__exactly_once": on}
            tag = f"-{mode}-{n}"
            rates[mode].append(
                throughput(servers, workdir, count, 100, report, overrides=overrides, tag=tag)
            )
            steady_load(
                servers,
                workdir,
                report,
                f"steady {mode} {n}",
                overrides,
                seconds=seconds,
                max_delay_ms=max_delay_ms,
            )
    f = report.figures

    def worst(mode: str, key: str, q: str) -> int:
        return max(int(f[f"steady {mode} {n}"][key][q]) for n in range(1, rounds + 1))

    def cpu(mode: str) -> list[float]:
        return [f[f"steady {mode} {n}"]["cpu_ms_per_record"] for n in range(1, rounds + 1)]

    mean = {m: sum(r) / len(r) for m, r in rates.items()}
    f["exactly once"] = {
        "end_to_end_per_s": rates,
        "throughput_ratio": mean["exactly-once"] / max(1e-9, mean["at-least-once"]),
        "seen_p99_ms": {m: worst(m, "seen_lateness_ms", "p99") for m in MODES},
        "seen_max_ms": {m: worst(m, "seen_lateness_ms", "max") for m in MODES},
        "cpu_ms_per_record": {m: cpu(m) for m in MODES},
        "duplicates": sum(
            int(f[f"steady exactly-once {n}"]["duplicates"]) for n in range(1, rounds + 1)
        ),
    }
