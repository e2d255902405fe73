"""The soak's report (Markdown, a row per minute) and its plot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.soak.judge import WARM_UP_MIN, calm, flat, thirds


def plot(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["minutes"]
    t = [r["minute"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    mib = 1 << 20
    axes[0].plot(t, [r["rss_bytes"] / mib for r in rows], label="bridge RSS")
    axes[0].plot(t, [r["redis_used_bytes"] / mib for r in rows], label="Redis used_memory")
    axes[0].set(ylabel="MiB", title="Memory")
    delivering = [r for r in rows if r["delivered"]]
    for who, label in (("bridge", "bridge"), ("redis", "Redis")):
        axes[1].plot(
            [r["minute"] for r in delivering],
            [r[f"{who}_cpu_ms_per_record"] for r in delivering],
            label=label,
        )
    axes[1].set(ylabel="CPU ms / record", title="CPU per record delivered")
    axes[2].plot(t, [r["p99_ms"] for r in rows], label="p99")
    axes[2].set_yscale("log")
    axes[2].set(ylabel="ms (log)", title="Lateness of the records due in the minute")
    axes[3].plot(t, [r["delivered"] for r in rows], label="delivered")
    axes[3].set(ylabel="records", xlabel="minute", title="Records delivered per minute")
    for ax in axes:
        for r in rows:
            if r["killed"]:
                ax.axvline(r["minute"], color="tab:red", lw=0.6, ls=":")
        ax.legend(loc="upper right")
    fig.suptitle(
        f"Soak: {results['args']['rate']:.0f} records/s, SIGKILL every "
        f"{results['args']['kill_every_min']:.0f} min (red), three brokers"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report(results: dict[str, Any]) -> str:
    """Markdown: the targets, the totals, and one row per minute."""
    a = results["args"]
    lines = [
        f"# Soak: {a['minutes']:.0f} min at {a['rate']:,.0f} records/s, delays 1 s to "
        f"{a['max_delay_s']:.0f} s, SIGKILL every {a['kill_every_min']:.0f} min",
        "",
        f"`{results['command']}` at {results.get('commit', '?')}: {results['records']:,} records "
        f"({results['preload']:,} of them the preload), {results['kills']} kills; lost "
        f"{results['lost']}, early {results['early']}, dead-lettered {results['dead_lettered']}, "
        f"duplicates {results['duplicates']:,}; lateness p99 {results['p99_ms']:,} ms, max "
        f"{results['max_ms']:,} ms.",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in results["targets"]),
        "",
        *_anon(results),
        *_machine(results),
        "| minute | bridge age (min) | bridge RSS MiB | Redis used MiB | bridge CPU ms/record | "
        "Redis CPU ms/record | delivered | due | p99 ms | max ms | killed | busy cores | "
        "steal cores | CPU pressure | probe ms | memory probe ms | Redis µs/command | "
        "Redis µs/script | bridge hands over, mean ms | acknowledged, mean ms | "
        "brokers' longest GC pause ms | Redis's longest stall ms |",
        "|" + "---|" * 22,
    ]
    mib = 1 << 20
    for r in results["minutes"]:
        lines.append(
            f"| {r['minute']} | {r['age_min']} | {r['rss_bytes'] / mib:.1f} | "
            f"{r['redis_used_bytes'] / mib:.1f} | {_ms(r['bridge_cpu_ms_per_record'])} | "
            f"{_ms(r['redis_cpu_ms_per_record'])} | {r['delivered']:,} | {r['due']:,} | "
            f"{r['p99_ms']:,} | {r['max_ms']:,} | {'yes' if r['killed'] else ''} | "
            f"{_fixed(r.get('machine_busy_cores'), 2)} | "
            f"{_fixed(r.get('machine_steal_cores'), 3)} | {_fixed(r.get('cpu_pressure'), 3)} | "
            f"{_fixed(r.get('probe_ms'), 1)} | "
            f"{_fixed(r.get('memory_probe_ms'), 1)} | {_fixed(r.get('redis_usec_per_command'), 1)} "
            f"| {_fixed(r.get('redis_usec_per_script'), 0)} | {_fixed(r.get('send_mean_ms'), 2)} "
            f"| {_fixed(r.get('ack_mean_ms'), 2)} | {_fixed(r.get('broker_gc_max_ms'), 1)} | "
            f"{_stall(r)} |"
        )
    return "\n".join(lines) + "\n"


# What the baseline line names, in its order: row key, words, digits.
BASELINE = (
    ("probe_ms", "probe {} ms (pure-Python arithmetic's CPU time: the cores' speed)", 1),
    ("memory_probe_ms", "memory probe {} ms (scattered reads of 64 MiB)", 1),
    ("machine_busy_cores", "busy cores {}", 2),
    ("machine_system_cores", "{} of them in the kernel", 2),
    ("machine_steal_cores", "steal {} cores", 3),
    ("cpu_pressure", "some task waiting for a core {} of the time", 3),
    ("memory_pressure", "for memory {}", 3),
    ("io_pressure", "for I/O {}", 3),
    ("redis_usec_per_command", "Redis {} µs per command", 1),
    ("redis_usec_per_script", "{} µs per script call", 0),
    ("redis_fragmentation", "fragmentation {}", 2),
    ("send_mean_ms", "the bridge handing records over {} ms after their due time", 2),
    ("ack_mean_ms", "Kafka acknowledging them {} ms after", 2),
    ("broker_gc_ms", "the brokers paused for GC {} ms a minute", 0),
    ("broker_gc_max_ms", "{} ms at the longest", 1),
)


def _machine(results: dict[str, Any]) -> list[str]:
    """The machine's and Redis's baseline over the minutes the trends compare: what the run
    recorded of :data:`BASELINE`, the median of the first third against the last's."""
    rows = calm(results)
    parts = []
    for key, words, digits in BASELINE:
        medians = None
        if all(r.get(key) is not None for r in rows):
            medians = thirds([float(r[key]) for r in rows])
        if medians is not None:
            parts.append(words.format(" → ".join(f"{m:.{digits}f}" for m in medians)))
    if not parts:
        return []
    return [
        f"The machine and Redis over the same minutes, medians of the first and last third (a "
        f"baseline measured in the same run, not a target; {os.cpu_count()} cores): "
        f"{', '.join(parts)}.",
        "",
    ]


def _fixed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _anon(results: dict[str, Any]) -> list[str]:
    """The RSS target's reading without file-backed pages (RssAnon), when the run recorded it."""
    old = [
        r["anon_bytes"]
        for r in results["minutes"]
        if r["age_min"] > WARM_UP_MIN and "anon_bytes" in r
    ]
    spread = flat([float(v) for v in old]) if old else None
    if spread is None:
        return []
    return [
        f"Bridge RSS without file-backed pages (RssAnon: the heap, not the shared libraries' "
        f"code, which the kernel may evict and load again): {spread:.1%} from its median, "
        f"{min(old) / (1 << 20):.1f} to {max(old) / (1 << 20):.1f} MiB.",
        "",
    ]


def _stall(row: dict[str, Any]) -> str:
    """Redis's longest latency event of the minute and its name ("" when none was noted)."""
    if not row.get("redis_stall"):
        return ""
    return f"{row['redis_stall_ms']:.0f} ({row['redis_stall']})"


def _ms(value: float | None) -> str:
    return "" if value is None or value > 1000 else f"{value:.3f}"  # > 1 s: no record delivered
