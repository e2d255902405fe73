"""Loading the config: YAML, then environment overrides, read strictly and validated.

Unknown keys, wrong types and bad values stop start-up with :class:`ConfigError`, whose one-line
message names the key path. ``DELAY_BRIDGE_<PATH>`` environment variables (``__`` between
levels) override scalar keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import types
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

import yaml

from bridge.config.librdkafka import consumer_settings, producer_settings, set_in, written_as
from bridge.config.schema import TRACING_MODES, Config
from bridge.errors import ConfigError
from bridge.message import (
    DIALECTS,
    format_duration_ms,
    is_legal_topic,
    parse_count,
    parse_duration_ms,
)

DEFAULT_PATH = "config/bridge.yaml"
ENV_PATH = "DELAY_BRIDGE_CONFIG"
ENV_PREFIX = "DELAY_BRIDGE_"


# librdkafka properties the bridge sets from its own keys, refused where they would pass through
# (kafka.common, or the client's own map): a consumer group of another name than kafka.group_id
# was joined while the transactional ids, the replicas' registry and the start-up line went by
# kafka.group_id.
_SET_BY_THE_BRIDGE = (
    ("group.id", ("common", "consumer"), "kafka.group_id"),
    ("group.instance.id", ("common", "consumer"), "kafka.group_instance_id"),
    (
        "transactional.id",
        ("common", "producer"),
        "the bridge (one per delay-topic partition with egress.exactly_once)",
    ),
)


def load(path: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config file (``path``, else ``$DELAY_BRIDGE_CONFIG``, else the default path).

    A missing file is an error only when it was named explicitly; the default path may be
    absent, and then every key has its default.
    """
    env = os.environ if env is None else env
    explicit = path or env.get(ENV_PATH)
    file = Path(explicit or DEFAULT_PATH)
    raw: Any = {}
    if file.exists():
        try:
            raw = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{file}:{where} is not valid YAML") from None
        except OSError as exc:
            raise ConfigError(f"cannot read {file}: {exc.strerror}") from None
    elif explicit:
        raise ConfigError(f"config file {file} does not exist")
    return from_mapping(raw, env)


def from_mapping(raw: Any, env: Mapping[str, str] | None = None) -> Config:
    """Build a :class:`Config` from parsed YAML plus environment overrides, strictly."""
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping at the top level")
    merged = _apply_env(raw, dict(os.environ if env is None else env))
    config: Config = _build(Config, merged, "")
    _validate(config)
    return config


def _apply_env(raw: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    merged: dict[str, Any] = _copy(raw)
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_PATH or "__" not in name:
            continue
        *sections, key = name[len(ENV_PREFIX) :].lower().split("__")
        cls: Any = Config
        target = merged
        for depth, section in enumerate(sections):  # down to the key's own section
            cls = get_type_hints(cls).get(section)
            if cls is None or not dataclasses.is_dataclass(cls):
                raise ConfigError(f"environment variable {name} names no config key")
            nested = target.setdefault(section, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"{'.'.join(sections[: depth + 1])}: expected a mapping")
            target = nested
        if key not in get_type_hints(cls) or dataclasses.is_dataclass(get_type_hints(cls)[key]):
            where = ".".join([*sections, key])
            raise ConfigError(f"environment variable {name} names no config key ({where})")
        target[key] = _EnvText(value)
    return merged


def _copy(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: (_copy(v) if isinstance(v, dict) else v) for k, v in raw.items()}


class _EnvText(str):
    """A value from the environment: typed by the field it lands in."""


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping, got {_show(raw)}")
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    for key in raw:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"unknown key {where}")
    values: dict[str, Any] = {}
    for name, f in known.items():
        if name not in raw:
            continue
        key_path = f"{path}.{name}" if path else name
        values[name] = _convert(hints[name], raw[name], key_path, bool(f.metadata.get("duration")))
    return cls(**values)


def _convert(hint: Any, value: Any, path: str, is_duration: bool) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    from_env = isinstance(value, _EnvText)
    if is_duration:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return parse_duration_ms(value)
            except ValueError as exc:
                raise ConfigError(f"{path}: {exc}") from None
        raise ConfigError(f"{path}: expected a duration like 30s, got {_show(value)}")
    if hint is bool:
        if from_env:
            lowered = value.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true or false, got {_show(value)}")
    if hint is int:
        if from_env and (number := parse_count(value.strip().removeprefix("-"))) is not None:
            return -number if value.strip().startswith("-") else number
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected an integer, got {_show(value)}")
    if hint is str:
        if isinstance(value, str):
            return str(value)
        raise ConfigError(f"{path}: expected a string, got {_show(value)}")
    origin = get_origin(hint)
    if origin is tuple:
        if from_env:
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected a list of strings, got {_show(value)}")
        return tuple(value)
    if origin is dict:
        if from_env:
            raise ConfigError(f"{path}: a mapping cannot be set from the environment")
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
        out: dict[str, Any] = {}
        for k, v in value.items():
            if get_args(hint)[1] is int:
                out[str(k)] = _convert(int, v, f"{path}.{k}", False)
                continue
            if not isinstance(v, str | int | float | bool):
                raise ConfigError(f"{path}.{k}: expected a scalar, got {_show(v)}")
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
        return out
    if origin in (Union, types.UnionType):  # pragma: no cover - no optional fields today
        return value
    raise ConfigError(f"{path}: unsupported type {hint}")  # pragma: no cover


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _validate(config: Config) -> None:
    def positive(path: str, value: int) -> None:
        if value <= 0:
            raise ConfigError(f"{path}: must be greater than 0, got {value}")

    positive("ingress.batch_size", config.ingress.batch_size)
    positive("egress.batch_size", config.egress.batch_size)
    positive("egress.lease", config.egress.lease)
    positive("egress.max_attempts", config.egress.max_attempts)
    for path, ms in (
        ("ingress.linger", config.ingress.linger),
        ("ingress.hold", config.ingress.hold),
        ("egress.tick", config.egress.tick),
        ("egress.send_tick", config.egress.send_tick),
        ("egress.ahead", config.egress.ahead),
        ("egress.transaction", config.egress.transaction),
    ):
        if not 0 <= ms <= 1000:
            raise ConfigError(f"{path}: must be between 0 and 1s, got {format_duration_ms(ms)}")
    if config.egress.ahead * 10 > config.egress.lease:
        raise ConfigError(
            f"egress.ahead: must be at most a tenth of egress.lease "
            f"({format_duration_ms(config.egress.lease)}), "
            f"got {format_duration_ms(config.egress.ahead)}"
        )
    limits = {"egress.max_rate": config.egress.max_rate}
    limits.update(
        (f"egress.max_rate_per_target.{target}", rate)
        for target, rate in config.egress.max_rate_per_target.items()
    )
    for path, rate in limits.items():
        if rate < 0:
            raise ConfigError(f"{path}: must be 0 (no limit) or more, got {rate}")
    positive("store.fetch_ahead", config.store.fetch_ahead)
    if config.store.payload_horizon <= config.store.fetch_ahead:
        raise ConfigError(
            f"store.payload_horizon: must be longer than store.fetch_ahead "
            f"({format_duration_ms(config.store.fetch_ahead)}), "
            f"got {format_duration_ms(config.store.payload_horizon)}"
        )
    positive("limits.max_delay", config.limits.max_delay)
    positive("limits.max_record_bytes", config.limits.max_record_bytes)
    for pattern, quota in config.limits.max_waiting_per_target.items():
        path = f"limits.max_waiting_per_target.{pattern}"
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{path}: bad pattern: {exc}") from None
        if quota < 0:
            raise ConfigError(f"{path}: must be 0 or more records, got {quota}")
    positive("redis.socket_timeout", config.redis.socket_timeout)
    if config.egress.batch_size > 10_000:
        raise ConfigError("egress.batch_size: at most 10000 (one Redis script call claims a batch)")
    if not 0 <= config.http.port <= 65535:
        raise ConfigError(f"http.port: {config.http.port} is not a TCP port")
    if config.logging.level.upper() not in logging.getLevelNamesMapping():
        raise ConfigError(f"logging.level: unknown level {config.logging.level!r}")
    if not config.topics.delay:
        raise ConfigError("topics.delay: at least one delay topic is needed")
    for topic in (*config.topics.delay, config.topics.dead_letter, *config.journal_topics()):
        if not is_legal_topic(topic):
            raise ConfigError(f"topics: {topic!r} is not a legal topic name")
    for pattern in config.topics.allowed_targets:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"topics.allowed_targets: bad pattern {pattern!r}: {exc}") from None
    for delay_topic, target in config.topics.default_target.items():
        if delay_topic not in config.topics.delay:
            raise ConfigError(f"topics.default_target.{delay_topic}: not one of topics.delay")
        refusal = config.rules().target_refusal(target)
        if refusal is not None:
            raise ConfigError(f"topics.default_target.{delay_topic}: {refusal}")
    for target in config.egress.max_rate_per_target:
        refusal = config.rules().target_refusal(target)
        if refusal is not None:
            raise ConfigError(f"egress.max_rate_per_target.{target}: {refusal}")
    for delay_topic, dialect in config.topics.dialect.items():
        if delay_topic not in config.topics.delay:
            raise ConfigError(f"topics.dialect.{delay_topic}: not one of topics.delay")
        if dialect not in DIALECTS:
            raise ConfigError(
                f"topics.dialect.{delay_topic}: unknown dialect {dialect!r} "
                f"(one of {', '.join(DIALECTS)})"
            )
    instance = config.kafka.group_instance_id
    if instance and not is_legal_topic(instance):
        raise ConfigError(
            f"kafka.group_instance_id: {instance!r} is not a legal instance id "
            "(at most 249 of a-z A-Z 0-9 . _ -)"
        )
    if instance and not config.kafka.static_membership:
        raise ConfigError(
            "kafka.static_membership: false, but kafka.group_instance_id names a static member"
        )
    if config.topics.dead_letter in config.topics.delay:
        raise ConfigError("topics.dead_letter: must not be a delay topic")
    if config.topics.journal in (*config.topics.delay, config.topics.dead_letter):
        raise ConfigError("topics.journal: must be neither a delay topic nor the DLQ")
    if config.egress.exactly_once and not config.topics.journal:
        raise ConfigError(
            "egress.exactly_once: needs topics.journal (a shard taken over reads what was "
            "committed there)"
        )
    if config.tracing.mode not in TRACING_MODES:
        raise ConfigError(
            f"tracing.mode: {config.tracing.mode!r} is none of {', '.join(TRACING_MODES)}"
        )
    if config.tracing.enabled and not _has_otel():
        raise ConfigError(
            "tracing.enabled: needs the OpenTelemetry SDK and its OTLP exporter: "
            "pip install 'delay-bridge[otel]'"
        )
    for key, roles, why in _SET_BY_THE_BRIDGE:
        where = set_in(config, roles, key)
        if where is not None:
            raise ConfigError(f"{where}: set by {why}")
    if (
        not config.redis.key_prefix
        or "{" in config.redis.key_prefix
        or "}" in config.redis.key_prefix
    ):
        raise ConfigError("redis.key_prefix: must be non-empty and free of { and }")
    if urlsplit(config.redis.url).scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"redis.url: expected redis://, rediss:// or unix://, got {config.redis.url!r}"
        )
    for node in config.redis.sentinel.nodes:
        host, sep, port = node.rpartition(":")
        if not sep or not host or parse_count(port, 65535) is None:
            raise ConfigError(f"redis.sentinel.nodes: expected host:port, got {node!r}")
    if config.redis.sentinel.nodes and config.redis.cluster:
        raise ConfigError(
            "redis.cluster and redis.sentinel.nodes: choose one (a cluster fails over by itself)"
        )
    if config.redis.sentinel.nodes and not config.redis.sentinel.master:
        raise ConfigError("redis.sentinel.master: the master's name is needed with sentinel nodes")
    config.sentinel_password()
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(config.redis.tls, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"redis.tls.{key}: {path} is not a readable file")
    if bool(config.redis.tls.cert_file) != bool(config.redis.tls.key_file):
        raise ConfigError("redis.tls.cert_file and redis.tls.key_file go together")
    config.redis_password()  # a missing or unreadable password file
    if config.http.console.read_token_file and not config.console_read_token():
        raise ConfigError(
            f"http.console.read_token_file: {config.http.console.read_token_file} is empty"
        )
    if config.http.console.token_file and not config.console_token():
        raise ConfigError(f"http.console.token_file: {config.http.console.token_file} is empty")
    consumer_settings(config)
    timeout = producer_settings(config)["delivery.timeout.ms"]
    timeout_ms = parse_count(timeout)
    if timeout_ms is None or timeout_ms >= config.egress.lease:
        raise ConfigError(
            f"{written_as(config, 'producer', 'delivery.timeout.ms')}: {timeout} must be below "
            f"egress.lease ({config.egress.lease} ms), or a lease would expire while its record "
            "is in flight"
        )


def _has_otel() -> bool:
    """Whether the extra delay-bridge[otel] is installed (tracing.enabled needs it)."""
    try:  # a dotted name's parents are imported: ModuleNotFoundError when one is missing
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        )
    except ModuleNotFoundError:
        return False
