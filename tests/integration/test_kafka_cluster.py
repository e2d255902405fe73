"""The bridge on the Kafka that teams run: three brokers, replication factor 3 and
min.insync.replicas 2 (``scripts/services up kafka-cluster``), with its brokers failing."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from bridge.topics import ID_TIMEOUT_S, Topics
from tests.chaos.servers import cluster_brokers
from tests.conftest import run_services, started, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """The three-broker cluster, started for this module (its faults change it)."""
    yield started("kafka-cluster")
    run_services("down", "kafka-cluster")


def broker_pids() -> dict[int, int]:
    """broker id → pid, as ``scripts/services info kafka-cluster`` tells them now."""
    brokers = cluster_brokers(run_services("info", "kafka-cluster"))
    return {broker.id: broker.pid for broker in brokers.values()}


def new_topic(admin: AdminClient, partitions: int = 3) -> str:
    """A topic with the cluster's defaults (no replication factor given)."""
    name = f"cluster-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions)])[name].result(30)
    return name


def test_the_cluster_replicates_every_topic_three_ways_and_wants_two_in_sync(
    cluster: dict[str, str],
) -> None:
    pids = broker_pids()
    assert sorted(pids) == [1, 2, 3]
    for pid in pids.values():
        os.kill(pid, 0)  # alive
    admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
    topic = new_topic(admin)

    def replicas() -> set[int]:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        return {len(p.replicas) for p in partitions}

    # A broker answers for a new topic once the controller's record reached it.
    wait_for(lambda: bool(replicas()), 30, f"the partitions of {topic} in the metadata")
    assert replicas() == {3}
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(10)
    assert config["min.insync.replicas"].value == "2"


def test_brokers_that_stop_answering_hold_a_topic_id_question_no_longer_than_its_timeout(
    cluster: dict[str, str],
) -> None:
    """The ingress asks for topic ids on an assignment, with the partitions held meanwhile.
    Brokers that stopped answering (SIGSTOP: a GC pause, a network partition; which broker an
    admin request waits on is librdkafka's choice, so all of them here) must not hold them for
    the admin client's whole request timeout: the shards are bound by the next check instead."""
    admin_conf: dict[str, str | int | float | bool] = {"bootstrap.servers": cluster["bootstrap"]}
    topic = new_topic(AdminClient(admin_conf))
    topics = Topics(admin_conf)
    # A fresh cluster may take longer than ID_TIMEOUT_S for its first answer (connections, the
    # controller's record reaching every broker): wait for one before the fault.
    wait_for(lambda: topic in topics.ids([topic]), 30, f"the id of {topic}")
    pids = broker_pids().values()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        started_at = time.monotonic()
        answered = topics.ids([topic])
        waited = time.monotonic() - started_at
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert answered == {}
    assert waited < ID_TIMEOUT_S + 1, f"waited {waited:.1f}s for frozen brokers"
    # and answered again once they are back
    wait_for(lambda: topic in topics.ids([topic]), 30, f"the id of {topic} after SIGCONT")
