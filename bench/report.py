"""The report: Markdown tables (BENCHMARKS.md takes them as printed), the targets, and the plots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.scenarios import SESSION_TIMEOUT_S, Report

RECOVERY_CASES = ("restart", "restart, dynamic member", "takeover")


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _section(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    return [
        title,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _lateness(figures: dict[str, int]) -> list[str]:
    return [f"{figures[k]} ms" for k in ("p50", "p90", "p99", "p99.9", "max")]


def _with_ceilings(name: str, figures: dict[str, Any]) -> bool:
    """Whether ``name`` is a throughput run measured beside its ceilings, the bare pipe and the
    bare store (the run with delay-ids is compared with the one without instead)."""
    return name.startswith("throughput") and "end_to_end_vs_pipe" in figures


def tables(report: Report) -> str:
    """The figures as Markdown tables, one per scenario."""
    f = report.figures
    throughput = [
        [
            f"{t['records']:,} x {t['value_bytes']} B",
            _rate(t["ingest_per_s"]),
            _rate(t["egress_per_s"]),
            _rate(t["end_to_end_per_s"]),
            _rate(t["bare_pipe_per_s"]),
            f"**{t['end_to_end_vs_pipe']:.0%}**",
            _rate(t["bare_store_add_per_s"]),
            f"{t['ingest_vs_store_add']:.0%}",
            _rate(t["bare_store_claim_ack_per_s"]),
            f"{t['egress_vs_store_claim_ack']:.0%}",
            f"{t['journal_bytes_per_record']:.0f}" if t.get("journal_bytes_per_record") else "off",
        ]
        for name, t in f.items()
        if _with_ceilings(name, t)
    ]
    with_ids = [
        [
            f"{t['records']:,} x {t['value_bytes']} B, a {t['delay_id_bytes']}-byte delay-id each",
            *(
                f"{_rate(t[f'{r}_per_s'])} ({t[f'{r}_vs_no_ids']:.0%})"
                for r in ("ingest", "egress", "end_to_end")
            ),
        ]
        for name, t in f.items()
        if name.startswith("throughput") and "ingest_vs_no_ids" in t
    ]
    side_by_side = [
        [
            str(r["replicas"]),
            f"{r['records']:,} x {r['value_bytes']} B on {r['partitions']} partitions",
            *(_rate(r[f"{leg}_per_s"]) for leg in ("ingest", "egress", "end_to_end")),
            f"{r['cpu_ms_per_record']:.3f} ms",
            f"**{r['end_to_end_vs_one']:.2f}x**" if "end_to_end_vs_one" in r else "1",
        ]
        for name, r in f.items()
        if name.startswith("replicas-")
    ]
    precision = [
        [
            name.removeprefix("precision "),
            _rate(p["rate_per_s"]),
            f"{p['records']:,}",
            str(p["early"]),
            *_lateness(p["ack_lateness_ms"]),
            *_lateness(p["consumer_lateness_ms"]),
        ]
        for name, p in f.items()
        if name.startswith("precision")
    ]
    quantiles = ["p50", "p90", "p99", "p99.9", "max"]
    b, c = f.get("backlog"), f.get("catch-up")
    backlog = [
        [
            label,
            f"{x['records']:,}",
            f"{x['redis_bytes_per_record']:.0f}",
            str(x["payload_bytes"]),
            f"{x['overhead_bytes']:.0f}",
            f"{x['p99_ratio']:.2f}x" if "p99_ratio" in x else "",
        ]
        for label, x in (
            ("far-future, no delay-id", b),
            ("far-future, a delay-id each", f.get("backlog with ids")),
            ("near-term, no delay-id", f.get("near-term backlog")),
            ("near-term, a delay-id each", f.get("near-term backlog with ids")),
        )
        if x
    ]
    drained, live = (c["drained_lateness_ms"], c["live_lateness_ms"]) if c else ({}, {})
    catch_up = (
        [
            [
                f"{c['records']:,}",
                f"{c['stopped_s']} s",
                f"{c['start_to_ready_s']} s",
                f"{c['drain_s_from_start']} s",
                _rate(c["drain_per_s"]),
                f"{drained['p50']} / {drained['max']} ms",
                f"{c['live_due_during_drain']:,}",
                f"{c['live_on_time_250ms']:,}",
                f"{live['p99']} / {live['max']} ms",
            ]
        ]
        if c
        else []
    )
    prio = [
        [
            label,
            f"{x['records']:,}",
            f"{x['max_rate']:,}/s" if x["max_rate"] else "none",
            f"{x['drain_s']} s",
            _rate(x["drain_per_s"]),
            *(
                f"{x['lateness_ms'][p]['p50']:,} / {x['lateness_ms'][p]['max']:,} ms"
                for p in ("high", "normal", "low")
            ),
            f"{x['normal_before_last_high']:,} / {x['low_before_last_high']:,} / "
            f"{x['low_before_last_normal']:,}",
            f"{x['live_lateness_ms']['p99']} / {x['live_lateness_ms']['max']} ms"
            if "live" in x
            else "",
        ]
        for label, x in (
            ("no limit", f.get("priority")),
            ("egress.max_rate", f.get("priority, rate-limited")),
        )
        if x
    ]
    m = f.get("redis modes")
    modes = (
        [
            [
                mode,
                _rate(m[mode]["end_to_end_per_s"]),
                f"{m[mode]['precision_records']:,}",
                _rate(m[mode]["precision_rate_per_s"]),
                str(m[mode]["early"]),
                *_lateness(m[mode]["ack_lateness_ms"]),
            ]
            for mode in ("standalone", "cluster")
        ]
        if m
        else []
    )
    if m:
        modes.append(
            [
                "cluster / standalone",
                f"**{m['end_to_end_ratio']:.2f}x**",
                "",
                "",
                "",
                "",
                "",
                f"**{m['p99_ratio']:.2f}x**",
                "",
                "",
            ]
        )
    cost = [
        [
            name.removeprefix("steady "),
            _rate(c["rate_per_s"]),
            f"{c['measured_records']:,.0f}",
            f"{c['bridge_cpu_ms_per_record']:.3f}",
            f"{c['redis_cpu_ms_per_record']:.3f}",
            f"**{c['cpu_ms_per_record']:.3f}**",
            f"**{c['redis_calls_per_record']:.2f}**",
            str(c["early"]),
            *_lateness(c["ack_lateness_ms"]),
        ]
        for name, c in f.items()
        if name.startswith("steady ")
    ]
    recovery = [
        [
            name,
            f"{r['replicas']}",
            _rate(r["rate_per_s"]),
            f"{r['records']:,}",
            str(r["lost"]),
            str(r["early"]),
            str(r["duplicates"]),
            f"**{r['kill_to_last_due_acked_s']} s**",
            *_lateness(r["due_after_kill_lateness_ms"]),
        ]
        for name in RECOVERY_CASES
        if (r := f.get(name))
    ]
    held = [
        [
            f"{h['records']:,} x {h['value_bytes']} B",
            _rate(h["stored_per_s"]),
            f"**{h['redis_bytes_per_record']:.1f}**",
            f"{h['redis_bytes'] / 1e6:.1f}",
            f"{h['bridge_rss_bytes'] / 1e6:.0f}",
            f"**{h['total_mb']:.0f}**",
            f"{h['restart_start_to_ready_s']:.2f} s",
            f"**{h['restart_start_to_first_due_acked_s']:.2f} s**",
        ]
        for name, h in f.items()
        if name.startswith("far-future held")
    ]
    read_back = [
        [
            name.removeprefix("read-back "),
            f"{r['fetch_ahead_s']:.1f} s",
            _rate(r["read_back_per_s"]) if r["read_back_per_s"] else "",
            f"{r['read_back_late']:.0f}",
            f"{r['fetched_per_record']:.2f}",
            f"{r['fetched_bytes_per_record']:,.0f}",
            str(r["lost"]),
            str(r["early"]),
            *_lateness(r["ack_lateness_ms"]),
        ]
        for name, r in f.items()
        if name.startswith("read-back")
    ]
    traced = [
        [
            f"{t['entries']:,}",
            f"{t['stored_bytes_per_entry']:.0f}" if "stored_bytes_per_entry" in t else "",
            f"{t['process_start_s']:.2f} s",
            f"**{t['on_time_s']:.2f} s**",
            f"{t['hour_late_s']:.2f} s",
            f"{t['by_id_since_25h_s']:.2f} s",
        ]
        for name, t in f.items()
        if name.startswith("trace")
    ]
    rebuilt = [
        [
            f"{r['records']:,} ({r['whole']:,} whole)",
            f"{r['seconds_to_store']:.0f} s",
            f"**{r['rebuild_s']:.1f} s**",
            _rate(r["rebuild_per_s"]),
            _rate(r["bare_read_per_s"]),
            f"{r['rebuild_vs_bare_read']:.2f}",
            f"{r['probes']:,}",
            str(r["probes_lost"] + r["probes_early"]),
            str(r["probes_duplicates"]),
            *_lateness(r["probe_lateness_ms"]),
        ]
        for name, r in f.items()
        if name.startswith("rebuild")
    ]
    eos = f.get("exactly once")
    exactly = (
        [
            [
                mode,
                str(n),
                _rate(eos["end_to_end_per_s"][mode][n - 1]),
                f"{f[f'steady {mode} {n}']['cpu_ms_per_record']:.3f}",
                *_lateness(f[f"steady {mode} {n}"]["seen_lateness_ms"]),
                str(f[f"steady {mode} {n}"]["ack_lateness_ms"]["p99"]),
            ]
            for n in range(1, len(eos["end_to_end_per_s"]["exactly-once"]) + 1)
            for mode in eos["end_to_end_per_s"]
        ]
        if eos
        else []
    )
    recurring = [
        [
            f"{r['schedules']:,} every {r['every_s']} s",
            _rate(r["occurrences_per_s"]),
            f"{r['delivered']:,} of {r['expected']:,}",
            str(r["missed"]),
            str(r["early"]),
            str(r["twice"]),
            *_lateness(r["ack_lateness_ms"]),
            f"{r['one_shot_ack_lateness_ms']['p99']} ms",
        ]
        for name, r in f.items()
        if name.startswith("recurring ")
    ]
    return "\n".join(
        [
            *_section(
                "Recurring schedules beside 2,000 one-shot records/s (exactly once; lateness at "
                "the acknowledgement)",
                [
                    "schedules",
                    "occurrences",
                    "delivered",
                    "missed",
                    "early",
                    "twice",
                    "p50",
                    "p90",
                    "p99",
                    "p99.9",
                    "max",
                    "one-shot p99",
                ],
                recurring,
            ),
            *_section(
                "Exactly once next to at-least-once (alternating runs, the same hour; lateness "
                "as a read_committed consumer saw each record, at 2,000/s)",
                [
                    "mode",
                    "round",
                    "end to end (due at once, 100 B)",
                    "CPU ms per record",
                    *[f"seen {q}" for q in quantiles],
                    "append p99",
                ],
                exactly,
            ),
            *_section(
                "Trace (records delivered a day ago; a journal written over two days, all on "
                "the traced partition)",
                [
                    "journal entries",
                    "broker bytes/entry (zstd)",
                    "process start (--version)",
                    "delivered on time",
                    "delivered an hour late",
                    "by caller id, --since 25h",
                ],
                traced,
            ),
            *_section(
                "Far-future records held (due in 30 days; the defaults)",
                [
                    "records",
                    "stored",
                    "Redis bytes/record",
                    "Redis MB",
                    "bridge RSS MB",
                    "RSS + Redis MB",
                    "restart: start to ready",
                    "start to first due acked",
                ],
                held,
            ),
            *_section(
                "Read-back (records kept as references, read back from Kafka)",
                [
                    "case",
                    "fetch ahead",
                    "read back",
                    "read back late",
                    "fetched/record",
                    "Kafka bytes/record",
                    "lost",
                    "early",
                    *[f"ack {q}" for q in quantiles],
                ],
                read_back,
            ),
            *_section(
                "Rebuild (Redis lost holding the records; the probes fall due during the "
                "rebuild, lateness at the acknowledgement)",
                [
                    "records waiting",
                    "stored in",
                    "rebuilt in",
                    "rebuild rate",
                    "bare read (ceiling)",
                    "rebuild / bare read",
                    "probes",
                    "lost + early",
                    "delivered twice",
                    *[f"probe {q}" for q in quantiles],
                ],
                rebuilt,
            ),
            *_section(
                "Throughput (due at once)",
                [
                    "records",
                    "ingest",
                    "egress",
                    "end to end",
                    "bare pipe",
                    "e2e / pipe",
                    "bare store add",
                    "ingest / add",
                    "bare claim+ack",
                    "egress / claim+ack",
                    "journal bytes/record",
                ],
                throughput,
            ),
            *_section(
                "A delay-id through the bridge (due at once; in brackets: of the same run's "
                "records without one)",
                ["records", "ingest", "egress (claim + ack)", "end to end"],
                with_ids,
            ),
            *_section(
                "Replicas side by side on the same machine (due at once; each replica a static "
                "member of the group)",
                [
                    "replicas",
                    "records",
                    "ingest",
                    "egress",
                    "end to end",
                    "CPU per record, bridges + Redis",
                    "end to end / one",
                ],
                side_by_side,
            ),
            *_section(
                "Precision (delays uniform in 1-10 s; lateness at the acknowledgement and at "
                "a consumer)",
                [
                    "load",
                    "rate",
                    "records",
                    "early",
                    *[f"ack {q}" for q in quantiles],
                    *[f"consumer {q}" for q in quantiles],
                ],
                precision,
            ),
            *_section(
                "Backlog (records waiting in the same shards)",
                [
                    "records",
                    "count",
                    "Redis bytes/record",
                    "payload bytes",
                    "overhead bytes",
                    "ack p99 with / without backlog",
                ],
                backlog,
            ),
            *_section(
                "Catch-up (records came due while the bridge was stopped)",
                [
                    "records",
                    "stopped",
                    "start to ready",
                    "drained after start",
                    "drain rate",
                    "drained lateness p50 / max",
                    "live due during drain",
                    "live on time (<= 250 ms)",
                    "live ack p99 / max",
                ],
                catch_up,
            ),
            *_section(
                "Priority (records due at one instant while the bridge was stopped: 10% "
                "high, 60% normal, 30% low; lateness from the due time, at the append)",
                [
                    "limit",
                    "records",
                    "max_rate",
                    "drain",
                    "drain rate",
                    "high p50 / max",
                    "normal p50 / max",
                    "low p50 / max",
                    "normal / low before the last high, low before the last normal",
                    "live high ack p99 / max",
                ],
                prio,
            ),
            *_section(
                "Redis Cluster (3 masters + 3 replicas) next to standalone Redis, same run",
                [
                    "redis",
                    "end to end (due at once)",
                    "records due in 1-10 s",
                    "rate",
                    "early",
                    *[f"ack {q}" for q in quantiles],
                ],
                modes,
            ),
            *_section(
                "Cost per record at a steady 2,000 records/s (delays 1-10 s)",
                [
                    "run",
                    "rate",
                    "records measured",
                    "bridge CPU ms",
                    "Redis CPU ms",
                    "CPU ms",
                    "Redis calls",
                    "early",
                    *[f"ack {q}" for q in quantiles],
                ],
                cost,
            ),
            *_section(
                "Recovery (a bridge SIGKILLed half-way; delays 1-3 s)",
                [
                    "case",
                    "replicas",
                    "rate",
                    "records",
                    "lost",
                    "early",
                    "duplicates",
                    "kill to every record due by then acked",
                    *[f"due in 10 s after the kill: ack {q}" for q in quantiles],
                ],
                recovery,
            ),
        ]
    )


def targets(report: Report) -> list[tuple[str, str, bool]]:
    """(target, measured, held) for each of the issue's targets the run measured."""
    f = report.figures
    out = []
    for name, t in f.items():
        if _with_ceilings(name, t) and "once" not in name:
            ratio = t["end_to_end_vs_pipe"]
            out.append(
                (f"{name}: end to end >= 50% of the bare pipe", f"{ratio:.0%}", ratio >= 0.5)
            )
    p = f.get("precision without backlog")
    if p:
        late = p["ack_lateness_ms"]
        out.append(("precision: p99 <= 25 ms", f"{late['p99']} ms", late["p99"] <= 25))
        out.append(("precision: max <= 250 ms", f"{late['max']} ms", late["max"] <= 250))
        early = sum(v["early"] for k, v in f.items() if k.startswith("precision"))
        out.append(("precision: 0 early", str(early), early == 0))
    b, near, near_ids = (
        f.get("backlog"),
        f.get("near-term backlog"),
        f.get("near-term backlog with ids"),
    )
    if near:  # a record held whole (the far-future backlog is kept as references)
        overhead = near["overhead_bytes"]
        label = "memory <= payload + 150 B per record held whole"
        out.append((label, f"payload + {overhead:.0f} B", overhead <= 150))
    if b:
        out.append(
            ("p99 with the backlog <= 2x without", f"{b['p99_ratio']:.2f}x", b["p99_ratio"] <= 2)
        )
        with_ids = f.get("backlog with ids")
        if with_ids:
            per = with_ids["redis_bytes_per_record"]
            label = "a far-future record with a 31-byte delay-id: Redis <= 40 B"
            out.append((label, f"{per:.1f} B", per <= 40))
    if near and near_ids:  # the id's own bytes are payload: what Redis adds for it beyond
        extra = near_ids["overhead_bytes"] - near["overhead_bytes"]
        out.append(
            (
                "a caller-given delay-id adds <= 48 B to a near-term record",
                f"{extra:.0f} B",
                extra <= 48,
            )
        )
    for name, r in f.items():
        if name.startswith("rebuild"):
            label = f"{name}: every shard rebuilt within 5 min (10,000,000)"
            out.append((label, f"{r['rebuild_s']:.1f} s", r["rebuild_s"] <= 300))
    bulk = f.get("bulk cancel")
    if bulk:
        label = f"bulk cancel of {bulk['records']:,} by a key prefix <= 60 s (1,000,000)"
        out.append((label, f"{bulk['applied_s']:.1f} s", bulk["applied_s"] <= 60))
        p99 = bulk["live_ack_lateness_ms"]["p99"]
        out.append(("bulk cancel: live ack p99 <= 50 ms meanwhile", f"{p99} ms", p99 <= 50))
    for name in ("priority", "priority, rate-limited"):
        x = f.get(name)
        if x:
            out.append(
                (
                    f"{name}: every high record before the first low (one replica)",
                    f"{x['low_before_last_high']:,} low before the last high",
                    x["low_before_last_high"] == 0,
                )
            )
    x = f.get("priority, rate-limited")
    if x:
        planned = x["records"] / x["max_rate"]
        out.append(
            (
                f"priority: the drain at max_rate takes {planned:g} s ± 10%",
                f"{x['drain_s']} s",
                abs(x["drain_s"] - planned) <= planned / 10,
            )
        )
    c = f.get("steady defaults")
    if c:
        late = c["ack_lateness_ms"]
        out += [
            (
                "2,000/s: bridge + Redis CPU <= 0.12 ms per record",
                f"{c['cpu_ms_per_record']:.3f} ms ({c['cpu_vs_off']:.2f}x of coalescing off)",
                c["cpu_ms_per_record"] <= 0.12,
            ),
            (
                "2,000/s: Redis calls <= 1.0 per record",
                f"{c['redis_calls_per_record']:.2f}",
                c["redis_calls_per_record"] <= 1.0,
            ),
            ("2,000/s: ack p99 <= 25 ms", f"{late['p99']} ms", late["p99"] <= 25),
            ("2,000/s: ack max <= 250 ms", f"{late['max']} ms", late["max"] <= 250),
        ]
    e = f.get("exactly once")
    if e:
        ratio, seen = e["throughput_ratio"], e["seen_p99_ms"]["exactly-once"]
        out += [
            ("exactly once: end to end >= 60% of at-least-once", f"{ratio:.0%}", ratio >= 0.6),
            (
                "exactly once: 2,000/s, p99 as a read_committed consumer sees it <= 50 ms",
                f"{seen} ms (at-least-once {e['seen_p99_ms']['at-least-once']} ms)",
                seen <= 50,
            ),
            ("exactly once: 0 duplicates", str(e["duplicates"]), e["duplicates"] == 0),
        ]
    r = f.get("restart")
    if r:
        back = r["kill_to_last_due_acked_s"]
        worst = r["due_after_kill_lateness_ms"]["max"] / 1000
        out.append(
            (
                "restart: kill to last record delivered <= 5 s",
                f"{back} s (due after the kill: {worst:.2f} s late at most)",
                max(back, worst) <= 5,
            )
        )
    t = f.get("takeover")
    if t:
        bound = SESSION_TIMEOUT_S + 5
        back = t["kill_to_last_due_acked_s"]
        worst = t["due_after_kill_lateness_ms"]["max"] / 1000
        out.append(
            (
                f"takeover: within session.timeout.ms + 5 s = {bound:.0f} s",
                f"{back} s (due after the kill: {worst:.2f} s late at most)",
                max(back, worst) <= bound,
            )
        )
    out += _far_future_targets(f)
    for name, t in f.items():
        if name.startswith("trace"):
            out.append(
                (
                    f"{name}: a record delivered a day ago traced within 1 s",
                    f"{t['on_time_s']:.2f} s",
                    t["on_time_s"] <= 1,
                )
            )
    for name in RECOVERY_CASES:
        if name in f:
            bad = f[name]["lost"] + f[name]["early"]
            out.append((f"{name}: 0 lost, 0 early", str(bad), bad == 0))
    for name, r in f.items():
        if name.startswith("recurring "):
            p99 = r["ack_lateness_ms"]["p99"]
            out.append((f"{name}: occurrence lateness p99 <= 25 ms", f"{p99} ms", p99 <= 25))
            bad = r["missed"] + r["early"] + r["twice"]
            out.append((f"{name}: 0 missed, 0 early, 0 twice", str(bad), bad == 0))
    return out


def _far_future_targets(f: dict[str, Any]) -> list[tuple[str, str, bool]]:
    out = []
    for name, h in f.items():
        if not name.startswith("far-future held"):
            continue
        what = f"{h['records']:,} x {h['value_bytes']} B"
        per = h["redis_bytes_per_record"]
        if h.get("delay_id_bytes"):
            label = (
                f"{what}: Redis <= 40 B per far-future record with a {h['delay_id_bytes']}-byte id"
            )
            out.append((label, f"{per:.1f} B", per <= 40))
            continue
        out.append((f"{what}: Redis <= 32 B per far-future record", f"{per:.1f} B", per <= 32))
        if h["value_bytes"] == 1024:
            total = h["total_mb"]
            out.append(
                (
                    f"{what}: bridge RSS + Redis <= 120 MB (1,000,000 in the full run)",
                    f"{total:.0f} MB",
                    total <= 120,
                )
            )
        first = h["restart_start_to_first_due_acked_s"]
        out.append(
            (
                f"{what} held: restart to first due record delivered <= 1 s",
                f"{first:.2f} s",
                first <= 1,
            )
        )
    for name, r in f.items():
        if name.startswith("read-back contiguous"):
            rate = r["read_back_per_s"] or 0
            out.append((f"{name}: >= 50,000 records/s read back", _rate(rate), rate >= 50_000))
        if name.startswith("read-back scattered"):
            late = r["read_back_late"] + r["lost"]
            out.append(
                (f"{name}: every record read back before it is due", f"{late:.0f} late", late == 0)
            )
            p99 = r["ack_lateness_ms"]["p99"]
            out.append(
                (f"{name}: ack p99 <= 25 ms at {r['due_per_s']:,.0f}/s", f"{p99} ms", p99 <= 25)
            )
        if name.startswith("read-back"):
            bad = r["lost"] + r["early"]
            out.append((f"{name}: 0 lost, 0 early", str(bad), bad == 0))
    return out


def plots(report: Report, out: Path) -> list[Path]:
    """PNG plots of the series (matplotlib, installed with the ``bench`` extra). Without
    matplotlib there are none, and one line on stderr says so: the tables and results.json do
    not depend on it."""
    try:
        import matplotlib
    except ImportError:
        print(
            "no plots: matplotlib is not installed (the bench extra: make bench)", file=sys.stderr
        )
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    s: dict[str, Any] = report.series
    names = [n for n in s if n.startswith("throughput")]
    if names:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name in names:
            t = [p[0] for p in s[name]]
            ax.plot(t, [p[1] for p in s[name]], label=f"{name}: stored")
            ax.plot(t, [p[2] for p in s[name]], "--", label=f"{name}: acknowledged")
        ax.set(
            xlabel="seconds since the first record was stored",
            ylabel="records",
            title="Throughput: records due at once",
        )
        ax.legend()
        written.append(_save(fig, out / "throughput.png"))
    names = [n for n in s if n.startswith("precision")]
    if names:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name in names:
            for where, style in (("ack", "-"), ("consumer", ":")):
                values = sorted(s[name][where])
                if values:
                    ys = [i / len(values) for i in range(1, len(values) + 1)]
                    ax.plot(
                        [max(v, 0.5) for v in values],
                        ys,
                        style,
                        label=f"{name.removeprefix('precision ')} ({where})",
                    )
        ax.set_xscale("log")
        ax.set(
            xlabel="lateness, ms (log)",
            ylabel="fraction delivered",
            title="Precision: lateness CDF at half capacity",
        )
        ax.axvline(25, color="grey", lw=0.5)
        ax.legend()
        written.append(_save(fig, out / "lateness.png"))
    if "catch-up" in s:
        c = s["catch-up"]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        backlog = c["backlog"]
        ax.plot(backlog, range(1, len(backlog) + 1), label="backlog delivered (left axis)")
        ax.set(
            xlabel="seconds since the bridge was started again",
            ylabel="records",
            title="Catch-up: drain, and live records due meanwhile",
        )
        twin = ax.twinx()
        twin.scatter(
            [d / 1000 for d, _ in c["live"]],
            [max(v, 0) for _, v in c["live"]],
            s=2,
            color="tab:orange",
            label="live record lateness, ms (right axis)",
        )
        twin.set_ylabel("lateness, ms")
        fig.legend(loc="upper left", bbox_to_anchor=(0.1, 0.9))
        written.append(_save(fig, out / "catchup.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
