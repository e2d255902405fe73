"""What the bridge asks Kafka about its delay topics: their incarnation and their retention.

The incarnation is the topic id; the retention says, at start-up, whether they can rebuild a Redis
that lost its data.

The committed offset of a delay-topic partition is its lowest pending record, which can be as old
as ``limits.max_delay``. If Redis loses its data, the bridge re-reads the topic from there — so the
topic must still hold those records. Time retention shorter than ``limits.max_delay``, any size
retention, or compaction can delete a record that is still waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from bridge.message import format_duration_ms

logger = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 10.0
# How long the ingress thread waits for a topic id: it asks on an assignment, with the partitions
# held until the answer. A broker that stopped answering (frozen, or gone before Kafka fenced it)
# can hold an admin request for the whole DESCRIBE_TIMEOUT_S; a shard without an answer is bound
# by the next incarnation check instead (bridge.positions), as when Kafka is unreachable.
ID_TIMEOUT_S = 2.0


def retention_problems(
    topic: str, settings: Mapping[str, str], max_delay_ms: int, *, key_is_id: bool = False
) -> list[str]:
    """What in a delay topic's configuration can delete records before they are due. Where the
    record key is the delay-id (the etf1 dialect), compaction keeps the latest record per id —
    the one a replacement or cancel leaves in force — so it deletes nothing still waiting."""
    problems = []
    retention_ms = int(settings.get("retention.ms", "-1"))
    if 0 <= retention_ms < max_delay_ms:
        problems.append(
            f"delay topic {topic} keeps records for retention.ms={retention_ms} "
            f"({format_duration_ms(retention_ms)}) but limits.max_delay is "
            f"{format_duration_ms(max_delay_ms)}: if Redis loses its data, records scheduled "
            f"further out than {format_duration_ms(retention_ms)} cannot be rebuilt from the "
            f"topic. Set retention.ms >= {max_delay_ms} (or -1) or lower limits.max_delay"
        )
    if int(settings.get("retention.bytes", "-1")) >= 0:
        problems.append(
            f"delay topic {topic} has retention.bytes={settings['retention.bytes']}: size-based "
            "retention can delete records that are still scheduled, and a Redis that lost its "
            "data could not be rebuilt from the topic. Set retention.bytes=-1"
        )
    if "compact" in settings.get("cleanup.policy", "delete") and not key_is_id:
        problems.append(
            f"delay topic {topic} has cleanup.policy={settings['cleanup.policy']}: compaction "
            "removes older records with the same key that may still be scheduled. "
            "Use cleanup.policy=delete"
        )
    return problems


def check_retention(
    admin_conf: Mapping[str, Any],
    topics: Sequence[str],
    max_delay_ms: int,
    *,
    key_is_id: Collection[str] = (),
) -> int:
    """Warn loudly for every delay topic that cannot rebuild Redis; returns how many warnings.
    ``key_is_id``: the topics whose record key is the delay-id (see :func:`retention_problems`)."""
    try:
        problems = read_retention(admin_conf, topics, max_delay_ms, key_is_id=key_is_id)
    except (KafkaException, TimeoutError) as exc:
        logger.warning(
            "could not read the delay topics' retention (%s); make sure it covers limits.max_delay",
            exc,
        )
        return 0
    for problem in problems:
        logger.warning("DELAY TOPIC CANNOT REBUILD REDIS: %s", problem)
    return len(problems)


def read_retention(
    admin_conf: Mapping[str, Any],
    topics: Sequence[str],
    max_delay_ms: int,
    *,
    key_is_id: Collection[str] = (),
) -> list[str]:
    """The :func:`retention_problems` of the delay topics as Kafka describes them; raises
    KafkaException or TimeoutError when Kafka does not say."""
    admin = AdminClient(dict(admin_conf))
    resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics]
    problems = []
    futures = admin.describe_configs(resources, request_timeout=DESCRIBE_TIMEOUT_S)
    for resource, future in futures.items():
        entries = future.result(timeout=DESCRIBE_TIMEOUT_S)
        settings = {name: str(entry.value) for name, entry in entries.items()}
        problems += retention_problems(
            resource.name, settings, max_delay_ms, key_is_id=resource.name in key_is_id
        )
    return problems


# Answers that mean "this topic is not there for the bridge", as opposed to "Kafka did not answer".
_ABSENT = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: "it does not exist",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "not authorized to describe it",
}


class Topics:
    """What the running bridge asks Kafka about topics, on one admin client: a topic's id (a topic
    deleted and created again under the same name gets a new one, which is how the ingress tells
    the incarnations apart) and whether a topic exists (the DLQ)."""

    def __init__(self, admin_conf: Mapping[str, Any]) -> None:
        self.admin = AdminClient(dict(admin_conf))
        self._known: dict[str, str] = {}
        self._partitions: dict[str, int] = {}

    def partitions(self) -> dict[str, int]:
        """The partition count of each topic of the latest answers, without asking Kafka."""
        return dict(self._partitions)

    def known(self) -> dict[str, str]:
        """The topic ids of the latest answers, without asking Kafka."""
        return dict(self._known)

    def describe(
        self, topics: Sequence[str], timeout_s: float = DESCRIBE_TIMEOUT_S
    ) -> tuple[dict[str, str], dict[str, str]]:
        """(topic → id, topic → why it is absent) for the topics Kafka answered about within
        ``timeout_s``; a topic Kafka did not answer about (unreachable, timed out) is in neither."""
        ids: dict[str, str] = {}
        absent: dict[str, str] = {}
        if not topics:
            return ids, absent
        futures = self.admin.describe_topics(
            TopicCollection(list(topics)), request_timeout=timeout_s
        )
        deadline = time.monotonic() + timeout_s
        for topic, future in futures.items():
            try:
                left = max(0.0, deadline - time.monotonic())
                description = future.result(timeout=left)
                ids[topic] = str(description.topic_id)
                self._partitions[topic] = len(description.partitions)
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() in _ABSENT:
                    absent[topic] = _ABSENT[error.code()]
                else:
                    logger.warning("could not describe topic %s: %s", topic, error.str())
            except TimeoutError:
                logger.warning("could not describe topic %s: no answer in %.0fs", topic, timeout_s)
        self._known.update(ids)
        for topic in absent:
            self._known.pop(topic, None)
            self._partitions.pop(topic, None)
        return ids, absent

    def ids(self, topics: Sequence[str]) -> dict[str, str]:
        """The topic ids Kafka told within ID_TIMEOUT_S (a topic it did not is left out, and its
        check waits)."""
        return self.describe(topics, ID_TIMEOUT_S)[0]

    def absent(self, topics: Sequence[str]) -> dict[str, str]:
        """The topics Kafka said are not there (or not visible to the bridge), with why."""
        return self.describe(topics)[1]
