"""BENCHMARKS.md stays the one page that answers "how fast, on what, how do I reproduce it": short,
a line per row, every target with its status and the command that measures it."""

from __future__ import annotations

from tests.conftest import ROOT

PAGE = ROOT / "BENCHMARKS.md"
MAX_LINES = 300
MAX_CELL = 120  # characters: a figure and its date, not a paragraph


def rows(heading: str) -> list[list[str]]:
    """The table rows (cells stripped) of the section under ``heading``, its header row first."""
    section = PAGE.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in section.splitlines() if x.startswith("|") and not x.startswith("|---")]
    return [[c.strip() for c in x.strip("|").split("|")] for x in lines]


def test_the_page_fits_on_a_page() -> None:
    assert len(PAGE.read_text().splitlines()) <= MAX_LINES


def test_no_table_cell_is_a_paragraph() -> None:
    cells = [
        c.strip() for x in PAGE.read_text().splitlines() if x.startswith("|") for c in x.split("|")
    ]
    long = [c[:60] for c in cells if len(c) > MAX_CELL]
    assert not long, long


def test_every_target_says_its_status_and_its_command() -> None:
    header, *targets = rows("Targets and current figures")
    assert header == ["target", "figure", "status", "command"]
    assert len(targets) >= 20
    for target, figure, status, command in targets:
        assert figure and status.split()[0].rstrip(":") in ("held", "missed"), target
        assert command.startswith("`") and ("bench" in command or "soak" in command), target
