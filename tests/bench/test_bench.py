"""The benchmark harness at toy sizes: it runs end to end and its runs keep the contract.

Only correctness is asserted (nothing lost, nothing early, every figure measured); how fast is
for ``make bench`` to report, never for a test to assert.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import report
from bench.__main__ import run_all
from bench.exactly_once import MODES, exactly_once
from bench.scenarios import Report, Sizes
from testbed.servers import Servers
from tests.conftest import Services

pytestmark = [pytest.mark.integration, pytest.mark.bench]

TOY = Sizes(
    throughput=3000,
    values=(100,),
    precision_s=1,
    backlog=3000,
    catchup=3000,
    cluster=2000,
    max_delay_ms=2000,
    held=((3000, 100),),
    contiguous=3000,
    scattered=3000,
    spread_s=4,
    session_ms=6000,
    priority=3000,
    max_rate=1500,
    live_rate=20,
    journal=20_000,
    bulk=3000,
    rebuild=30_000,
    recurring=(300, 2, 4.0),
)


def test_every_scenario_runs_and_keeps_the_contract(services: Services, tmp_path: Path) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["throughput", "precision", "catchup"])
    assert result.problems == []  # nothing lost, early or misrouted in any scenario
    f = result.figures
    t = f["throughput-100"]
    assert t["records"] == 3000 and t["duplicates"] == 0
    # An entry a record, read to the journal's end (its size less the batches' own headers).
    assert t["journal_bytes_per_record"] > 0
    for rate in (
        "ingest_per_s",
        "egress_per_s",
        "end_to_end_per_s",
        "bare_pipe_per_s",
        "bare_store_add_per_s",
        "bare_store_claim_ack_per_s",
    ):
        assert t[rate] > 0, rate
    ids = f["throughput-100-ids"]  # the same records, a delay-id each
    assert ids["records"] == 3000 and ids["duplicates"] == 0 and ids["delay_id_bytes"] == 31
    assert ids["egress_vs_no_ids"] == ids["egress_per_s"] / t["egress_per_s"] > 0
    for phase in ("precision without backlog", "precision with backlog"):
        assert f[phase]["early"] == 0 and f[phase]["lost"] == 0
        assert f[phase]["records"] > 0
    # Measured (a used_memory delta: the tests beside move it, so only that it is a number).
    assert f["backlog"]["records"] == 3000 and math.isfinite(f["backlog"]["redis_bytes_per_record"])
    for run in ("steady coalescing off", "steady defaults"):
        cost = f[run]
        assert cost["early"] == 0 and cost["lost"] == 0 and cost["measured_records"] > 0
        assert cost["bridge_cpu_ms_per_record"] > 0 and cost["redis_calls_per_record"] > 0
        # The bridge's share by thread, its loops by the names it gives them.
        assert {"db-ingress", "db-egress"} <= set(cost["threads_us_per_record"]), cost
    assert f["steady defaults"]["cpu_vs_off"] > 0
    c = f["catch-up"]
    assert c["records"] == 3000
    # The backlog came due while the bridge was stopped, so every drained record was late.
    assert c["drained_lateness_ms"]["p50"] > 0
    assert c["live_due_during_drain"] >= 0
    text = report.tables(result)
    for title in (
        "Throughput",
        "A delay-id through the bridge",
        "Precision",
        "Backlog",
        "Catch-up",
        "Cost per record",
    ):
        assert title in text
    assert {t for t, _, _ in report.targets(result)} >= {"precision: 0 early"}


def test_the_exactly_once_scenario_runs_both_modes_and_keeps_the_contract(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = Report()
    exactly_once(
        servers,
        tmp_path,
        result,
        count=1000,
        seconds=TOY.precision_s,
        max_delay_ms=TOY.max_delay_ms,
        rounds=1,
    )
    assert result.problems == []
    e = result.figures["exactly once"]
    assert e["duplicates"] == 0 and e["throughput_ratio"] > 0
    assert all(e["seen_p99_ms"][m] >= 0 and e["cpu_ms_per_record"][m][0] > 0 for m in MODES)
    assert "Exactly once next to at-least-once" in report.tables(result)
    assert "exactly once: 0 duplicates" in {t for t, _, _ in report.targets(result)}


def test_the_cluster_scenario_runs_on_both_redis_and_keeps_the_contract(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # cluster of its own
    result = run_all(servers, tmp_path, TOY, ["cluster"])
    assert result.problems == []
    m = result.figures["redis modes"]
    for mode in ("standalone", "cluster"):
        assert m[mode]["records"] == 2000 and m[mode]["early"] == 0
        assert m[mode]["end_to_end_per_s"] > 0 and m[mode]["precision_records"] > 0
    # Both loads ran at the same rate, so the lateness figures compare.
    assert m["cluster"]["precision_rate_per_s"] == m["standalone"]["precision_rate_per_s"]
    assert m["end_to_end_ratio"] > 0
    assert "Redis Cluster" in report.tables(result)


def test_the_recovery_scenario_kills_restarts_and_keeps_the_contract(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["recovery"])
    assert result.problems == []  # nothing lost or early around the SIGKILL
    for case, replicas in (("restart", 1), ("restart, dynamic member", 1), ("takeover", 2)):
        r = result.figures[case]
        assert (r["replicas"], r["records"], r["lost"], r["early"]) == (replicas, 8000, 0, 0)
        assert r["kill_to_last_due_acked_s"] >= 0
        assert r["due_after_kill_lateness_ms"]["max"] >= r["due_after_kill_lateness_ms"]["p50"]
    assert "Recovery" in report.tables(result)
    assert {t for t, _, _ in report.targets(result)} >= {"restart: 0 lost, 0 early"}


def test_the_replicas_scenario_drains_with_one_bridge_then_two_side_by_side(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["replicas"])
    assert result.problems == []  # nothing lost or early, whichever replica delivered it
    one, two = result.figures["replicas-1"], result.figures["replicas-2"]
    for n, r in ((1, one), (2, two)):
        assert (r["replicas"], r["partitions"], r["records"]) == (n, 6, 9000)
        assert r["end_to_end_per_s"] > 0 and r["cpu_ms_per_record"] > 0
    assert two["end_to_end_vs_one"] == two["end_to_end_per_s"] / one["end_to_end_per_s"]
    assert "| 2 | 9,000 x 100 B on 6 partitions |" in report.tables(result)


def test_tables_report_missed_targets() -> None:
    # The far-future backlog is kept as references (overhead below the payload): the memory
    # target is the near-term one's, a record held whole.
    far = {
        "records": 1,
        "redis_bytes_per_record": 17.0,
        "payload_bytes": 167,
        "overhead_bytes": -150.0,
        "p99_ratio": 1.5,
        "seconds_to_store": 1,
    }
    near = {**far, "redis_bytes_per_record": 467.0, "overhead_bytes": 300.0}
    r = Report(figures={"backlog": far, "near-term backlog": near})
    held = {t: ok for t, _, ok in report.targets(r)}
    assert held == {
        "memory <= payload + 150 B per record held whole": False,
        "p99 with the backlog <= 2x without": True,
    }


def test_the_far_future_scenarios_keep_records_as_references_and_the_contract(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["far-future"])
    assert result.problems == []  # every record kept as a reference; none lost, early, misrouted
    held = result.figures["far-future held 3,000 x 100 B"]
    assert held["references"] == 3000 and math.isfinite(held["redis_bytes_per_record"])
    assert held["bridge_rss_bytes"] > 0
    assert held["restart_probes_lost"] == held["restart_probes_early"] == 0
    assert held["restart_start_to_first_due_acked_s"] > 0
    for name in (
        "read-back contiguous 3,000 x 100 B",
        "read-back scattered 3,000 x 1024 B over 4 s",
    ):
        r = result.figures[name]
        assert r["references"] == r["read_back"] == 3000, name
        assert r["lost"] == r["early"] == r["duplicates"] == 0, name
        assert r["fetched_per_record"] >= 1 and r["fetched_bytes_per_record"] > 100, name
    assert result.figures["read-back contiguous 3,000 x 100 B"]["read_back_per_s"] > 0
    text = report.tables(result)
    assert "Far-future records held" in text and "Read-back" in text
    assert any("read back before it is due" in t for t, _, _ in report.targets(result))


def test_the_bulk_scenario_cancels_a_customer_under_live_traffic(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["bulk"])
    assert result.problems == []  # no live record lost or early, no cancelled one delivered
    x = result.figures["bulk cancel"]
    assert x["records"] == 3000 and x["cancelled_delivered"] == 0
    assert 0 < x["command_s"] <= x["applied_s"] and x["live_records"] > 0
    assert x["live_ack_lateness_ms"]["p99"] >= 0
    assert any(t.startswith("bulk cancel of 3,000") for t, _, _ in report.targets(result))


def test_the_priority_scenario_drains_high_first_and_keeps_the_rate(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["priority"])
    assert result.problems == []  # nothing lost or early in either drain
    for name in ("priority", "priority, rate-limited"):
        x = result.figures[name]
        assert x["records"] == 3000 and x["drain_s"] > 0
        assert x["low_before_last_high"] == x["normal_before_last_high"] == 0
        assert x["low_before_last_normal"] == 0
    limited = result.figures["priority, rate-limited"]
    assert limited["max_rate"] == 1500 and limited["live"] == 100
    # At 1,500/s the 3,000 records take about 2 s (the harness checks the range, not this).
    assert limited["drain_s"] >= 1.0
    assert "Priority" in report.tables(result)
    assert any(
        t.startswith("priority: the drain at max_rate") for t, _, _ in report.targets(result)
    )


def test_the_rebuild_scenario_loses_redis_and_stores_every_record_again(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["rebuild"])
    assert result.problems == []  # every reference and whole record back; no probe lost or early
    r = result.figures["rebuild 30,000"]
    assert (r["references_after"], r["whole_after"]) == (27_000, 3000)
    assert r["probes"] == 100 and r["probes_duplicates"] == 0
    assert r["keys_deleted"] > 0 and r["rebuild_s"] > 0 and r["bare_read_s"] > 0
    assert "Rebuild" in report.tables(result)
    assert any(t.startswith("rebuild 30,000: every shard") for t, _, _ in report.targets(result))


def test_the_trace_scenario_finds_what_was_delivered_a_day_ago(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["trace"])
    assert result.problems == []  # each trace found the delivery, where it went
    t = result.figures["trace, 20,002 journal entries"]
    assert t["process_start_s"] > 0 and t["on_time_s"] > 0 and t["hour_late_s"] > 0
    assert t["by_id_since_25h_s"] > 0
    assert "Trace" in report.tables(result)
    assert any("traced within 1 s" in t for t, _, _ in report.targets(result))


def test_the_recurring_scenario_delivers_every_occurrence_once(
    services: Services, tmp_path: Path
) -> None:
    servers = Servers.on(services, tmp_path)  # never started
    result = run_all(servers, tmp_path, TOY, ["recurring"])
    assert result.problems == []  # no occurrence missed, early or twice; no one-shot lost
    r = result.figures["recurring 300 every 2s"]
    assert r["expected"] == 600 and r["delivered"] == 600
    assert r["missed"] == r["early"] == r["twice"] == 0
    assert r["ack_lateness_ms"]["p99"] >= 0 and r["one_shot_ack_lateness_ms"]["p99"] >= 0
    assert "Recurring schedules" in report.tables(result)
    assert any(
        t.endswith("0 missed, 0 early, 0 twice") and ok for t, _, ok in report.targets(result)
    )
