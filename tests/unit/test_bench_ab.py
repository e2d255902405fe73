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


def test_a_bisects_sides_each_run_once_a_round_and_no_side_always_first() -> None:
    assert order(2, 3) == [0, 1, 2, 2, 1, 0]
    runs = order(4, 5)
    assert all(runs.count(side) == 4 for side in range(5))
    firsts = {runs[r * 5] for r in range(4)}
    assert len(firsts) == 2


def test_each_figure_is_this_checkouts_mean_over_the_bases() -> None:
    base = Side(
        "base",
        Path("/base"),
        {
            "throughput": [
                {"end_to_end_per_s": 10_000.0, "cpu_ms_per_record": 0.2},
                {"end_to_end_per_s": 14_000.0, "cpu_ms_per_record": 0.1},
            ]
        },
    )
    head = Side(
        "head",
        Path("/head"),
        {
            "throughput": [
                {"end_to_end_per_s": 18_000.0, "cpu_ms_per_record": 0.1},
                {"end_to_end_per_s": 18_000.0, "cpu_ms_per_record": 0.05},
            ]
        },
    )
    got = ratios(base, head, ["throughput"])["throughput"]
    assert got["end_to_end_per_s"] == 18_000 / 12_000
    assert abs(got["cpu_ms_per_record"] - 0.075 / 0.15) < 1e-12
    text = table([base, head], ["throughput"])
    assert "| throughput | end_to_end_per_s (higher is better) | 10,000 · 14,000 |" in text
    assert text.rstrip().endswith("| 0.500 |")
    other = Side(
        "other",
        Path("/other"),
        {
            "throughput": [
                {"end_to_end_per_s": 6_000.0, "cpu_ms_per_record": 0.3},
            ]
        },
    )
    three = table([base, head, other], ["throughput"]).splitlines()
    assert three[0] == "| scenario | figure | base | head | ratio | other | ratio |"
    assert three[2].endswith("| 18,000 · 18,000 | 1.500 | 6,000 | 0.500 |")


def test_the_last_side_of_a_round_runs_in_the_middle_of_each_pair_of_rounds() -> None:
    # The A/A side is the last of the list: where a dip between the base's runs weighs on
    # the heads, it weighs on the A/A too, and shows in its ratio.
    runs = order(4, 3)
    assert [i for i, side in enumerate(runs) if side == 2] == [2, 3, 8, 9]
    assert [i for i, side in enumerate(runs) if side == 0] == [0, 5, 6, 11]
