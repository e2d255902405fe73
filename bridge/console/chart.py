"""What falls due over the next hour, day or month: counted in Redis, drawn as an SVG bar chart.

The counts are those of ``status`` split in time: per span (5 minutes of the hour, an hour of the
day, a day of the month) the records every delay-topic partition holds due in it, references
included; with what is overdue already and what falls due after the chart's end beside them.
"""

from __future__ import annotations

from html import escape
from typing import Any

from bridge.config import Config
from bridge.message import format_duration_ms

MINUTE_MS = 60_000
SPANS: dict[str, tuple[int, int]] = {  # span: (bar width ms, bars)
    "hour": (5 * MINUTE_MS, 12),
    "day": (60 * MINUTE_MS, 24),
    "month": (24 * 60 * MINUTE_MS, 30),
}


def due_over(config: Config, span: str) -> dict[str, Any]:
    """The records due in each bar of ``span`` from Redis's now, over every delay-topic
    partition: ``counts`` (one per bar of ``step_ms``), ``overdue``, ``later`` (due after the
    last bar)."""
    from bridge import ops
    from bridge.store import due_counts

    step, bars = SPANS[span]
    store = ops.store_of(config)
    try:
        now = store.time_ms()
        bounds = [now + i * step for i in range(bars + 1)]
        counts, overdue, total = [0] * bars, 0, 0
        for shard in ops.delay_shards(config, list(config.topics.delay)):
            counts = [
                a + b
                for a, b in zip(counts, due_counts(store.inventory, shard, bounds), strict=True)
            ]
            overdue += store.inventory.count(shard, now)
            total += store.inventory.count(shard)
    finally:
        store.client.close()
    return {
        "span": span,
        "now_ms": now,
        "step_ms": step,
        "counts": counts,
        "overdue": overdue,
        "later": max(0, total - overdue - sum(counts)),
    }


WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 260, 72, 36, 24


def svg(due: dict[str, Any]) -> str:
    """``due`` (from :func:`due_over`) as an SVG bar chart: a bar per span with its count on
    hover, the busiest bar's count on the axis, a tick every few bars."""
    counts: list[int] = due["counts"]
    step: int = due["step_ms"]
    peak = max(counts, default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    bar_w = plot_w / max(1, len(counts))
    label = f"records falling due over the next {escape(due['span'])}, {sum(counts):,} in all"
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'class="axis"/>',
        f'<text x="{LEFT - 8}" y="{TOP + 8}" text-anchor="end" class="tick">'
        f"{max(counts, default=0):,}</text>",
        f'<text x="{LEFT - 8}" y="{TOP + plot_h}" text-anchor="end" class="tick">0</text>',
    ]
    every = max(1, len(counts) // 6)
    for i, count in enumerate(counts):
        height = plot_h * count / peak
        x = LEFT + i * bar_w
        when = f"+{format_duration_ms(i * step)} to +{format_duration_ms((i + 1) * step)}"
        parts.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{TOP + plot_h - height:.1f}" '
            f'width="{max(1.0, bar_w - 2):.1f}" height="{height:.1f}" data-count="{count}">'
            f"<title>{when}: {count:,}</title></rect>"
        )
        if i % every == 0:
            parts.append(
                f'<text x="{x + 1:.1f}" y="{HEIGHT - 8}" class="tick">'
                f"+{format_duration_ms(i * step)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)
