"""The soak's targets: memory flat, CPU per record and lateness without a trend, nothing lost."""

from __future__ import annotations

import statistics
from typing import Any

WARM_UP_MIN = 5  # the targets are checked on the minutes after this
FLAT = 0.05  # RSS and Redis memory within 5% of their median after the warm-up
TREND = 1.10  # CPU per record and p99: the last third at most 10% over the first third


def flat(values: list[float]) -> float | None:
    """The largest distance from the median, as a fraction of it (None: no values)."""
    if not values:
        return None
    median = sorted(values)[len(values) // 2]
    return max(abs(v - median) for v in values) / median if median else 0.0


def thirds(values: list[float]) -> tuple[float, float] | None:
    """The medians of the first and of the last third of ``values`` (None: too few values).
    Medians: one disturbed minute must not make a trend, nor hide one."""
    if len(values) < 3:
        return None
    third = len(values) // 3
    return statistics.median(values[:third]), statistics.median(values[-third:])


def _trend(values: list[float]) -> float | None:
    """The last third's median over the first third's (None: too few values)."""
    medians = thirds(values)
    if medians is None:
        return None
    first, last = medians
    return last / first if first else 0.0


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met): memory flat after the warm-up (the bridge's RSS once the process
    running is WARM_UP_MIN minutes old: a process started again after a kill grows back first;
    the last minute, when the load ends, left out), CPU per record and p99 without a trend
    (minutes without a kill, the last one left out), nothing lost, early or dead-lettered. A run
    too short to judge a target misses it."""
    quiet = calm(results)
    old = [r["rss_bytes"] for r in results["minutes"] if r["age_min"] > WARM_UP_MIN]
    out = [
        _judged(
            f"bridge RSS within {FLAT:.0%} of its median (processes over {WARM_UP_MIN} min old)",
            flat(old),
            FLAT,
            "{:.1%}",
        ),
        _judged(
            f"Redis used_memory within {FLAT:.0%} of its median after minute {WARM_UP_MIN}",
            flat([r["redis_used_bytes"] for r in _settled(results)]),
            FLAT,
            "{:.1%}",
        ),
    ]
    for key, name in (
        ("bridge_cpu_ms_per_record", "bridge CPU per record"),
        ("p99_ms", "lateness p99 per minute"),
    ):
        trend = _trend([float(r[key]) for r in quiet])
        out.append(
            _judged(
                f"{name}: last third / first third <= {TREND:.2f} (minutes without a kill)",
                trend,
                TREND,
                "{:.2f}",
            )
        )
    bad = sum(results[k] for k in ("lost", "early", "dead_lettered", "wrong_due_header"))
    out.append(("0 lost, 0 early, 0 dead-lettered, due-at as asked", str(bad), bad == 0))
    return out


def _settled(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The minutes after the warm-up but the last, when the load ends."""
    return [r for r in results["minutes"] if r["minute"] > WARM_UP_MIN][:-1]


def calm(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The minutes the trends compare: after the warm-up, without a kill, not the last."""
    return [r for r in _settled(results) if not r["killed"]]


def _judged(target: str, value: float | None, limit: float, fmt: str) -> tuple[str, str, bool]:
    if value is None:
        return target, "too short to judge", False
    return target, fmt.format(value), value <= limit
