"""The soak's meters: the bridge's CPU and its own lateness histograms across its lives, Redis's
and the machine's state."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.scenarios import redis_cpu_s
from bridge.store.scripts import script_names
from testbed.harness import Bridge

REDIS_STALL_MS = 20  # Redis's latency monitor notes events at least this long
PROBE_LOOPS = 300_000  # ~12 ms of pure Python on this machine
# The memory probe reads this many bytes scattered over a buffer larger than any CPU cache.
MEMORY_PROBE_BYTES, MEMORY_PROBE_READS = 64 << 20, 200_000


def least_cpu_ms(work: Callable[[], object], tries: int) -> float:
    """The least thread CPU time of ``tries`` runs of ``work``, in milliseconds: waiting for the
    GIL or a core does not count, and the least is the run nothing else disturbed."""
    best = float("inf")
    for _ in range(tries):
        started = time.thread_time()
        work()
        best = min(best, time.thread_time() - started)
    return best * 1000


def _arithmetic() -> int:
    x = 0
    for i in range(PROBE_LOOPS):
        x += i * i
    return x


def probe_ms() -> float:
    """The CPU time of a fixed piece of pure-Python arithmetic, the least of five tries: the
    speed of this machine's cores right now (another guest on the same host slows them)."""
    return least_cpu_ms(_arithmetic, 5)


class MemoryProbe:
    """The CPU time of reading :data:`MEMORY_PROBE_READS` bytes at fixed scattered places of a
    64 MiB buffer, the least of three tries, in milliseconds: most reads miss every cache, so it
    slows with the host's memory, which :func:`probe_ms` (arithmetic in the caches) does not see."""

    def __init__(self) -> None:
        # Written, so every page is a page of its own (a zeroed buffer maps one shared zero page).
        self.buffer = bytearray(b"\x01") * MEMORY_PROBE_BYTES
        self.places = [(i * 2654435761) % MEMORY_PROBE_BYTES for i in range(MEMORY_PROBE_READS)]

    def _read(self) -> int:
        total, buffer = 0, self.buffer
        for place in self.places:
            total += buffer[place]
        return total

    def ms(self) -> float:
        return least_cpu_ms(self._read, 3)


PRESSURES = ("cpu", "memory", "io")


def _stalled_us() -> dict[str, int] | None:
    """Microseconds in which some task waited for a core, memory or I/O since boot (the kernel's
    pressure stall information, /proc/pressure; None where the kernel has none)."""
    try:
        return {
            name: int(Path(f"/proc/pressure/{name}").read_text().split("total=", 1)[1].split()[0])
            for name in PRESSURES
        }
    except (OSError, IndexError, ValueError):
        return None


def _cpu_ticks() -> list[int]:
    """user, nice, system, idle, iowait, irq, softirq, steal of all cores (/proc/stat)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


@dataclass
class Machine:
    """The machine's state over each minute, a baseline measured in the same run for the bridge's
    figures: the cores busy (of ``os.cpu_count()``) and those in the kernel, the cores' time the
    host gave to others (steal), the share of the minute in which some task waited for a core,
    for memory or for I/O (pressure), :func:`probe_ms` and the :class:`MemoryProbe`. A slower or
    busier host shows in all of the bridge's timings at once."""

    last: list[int] = field(default_factory=_cpu_ticks)
    memory: MemoryProbe = field(default_factory=MemoryProbe)
    stalled: dict[str, int] | None = field(default_factory=_stalled_us)
    at: float = field(default_factory=time.monotonic)

    def sample(self) -> dict[str, float | None]:
        now, stalled, at = _cpu_ticks(), _stalled_us(), time.monotonic()
        delta = [b - a for a, b in zip(self.last, now, strict=True)]
        share = (os.cpu_count() or 1) / (sum(delta) or 1)
        idle, steal = delta[3] + delta[4], delta[7]
        sample: dict[str, float | None] = {
            "machine_busy_cores": (sum(delta) - idle - steal) * share,
            "machine_system_cores": (delta[2] + delta[5] + delta[6]) * share,
            "machine_steal_cores": steal * share,
        }
        seconds = (at - self.at) or 1
        for name in PRESSURES:
            waited = (
                None
                if stalled is None or self.stalled is None
                else (stalled[name] - self.stalled[name])
            )
            # a share of the interval: the kernel folds its per-core stall times in at its own
            # moments, so over a short interval the difference can overshoot a whole interval
            sample[f"{name}_pressure"] = (
                None if waited is None else min(1.0, waited / 1e6 / seconds)
            )
        self.last, self.stalled, self.at = now, stalled, at
        return sample | {"probe_ms": probe_ms(), "memory_probe_ms": self.memory.ms()}


@dataclass
class RedisMeter:
    """Redis over each minute: its memory, its CPU, and what a command and a script call cost it on
    average (``INFO commandstats``: a script's time includes the commands it runs, which are
    counted on their own too, so the two are kept apart) and its allocator's fragmentation."""

    client: Any
    last: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.last = self._totals()
        self.client.config_set("latency-monitor-threshold", REDIS_STALL_MS)
        self.client.execute_command("LATENCY", "RESET")
        self.client.slowlog_reset()
        self.scripts = script_names()

    def _totals(self) -> dict[str, float]:
        totals = {
            "cpu_s": redis_cpu_s(self.client),
            "calls": 0.0,
            "usec": 0.0,
            "script_calls": 0.0,
            "script_usec": 0.0,
        }
        for name, stats in self.client.info("commandstats").items():
            kind = "script_" if name.startswith(("cmdstat_eval", "cmdstat_fcall")) else ""
            totals[f"{kind}calls"] += stats["calls"]
            totals[f"{kind}usec"] += stats["usec"]
        return totals

    def sample(self) -> dict[str, float | str | None]:
        now = self._totals()
        delta = {k: now[k] - self.last[k] for k in now}
        self.last = now
        memory = self.client.info("memory")
        # Redis's latency monitor: its longest event over REDIS_STALL_MS since the last reading
        # (a fork for the AOF rewrite, a write or fsync of the AOF, a slow command or script).
        latest = self.client.execute_command("LATENCY", "LATEST")
        events = [(float(e[3]), _text(e[0])) for e in latest]
        self.client.execute_command("LATENCY", "RESET")
        slow = self.client.slowlog_get(128)
        self.client.slowlog_reset()
        stall_ms, stall = max(events, default=(0.0, ""))
        if stall.endswith("command") and slow:  # which: the slowest the slow log kept
            stall += f": {self._named(max(slow, key=lambda e: e['duration'])['command'])}"
        return {
            "redis_stall_ms": stall_ms,
            "redis_stall": stall,
            "redis_used_bytes": int(memory["used_memory"]),
            "redis_fragmentation": float(memory["mem_fragmentation_ratio"]),
            "redis_cpu_s": delta["cpu_s"],
            "redis_usec_per_command": _per(delta["usec"], delta["calls"]),
            "redis_usec_per_script": _per(delta["script_usec"], delta["script_calls"]),
        }

    def _named(self, command: bytes | str) -> str:
        """A slow-log entry's command, a script call by the bridge script's name."""
        words = _text(command).split()
        if len(words) > 1 and words[0].upper() == "EVALSHA":
            name = self.scripts.get(words[1])
            return f"{name}.lua" if name else f"script {words[1][:8]}"
        return words[0].upper() if words else "?"


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# A GC pause as the brokers' JVMs log it (-Xlog:gc): "... Pause Young (Normal) ... 4.321ms".
_PAUSE = re.compile(r"\bPause\b.* (\d+(?:\.\d+)?)ms$")


@dataclass
class BrokerGC:
    """The brokers' JVM pauses over each minute, from the GC log ``scripts/services`` has each
    node of the cluster write: the longest and their total, every broker's together, in ms. A
    broker that pauses stops appending for as long: the lateness's tail sees it first."""

    logs: list[Path]
    read: dict[Path, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.read = {log: log.stat().st_size if log.exists() else 0 for log in self.logs}

    def sample(self) -> dict[str, float | None]:
        pauses = [
            float(m.group(1))
            for log in self.logs
            for line in self._new_lines(log)
            if (m := _PAUSE.search(line))
        ]
        return {"broker_gc_max_ms": max(pauses, default=0.0), "broker_gc_ms": sum(pauses)}

    def _new_lines(self, log: Path) -> list[str]:
        """The whole lines written since the last reading (all of a log a restarted JVM began)."""
        try:
            with log.open("rb") as f:
                start = self.read.get(log, 0)
                if f.seek(0, os.SEEK_END) < start:
                    start = 0
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        whole = data.rfind(b"\n") + 1
        self.read[log] = start + whole
        return data[:whole].decode(errors="replace").splitlines()


def _per(total: float, count: float) -> float | None:
    return total / count if count else None


@dataclass
class Meter:
    """The bridge's CPU seconds across its lives (a SIGKILLed one's last reading kept)."""

    dead_cpu_s: float = 0.0

    def total(self, bridge: Bridge) -> float:
        return self.dead_cpu_s + bridge.cpu_seconds()

    def kill(self, bridge: Bridge) -> None:
        self.dead_cpu_s += bridge.cpu_seconds()
        bridge.kill()


# The bridge's histograms the soak reads each minute: when it handed records to the producer,
# and when Kafka acknowledged them (every priority), both from the due time.
HISTOGRAMS = {
    "send": "delay_bridge_send_lateness_seconds",
    "ack": "delay_bridge_delivery_lateness_seconds",
}


def _histograms(text: str) -> dict[str, dict[str, float]]:
    """Each of HISTOGRAMS as {"count", "sum", and each bucket's upper bound: cumulative count},
    summed over labels, from the Prometheus text format."""
    names = {metric: short for short, metric in HISTOGRAMS.items()}
    totals: dict[str, dict[str, float]] = {short: {} for short in HISTOGRAMS}
    for family in text_string_to_metric_families(text):
        short = names.get(family.name)
        if short is None:
            continue
        for sample in family.samples:
            kind = sample.name.removeprefix(family.name).lstrip("_")
            key = sample.labels["le"] if kind == "bucket" else kind
            if kind in ("bucket", "count", "sum"):
                totals[short][key] = totals[short].get(key, 0.0) + sample.value
    return totals


def _spread(now: dict[str, float], last: dict[str, float]) -> dict[str, float | None]:
    """Mean and p99 (the upper bound of the bucket it falls in) of the observations between two
    readings of a histogram, in ms."""
    count = now.get("count", 0.0) - last.get("count", 0.0)
    if count <= 0:
        return {"mean_ms": None, "p99_ms": None}
    bounds = sorted(
        (float(le), n - last.get(le, 0.0)) for le, n in now.items() if le not in ("count", "sum")
    )
    p99 = next((bound for bound, n in bounds if n >= 0.99 * count), float("inf"))
    return {
        "mean_ms": (now.get("sum", 0.0) - last.get("sum", 0.0)) / count * 1000,
        "p99_ms": p99 * 1000,
    }


@dataclass
class BridgeMeter:
    """The bridge's own lateness over each minute, from its /metrics: the mean and p99 of when it
    handed records to the producer (``send_*``) and of when Kafka acknowledged them (``ack_*``).
    The first is the bridge's share of the lateness (its threads' wake-ups and pacing); what
    lies between them is librdkafka's batching and the brokers'. A bridge started in the minute
    counts from its start; one that does not answer gives nothing."""

    bridge: Bridge | None = None
    last: dict[str, dict[str, float]] = field(default_factory=dict)

    def sample(self, bridge: Bridge) -> dict[str, float | None]:
        if bridge is not self.bridge:
            self.bridge, self.last = bridge, {}
        try:
            status, text = bridge.get("/metrics")
        except OSError:
            status, text = 0, ""
        now = _histograms(text) if status == 200 else {}
        sample: dict[str, float | None] = {}
        for short in HISTOGRAMS:
            spread = _spread(now.get(short, {}), self.last.get(short, {}))
            sample.update({f"{short}_{k}": v for k, v in spread.items()})
        if now:
            self.last = now
        return sample
