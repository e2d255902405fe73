"""The bench's plots are optional: without matplotlib the run still ends with its results."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import report
from bench.scenarios import Report


def test_plots_without_matplotlib_are_none_and_say_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    rep = Report()
    rep.series["throughput 100 B"] = [(0.0, 1, 0), (1.0, 2, 2)]

    assert report.plots(rep, tmp_path) == []
    assert "no plots: matplotlib is not installed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
