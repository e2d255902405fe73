"""bench.ab's pure parts: the order the two checkouts run in, and the ratios it reports."""

from __future__ import annotations

from pathlib import Path

from bench.ab import Side, order, ratios, table


def test_the_sides_alternate_and_neither_always_runs_first() -> None:
    assert order(1) == [0, 1]
    assert order(2) == [0, 1, 1, 0]
    assert order(3) == [0, 1, 1, 0, 0, 1]
    for rounds in range(1, 6):
        runs = order(rounds)
        assert runs.count(0) == runs.count(1) == rounds


def test_each_figure_is_this_checkouts_mean_over_the_bases() -> None:
    base = Side("base", Path("/base"), {"throughput": [
        {"end_to_end_per_s": 10_000.0, "cpu_ms_per_record": 0.2},
        {"end_to_end_per_s": 14_000.0, "cpu_ms_per_record": 0.1},
    ]})  # fmt: skip
    head = Side("head", Path("/head"), {"throughput": [
        {"end_to_end_per_s": 18_000.0, "cpu_ms_per_record": 0.1},
        {"end_to_end_per_s": 18_000.0, "cpu_ms_per_record": 0.05},
    ]})  # fmt: skip
    got = ratios(base, head, ["throughput"])["throughput"]
    assert got["end_to_end_per_s"] == 18_000 / 12_000
    assert abs(got["cpu_ms_per_record"] - 0.075 / 0.15) < 1e-12
    text = table(base, head, ["throughput"])
    assert "| throughput | end_to_end_per_s (higher is better) | 10,000 · 14,000 |" in text
    assert text.rstrip().endswith("| 0.500 |")
