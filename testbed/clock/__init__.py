"""Clocks a test steps: ``shift.c`` moves a process's wall clock (a real Redis's, a bridge's),
``python/sitecustomize.py`` a bridge's Python clock alone (each says how and why)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PYTHON_SHIFT = Path(__file__).parent / "python"


def python_shift(shift_ms: int) -> dict[str, str]:
    """The environment that starts a Python process (a bridge) on a host whose wall clock is
    ``shift_ms`` off: python/sitecustomize.py reads it."""
    return {"CLOCK_SHIFT_MS": str(shift_ms), "PYTHONPATH": str(PYTHON_SHIFT)}


def build_shim(directory: Path) -> Path:
    """shift.c built with the machine's C compiler into ``directory``: the shim's path."""
    built = directory / "shift.so"
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
            str(built),
            str(Path(__file__).parent / "shift.c"),
            "-ldl",
        ],
        check=True,
        capture_output=True,
    )
    return built
