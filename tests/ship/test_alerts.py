"""The chart's alert rules, rendered for real releases and unit-tested by promtool: each alert
fires on its failure and stays silent when healthy, and two releases (and one namespace more) side
by side fire on their own series only."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_observability import exported_names, metric_names
from tests.ship.test_chart import CHART, MONITORING, render

pytestmark = pytest.mark.ship

UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
# The release the unit tests are written for, and the two more they are run beside.
RELEASES = [("a", "apps"), ("b", "apps"), ("a", "other")]
RUNBOOKS = "https://runbooks.example/delay-bridge"


def rules(helm: str, release: str, namespace: str, *args: str) -> dict[str, Any]:
    """The PrometheusRule's spec (a Prometheus rules file) of ``release`` in ``namespace``."""
    docs = [
        d
        for d in render(
            helm,
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--api-versions",
            MONITORING,
            *args,
            release=release,
            namespace=namespace,
        )
        if d["kind"] == "PrometheusRule"
    ]
    [doc] = docs
    spec: dict[str, Any] = doc["spec"]
    return spec


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)


def _as(text: str, release: str, namespace: str) -> str:
    return (
        text.replace("a-delay-bridge", f"{release}-delay-bridge")
        .replace('namespace="apps"', f'namespace="{namespace}"')
        .replace("apps/", f"{namespace}/")
    )


def side_by_side(tests: dict[str, Any]) -> dict[str, Any]:
    """The unit tests with every series and every expected alert also for the other releases."""
    out = copy.deepcopy(tests)
    out["rule_files"] = [f"rules-{r}-{n}.yaml" for r, n in RELEASES]
    for test in out["tests"]:
        series = test["input_series"]
        test["input_series"] = [
            {**s, "series": _as(s["series"], r, n)}
            for r, n in RELEASES
            for s in series
            if 'job="a-delay-bridge"' in s["series"] or (r, n) == RELEASES[0]
        ]
        for check in test["alert_rule_test"]:
            check["exp_alerts"] = [
                {
                    "exp_labels": {**a["exp_labels"], "job": f"{r}-delay-bridge", "namespace": n},
                    "exp_annotations": {k: _as(v, r, n) for k, v in a["exp_annotations"].items()},
                }
                for r, n in RELEASES
                for a in check["exp_alerts"]
            ]
    return out


def test_each_alert_fires_on_its_failure_and_only_on_its_releases_series(
    helm: str, tmp_path: Path
) -> None:
    for release, namespace in RELEASES:
        written = tmp_path / f"rules-{release}-{namespace}.yaml"
        spec = rules(
            helm, release, namespace, "--set", f"metrics.prometheusRule.runbookUrl={RUNBOOKS}"
        )
        written.write_text(yaml.safe_dump(spec))
        check = promtool("check", "rules", str(written))
        assert check.returncode == 0, check.stdout + check.stderr
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    (tmp_path / "alone.yaml").write_text(yaml.safe_dump(tests))
    alone = promtool("test", "rules", str(tmp_path / "alone.yaml"))
    assert alone.returncode == 0, alone.stdout + alone.stderr
    (tmp_path / "beside.yaml").write_text(yaml.safe_dump(side_by_side(tests)))
    beside = promtool("test", "rules", str(tmp_path / "beside.yaml"))
    assert beside.returncode == 0, beside.stdout + beside.stderr
    tested = {c["alertname"] for t in tests["tests"] for c in t["alert_rule_test"]}
    assert tested == {r["alert"] for r in spec["groups"][0]["rules"]}, "every alert has a test"


def test_every_rule_selects_its_release_keeps_namespace_and_job_and_has_a_runbook(
    helm: str,
) -> None:
    readme = (CHART / "README.md").read_text()
    for rule in rules(helm, "orders", "team-a")["groups"][0]["rules"]:
        expr = rule["expr"]
        selectors = expr.count("{")
        assert expr.count('job="orders-delay-bridge", namespace="team-a"') == selectors, expr
        for by in (part.split(")")[0] for part in expr.split("by (")[1:]):
            assert {"namespace", "job"} <= {label.strip() for label in by.split(",")}, expr
        url = rule["annotations"]["runbook_url"]
        anchor = url.split("#")[1]
        assert anchor == rule["alert"].lower()
        assert f"\n### {rule['alert']}\n" in readme, f"the README has no runbook for {anchor}"
        assert metric_names(expr) <= exported_names(), expr


def test_rules_are_tuned_disabled_and_extended_from_values(helm: str) -> None:
    spec = rules(
        helm,
        "a",
        "apps",
        "--set",
        "metrics.prometheusRule.rules.DelayBridgeOverdueRecords.threshold=300",
        "--set",
        "metrics.prometheusRule.rules.DelayBridgeOverdueRecords.for=15m",
        "--set",
        "metrics.prometheusRule.rules.DelayBridgeDeadLetters.disabled=true",
        "--set",
        "metrics.prometheusRule.rules.DelayBridgeDown.severity=page",
        "--set",
        "metrics.prometheusRule.ruleLabels.team=orders",
        "--set",
        'metrics.prometheusRule.selector=service="x"',
        "--set-json",
        'metrics.prometheusRule.additionalRules=[{"alert": "Mine", "expr": "vector(1)"}]',
    )
    by_name = {r["alert"]: r for r in spec["groups"][0]["rules"]}
    overdue = by_name["DelayBridgeOverdueRecords"]
    assert overdue["expr"].endswith(") > 300") and overdue["for"] == "15m"
    assert "300 s" in overdue["annotations"]["description"]
    assert "DelayBridgeDeadLetters" not in by_name
    assert by_name["DelayBridgeDown"]["labels"] == {"severity": "page", "team": "orders"}
    assert by_name["DelayBridgeDown"]["expr"] == 'up{service="x"} == 0'
    assert by_name["Mine"] == {"alert": "Mine", "expr": "vector(1)"}
    assert "for" not in by_name["DelayBridgeRedisLostData"]  # for: 0 fires at once


def test_service_monitor_options(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--api-versions",
        MONITORING,
        "--set",
        "metrics.serviceMonitor.scrapeTimeout=5s",
        "--set-json",
        'metrics.serviceMonitor.relabelings=[{"targetLabel": "team", "replacement": "o"}]',
        "--set-json",
        'metrics.serviceMonitor.metricRelabelings=[{"action": "drop", '
        '"sourceLabels": ["__name__"], "regex": "python_.*"}]',
        "--set-json",
        'metrics.serviceMonitor.namespaceSelector={"matchNames": ["apps"]}',
    )
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scrapeTimeout"] == "5s"
    assert endpoint["relabelings"] == [{"targetLabel": "team", "replacement": "o"}]
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["apps"]}
    plain = [
        d
        for d in render(
            helm, "--set", "metrics.serviceMonitor.enabled=true", "--api-versions", MONITORING
        )
        if d["kind"] == "ServiceMonitor"
    ]
    assert "namespaceSelector" not in plain[0]["spec"]
    assert set(plain[0]["spec"]["endpoints"][0]) == {"port", "path", "interval"}
