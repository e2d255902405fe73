"""Strict config loading: defaults, overrides, secrets, and one-line errors naming the key."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bridge.config import (
    Config,
    consumer_settings,
    dump,
    from_mapping,
    load,
    member_instance,
    producer_settings,
    transactional_id,
    transactional_settings,
)
from bridge.config.schema import EgressConfig
from bridge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_a_transactional_producer_is_the_producer_with_its_id_and_the_lease_as_its_timeout() -> (
    None
):
    config = from_mapping({"egress": {"exactly_once": True, "lease": "20s"}}, env={})
    settings = transactional_settings(config, "delay-bridge:delay:0")
    assert settings["transactional.id"] == "delay-bridge:delay:0"
    assert settings["transaction.timeout.ms"] == "20000"
    assert settings["enable.idempotence"] == "true"
    assert int(settings["delivery.timeout.ms"]) <= 20000  # librdkafka requires it


def test_transactional_ids_of_two_deployments_never_meet() -> None:
    """``<group>.<topic>.<partition>`` gave group ``a.b`` with topic ``c`` and group ``a`` with
    topic ``b.c`` one id: the two deployments' producers fenced each other. A topic name holds
    no ``:``, so the id splits back into the one (group, topic, partition) it was made of."""
    assert transactional_id("a.b", "c", 1) != transactional_id("a", "b.c", 1)
    made = transactional_id("deploy:eu.1", "orders.delay", 12)
    group, topic, partition = made.rsplit(":", 2)
    assert (group, topic, partition) == ("deploy:eu.1", "orders.delay", "12")


def test_defaults_match_the_documented_file() -> None:
    documented = load(str(ROOT / "config" / "bridge.yaml"), env={})
    assert documented == Config()
    assert documented.egress.lease == 30_000
    assert documented.limits.max_delay == 365 * 86_400_000


def test_the_default_journal_follows_the_first_delay_topic() -> None:
    """Two deployments that name their delay topics apart do not share a journal by default;
    ``<delay>`` in a journal's name given stands for the first delay topic too."""
    assert Config().topics.journal == "delay.journal"
    orders = from_mapping({"topics": {"delay": ["orders.delay", "orders.retry"]}}, env={})
    assert orders.topics.journal == "orders.delay.journal"
    by_env = from_mapping({}, env={"DELAY_BRIDGE_TOPICS__DELAY": "billing"})
    assert by_env.topics.journal == "billing.journal"
    named = from_mapping({"topics": {"delay": ["a"], "journal": "fates-<delay>"}}, env={})
    assert named.topics.journal == "fates-a"
    assert from_mapping({"topics": {"journal": "shared.journal"}}, env={}).topics.journal == (
        "shared.journal"
    )
    assert from_mapping({"topics": {"journal": ""}}, env={}).topics.journal == ""
    with pytest.raises(ConfigError, match=r"^topics.journal: must be neither"):
        from_mapping({"topics": {"delay": ["x"], "journal": "<delay>"}}, env={})
    shown = yaml.safe_load(dump(orders))
    assert shown["topics"]["journal"] == "orders.delay.journal"  # check-config shows the name


def test_documented_file_lists_every_key() -> None:
    raw = yaml.safe_load((ROOT / "config" / "bridge.yaml").read_text())
    shown = yaml.safe_load(dump(Config()))
    assert {s: set(v) for s, v in raw.items()} == {s: set(v) for s, v in shown.items()}


def test_yaml_values_and_durations() -> None:
    config = from_mapping(
        {
            "egress": {"lease": "1m30s", "batch_size": 100},
            "topics": {"delay": ["a", "b"], "dialect": {"a": "kaspr", "b": "etf1"}},
        },
        env={},
    )
    quotas = {"orders[.].*": 1000, "mail": 0}
    limits = from_mapping({"limits": {"max_waiting_per_target": quotas}}, env={}).limits
    assert limits.max_waiting_per_target == quotas
    assert from_mapping({"egress": {"max_rate_per_target": {"orders": 500}}}, env={}).egress == (
        EgressConfig(max_rate_per_target={"orders": 500})
    )
    assert config.egress.lease == 90_000
    assert config.egress.batch_size == 100
    assert config.topics.delay == ("a", "b")
    assert config.topics.dialect == {"a": "kaspr", "b": "etf1"}


def test_environment_overrides_scalars() -> None:
    env = {
        "DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS": "k:1",
        "DELAY_BRIDGE_EGRESS__LEASE": "45s",
        "DELAY_BRIDGE_EGRESS__BATCH_SIZE": "7",
        "DELAY_BRIDGE_LOGGING__JSON": "true",
        "DELAY_BRIDGE_TOPICS__DELAY": "d1, d2",
        "DELAY_BRIDGE_CONFIG": "ignored-here",
        "UNRELATED": "x",
    }
    config = from_mapping({"kafka": {"bootstrap_servers": "file:1"}}, env=env)
    assert config.kafka.bootstrap_servers == "k:1"
    assert (config.egress.lease, config.egress.batch_size) == (45_000, 7)
    assert config.logging.json is True
    assert config.topics.delay == ("d1", "d2")


@pytest.mark.parametrize(
    ("raw", "env", "message"),
    [
        ({"kafka": {"bootstrap": "x"}}, {}, "unknown key kafka.bootstrap"),
        ({"nope": {}}, {}, "unknown key nope"),
        ({"egress": {"batch_size": "many"}}, {}, "egress.batch_size: expected an integer"),
        ({"egress": {"batch_size": True}}, {}, "egress.batch_size: expected an integer"),
        ({"egress": {"batch_size": 0}}, {}, "egress.batch_size: must be greater than 0"),
        ({"egress": {"lease": "soon"}}, {}, "egress.lease: not a duration"),
        (
            {"egress": {"exactly_once": True}, "topics": {"journal": ""}},
            {},
            "egress.exactly_once: needs topics.journal",
        ),
        ({"egress": {"transaction": "2s"}}, {}, "egress.transaction: must be between 0 and 1s"),
        (
            {"kafka": {"producer": {"transactional.id": "mine"}}},
            {},
            "kafka.producer.transactional.id: set by the bridge",
        ),
        (  # named where it was set
            {"kafka": {"common": {"transactional.id": "mine"}}},
            {},
            "kafka.common.transactional.id: set by the bridge",
        ),
        (  # the bridge's other uses of its group (transactional ids, lag) go by kafka.group_id
            {"kafka": {"consumer": {"group.id": "other"}}},
            {},
            "kafka.consumer.group.id: set by kafka.group_id",
        ),
        (
            {"kafka": {"common": {"group.id_file": "/run/secrets/group"}}},
            {},
            "kafka.common.group.id_file: set by kafka.group_id",
        ),
        (
            {"kafka": {"consumer": {"isolation.level": "read_uncommitted"}}},
            {},
            "kafka.consumer.isolation.level: must be read_committed",
        ),
        ({"logging": {"json": "yes"}}, {}, "logging.json: expected true or false"),
        ({"logging": {"level": "LOUD"}}, {}, "logging.level: unknown level"),
        ({"topics": {"delay": "delay"}}, {}, "topics.delay: expected a list"),
        ({"topics": {"delay": []}}, {}, "topics.delay: at least one"),
        ({"topics": {"allowed_targets": ["("]}}, {}, "topics.allowed_targets: bad pattern"),
        ({"topics": {"dead_letter": "bad name"}}, {}, "not a legal topic name"),
        ({"topics": {"dead_letter": "delay"}}, {}, "topics.dead_letter: must not be a delay topic"),
        ({"topics": {"default_target": {"other": "t"}}}, {}, "topics.default_target.other"),
        ({"topics": {"default_target": {"delay": "__x"}}}, {}, "internal topic"),
        ({"topics": {"dialect": {"other": "etf1"}}}, {}, "topics.dialect.other: not one of"),
        ({"topics": {"dialect": {"delay": "etf2"}}}, {}, "topics.dialect.delay: unknown dialect"),
        (
            {"egress": {"max_rate_per_target": {"t": "fast"}}},
            {},
            "egress.max_rate_per_target.t: expected an integer",
        ),
        (
            {"egress": {"max_rate_per_target": {"t": -1}}},
            {},
            "egress.max_rate_per_target.t: must be 0 (no limit) or more",
        ),
        (
            {"egress": {"max_rate_per_target": {"a b": 1}}},
            {},
            "egress.max_rate_per_target.a b: 'a b' is not a legal topic name",
        ),
        (
            {"limits": {"max_waiting_per_target": {"orders(": 10}}},
            {},
            "limits.max_waiting_per_target.orders(: bad pattern",
        ),
        (
            {"limits": {"max_waiting_per_target": {"orders": -1}}},
            {},
            "limits.max_waiting_per_target.orders: must be 0 or more records, got -1",
        ),
        (
            {"limits": {"max_waiting_per_target": {"orders": "many"}}},
            {},
            "limits.max_waiting_per_target.orders: expected an integer",
        ),
        ({"kafka": {"common": {"a": {"b": 1}}}}, {}, "kafka.common.a: expected a scalar"),
        ({"kafka": "x"}, {}, "kafka: expected a mapping"),
        ({"http": {"port": 70000}}, {}, "http.port"),
        ({"redis": {"url": "http://x"}}, {}, "redis.url"),
        ({"redis": {"key_prefix": "a{b}"}}, {}, "redis.key_prefix"),
        (
            {},
            {"DELAY_BRIDGE_KAFKA__GROUP_INSTANCE_ID": "pod 0"},
            "kafka.group_instance_id: 'pod 0' is not a legal instance id",
        ),
        (
            {"kafka": {"consumer": {"enable.auto.offset.store": True}}},
            {},
            "kafka.consumer.enable.auto.offset.store: must be false",
        ),
        (  # a partition never read would be read from its end: what came before, never delivered
            {"kafka": {"consumer": {"auto.offset.reset": "latest"}}},
            {},
            "kafka.consumer.auto.offset.reset: must be earliest",
        ),
        (  # nothing committed until a partition was revoked
            {"kafka": {"consumer": {"enable.auto.commit": False}}},
            {},
            "kafka.consumer.enable.auto.commit: must be true",
        ),
        (
            {"kafka": {"common": {"enable.auto.commit": "false"}}},
            {},
            "kafka.common.enable.auto.commit: must be true",
        ),
        (
            {"kafka": {"producer": {"enable.idempotence": "false"}}},
            {},
            "kafka.producer.enable.idempotence: must be true",
        ),
        (
            {"kafka": {"producer": {"delivery.timeout.ms": 60000}}},
            {},
            "kafka.producer.delivery.timeout.ms: 60000 must be below egress.lease",
        ),
        (  # librdkafka's other name for it, set last, replaced the bridge's value unchecked
            {"kafka": {"producer": {"message.timeout.ms": 60000}}},
            {},
            "kafka.producer.message.timeout.ms: 60000 must be below egress.lease",
        ),
        (
            {"kafka": {"common": {"message.timeout.ms": 60000}}},
            {},
            "kafka.common.message.timeout.ms: 60000 must be below egress.lease",
        ),
        ({"egress": {"ahead": "2s"}}, {}, "egress.ahead: must be between 0 and 1s, got 2s"),
        (
            {"egress": {"lease": "5s", "ahead": "1s"}},
            {},
            "egress.ahead: must be at most a tenth of egress.lease (5s), got 1s",
        ),
        ({"ingress": {"hold": "-1ms"}}, {}, "ingress.hold"),
        ({"egress": {"send_tick": "5s"}}, {}, "egress.send_tick: must be between 0 and 1s, got 5s"),
        ({}, {"DELAY_BRIDGE_EGRESS__NOPE": "1"}, "DELAY_BRIDGE_EGRESS__NOPE names no config key"),
        ({}, {"DELAY_BRIDGE_NOPE__X": "1"}, "DELAY_BRIDGE_NOPE__X names no config key"),
        ({}, {"DELAY_BRIDGE_EGRESS__BATCH_SIZE": "ten"}, "egress.batch_size: expected an integer"),
        ({}, {"DELAY_BRIDGE_KAFKA__COMMON": "x"}, "kafka.common: a mapping cannot be set"),
        ({"redis": {"password_file": "/nonexistent/pw"}}, {}, None),
        (
            {"kafka": {"common": {"sasl.password_file": "/nonexistent/pw"}}},
            {},
            "kafka.common.sasl.password_file: cannot read /nonexistent/pw",
        ),
    ],
)
def test_errors_name_the_key(
    raw: dict[str, object], env: dict[str, str], message: str | None
) -> None:
    if message is None:  # secrets files are read when used, and name their key then
        with pytest.raises(ConfigError, match=r"redis\.password_file: cannot read"):
            from_mapping(raw, env=env).redis_password()
        return
    with pytest.raises(ConfigError) as info:
        from_mapping(raw, env=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_secret_files_and_redaction(tmp_path: Path) -> None:
    (tmp_path / "kafka").write_text("s3cret\n")
    (tmp_path / "redis").write_text("r3dis\n")
    config = from_mapping(
        {
            "kafka": {
                "common": {"sasl.username": "u", "sasl.password_file": str(tmp_path / "kafka")}
            },
            "redis": {
                "url": "redis://user:hunter2@r:6379/0",
                "password_file": str(tmp_path / "redis"),
            },
        },
        env={},
    )
    assert producer_settings(config)["sasl.password"] == "s3cret"
    assert "sasl.password_file" not in consumer_settings(config)
    assert config.redis_password() == "r3dis"
    shown = dump(config)
    assert "hunter2" not in shown and "s3cret" not in shown
    assert "redis://user:***@r:6379/0" in shown
    assert "sasl.username: u" in shown


def test_producer_and_consumer_defaults() -> None:
    producer = producer_settings(Config())
    assert producer["enable.idempotence"] == "true"
    assert producer["partitioner"] == "murmur2_random"
    assert int(producer["delivery.timeout.ms"]) < Config().egress.lease
    consumer = consumer_settings(Config())
    assert consumer["enable.auto.offset.store"] == "false"
    assert consumer["partition.assignment.strategy"] == "cooperative-sticky"
    assert consumer["auto.offset.reset"] == "earliest"
    # Longer than a broker's fencing (9 s) plus the socket timeout, shorter than librdkafka's 45 s.
    assert consumer["session.timeout.ms"] == "20000"
    # A broker that stops answering is given up on after 10 s (librdkafka: 60 s), by both.
    assert consumer["socket.timeout.ms"] == producer["socket.timeout.ms"] == "10000"
    assert (consumer["fetch.wait.max.ms"], consumer["fetch.min.bytes"]) == ("10", "1048576")
    # A bounded prefetch, fetched again soon: RSS after a backlog, not a slower ingest.
    assert consumer["queued.max.messages.kbytes"] == "16384"
    assert consumer["fetch.queue.backoff.ms"] == "10"
    assert "group.instance.id" not in consumer_settings(Config(), instance="")
    mine = from_mapping({"kafka": {"consumer": {"fetch.wait.max.ms": "500"}}}, env={})
    assert consumer_settings(mine)["fetch.wait.max.ms"] == "500"  # the user's value wins


def test_a_setting_under_librdkafkas_other_name_is_read_under_the_bridges() -> None:
    """Of two names of one librdkafka property, the one set last wins: a user's
    ``queue.buffering.max.ms`` after the bridge's ``linger.ms`` was the one that counted, unseen
    by anything that read linger.ms. Each client gets one name, with the user's value."""
    config = from_mapping(
        {
            "kafka": {
                "common": {"metadata.broker.list": "k:9092"},
                "producer": {"queue.buffering.max.ms": "5", "message.timeout.ms": "9000"},
            }
        },
        env={},
    )
    producer = producer_settings(config)
    assert (producer["linger.ms"], producer["delivery.timeout.ms"]) == ("5", "9000")
    assert producer["bootstrap.servers"] == "k:9092"
    for alias in ("queue.buffering.max.ms", "message.timeout.ms", "metadata.broker.list"):
        assert alias not in producer and alias not in consumer_settings(config)


@pytest.mark.parametrize(
    ("horizon", "fetch_ahead", "bucket_ms", "read_ahead_ms"),
    [
        ("1h", "2m", 1_740_000, 240_000),  # fetch_ahead twice: reading may take 2 min
        ("4s", "2s", 1_000, 2_500),  # half a bucket: a new reference waits 0.5 s at least
        ("30d", "2m", 3_600_000, 240_000),  # buckets of an hour at most
    ],
)
def test_a_bucket_is_read_back_fetch_ahead_and_its_reading_time_before_it_starts(
    horizon: str, fetch_ahead: str, bucket_ms: int, read_ahead_ms: int
) -> None:
    store = from_mapping(
        {"store": {"payload_horizon": horizon, "fetch_ahead": fetch_ahead}}, env={}
    ).store
    assert (store.bucket_ms, store.read_ahead_ms) == (bucket_ms, read_ahead_ms)
    # A reference (due past the horizon) is never due for read-back when it is made.
    assert store.payload_horizon - store.bucket_ms > store.read_ahead_ms


def test_only_the_group_member_carries_the_instance_id() -> None:
    """Another consumer of the bridge (status, list, dlq replay) with the replica's
    group.instance.id would fence the running replica out of its group."""
    config = from_mapping({}, env={"DELAY_BRIDGE_KAFKA__GROUP_INSTANCE_ID": "delay-bridge-7f9c"})
    instance = member_instance(config, 9464)
    assert consumer_settings(config, instance=instance)["group.instance.id"] == "delay-bridge-7f9c"
    assert "group.instance.id" not in consumer_settings(config)
    # Named through the consumer's map, it would have been every consumer's: refused.
    with pytest.raises(ConfigError, match=r"^kafka.consumer.group.instance.id: set by kafka.gr"):
        from_mapping({"kafka": {"consumer": {"group.instance.id": "x"}}}, env={})


def test_a_member_is_named_after_its_host_and_http_port_unless_named_or_dynamic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Static by default, so that a member cut off from Kafka past its session rejoins as itself
    at once: under a name its restart on the same host takes again and no other process there
    has (two cannot listen on one port), made legal (Kafka takes a-z A-Z 0-9 . _ -, 249 at most)."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node 7.example:x")
    assert member_instance(Config(), 9464) == "node_7.example_x-9464"
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 300)
    assert member_instance(Config(), 65535) == "h" * 243 + "-65535"
    named = from_mapping({"kafka": {"group_instance_id": "pod-0"}}, env={})
    assert member_instance(named, 9464) == "pod-0"
    dynamic = from_mapping({"kafka": {"static_membership": False}}, env={})
    assert member_instance(dynamic, 9464) == ""
    with pytest.raises(ConfigError, match=r"^kafka.static_membership: false, but"):
        from_mapping({"kafka": {"static_membership": False, "group_instance_id": "pod-0"}}, env={})


def cli(
    *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["check-config", "-c", "/does/not/exist.yaml"], {}, "does not exist"),
        (["check-config"], {"DELAY_BRIDGE_EGRESS__LEASE": "forever"}, "egress.lease"),
        (["run"], {"DELAY_BRIDGE_HTTP__PORT": "x"}, "http.port"),
        (["produce", "--target", "t", "--after", "soon", "v"], {}, "--after"),
        (["produce", "--target", "t", "--at", "noon", "v"], {}, "--at"),
        (["produce", "--target", "__t", "--after", "1s", "v"], {}, "internal topic"),
        (["produce", "--target", "t", "--after", "1s", "--header", "novalue", "v"], {}, "--header"),
        (
            ["produce", "--target", "t", "--after", "1s", "--priority", "urgent", "v"],
            {},
            "--priority: delay-priority must be one of high, normal, low",
        ),
        (
            ["produce", "--target", "t", "--after", "1s", "--header", "delay-priority=high", "v"],
            {},
            "set it with its own option",
        ),
        (["produce", "--target", "t", "--after", "1s", "--at", "1", "v"], {}, "not allowed with"),
        (["produce", "--after", "1s", "v"], {}, "--target"),
        (["produce", "--target", "t", "--after", "400d", "v"], {}, "delay-too-long"),
        (["produce", "--target", "t", "--at", "1790000000", "v"], {}, "looks like epoch seconds"),
        (
            ["produce", "--target", "t", "--after", "1s", "--header", "delay-after=2s", "v"],
            {},
            "--header delay-after",
        ),
        (["produce", "--target", "t", "--after", "1s", "--id", "", "v"], {}, "bad-header"),
        (
            ["produce", "--target", "other", "--after", "1s", "v"],
            {"DELAY_BRIDGE_TOPICS__ALLOWED_TARGETS": "orders\\..*"},
            "target-not-allowed",
        ),
        (["produce", "--target", "t", "--after", "1s", "--timeout", "x", "v"], {}, "--timeout"),
        (
            ["check-config"],
            {"DELAY_BRIDGE_REDIS__PASSWORD_FILE": "/nonexistent/pw"},
            "redis.password_file",
        ),
        (["run"], {"DELAY_BRIDGE_REDIS__PASSWORD_FILE": "/nonexistent/pw"}, "redis.password_file"),
        (["trace", "--id", "x", "--since", "yesterday"], {}, "--since: not a time: 'yesterday'"),
        (["trace", "--origin", "delay-0-7"], {}, "expected TOPIC:PARTITION:OFFSET"),
        (["trace", "--id", "x", "--origin", "d:0:1"], {}, "not allowed with"),
        (["trace"], {}, "required"),
        (["frobnicate"], {}, "invalid choice"),
        ([], {}, "required"),
    ],
)
def test_cli_user_errors_are_one_line(args: list[str], env: dict[str, str], needle: str) -> None:
    proc = cli(*args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_cli_bad_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed\n")
    proc = cli("check-config", "-c", str(bad))
    assert (
        proc.returncode == 2 and "not valid YAML" in proc.stderr and "Traceback" not in proc.stderr
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--target-key", "k"], "--target-key: Kaspr's headers have no target key"),
        (["--header", "x-scheduler-action=CANCEL"], "--header x-scheduler-action: set it with"),
        (["--target", "delay"], "--target: 'delay' is a delay topic"),
    ],
)
def test_cli_produce_on_a_kaspr_topic_checks_kasprs_headers(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    config = tmp_path / "bridge.yaml"
    config.write_text("topics:\n  dialect: {delay: kaspr}\n")
    proc = cli("produce", "-c", str(config), "--target", "t", "--after", "1s", *args, "v")
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_cli_check_config_and_version() -> None:
    proc = cli("check-config", env={"DELAY_BRIDGE_REDIS__URL": "redis://:pw@h:1/0"})
    assert proc.returncode == 0
    assert yaml.safe_load(proc.stdout)["redis"]["url"] == "redis://:***@h:1/0"
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("delay-bridge ")


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_properties_librdkafka_rejects_stop_check_config_and_run(
    command: str, tmp_path: Path
) -> None:
    config = tmp_path / "bridge.yaml"
    config.write_text("kafka:\n  common: {not.a.property: 1}\n")
    proc = cli(command, "-c", str(config))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "kafka.common.not.a.property" in proc.stderr
    config.write_text("kafka:\n  producer: {linger.ms: soon}\n")
    proc = cli(command, "-c", str(config))
    assert proc.returncode == 2 and "kafka.producer.linger.ms" in proc.stderr, proc.stderr


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli(
            "run",
            env={"DELAY_BRIDGE_HTTP__HOST": "127.0.0.1", "DELAY_BRIDGE_HTTP__PORT": str(port)},
        )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"http.port: cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_produce_to_an_unreachable_kafka_is_one_line_within_its_timeout() -> None:
    started = time.monotonic()
    proc = cli(
        "produce",
        "--target",
        "t",
        "--after",
        "1s",
        "--timeout",
        "2s",
        "v",
        env={"DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"},
    )
    assert time.monotonic() - started < 15
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("delay-bridge: cannot reach Kafka at 127.0.0.1:1 within 2s")
    assert proc.stderr.count("\n") == 1 and "%3|" not in proc.stderr, proc.stderr


def test_sentinel_and_tls_keys(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("pem\n")
    env = {
        "DELAY_BRIDGE_REDIS__SENTINEL__NODES": "s1:26379, s2:26379",
        "DELAY_BRIDGE_REDIS__SENTINEL__PASSWORD": "sentinel-secret",
        "DELAY_BRIDGE_REDIS__TLS__CA_FILE": str(ca),
    }
    config = from_mapping({"redis": {"sentinel": {"master": "orders"}}}, env=env)
    assert config.redis.sentinel.nodes == ("s1:26379", "s2:26379")
    assert config.redis.sentinel.master == "orders" and config.redis.tls.ca_file == str(ca)
    assert config.sentinel_password() == "sentinel-secret"
    shown = yaml.safe_load(dump(config))["redis"]
    assert shown["sentinel"]["password"] == "***" and shown["sentinel"]["nodes"] == [
        "s1:26379",
        "s2:26379",
    ]


@pytest.mark.parametrize(
    ("raw", "env", "message"),
    [
        (
            {"redis": {"sentinel": {"nodes": ["nohost"]}}},
            {},
            "redis.sentinel.nodes: expected host:port",
        ),
        ({"redis": {"sentinel": {"nodes": ["s:1"], "master": ""}}}, {}, "redis.sentinel.master"),
        (
            {"redis": {"sentinel": {"password_file": "/nonexistent"}}},
            {},
            "redis.sentinel.password_file",
        ),
        ({"redis": {"tls": {"ca_file": "/nonexistent/ca"}}}, {}, "redis.tls.ca_file"),
        ({"redis": {"sentinel": {"bogus": 1}}}, {}, "unknown key redis.sentinel.bogus"),
        (
            {},
            {"DELAY_BRIDGE_REDIS__SENTINEL__BOGUS": "1"},
            "names no config key (redis.sentinel.bogus)",
        ),
        ({}, {"DELAY_BRIDGE_REDIS__SENTINEL": "x"}, "names no config key (redis.sentinel)"),
        ({}, {"DELAY_BRIDGE_REDIS__URL__X": "1"}, "names no config key"),
    ],
)
def test_sentinel_and_tls_errors_name_the_key(
    raw: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(raw, env=env)
    assert message in str(info.value)
