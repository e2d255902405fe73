"""The Helm chart: helm lint, strict schema validation of the rendered manifests, and what the
rendered manifests must say (security, probes, config, labels)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bridge.config import from_mapping, kafka_settings
from bridge.errors import ConfigError
from tests.conftest import ROOT

CHART = ROOT / "helm" / "delay-bridge"
# The chart has no default image (none is published): every render names one, as a user does.
REPOSITORY = "registry.example.com/platform/delay-bridge"
AT_CHART = (str(CHART), "--set", f"image.repository={REPOSITORY}")
ALL_VALUES = CHART / "ci" / "all-values.yaml"
KUBE_VERSION = "1.31.0"
MONITORING = "monitoring.coreos.com/v1"

sys.path.insert(0, str(ROOT / "scripts"))
import chart_schema  # noqa: E402
import chart_values  # noqa: E402

pytestmark = pytest.mark.ship


def render(
    helm: str, *args: str, release: str = "rel", namespace: str = "apps"
) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [
            helm,
            "template",
            release,
            *AT_CHART,
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        name = doc["kind"] if doc["kind"] != "ConfigMap" else f"ConfigMap/{doc['metadata']['name']}"
        out[name] = doc
    return out


def workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The bridge's StatefulSet or Deployment."""
    [found] = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [c] = workload(docs)["spec"]["template"]["spec"]["containers"]
    return dict(c)


@pytest.mark.parametrize("values", [[], ["-f", str(ALL_VALUES)]], ids=["default", "all"])
def test_helm_lint_strict(helm: str, values: list[str]) -> None:
    proc = subprocess.run(
        [helm, "lint", "--strict", *AT_CHART, *values], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-f", str(ALL_VALUES), "--api-versions", MONITORING],
        ["--set", "workloadKind=Deployment"],
    ],
    ids=["default", "all-features", "deployment"],
)
def test_rendered_manifests_pass_strict_schemas(helm: str, args: list[str], tmp_path: Path) -> None:
    docs = render(helm, *args)
    crds = [d for d in docs if d["apiVersion"] == MONITORING]
    errors = []
    for doc in docs:
        if doc in crds:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {err.message}")
    assert errors == []
    if MONITORING in args:
        # The operator's kinds have no bundled schema: the rules go through promtool instead.
        assert sorted(d["kind"] for d in crds) == ["PrometheusRule", "ServiceMonitor"]
        rule = next(d for d in crds if d["kind"] == "PrometheusRule")
        rules_file = tmp_path / "rules.yaml"
        rules_file.write_text(yaml.safe_dump(rule["spec"]))
        proc = subprocess.run(
            ["promtool", "check", "rules", str(rules_file)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert 'job="rel-delay-bridge"' in rules_file.read_text()  # the ServiceMonitor's job
        monitor = next(d for d in crds if d["kind"] == "ServiceMonitor")
        assert monitor["spec"]["endpoints"] == [
            {"port": "http", "path": "/metrics", "interval": "15s"}
        ]


def test_default_render_has_the_expected_objects(helm: str) -> None:
    assert sorted(kinds(render(helm))) == sorted(
        [
            "ConfigMap/rel-delay-bridge",
            "StatefulSet",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
            "Pod",  # the helm test hook
        ]
    )
    # Asked for, but the cluster does not serve the operator's API: nothing rendered, no error.
    asked = render(
        helm,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
    )
    assert "ServiceMonitor" not in kinds(asked) and "PrometheusRule" not in kinds(asked)
    full = kinds(render(helm, "-f", str(ALL_VALUES), "--api-versions", MONITORING))
    assert {
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap/rel-delay-bridge-dashboard",
    } <= set(full)
    assert (
        full["ConfigMap/rel-delay-bridge-dashboard"]["metadata"]["labels"]["grafana_dashboard"]
        == "1"
    )
    assert "replicas" not in full["StatefulSet"]["spec"]  # the HPA owns it


@pytest.mark.parametrize("values", [[], ["-f", str(ALL_VALUES)]], ids=["default", "all"])
def test_restricted_pod_security(helm: str, values: list[str]) -> None:
    docs = render(helm, *values)
    pod = workload(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        isinstance(pod["securityContext"]["runAsUser"], int)
        and pod["securityContext"]["runAsUser"] > 0
    )
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = container(docs)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    tmp = [m for m in container(docs)["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and {"name": tmp[0]["name"], "emptyDir": {}} in pod["volumes"]
    resources = container(docs)["resources"]  # sized from the bench by default
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]
    assert "cpu" not in resources["limits"]  # throttling makes due records late
    test_pod = kinds(docs)["Pod"]["spec"]
    assert test_pod["securityContext"] == pod["securityContext"]
    assert test_pod["containers"][0]["securityContext"] == sc


def test_probes_point_at_the_real_endpoints(helm: str) -> None:
    docs = render(helm, "--set", "service.port=8080")
    c = container(docs)
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    # ... and the port named http is the one the bridge listens on.
    config = yaml.safe_load(kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"])
    assert config["http"] == {"host": "0.0.0.0", "port": 8080, "console": {"enabled": True}}
    service = kinds(docs)["Service"]["spec"]["ports"]
    assert service == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]


def test_checksum_annotation_follows_the_config(helm: str) -> None:
    def checksum(*args: str) -> str:
        deployment = workload(render(helm, *args))
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    base = checksum()
    assert checksum() == base
    assert checksum("--set", "config.limits.max_delay=30d") != base
    assert checksum("--set", "replicaCount=5") == base


@pytest.mark.parametrize(
    "values", [[], ["-f", str(ALL_VALUES), "--api-versions", MONITORING]], ids=["default", "all"]
)
def test_selectors_never_hold_the_chart_label(helm: str, values: list[str]) -> None:
    def selectors(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("selector", "matchLabels") and isinstance(value, dict):
                    yield value
                yield from selectors(value)
        elif isinstance(node, list):
            for item in node:
                yield from selectors(item)

    found = [s for doc in render(helm, *values) for s in selectors(doc)]
    assert found
    assert not [s for s in found if "helm.sh/chart" in str(s)]
    for doc in render(helm, *values):
        labels = doc["metadata"]["labels"]
        test = labels.get("app.kubernetes.io/component") == "test"  # no Service may select it
        assert labels["app.kubernetes.io/name"] == "delay-bridge" + ("-test" if test else "")
        assert labels["app.kubernetes.io/instance"] == "rel"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize("values", [[], ["-f", str(ALL_VALUES)]], ids=["default", "all"])
def test_rendered_config_passes_check_config(helm: str, values: list[str], tmp_path: Path) -> None:
    docs = render(helm, *values)
    text = kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    # The Secrets are mounted under /var/run/secrets in the pod; stand in for them here.
    secrets, tls = tmp_path / "secrets", tmp_path / "tls"
    secrets.mkdir()
    for key in ("kafka", "redis", "sentinel", "console"):
        (secrets / key).write_text(f"{key}-password\n")
    # check-config builds the Kafka clients, which read the CA file: a real one stands in.
    system_ca = Path("/etc/ssl/certs/ca-certificates.crt").read_bytes()
    for path in ("kafka/ca.crt", "redis/ca.pem", "redis/tls.crt", "redis/tls.key"):
        (tls / path).parent.mkdir(parents=True, exist_ok=True)
        (tls / path).write_bytes(system_ca)
    config = tmp_path / "bridge.yaml"
    text = text.replace("/var/run/secrets/delay-bridge-tls", str(tls))
    config.write_text(text.replace("/var/run/secrets/delay-bridge", str(secrets)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAY_BRIDGE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    effective = yaml.safe_load(proc.stdout)
    if values:
        # The passwords are read from the mounted files and never shown.
        assert "sasl.password_file" in effective["kafka"]["common"]
        assert effective["redis"]["password_file"]
        assert "kafka-password" not in proc.stdout and "redis-password" not in proc.stdout
        (secrets / "kafka").unlink()
        missing = subprocess.run(
            [sys.executable, "-m", "bridge", "check-config", "-c", str(config)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=False,
        )
        assert missing.returncode == 2 and "sasl.password_file" in missing.stderr
        assert effective["redis"]["sentinel"]["password_file"] == str(secrets / "sentinel")
        # TLS files from the Secrets, at the paths the chart mounts them.
        assert effective["redis"]["tls"] == {
            "ca_file": str(tls / "redis/ca.pem"),
            "cert_file": str(tls / "redis/tls.crt"),
            "key_file": str(tls / "redis/tls.key"),
        }
        common = effective["kafka"]["common"]
        assert common["ssl.ca.location"] == str(tls / "kafka/ca.crt")
        assert common["security.protocol"] == "SASL_SSL"  # the user's, not the chart's default
        assert "ssl.certificate.location" not in common  # no certKey given
        pod = workload(docs)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["secrets"]["secret"] == {"secretName": "delay-bridge-passwords"}
        assert volumes["tls-kafka"]["secret"] == {"secretName": "kafka-tls"}
        assert volumes["tls-redis"]["secret"] == {"secretName": "redis-tls"}
        mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
        for name in ("secrets", "tls-kafka", "tls-redis"):
            assert mounts[name]["readOnly"] is True
        assert mounts["tls-redis"]["mountPath"] == "/var/run/secrets/delay-bridge-tls/redis"


def test_passwords_inline_in_config_go_to_the_secret_too(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "config.redis.password=r-pw",
        "--set",
        "config.redis.sentinel.password=s-pw",
        "--set",
        "config.kafka.common.sasl\\.password=k-pw",
    )
    text = kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    assert not any(pw in text for pw in ("r-pw", "k-pw", "s-pw")), text
    config = yaml.safe_load(text)
    assert config["redis"]["password_file"].endswith("/redis-password")
    assert config["redis"]["sentinel"]["password_file"].endswith("/sentinel-password")
    assert config["kafka"]["common"]["sasl.password_file"].endswith("/kafka-password")
    assert set(kinds(docs)["Secret"]["data"]) == {
        "redis-password",
        "kafka-password",
        "sentinel-password",
    }
    # With a Secret of the user's own there is nowhere to put it: refused, not dropped.
    proc = subprocess.run(
        [
            helm,
            "template",
            "rel",
            *AT_CHART,
            "--set",
            "config.redis.password=x",
            "--set",
            "auth.existingSecret=mine",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "cannot be used with auth.existingSecret" in proc.stderr


def test_inline_passwords_go_to_the_charts_secret_never_the_configmap(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "auth.redisPassword=r-pw",
        "--set",
        "auth.kafkaPassword=k-pw",
        "--set",
        "auth.sentinelPassword=s-pw",
        "--set",
        "tls.kafka.existingSecret=kt",
    )
    config = kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    assert not any(pw in config for pw in ("r-pw", "k-pw", "s-pw"))
    secret = kinds(docs)["Secret"]["data"]
    assert set(secret) == {"redis-password", "kafka-password", "sentinel-password"}
    effective = yaml.safe_load(config)
    assert effective["redis"]["sentinel"]["password_file"].endswith("/sentinel-password")
    # A Kafka TLS Secret alone turns TLS on.
    assert effective["kafka"]["common"]["security.protocol"] == "SSL"


def test_values_are_documented_and_the_readme_lists_them() -> None:
    assert chart_values.problems() == []
    readme = (CHART / "README.md").read_text()
    assert chart_values.table() in readme, "run: python scripts/chart_values.py --write"
    # The prose quotes values.yaml's defaults: it must quote them as they are.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    requests, limits = values["resources"]["requests"], values["resources"]["limits"]
    quoted = [
        f"{values['replicaCount']} replicas",
        f"a {values['workloadKind']}",
        f"requests `cpu: {requests['cpu']}, memory: {requests['memory']}`",
        f"`memory: {limits['memory']}` limit",
        f"`terminationGracePeriodSeconds: {values['terminationGracePeriodSeconds']}`",
    ]
    assert [q for q in quoted if q not in " ".join(readme.split())] == []
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == __import__("bridge").__version__


def test_the_schema_is_the_one_the_values_and_the_config_make() -> None:
    written = json.loads(chart_schema.SCHEMA.read_text())
    assert written == chart_schema.schema(), "run: python scripts/chart_schema.py --write"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "config.kafka.bootstrap_server=k:9092"],
            "config.kafka: Additional property bootstrap_server is not allowed",
        ),
        (
            ["--set", "config.topics.delay=orders.delay"],
            "config.topics.delay: Invalid type. Expected: array, given: string",
        ),
        (["--set", "replicaCount=two"], "replicaCount: Invalid type. Expected: integer"),
        (["--set", "config.redis.url="], "config.redis.url: String length must be greater"),
        (["--set", "config.logging.json=maybe"], "config.logging.json: Invalid type"),
        (["--set", "auth.existingSecrets=x"], "auth: Additional property existingSecrets"),
    ],
)
def test_mistakes_fail_at_render_time_naming_the_key(
    helm: str, args: list[str], message: str
) -> None:
    for command in (["template", "rel"], ["lint", "--strict"]):
        proc = subprocess.run(
            [helm, *command, *AT_CHART, *args], capture_output=True, text=True, check=False
        )
        assert proc.returncode != 0
        assert message in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_image_repository_is_required_and_names_where_to_get_one(helm: str) -> None:
    """No registry publishes the image: without image.repository nothing renders, and the error
    says what to do; with one, both the bridge and its helm test pod pull it."""
    for given in ([], ["--set", "image.repository="]):
        proc = subprocess.run(
            [helm, "template", "rel", str(CHART), *given],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode != 0
        assert "image.repository is required" in proc.stderr and "make dist" in proc.stderr
    docs = render(helm, "--set", "image.tag=1.2.3")
    images = [
        c["image"]
        for d in docs
        if d["kind"] in ("StatefulSet", "Pod")
        for c in (d["spec"]["template"]["spec"] if d["kind"] != "Pod" else d["spec"])["containers"]
    ]
    assert images == [f"{REPOSITORY}:1.2.3"] * 2


def test_defaults_spread_replicas_and_outlast_the_drain(helm: str) -> None:
    docs = render(helm)
    pod = workload(docs)["spec"]["template"]["spec"]
    spread = pod["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    assert all(c["whenUnsatisfiable"] == "ScheduleAnyway" for c in spread)
    selector = workload(docs)["spec"]["selector"]["matchLabels"]
    assert all(c["labelSelector"]["matchLabels"] == selector for c in spread)
    # The bridge's stop: up to 10 s of deliveries in flight, then up to 30 s of DLQ flush.
    assert pod["terminationGracePeriodSeconds"] > 40
    # The helm test pod is never one of the Service's endpoints.
    test_labels = kinds(docs)["Pod"]["metadata"]["labels"]
    assert not set(selector.items()) <= set(test_labels.items())
    assert kinds(docs)["Pod"]["metadata"]["annotations"]["helm.sh/hook"] == "test"
    own = workload(render(helm, "--set", "spreadReplicas=false"))
    assert "topologySpreadConstraints" not in own["spec"]["template"]["spec"]


def test_each_pod_is_a_static_group_member_named_after_itself(helm: str) -> None:
    """Under a StatefulSet the instance id is the pod's own name, unique per pod and kept across
    container restarts and rollouts; extraEnv still applies. Under a Deployment the bridge names
    its member itself (host name and port) and leaves the group as it stops, so a rollout under
    new names does not wait for a session; switching it off leaves the bridge a dynamic member."""
    env = container(
        render(helm, "--set", "extraEnv[0].name=X", "--set-string", "extraEnv[0].value=1")
    )
    by_name = {e["name"]: e for e in env["env"]}
    instance = by_name["DELAY_BRIDGE_KAFKA__GROUP_INSTANCE_ID"]
    assert instance["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "DELAY_BRIDGE_KAFKA__STATIC_MEMBERSHIP" not in by_name
    assert by_name["X"]["value"] == "1"
    deployment = container(render(helm, "--set", "workloadKind=Deployment"))
    assert not deployment.get("env")
    # The pods' own names would contradict the config's dynamic member: refused as the bridge would.
    mixed = subprocess.run(
        [helm, "template", "rel", *AT_CHART, "--set", "config.kafka.static_membership=false"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mixed.returncode != 0
    assert "config.kafka.static_membership: false, but staticMembership" in mixed.stderr
    for kind in ("StatefulSet", "Deployment"):
        off = container(
            render(helm, "--set", "staticMembership=false", "--set", f"workloadKind={kind}")
        )
        assert off["env"] == [{"name": "DELAY_BRIDGE_KAFKA__STATIC_MEMBERSHIP", "value": "false"}]


def test_a_statefulset_by_default_so_a_rolled_pod_rejoins_as_the_same_member(helm: str) -> None:
    """Under a StatefulSet a replaced pod keeps its name, hence its group instance id: it takes its
    partitions back without a rebalance (the `rollout` chaos scenario measures it). A Deployment
    stays available, starting the new pod first, and the HPA follows the kind."""
    docs = render(helm, "--set", "autoscaling.enabled=true")
    sts = workload(docs)
    assert sts["kind"] == "StatefulSet"
    assert sts["spec"]["serviceName"] == kinds(docs)["Service"]["metadata"]["name"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"  # a crash-looping pod blocks no other
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert "volumeClaimTemplates" not in sts["spec"]  # nothing on disk: the state is in Redis
    assert kinds(docs)["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    deployment = render(
        helm, "--set", "workloadKind=Deployment", "--set", "autoscaling.enabled=true"
    )
    dep = workload(deployment)
    assert dep["kind"] == "Deployment"
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert "serviceName" not in dep["spec"]
    target = kinds(deployment)["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert target["kind"] == "Deployment"
    own = workload(render(helm, "--set", "updateStrategy.type=OnDelete"))
    assert own["spec"]["updateStrategy"] == {"type": "OnDelete"}


def _materialised(docs: list[dict[str, Any]], secrets: Path) -> Any:
    """The bridge's config as the pod reads it: the chart's Secret written where it is mounted."""
    secrets.mkdir()
    for key, value in kinds(docs).get("Secret", {}).get("data", {}).items():
        (secrets / key).write_bytes(base64.b64decode(value))
    text = kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    return from_mapping(
        yaml.safe_load(text.replace("/var/run/secrets/delay-bridge", str(secrets))), env={}
    )


# Every librdkafka property librdkafka itself marks sensitive, and a few more by name.
SECRET_PROPERTIES = [
    ("common", "sasl.password"),
    ("producer", "sasl.password"),
    ("consumer", "sasl.password"),
    ("common", "ssl.key.password"),
    ("producer", "ssl.key.password"),
    ("common", "ssl.keystore.password"),
    ("common", "ssl.key.pem"),
    ("common", "sasl.oauthbearer.client.secret"),
    ("consumer", "sasl.oauthbearer.client.secret"),
    ("common", "sasl.oauthbearer.config"),
    ("common", "sasl.jaas.config"),
]


@pytest.mark.parametrize(("role", "name"), SECRET_PROPERTIES)
def test_every_secret_kafka_property_goes_to_the_secret_never_a_configmap(
    helm: str, role: str, name: str, tmp_path: Path
) -> None:
    value = f"s3cr3t-{role}-{name}"
    escaped = name.replace(".", "\\.")
    docs = render(
        helm,
        "--set-string",
        f"config.kafka.{role}.{escaped}={value}",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    )
    configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(configmaps) == 2 and not any(value in yaml.safe_dump(d) for d in configmaps)
    secret = kinds(docs)["Secret"]["data"]
    assert base64.b64encode(value.encode()).decode() in secret.values()
    # The bridge, reading the mounted Secret, hands librdkafka the same property and value.
    config = _materialised(docs, tmp_path / "secrets")
    role_for = "consumer" if role == "common" else role
    assert kafka_settings(config, role_for)[name] == value
    pod = workload(docs)["spec"]["template"]["spec"]
    assert {"name": "secrets", "secret": {"secretName": "rel-delay-bridge"}} in pod["volumes"]
    # With a Secret of the user's own, an inline secret has nowhere to go: refused, naming it.
    proc = subprocess.run(
        [
            helm,
            "template",
            "rel",
            *AT_CHART,
            "--set-string",
            f"config.kafka.{role}.{escaped}={value}",
            "--set",
            "auth.existingSecret=mine",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "cannot be used with auth.existingSecret" in proc.stderr
    assert name in proc.stderr and value not in proc.stderr


def test_a_password_inside_the_redis_url_goes_to_the_secret(helm: str, tmp_path: Path) -> None:
    docs = render(helm, "--set", "config.redis.url=rediss://app:url-pw@redis:6380/2")
    configmap = kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    assert "url-pw" not in configmap
    config = _materialised(docs, tmp_path / "secrets")
    assert config.redis.url == "rediss://app@redis:6380/2"  # the user stays, for ACLs
    assert config.redis_password() == "url-pw"
    anonymous = render(helm, "--set", "config.redis.url=redis://:pw2@redis:6379/0")
    text = kinds(anonymous)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    assert "pw2" not in text and "redis://redis:6379/0" in text
    proc = subprocess.run(
        [
            helm,
            "template",
            "rel",
            *AT_CHART,
            "--set",
            "config.redis.url=redis://:p%40ss@redis:6379/0",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        proc.returncode != 0 and "config.redis.url: its password is percent-encoded" in proc.stderr
    )


def _chart_config(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """values.yaml's config with ``pairs`` (dotted path under config, value) set in it."""
    config: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    for path, value in pairs:
        *parents, leaf = path.split("/")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


# (what is set under config, as path/with/slashes → value; the key check-config names; the key
# the chart names). The four of the issue first, then one per rule of check-config.
CHECK_CONFIG_MISTAKES: list[tuple[list[tuple[str, Any]], str, str]] = [
    ([("egress/lease", "30x")], "egress.lease", "config.egress.lease"),
    ([("logging/level", "verbose")], "logging.level", "config.logging.level"),
    ([("limits/max_delay", 0)], "limits.max_delay", "config.limits.max_delay"),
    ([("topics/dead_letter", "delay")], "topics.dead_letter", "config.topics.dead_letter"),
    ([("topics/journal", "delay.dlq")], "topics.journal", "config.topics.journal"),
    ([("topics/journal", "no spaces")], "topics", "config.topics.journal"),
    (
        [("topics/delay", ["orders"]), ("topics/journal", "<delay>")],
        "topics.journal",
        "config.topics.journal",
    ),
    ([("limits/max_delay", "0s")], "limits.max_delay", "config.limits.max_delay"),
    ([("egress/lease", "0m0s")], "egress.lease", "config.egress.lease"),
    ([("egress/lease", "30s1h")], "egress.lease", "config.egress.lease"),
    ([("egress/lease", "900ms")], "egress.ahead", "config.egress.ahead"),
    ([("egress/ahead", "2s")], "egress.ahead", "config.egress.ahead"),
    ([("ingress/linger", 1500)], "ingress.linger", "config.ingress.linger"),
    ([("ingress/hold", "1s1ms")], "ingress.hold", "config.ingress.hold"),
    ([("ingress/batch_size", 0)], "ingress.batch_size", "config.ingress.batch_size"),
    ([("egress/batch_size", 20_000)], "egress.batch_size", "config.egress.batch_size"),
    ([("egress/max_attempts", 0)], "egress.max_attempts", "config.egress.max_attempts"),
    ([("limits/max_record_bytes", 0)], "limits.max_record_bytes", "config.limits.max_record_bytes"),
    ([("redis/socket_timeout", "0s")], "redis.socket_timeout", "config.redis.socket_timeout"),
    (
        [("topics/dialect", {"delay": "kafka-streams"})],
        "topics.dialect.delay",
        "config.topics.dialect",
    ),
    (
        [("topics/dialect", {"other": "etf1"})],
        "topics.dialect.other",
        "config.topics.dialect.other",
    ),
    (
        [("topics/default_target", {"other": "x"})],
        "topics.default_target.other",
        "config.topics.default_target.other",
    ),
    ([("topics/delay", [])], "topics.delay", "config.topics.delay"),
    ([("topics/delay", ["bad topic"])], "topics", "config.topics.delay"),
    ([("topics/dead_letter", "..")], "topics", "config.topics.dead_letter"),
    ([("redis/key_prefix", "a{b}")], "redis.key_prefix", "config.redis.key_prefix"),
    ([("redis/url", "http://redis:6379")], "redis.url", "config.redis.url"),
    (
        [("redis/sentinel/nodes", ["sentinel"])],
        "redis.sentinel.nodes",
        "config.redis.sentinel.nodes",
    ),
    (
        [("redis/cluster", True), ("redis/sentinel/nodes", ["s:26379"])],
        "redis.cluster",
        "config.redis.cluster",
    ),
    (
        [("kafka/group_instance_id", "pod 0")],
        "kafka.group_instance_id",
        "config.kafka.group_instance_id",
    ),
    (
        [("kafka/static_membership", False), ("kafka/group_instance_id", "pod-0")],
        "kafka.static_membership",
        "config.kafka.static_membership",
    ),
    (
        [("kafka/producer", {"delivery.timeout.ms": "30000"})],
        "kafka.producer.delivery.timeout.ms",
        "config.kafka.producer.delivery.timeout.ms",
    ),
]


@pytest.mark.parametrize(
    ("pairs", "bridge_key", "chart_key"),
    CHECK_CONFIG_MISTAKES,
    ids=[c[1] + "=" + str(c[0][-1][1]) for c in CHECK_CONFIG_MISTAKES],
)
def test_what_check_config_rejects_the_chart_rejects_naming_the_key(
    helm: str, pairs: list[tuple[str, Any]], bridge_key: str, chart_key: str, tmp_path: Path
) -> None:
    """The schema (and, across keys, the chart's validate template) is the bridge's validation:
    a mistake fails `helm template` and `helm lint --strict`, not the pod's start."""
    with pytest.raises(ConfigError) as refused:
        from_mapping(_chart_config(*pairs), env={})
    assert str(refused.value).startswith(bridge_key), refused.value
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": _chart_config(*pairs)}))
    for command in (["template", "rel"], ["lint", "--strict"]):
        proc = subprocess.run(
            [helm, *command, *AT_CHART, "-f", str(values)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode != 0, f"helm {command[0]} took {pairs}"
        assert chart_key in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "pairs",
    [
        [("egress/lease", "1h30m"), ("logging/level", "debug"), ("limits/max_delay", "30d")],
        [("egress/lease", "10s"), ("egress/ahead", "1s"), ("ingress/linger", "1000ms")],
        [("egress/lease", 5000), ("kafka/producer", {"delivery.timeout.ms": "4999"})],
        [
            ("topics/delay", ["a", "b"]),
            ("topics/dialect", {"b": "etf1"}),
            ("topics/dead_letter", "c"),
        ],
        [("topics/journal", "")],
        [("http", {"port": 9464})],
    ],
)
def test_what_check_config_takes_the_chart_takes(
    helm: str, pairs: list[tuple[str, Any]], tmp_path: Path
) -> None:
    from_mapping(_chart_config(*pairs), env={})
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": _chart_config(*pairs)}))
    for command in (["template", "rel"], ["lint", "--strict"]):
        proc = subprocess.run(
            [helm, *command, *AT_CHART, "-f", str(values)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_http_port_is_one_value(helm: str) -> None:
    config = kinds(render(helm, "--set", "service.port=8080"))["ConfigMap/rel-delay-bridge"]
    assert yaml.safe_load(config["data"]["bridge.yaml"])["http"]["port"] == 8080
    for command in (["template", "rel"], ["lint", "--strict"]):
        proc = subprocess.run(
            [helm, *command, *AT_CHART, "--set", "config.http.port=8081"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode != 0
        assert (
            "config.http.port: 8081 differs from service.port (9464)" in proc.stdout + proc.stderr
        )


def test_the_console_token_goes_to_the_secret_and_the_console_stays_behind_the_service(
    helm: str,
) -> None:
    docs = render(helm, "--set", "auth.consoleToken=tok-123")
    config_text = kinds(docs)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"]
    assert "tok-123" not in config_text
    console = yaml.safe_load(config_text)["http"]["console"]
    assert console == {"enabled": True, "token_file": "/var/run/secrets/delay-bridge/console-token"}
    assert set(kinds(docs)["Secret"]["data"]) == {"console-token"}
    assert not [d for d in docs if d["kind"] == "Ingress"]  # no Ingress unless asked
    mine = render(
        helm,
        "--set",
        "auth.existingSecret=mine",
        "--set",
        "auth.consoleTokenKey=ui",
        "--set",
        "console.enabled=false",
    )
    config = yaml.safe_load(kinds(mine)["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"])
    assert config["http"]["console"] == {
        "enabled": False,
        "token_file": "/var/run/secrets/delay-bridge/ui",
    }
    # Without a token the console answers reads and refuses writes: no file is named.
    plain = yaml.safe_load(kinds(render(helm))["ConfigMap/rel-delay-bridge"]["data"]["bridge.yaml"])
    assert plain["http"]["console"] == {"enabled": True}


def test_an_ingress_when_asked_serves_the_console_alone(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "console.ingress.enabled=true",
        "--set",
        "console.ingress.host=db.example.com",
    )
    [ingress] = [d for d in docs if d["kind"] == "Ingress"]
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "db.example.com"
    paths = {p["path"]: p["backend"]["service"] for p in rule["http"]["paths"]}
    assert paths == {
        p: {"name": "rel-delay-bridge", "port": {"name": "http"}} for p in ("/ui", "/api")
    }
    off = render(helm, "--set", "console.ingress.enabled=true", "--set", "console.enabled=false")
    assert not [d for d in off if d["kind"] == "Ingress"]  # no console, nothing to route to
