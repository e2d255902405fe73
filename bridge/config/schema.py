"""The config schema: frozen dataclasses with typed defaults, one per section."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.errors import ConfigError
from bridge.message import (
    Rules,
    parse_duration_ms,
)


def duration(default: str) -> Any:
    """A field holding milliseconds, written in YAML as a duration (``30s``, ``1h30m``)."""
    return field(default=parse_duration_ms(default), metadata={"duration": True})


@dataclass(frozen=True)
class KafkaConfig:
    """Where Kafka is and how the clients talk to it."""

    bootstrap_servers: str = "127.0.0.1:9092"
    group_id: str = "delay-bridge"
    group_instance_id: str = ""
    static_membership: bool = True
    common: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SentinelConfig:
    """Redis Sentinel: the master is found through the sentinels (when ``nodes`` is not empty)."""

    master: str = "mymaster"
    nodes: tuple[str, ...] = ()
    password: str = ""
    password_file: str = ""


@dataclass(frozen=True)
class TlsConfig:
    """TLS to Redis (also implied by a ``rediss://`` URL)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""


@dataclass(frozen=True)
class RedisConfig:
    """Where Redis is and how keys are named."""

    url: str = "redis://127.0.0.1:6379/0"
    password: str = ""
    password_file: str = ""
    key_prefix: str = "delay-bridge"
    socket_timeout: int = duration("5s")
    cluster: bool = False
    sentinel: SentinelConfig = field(default_factory=SentinelConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)


# In topics.journal, the first delay topic's name: the default journal follows a deployment's
# delay topics, so deployments that name theirs apart do not share one.
FIRST_DELAY = "<delay>"


@dataclass(frozen=True)
class TopicsConfig:
    """Which topics are read, where records may go, and where failures go."""

    delay: tuple[str, ...] = ("delay",)
    default_target: dict[str, str] = field(default_factory=dict)
    allowed_targets: tuple[str, ...] = (".*",)
    dead_letter: str = "delay.dlq"
    dialect: dict[str, str] = field(default_factory=dict)
    journal: str = f"{FIRST_DELAY}.journal"  # "": no journal

    def __post_init__(self) -> None:
        if FIRST_DELAY in self.journal and self.delay:  # none: refused by the loader
            object.__setattr__(self, "journal", self.journal.replace(FIRST_DELAY, self.delay[0]))


@dataclass(frozen=True)
class IngressConfig:
    """The delay-topic consumer."""

    batch_size: int = 500
    linger: int = duration("10ms")
    hold: int = duration("100ms")


@dataclass(frozen=True)
class EgressConfig:
    """The mover that claims due records and produces them."""

    batch_size: int = 500
    lease: int = duration("30s")
    max_attempts: int = 3
    # A record delivered later than its due time + this goes to the DLQ as expired (0: never);
    # a record's delay-max-lateness header overrides it.
    max_lateness: int = duration("0s")
    tick: int = duration("10ms")
    send_tick: int = duration("2ms")
    ahead: int = duration("400ms")
    max_rate: int = 0  # records/s per replica, 0: no limit
    max_rate_per_target: dict[str, int] = field(default_factory=dict)  # target -> records/s
    exactly_once: bool = False  # target, DLQ and journal records in one transaction per shard
    transaction: int = duration("10ms")  # how long a shard's transaction gathers records
    # Redis's clock and this host's may differ by this much before /readyz names the skew
    # (decisions go by the lesser of the two whatever the skew: bridge.egress.plan.DecisionClock).
    max_clock_skew: int = duration("2s")

    @property
    def due_by_ms(self) -> int:
        """A record in flight was due by its lease deadline minus this: it was claimed at most
        ``ahead`` before it fell due, under a ``lease`` (see stats.lua)."""
        return self.lease - self.ahead


@dataclass(frozen=True)
class StoreConfig:
    """Which records Redis holds whole, and which as references read back from the delay topic."""

    references: bool = True
    payload_horizon: int = duration("1h")
    fetch_ahead: int = duration("2m")

    @property
    def bucket_ms(self) -> int:
        """The width of a reference time bucket: half the span between the horizon and the read
        back (1 s to 1 h). A record kept as a reference is due a bucket after ``fetch_ahead``
        from now at least, so it waits half a bucket at least before it is read back."""
        return max(1000, min(3_600_000, (self.payload_horizon - self.fetch_ahead) // 2))

    @property
    def read_ahead_ms(self) -> int:
        """How long before a bucket starts its read-back begins: ``fetch_ahead``, and as long
        again (at most half a bucket) to read it in. A bucket read within that is stored whole
        ``fetch_ahead`` before its first record is due; every record is stored whole at most
        this + a bucket before its due time (the defaults: 4 min + 29 min)."""
        return self.fetch_ahead + min(self.fetch_ahead, self.bucket_ms // 2)


@dataclass(frozen=True)
class LimitsConfig:
    """What a delay-topic record may ask for."""

    max_delay: int = duration("365d")
    max_record_bytes: int = 1048576
    # Target topic regex -> records it may keep waiting at most (the first pattern that fully
    # matches counts); a record past it goes to the DLQ as quota-exceeded (docs/quotas.md).
    max_waiting_per_target: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsoleConfig:
    """The web console at /ui and its JSON API at /api/."""

    enabled: bool = True
    token_file: str = ""  # the bearer token writes need; "": writes are refused
    # A bearer token reads need too; "": reads are open (payloads shown only with a token)
    read_token_file: str = ""


@dataclass(frozen=True)
class HttpConfig:
    """The metrics and health endpoints, and the console."""

    host: str = "0.0.0.0"
    port: int = 9464
    console: ConsoleConfig = field(default_factory=ConsoleConfig)


@dataclass(frozen=True)
class LoggingConfig:
    """Log level and format."""

    level: str = "INFO"
    json: bool = False


TRACING_MODES = ("continue", "link")


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry spans of the bridge's hop (bridge.tracing)."""

    enabled: bool = False
    mode: str = "continue"  # TRACING_MODES


@dataclass(frozen=True)
class Config:
    """The whole configuration."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    ingress: IngressConfig = field(default_factory=IngressConfig)
    egress: EgressConfig = field(default_factory=EgressConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def journal_topics(self) -> tuple[str, ...]:
        """The journal topic, if there is one."""
        return (self.topics.journal,) if self.topics.journal else ()

    def rules(self) -> Rules:
        """The message-contract rules this config sets."""
        return Rules(
            delay_topics=frozenset(self.topics.delay),
            default_targets=dict(self.topics.default_target),
            allowed_targets=tuple(re.compile(p) for p in self.topics.allowed_targets),
            dead_letter=self.topics.dead_letter,
            max_delay_ms=self.limits.max_delay,
            max_record_bytes=self.limits.max_record_bytes,
            dialects=dict(self.topics.dialect),
        )

    def redis_password(self) -> str | None:
        """The Redis password from ``redis.password_file`` or ``redis.password``, if any."""
        if self.redis.password_file:
            return read_secret(self.redis.password_file, "redis.password_file")
        return self.redis.password or None

    def console_token(self) -> str | None:
        """The bearer token the console's writes need, from ``http.console.token_file``; None
        when there is none (writes are refused)."""
        path = self.http.console.token_file
        return read_secret(path, "http.console.token_file") or None if path else None

    def console_read_token(self) -> str | None:
        """The bearer token the console's reads need, from ``http.console.read_token_file``;
        None when there is none (reads are open)."""
        path = self.http.console.read_token_file
        return read_secret(path, "http.console.read_token_file") or None if path else None

    def sentinel_password(self) -> str | None:
        """The sentinels' own password from ``redis.sentinel.password_file`` or ``.password``."""
        sentinel = self.redis.sentinel
        if sentinel.password_file:
            return read_secret(sentinel.password_file, "redis.sentinel.password_file")
        return sentinel.password or None


def read_secret(path: str, key: str) -> str:
    """The contents of a mounted secret file, for the config key ``key`` that names it."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None
