"""The librdkafka settings each Kafka client gets from the config.

The librdkafka maps (``kafka.common/consumer/producer``) pass through untouched, except that a
``<property>_file`` entry is replaced by ``<property>`` read from that file, so Kubernetes Secrets
can be mounted; settings the bridge's guarantees rest on are fixed.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence

from bridge.config.schema import Config, read_secret
from bridge.errors import ConfigError
from bridge.message import parse_count

RECONNECT_BACKOFF_MAX_MS = "1000"
MAX_INSTANCE_ID = 249  # Kafka's rule for a group.instance.id: that many of a-z A-Z 0-9 . _ -
_ILLEGAL_IN_INSTANCE = re.compile(r"[^a-zA-Z0-9._-]")


# librdkafka's other names for properties the bridge sets or checks. Of two names of one
# property, the one set last wins there: message.timeout.ms: 60000 passed the check that
# delivery.timeout.ms stays below egress.lease, then replaced the bridge's value, and a record
# could still be in flight when its lease ran out. A user's setting is read under the bridge's
# name (and named as written in errors: see written_as).
ALIASES = {
    "message.timeout.ms": "delivery.timeout.ms",
    "queue.buffering.max.ms": "linger.ms",
    "request.required.acks": "acks",
    "metadata.broker.list": "bootstrap.servers",
}


def _property(key: str) -> str:
    """The librdkafka property a user's key sets: without ``_file``, under the bridge's name."""
    bare = key.removesuffix("_file")
    return ALIASES.get(bare, bare)


def _resolve_files(settings: Mapping[str, str], path: str) -> dict[str, str]:
    return {
        _property(key): read_secret(value, f"{path}.{key}") if key.endswith("_file") else value
        for key, value in settings.items()
    }


def set_in(config: Config, roles: Sequence[str], key: str) -> str | None:
    """Where the user set librdkafka property ``key`` (under any of its names, or its ``_file``
    variant) in ``kafka.<role>`` for the first of ``roles`` that sets it: ``kafka.<role>.<the
    name used>``; None if none does."""
    for where in roles:
        own: Mapping[str, object] = getattr(config.kafka, where)
        for name in own:
            if _property(name) == key:
                return f"kafka.{where}.{name}"
    return None


def written_as(config: Config, role: str, key: str) -> str:
    """Where the user's setting of librdkafka property ``key`` for ``role``'s client is in the
    config (see :func:`set_in`); ``kafka.<role>.<key>`` if none."""
    return set_in(config, (role, "common"), key) or f"kafka.{role}.{key}"


def admin_settings(config: Config) -> dict[str, str]:
    """librdkafka properties every client shares (and the admin client uses alone)."""
    merged = {
        "bootstrap.servers": config.kafka.bootstrap_servers,
        # A broker that was down is tried again at least every second (librdkafka backs off up
        # to 10 s between attempts): once it answers, the clients reconnect within a second.
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }
    merged.update(_resolve_files(config.kafka.common, "kafka.common"))
    return merged


def kafka_settings(config: Config, role: str) -> dict[str, str]:
    """librdkafka properties for ``role`` (``consumer`` or ``producer``): common, then role."""
    merged = admin_settings(config)
    merged.update(_resolve_files(getattr(config.kafka, role), f"kafka.{role}"))
    return merged


# How long a request to a broker may go unanswered before the client gives up on the connection
# and looks for the partition's leader again (librdkafka: 60 s). A broker that stops answering
# without closing its connections (a long GC pause, a network partition) is fenced by the cluster
# after broker.session.timeout.ms (9 s by default) and its partitions get new leaders; until the
# client gives up on it, the records in flight to it wait. The cost: a request that takes longer
# than this on a healthy cluster is sent again (the producer is idempotent: no duplicate).
SOCKET_TIMEOUT_MS = "10000"

# What the bridge's guarantees rest on: a user setting that contradicts one is a config error.
_CONSUMER_FIXED = {
    "enable.auto.offset.store": "false",  # offsets are stored only once Redis holds the record
    # ... and committed by librdkafka every auto.commit.interval.ms: without it, nothing was
    # committed until a partition was revoked, and a Redis loss without the journal read (and
    # delivered again) everything since.
    "enable.auto.commit": "true",
    # A partition never read (a new group's, or one a delay topic gained: assigned up to the
    # metadata refresh after records came to it) is read from its start; from its end, those
    # records were never delivered.
    "auto.offset.reset": "earliest",
    "partition.assignment.strategy": "cooperative-sticky",
    # A record of an aborted transaction is never scheduled, and the journal read back holds
    # only what was committed (exactly-once delivery rests on it).
    "isolation.level": "read_committed",
}
_PRODUCER_FIXED = {"enable.idempotence": "true", "acks": "all"}


def consumer_settings(config: Config, *, instance: str | None = None) -> dict[str, str]:
    """Delay-topic consumer properties: defaults, then the user's, then the fixed ones.

    ``instance``: for the bridge's own group member, its ``group.instance.id`` (see
    :func:`member_instance`; "" a dynamic member). Only that consumer may carry one: another
    consumer with it would fence the running replica."""
    settings = {
        "group.id": config.kafka.group_id,
        "auto.commit.interval.ms": "1000",
        "enable.partition.eof": "false",
        "statistics.interval.ms": "5000",  # ingest lag and broker state for the metrics
        # A replica that dies for good hands its partitions on after this long (librdkafka's
        # 45 s default); a restarted static member is back without waiting for it at all. It
        # must outlast a broker that stops answering: Kafka fences it after 9 s and the
        # heartbeats find the new coordinator only once a request to the old one has timed out
        # (socket.timeout.ms, 10 s): a session that ran out first made the group form again
        # (docs/bench/history.md, "Figures that lived in config comments").
        "session.timeout.ms": "20000",
        "heartbeat.interval.ms": "3000",
        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
        # A fetch waits up to 10 ms for records to gather (or returns at 1 MB) instead of
        # returning with the first one: far fewer wake-ups of librdkafka's and the ingress's
        # threads per record (docs/bench/history.md). A record due within 10 ms of being
        # produced may be stored up to 10 ms later; an idle replica fetches 100 times a second.
        "fetch.wait.max.ms": "10",
        "fetch.min.bytes": "1048576",
        # Prefetch at most 16 MB (librdkafka: 64 MB), and fetch again 10 ms (not 1 s) after the
        # queue drained below it: the prefetch bounds the bridge's memory while it reads a
        # backlog, at no cost in throughput (docs/bench/history.md).
        "queued.max.messages.kbytes": "16384",
        "fetch.queue.backoff.ms": "10",
        # A delay topic that gains partitions is seen within this long, and the group rebalances
        # to consume them (librdkafka's 5 min default left them unread that long).
        "topic.metadata.refresh.interval.ms": "10000",
    }
    if instance:
        settings["group.instance.id"] = instance
    # The user's: never group.id or group.instance.id (refused when the config is loaded).
    settings.update(kafka_settings(config, "consumer"))
    return _fix(settings, _CONSUMER_FIXED, config, "consumer")


def member_instance(config: Config, http_port: int) -> str:
    """The ``group.instance.id`` of this process's group member: ``kafka.group_instance_id``, else
    (unless ``kafka.static_membership`` is false) the host's name and the port the HTTP server
    listens on — the same for the process restarted on that host, and no other process there
    can listen on that port. A static member rejoins at once after a Kafka outage longer than its
    session, where a new member waits a session more for the broker to expire its lost self."""
    if config.kafka.group_instance_id or not config.kafka.static_membership:
        return config.kafka.group_instance_id
    suffix = f"-{http_port}"
    host = _ILLEGAL_IN_INSTANCE.sub("_", socket.gethostname())
    return host[: MAX_INSTANCE_ID - len(suffix)] + suffix


def read_back_settings(config: Config) -> dict[str, str]:
    """The read-back consumer's properties (see bridge.readback): the delay-topic consumer's, but
    assigned, never a group member, never committing; an offset gone from the log or past its
    end is reported, not skipped over; a fetch after a seek returns at once."""
    settings = consumer_settings(config)
    settings.pop("statistics.interval.ms", None)
    settings.update(
        {
            "group.id": f"{config.kafka.group_id}.read-back",  # never joined: librdkafka wants one
            "enable.auto.commit": "false",
            "auto.offset.reset": "error",
            "enable.partition.eof": "true",
            "fetch.wait.max.ms": "1",
            "fetch.min.bytes": "1",
        }
    )
    return settings


def producer_settings(config: Config) -> dict[str, str]:
    """Target/DLQ producer properties: defaults, then the user's, then the fixed ones."""
    settings = {
        # Records are produced the moment they are due, not after librdkafka's 5 ms wait to
        # fill batches (lateness: docs/bench/history.md); a claim's records go out together
        # anyway.
        "linger.ms": "1",
        # Java's partitioner, so a key lands where the services' own Java producers put it.
        "partitioner": "murmur2_random",
        # Below the lease, so a record is never leased out again while still in flight.
        "delivery.timeout.ms": str(min(120_000, config.egress.lease * 2 // 3)),
        "message.max.bytes": str(max(1_000_000, config.limits.max_record_bytes + 65_536)),
        "topic.metadata.propagation.max.ms": "5000",
        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
    }
    settings.update(kafka_settings(config, "producer"))
    return _fix(settings, _PRODUCER_FIXED, config, "producer")


def transactional_id(group_id: str, topic: str, partition: int) -> str:
    """The transactional id of a delay-topic partition's producer: ``<group>:<topic>:<partition>``.
    A topic name holds no ``:``, so the id names one (group, topic, partition) whatever the group
    holds: two deployments (two groups) never fence each other, as ``.`` joined ones could
    (group ``a.b`` topic ``c`` and group ``a`` topic ``b.c``)."""
    return f"{group_id}:{topic}:{partition}"


def transactional_settings(config: Config, transactional_id: str) -> dict[str, str]:
    """A transactional producer's properties (exactly-once egress, one per delay-topic partition):
    the producer's, with its transactional id. Kafka aborts a transaction open longer than
    ``egress.lease`` (at least the socket timeout, as librdkafka requires): one whose producer
    died and whose shard nobody took over, which holds back read_committed consumers meanwhile."""
    settings = producer_settings(config)
    floor = parse_count(settings["socket.timeout.ms"]) or 0
    settings.setdefault("transaction.timeout.ms", str(max(config.egress.lease, floor)))
    settings["transactional.id"] = transactional_id
    return settings


def _fix(
    settings: dict[str, str], fixed: dict[str, str], config: Config, role: str
) -> dict[str, str]:
    for key, value in fixed.items():
        if settings.get(key, value).lower() != value:
            where = written_as(config, role, key)
            raise ConfigError(f"{where}: must be {value} (the delivery guarantees rely on it)")
        settings[key] = value
    return settings
