"""The soak's meters: the bridge's CPU across its lives, and the machine's state each minute."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.harness import Bridge

PROBE_LOOPS = 300_000  # ~12 ms of pure Python on this machine


def probe_ms() -> float:
    """The CPU time of a fixed piece of pure-Python work, the least of five tries: the speed of
    this machine's cores right now (another guest on the same host slows them), in milliseconds.
    Thread CPU time, so waiting for the GIL or a core does not count."""
    best = float("inf")
    for _ in range(5):
        started, x = time.thread_time(), 0
        for i in range(PROBE_LOOPS):
            x += i * i
        best = min(best, time.thread_time() - started)
    return best * 1000


def _cpu_ticks() -> list[int]:
    """user, nice, system, idle, iowait, irq, softirq, steal of all cores (/proc/stat)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


@dataclass
class Machine:
    """The machine's state over each minute, a baseline measured in the same run for the bridge's
    figures: the cores busy (of ``os.cpu_count()``), the cores' time the host gave to others
    (steal), and :func:`probe_ms`. A slower host shows in all of the bridge's timings at once."""

    last: list[int] = field(default_factory=_cpu_ticks)

    def sample(self) -> dict[str, float]:
        now = _cpu_ticks()
        delta = [b - a for a, b in zip(self.last, now, strict=True)]
        self.last = now
        share = (os.cpu_count() or 1) / (sum(delta) or 1)
        idle, steal = delta[3] + delta[4], delta[7]
        return {
            "machine_busy_cores": (sum(delta) - idle - steal) * share,
            "machine_steal_cores": steal * share,
            "probe_ms": probe_ms(),
        }


@dataclass
class Meter:
    """The bridge's CPU seconds across its lives (a SIGKILLed one's last reading kept)."""

    dead_cpu_s: float = 0.0

    @staticmethod
    def cpu_s(bridge: Bridge) -> float:
        assert bridge.proc is not None
        fields = Path(f"/proc/{bridge.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def total(self, bridge: Bridge) -> float:
        return self.dead_cpu_s + self.cpu_s(bridge)

    def kill(self, bridge: Bridge) -> None:
        self.dead_cpu_s += self.cpu_s(bridge)
        bridge.kill()
