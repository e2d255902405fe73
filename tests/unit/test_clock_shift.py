"""The chaos runs' and tests' bridge on a host whose clock is off: the environment they start it
with moves a Python process's wall clock, and nothing else (testbed.clock)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from testbed.clock import python_shift

READ = "import time; print(time.time(), time.time_ns(), time.monotonic())"


def clocks(env: dict[str, str]) -> tuple[float, int, float]:
    out = subprocess.run(
        [sys.executable, "-c", READ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    wall, wall_ns, mono = out.stdout.split()
    return float(wall), int(wall_ns), float(mono)


def test_a_process_started_with_a_shift_reads_its_wall_clock_that_far_off() -> None:
    before = time.time()
    wall, wall_ns, _ = clocks(python_shift(3_600_000))
    after = time.time()
    assert before + 3_600 <= wall <= after + 3_600
    assert before + 3_600 <= wall_ns / 1e9 <= after + 3_600
    behind, _, _ = clocks(python_shift(-20_000))
    assert behind <= time.time() - 19


def test_its_monotonic_clock_stays() -> None:
    _, _, mono = clocks(python_shift(3_600_000))
    assert abs(mono - time.monotonic()) < 60
