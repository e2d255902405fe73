"""The soak's own logic without servers: its records' due times, the lateness quantile, the
targets it judges and the report it writes."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from bench.soak.judge import TREND, WARM_UP_MIN, flat, targets
from bench.soak.load import MIN_DELAY_MS, Load
from bench.soak.meters import BridgeMeter, BrokerGC, Machine, RedisMeter
from bench.soak.report import report
from bench.soak.tally import quantile
from bridge.metrics import Metrics
from bridge.store.scripts import Scripts, script_names
from testbed.harness import Bridge

MIB = 1 << 20


def _minute(
    minute: int,
    *,
    p99: int = 30,
    cpu: float = 0.1,
    age: int | None = None,
    killed: bool = False,
    rss: int = 50 * MIB,
    **more: float,
) -> dict[str, Any]:
    return {
        "minute": minute,
        "age_min": minute if age is None else age,
        "rss_bytes": rss,
        "anon_bytes": rss // 2,
        "redis_used_bytes": 160 * MIB,
        "bridge_cpu_s": cpu * 120,
        "redis_cpu_s": 6.0,
        "delivered": 120_000,
        "due": 120_000,
        "p99_ms": p99,
        "max_ms": p99 * 3,
        "killed": killed,
        "bridge_cpu_ms_per_record": cpu,
        "redis_cpu_ms_per_record": 0.05,
        **more,
    }


def _results(rows: list[dict[str, Any]], **totals: int) -> dict[str, Any]:
    results = {
        "command": "make soak",
        "commit": "abc1234",
        "records": 1000,
        "preload": 100,
        "kills": 0,
        "lost": 0,
        "early": 0,
        "dead_lettered": 0,
        "wrong_due_header": 0,
        "duplicates": 0,
        "p99_ms": 30,
        "max_ms": 90,
        "minutes": rows,
        "args": {"minutes": 60, "rate": 2000, "max_delay_s": 600, "kill_every_min": 10},
    }
    results.update(totals)
    results["targets"] = targets(results)
    return results


def _met(results: dict[str, Any]) -> dict[str, bool]:
    return {name.split(":")[0].split(" within")[0]: ok for name, _, ok in results["targets"]}


def test_the_load_keeps_its_records_due_where_it_promises() -> None:
    load = Load(
        "out",
        start_ms=1_000_000,
        preload=1000,
        steady=5000,
        rate=2000.0,
        max_delay_ms=600_000,
        steady_start_ms=2_000_000,
    )
    preload_end = 1_000_000 + 1000 * 1000 / load.preload_rate
    for i in range(1000):  # from the end of the preload, within the longest delay
        assert preload_end <= load.due_ms(i) <= preload_end + 600_000
    for i in range(1000, 6000):  # its produce time plus 1 s .. max_delay
        produced = 2_000_000 + (i - 1000) * 1000 / 2000.0
        assert produced + MIN_DELAY_MS - 1 <= load.due_ms(i) <= produced + 600_000
    assert load.due_ms(1234) == load.due_ms(1234)  # the same on every read: not stored
    assert len(load) == 6000


def test_quantile_reads_a_counter_of_values() -> None:
    counts = collections.Counter({5: 900, 40: 90, 700: 10})
    assert quantile(counts, 0.5) == 5
    assert quantile(counts, 0.95) == 40
    assert quantile(counts, 0.999) == 700
    assert quantile(collections.Counter(), 0.99) == 0


def test_flat_is_the_largest_distance_from_the_median() -> None:
    assert flat([100.0, 104.0, 97.0]) == pytest.approx(0.04)
    assert flat([]) is None


def test_a_steady_run_meets_every_target() -> None:
    rows = [_minute(m, age=(m - 1) % 10 + 1, killed=m % 10 == 1 and m > 1) for m in range(1, 41)]
    results = _results(rows)
    assert all(ok for _, _, ok in results["targets"]), results["targets"]


def test_a_lateness_that_grows_misses_its_target_and_a_killed_minute_does_not_count() -> None:
    growing = [_minute(m, p99=20 + m) for m in range(1, 41)]
    assert _met(_results(growing))["lateness p99 per minute"] is False
    # A kill's minute is late by nature: one at the end of the run makes no trend.
    spiked = [_minute(m, p99=900 if m == 38 else 30, killed=m == 38) for m in range(1, 41)]
    assert _met(_results(spiked))["lateness p99 per minute"] is True


def test_cpu_per_record_growing_past_the_trend_misses() -> None:
    rows = [_minute(m, cpu=0.1 * (1 + (TREND - 1) * 2 * m / 40)) for m in range(1, 41)]
    assert _met(_results(rows))["bridge CPU per record"] is False


def test_rss_is_judged_on_processes_past_their_warm_up() -> None:
    young = [
        _minute(m, age=1 if m == 20 else m, rss=80 * MIB if m == 20 else 50 * MIB)
        for m in range(1, 41)
    ]
    assert _met(_results(young))["bridge RSS"] is True
    old = [_minute(m, rss=80 * MIB if m == WARM_UP_MIN + 10 else 50 * MIB) for m in range(1, 41)]
    assert _met(_results(old))["bridge RSS"] is False


def test_a_lost_record_or_a_short_run_misses() -> None:
    rows = [_minute(m) for m in range(1, 41)]
    assert not all(ok for _, _, ok in _results(rows, lost=1)["targets"])
    short = _results([_minute(m) for m in range(1, 4)])
    assert [m for _, m, ok in short["targets"] if not ok][:2] == ["too short to judge"] * 2


def test_the_machine_is_sampled_in_cores_and_milliseconds() -> None:
    machine = Machine()
    sum(i * i for i in range(200_000))  # some work to count
    sample = {k: v for k, v in machine.sample().items() if v is not None}
    assert 0 < sample["machine_busy_cores"] <= (os.cpu_count() or 1)
    assert 0 <= sample["machine_steal_cores"] <= (os.cpu_count() or 1)
    assert 0 <= sample["machine_system_cores"] <= sample["machine_busy_cores"]
    if Path("/proc/pressure/cpu").exists():  # a kernel with pressure stall information
        assert all(0 <= sample[f"{r}_pressure"] <= 1 for r in ("cpu", "memory", "io")), sample
    assert 0 < sample["probe_ms"] < 10_000
    assert 0 < sample["memory_probe_ms"] < 10_000


def test_the_report_shows_the_machine_when_the_run_recorded_it() -> None:
    plain = report(_results([_minute(m) for m in range(1, 41)]))
    assert "| 0 | yes |" in plain and "The machine" not in plain  # a run from before the probe
    rows = [
        _minute(
            m,
            machine_busy_cores=1.25,
            machine_steal_cores=0.0,
            probe_ms=12.0 + m / 10,
            cpu_pressure=0.1 + m / 100,
        )
        for m in range(1, 41)
    ]
    rows[-1] |= {"broker_gc_max_ms": 41.5, "redis_stall": "aof-write", "redis_stall_ms": 230.0}
    text = report(_results(rows))
    assert "| 41.5 | 230 (aof-write) |" in text
    assert "probe 13.1 → 15.4 ms" in text
    assert "some task waiting for a core 0.210 → 0.440 of the time" in text
    assert (
        "| 40 | 40 | 50.0 | 160.0 | 0.100 | 0.050 | 120,000 | 120,000 | 30 | 90 |  | 1.25 | "
        "0.000 | 0.500 | 16.0 |" in text
    )


@pytest.mark.integration
def test_redis_is_metered_per_command_and_per_script(
    redis_client: redis.Redis, unique: str
) -> None:
    meter = RedisMeter(redis_client)
    key = f"{unique}:soak-meter"
    for i in range(200):
        redis_client.zadd(key, {str(i): i})
    script = redis_client.register_script("return redis.call('ZCARD', KEYS[1])")
    assert [script(keys=[key]) for _ in range(20)] == [200] * 20
    sample = meter.sample()
    for key in (
        "redis_usec_per_command",
        "redis_usec_per_script",
        "redis_used_bytes",
        "redis_fragmentation",
    ):
        value = sample[key]
        assert isinstance(value, int | float) and value > 0, key
    cpu = sample["redis_cpu_s"]
    assert isinstance(cpu, float) and cpu >= 0
    assert sample["redis_stall"] == "" and sample["redis_stall_ms"] == 0.0
    # A script that keeps Redis busy for 60 ms: the latency monitor's "command" event.
    busy = redis_client.register_script(
        "local t = redis.call('TIME') local from = t[1] * 1e6 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - from > 60000 return 1"
    )
    assert busy() == 1
    stalled = meter.sample()
    assert stalled["redis_stall"] == f"command: script {busy.sha[:8]}"  # not one of the bridge's
    assert isinstance(stalled["redis_stall_ms"], float) and stalled["redis_stall_ms"] >= 60
    assert busy(args=[b"\xec\xff"]) == 1  # a call whose arguments are not text
    assert meter.sample()["redis_stall"] == f"command: script {busy.sha[:8]}"
    assert meter.sample()["redis_stall_ms"] == 0.0  # each minute's own


def test_the_bridge_s_scripts_are_named_by_the_sha1_redis_runs_them_by(
    redis_client: redis.Redis,
) -> None:
    names = script_names()
    for name, script in Scripts(redis_client)._scripts.items():
        assert names[script.sha] == name


# What a broker's JVM writes with -Xlog:gc:file=...:uptime (scripts/services), as JDK 17 words it.
GC_LOG = """[0.033s] Using G1
[0.868s] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 51M->8M(1024M) 12.395ms
[1.233s] GC(1) Pause Young (Concurrent Start) (G1 Humongous Allocation) 60M->9M(1024M) 5.502ms
[1.240s] GC(2) Concurrent Mark Cycle 80.113ms
[1.300s] GC(2) Pause Remark 20M->20M(1024M) 2.100ms
"""


def test_the_brokers_gc_pauses_are_read_per_minute_from_their_logs(tmp_path: Path) -> None:
    one, two, absent = tmp_path / "1.log", tmp_path / "2.log", tmp_path / "3.log"
    one.write_text(
        "[0.010s] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 5M->1M(1024M) 99.0ms\n"
    )
    two.write_text("")
    gc = BrokerGC([one, two, absent])  # what was logged before it started is not the soak's
    with two.open("a") as f:
        f.write(GC_LOG + "[1.400s] GC(3) Pause Young (Normal) (G1 Evac")  # a line half written
    sample = gc.sample()
    assert sample["broker_gc_max_ms"] == pytest.approx(12.395)
    assert sample["broker_gc_ms"] == pytest.approx(12.395 + 5.502 + 2.1)  # not the marking
    with two.open("a") as f:
        f.write("uation Pause) 60M->9M(1024M) 7.000ms\n")
    assert gc.sample() == {"broker_gc_max_ms": 7.0, "broker_gc_ms": 7.0}
    assert gc.sample() == {"broker_gc_max_ms": 0.0, "broker_gc_ms": 0.0}
    two.write_text(
        "[0.500s] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 5M->1M(1024M) 3.0ms\n"
    )
    assert gc.sample()["broker_gc_ms"] == 3.0  # a broker started again: its new log from the top


class _Answers:
    """A bridge's /metrics as the soak's BridgeMeter reads it: the text of a real registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def get(self, path: str) -> tuple[int, str]:
        assert path == "/metrics"
        return 200, generate_latest(self.registry).decode()


def test_the_bridge_s_own_lateness_is_read_per_minute_and_per_life() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    bridge = cast(Bridge, _Answers(registry))
    meter = BridgeMeter()
    metrics.send_lateness.observe_many([0.001] * 99 + [0.2])  # before the first reading
    metrics.lateness.labels(priority="high").observe(0.004)
    first = meter.sample(bridge)
    assert first["send_p99_ms"] == 1.0 and first["send_mean_ms"] == pytest.approx(2.99)
    assert first["ack_mean_ms"] == pytest.approx(4.0) and first["ack_p99_ms"] == 5.0
    metrics.send_lateness.observe_many([0.003] * 100)  # the next minute's only
    metrics.lateness.labels(priority="low").observe(0.03)  # summed over priorities
    second = meter.sample(bridge)
    assert second["send_p99_ms"] == 5.0 and second["send_mean_ms"] == pytest.approx(3.0)
    assert second["ack_mean_ms"] == pytest.approx(30.0) and second["ack_p99_ms"] == 50.0
    assert meter.sample(bridge) == {
        "send_mean_ms": None,
        "send_p99_ms": None,
        "ack_mean_ms": None,
        "ack_p99_ms": None,
    }
    # A bridge killed and started again counts from its own start, not from the last one's.
    restarted = CollectorRegistry()
    Metrics(restarted).send_lateness.observe_many([0.0004] * 10)
    assert meter.sample(cast(Bridge, _Answers(restarted)))["send_mean_ms"] == pytest.approx(0.4)
