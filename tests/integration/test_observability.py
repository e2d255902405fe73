"""Metrics, probes, logs, alert rules and dashboard, checked by the real Prometheus tools."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from bridge.message import H_AFTER, H_TARGET_TOPIC
from bridge.metrics import Metrics
from testbed.harness import Bridge, bridge_env, produce_all
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "helm" / "delay-bridge" / "files"
# What every dashboard expression selects by: the deployments chosen in its variables.
SCOPE = 'namespace=~"$namespace", job=~"$job", instance=~"$instance"'


def exported_names() -> set[str]:
    """Every sample name the bridge can export (with _total, _bucket, ... suffixes)."""
    names: set[str] = set()
    for metric in Metrics(CollectorRegistry()).registry.collect():
        names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names |= {metric.name + s for s in ("_bucket", "_sum", "_count")}
    return names


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], input=stdin, capture_output=True, text=True, check=False
    )


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bdelay_bridge_[a-z_]+", expr))


def test_alerts_and_dashboard_use_only_exported_metrics(tmp_path: Path) -> None:
    exported = exported_names()
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:  # the alert rules': tests/ship/test_alerts.py
        unknown = metric_names(expr) - exported
        assert not unknown, f"{expr} uses metrics the bridge does not export: {unknown}"
        # Many deployments report to one Prometheus: every series is of the chosen ones.
        uses = re.findall(r"\bdelay_bridge_[a-z_]+(\{[^}]*\})?", expr)
        assert uses and all(u == "{" + SCOPE + "}" for u in uses), f"{expr} is not scoped"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    chosen: list[str] = []
    for name in ("namespace", "job", "instance"):
        query = variables[name]["query"]["query"]
        assert query.startswith("label_values(delay_bridge_build_info"), query
        assert all(f'{c}=~"${c}"' in query for c in chosen), f"{name} ignores {chosen}: {query}"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        chosen.append(name)
    # Syntax: wrap every dashboard expression in a recording rule and let promtool parse it.
    generated = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(generated))
    check = promtool("check", "rules", str(path))
    assert check.returncode == 0, check.stdout + check.stderr
    covered = set().union(*(metric_names(e) for e in exprs))
    for needed in (
        "delay_bridge_ingested_total",
        "delay_bridge_delivered_total",
        "delay_bridge_scheduled_messages",
        "delay_bridge_overdue_messages",
        "delay_bridge_delivery_lateness_seconds_bucket",
        "delay_bridge_ingest_lag_messages",
        "delay_bridge_dead_lettered_total",
        "delay_bridge_redelivered_total",
        "delay_bridge_cancelled_total",
        "delay_bridge_replaced_total",
        "delay_bridge_dlq_produce_errors_total",
        "delay_bridge_redis_writable",
        "delay_bridge_waiting_messages",
        "delay_bridge_waiting_quota_messages",
        "delay_bridge_schedules",
    ):
        assert needed in covered, f"the dashboard shows no {needed}"


@pytest.fixture
def running(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path
) -> Iterator[tuple[Bridge, str, str]]:
    delay, target = topics("delay", 2), topics("out")
    env = bridge_env(
        services.bootstrap,
        services.redis_url,
        topics__delay=delay,
        topics__dead_letter=topics("dlq"),
        topics__journal=topics("journal"),
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
        logging__json="true",
    )
    bridge = Bridge(env, tmp_path / "bridge.log").start()
    try:
        yield bridge, delay, target
    finally:
        bridge.kill()


def test_live_metrics_probes_and_json_logs(
    running: tuple[Bridge, str, str], services: Services
) -> None:
    bridge, delay, target = running
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "/readyz to answer 200")
    assert bridge.get("/healthz") == (200, "ok\n")
    assert bridge.get("/nope")[0] == 404
    for path in ("/healthz", "/readyz", "/metrics"):  # probes may use HEAD
        assert bridge.head(path) == (200, b"")
    produce_all(
        services.bootstrap,
        delay,
        [(None, b"v", [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"10ms")])] * 5,
    )
    wait_for(
        lambda: (
            f'delay_bridge_delivered_total{{target_topic="{target}"}} 5.0'
            in bridge.get("/metrics")[1]
        ),
        60,
        "5 deliveries in /metrics",
    )
    status, body = bridge.get("/metrics")
    assert status == 200
    lint = promtool("check", "metrics", stdin=body)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    for name in (
        "delay_bridge_scheduled_messages",
        "delay_bridge_oldest_overdue_seconds",
        "delay_bridge_delivery_lateness_seconds_bucket",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert name in body
    # the readiness gauge follows /readyz at the next sample
    wait_for(lambda: "delay_bridge_ready 1.0" in bridge.get("/metrics")[1], 10, "the ready gauge")

    lines = [line for line in bridge.output().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line is one JSON event
    assert {"time", "level", "logger", "message"} <= set(events[0])
    assigned = [e for e in events if e["message"].startswith("assigned")]
    assert assigned and assigned[0]["partitions"] == 2
    assert "redis://" not in bridge.output()  # no connection strings (which may hold secrets)


def test_readyz_fails_while_redis_is_unreachable(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, dead_port: int
) -> None:
    env = bridge_env(
        services.bootstrap,
        f"redis://127.0.0.1:{dead_port}/0",
        topics__delay=topics("delay"),
        kafka__group_id=f"g-{unique}",
        redis__socket_timeout="200ms",
    )
    bridge = Bridge(env, tmp_path / "bridge.log").start()
    try:
        # Until its first probe of Redis fails, /readyz says Redis has not answered yet (on a
        # busy machine the HTTP server can answer first: once in CI).
        answers: list[tuple[int, str]] = []

        def names_redis() -> bool:
            answers.append(bridge.get("/readyz"))
            return "redis unreachable" in answers[-1][1]

        wait_for(names_redis, 10, "/readyz naming Redis unreachable")
        assert {status for status, _ in answers} == {503}
        assert bridge.get("/healthz")[0] == 200  # alive: it waits for Redis, it is not stuck
        assert "delay_bridge_ready 0.0" in bridge.get("/metrics")[1]
        # the log names Redis as the cause, not another check failing beside it (the DLQ topic)
        wait_for(lambda: "not joining" in bridge.output(), 10, "the log line")
        assert "until Redis takes writes: redis unreachable" in bridge.output()
    finally:
        bridge.kill()


def test_readyz_fails_while_redis_has_not_answered_yet(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path
) -> None:
    # A Redis that takes the connection and never answers: the first check waits out its
    # socket timeout, and until it has an answer the bridge is not ready.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        env = bridge_env(
            services.bootstrap,
            url,
            topics__delay=topics("delay"),
            topics__dead_letter=topics("dlq"),
            topics__journal=topics("journal"),
            kafka__group_id=f"g-{unique}",
            redis__socket_timeout="3s",
        )
        bridge = Bridge(env, tmp_path / "bridge.log").start()
        try:
            status, body = bridge.get("/readyz")
            assert status == 503 and "redis" in body, body
            wait_for(
                lambda: "redis unreachable" in bridge.get("/readyz")[1], 30, "the timeout named"
            )
            assert bridge.get("/readyz")[0] == 503
        finally:
            bridge.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_scrapes_deliveries(
    running: tuple[Bridge, str, str], services: Services, tmp_path: Path
) -> None:
    bridge, delay, target = running
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "delay-bridge",
                "static_configs": [{"targets": [f"127.0.0.1:{bridge.http_port()}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )

    def query(expr: str) -> float | None:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                result = json.load(resp)["data"]["result"]
        except OSError:
            return None
        return float(result[0]["value"][1]) if result else None

    try:
        wait_for(
            lambda: query('up{job="delay-bridge"}') == 1.0, 60, "Prometheus to scrape the bridge"
        )
        produce_all(
            services.bootstrap,
            delay,
            [(None, b"v", [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"200ms")])] * 20,
        )
        delivered = f'sum(delay_bridge_delivered_total{{target_topic="{target}"}})'
        wait_for(lambda: query(delivered) == 20.0, 60, "20 deliveries in Prometheus")
        wait_for(
            lambda: query("sum(delay_bridge_delivery_lateness_seconds_count)") == 20.0,
            30,
            "the lateness histogram",
        )
        p99 = query(
            "histogram_quantile(0.99, sum by (le) (delay_bridge_delivery_lateness_seconds_bucket))"
        )
        assert p99 is not None and 0 <= p99 <= 3600
    finally:
        server.terminate()
        server.wait(30)
