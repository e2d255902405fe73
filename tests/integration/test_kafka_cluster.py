"""The bridge on the Kafka that teams run: three brokers, replication factor 3 and
min.insync.replicas 2 (``scripts/services up kafka-cluster``), with its brokers failing."""

from __future__ import annotations

import collections
import os
import signal
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from bridge.egress.settle import STALL_S
from bridge.message import H_AFTER, H_ID, H_TARGET_TOPIC
from bridge.topics import ID_TIMEOUT_S, Topics
from testbed.brokers import leader_of_most, proc_state
from testbed.harness import Bridge, bridge_env, metric, produce_all
from testbed.scenarios import KAFKA_CLUSTER_SCENARIOS, SCENARIOS, assert_kept, run_scenario
from testbed.servers import STATE_DIR, Servers, cluster_brokers
from tests.conftest import Services, run_services, started, wait_for
from tests.integration.conftest import redis_server
from tests.integration.test_exactly_once import journaled

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """The three-broker cluster, started for this module (its faults change it)."""
    yield started("kafka-cluster")
    run_services("down", "kafka-cluster")


@pytest.fixture(scope="module")
def own(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The session's Kafka beside a Redis of this module's own: make test runs this module in a
    pytest beside the others', whose tests change the session Redis's settings (SLOWLOG, a
    CLIENT PAUSE) as this module's scenarios do."""
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield Services(services.bootstrap, url)


def broker_pids() -> dict[int, int]:
    """broker id → pid, as ``scripts/services info kafka-cluster`` tells them now."""
    brokers = cluster_brokers(run_services("info", "kafka-cluster"))
    return {broker.id: broker.pid for broker in brokers.values()}


def _stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T in /proc)."""
    states = (proc_state(task / "stat") for task in Path(f"/proc/{pid}/task").iterdir())
    return all(state in (None, "T", "t") for state in states)  # None: a thread that just exited


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

    answers: list[str] = []

    def answered() -> bool:
        """Whether a broker gave the topic's min.insync.replicas (one that has not seen the topic
        yet says UNKNOWN_TOPIC_OR_PART; the one that answered the metadata may be another)."""
        try:
            config = admin.describe_configs([resource])[resource].result(10)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return False
        answers.append(str(config["min.insync.replicas"].value))
        return True

    wait_for(answered, 30, f"the configuration of {topic}")
    assert answers == ["2"]


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
        # SIGSTOP lands asynchronously: ask only once every broker is stopped.
        wait_for(lambda: all(_stopped(pid) for pid in pids), 10, "the brokers stopped")
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


def test_with_two_brokers_of_three_down_nothing_is_acknowledged_and_readyz_says_why(
    cluster: dict[str, str], own: Services, tmp_path: Path
) -> None:
    """Two brokers of three killed: no partition keeps min.insync.replicas (2), so Kafka takes
    no write, and librdkafka retries within delivery.timeout.ms without a report meanwhile. The
    bridge must notice the wait itself: nothing acknowledged, /readyz names the deliveries, the
    metric shows the wait; and it resumes by itself once the brokers are back."""
    bootstrap = cluster["bootstrap"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    delay, target, dlq, journal = (new_topic(admin, 1) for _ in range(4))
    env = bridge_env(
        bootstrap,
        own.redis_url,
        topics__delay=delay,
        topics__dead_letter=dlq,
        topics__journal=journal,
        kafka__group_id=f"g-{delay}",
        redis__key_prefix=f"test-{delay}",
    )
    bridge = Bridge(env, tmp_path / "bridge.log").start()
    delivered = f'delay_bridge_delivered_total{{target_topic="{target}"}}'
    try:
        wait_for(lambda: bridge.get("/readyz")[0] == 200, 90, "/readyz 200")
        # Stored before the fault (its producer could not write either), due during it.
        produce_all(
            bootstrap,
            delay,
            [(None, b"v", [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"4s")])] * 5,
        )
        wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 5, 30, "5 stored")
        pids = broker_pids()
        leader = leader_of_most(admin, target)
        other = min(set(pids) - {leader})
        for broker in (leader, other):
            os.kill(pids[broker], signal.SIGKILL)

        def refused() -> bool:
            status, body = bridge.get("/readyz")
            return status == 503 and "deliveries not acknowledged by Kafka" in body

        wait_for(refused, 4 + STALL_S + 15, "/readyz to name the deliveries Kafka does not take")
        assert metric(bridge, "delay_bridge_oldest_inflight_seconds") > STALL_S
        assert metric(bridge, delivered) == 0  # nothing acknowledged that Kafka did not take
        run_services("up", "kafka-cluster")  # starts the two again
        wait_for(lambda: metric(bridge, delivered) == 5, 120, "the 5 delivered once Kafka is back")
        wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "/readyz 200 again")
    finally:
        bridge.kill()


def test_an_exactly_once_burst_through_a_paused_leader_is_delivered_and_journaled_once(
    cluster: dict[str, str], own: Services, tmp_path: Path
) -> None:
    """Exactly once: 6,000 records with 64-byte ids due at once in one partition, and the target's
    leader paused (SIGSTOP: a GC pause) for a second while they go out: acknowledgements lag,
    transactions gather up to their cap (5,000 records) with journal records of up to 256 KB. A
    read_committed consumer sees each record once, the journal names each once, none refused."""
    bootstrap = cluster["bootstrap"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    delay, target, dlq, journal = (new_topic(admin, 1) for _ in range(4))
    env = bridge_env(
        bootstrap,
        own.redis_url,
        topics__delay=delay,
        topics__dead_letter=dlq,
        topics__journal=journal,
        kafka__group_id=f"g-{delay}",
        redis__key_prefix=f"test-{delay}",
        egress__exactly_once="true",
    )
    bridge = Bridge(env, tmp_path / "bridge.log").start()
    count = 6000
    try:
        wait_for(lambda: bridge.get("/readyz")[0] == 200, 90, "/readyz 200")
        produce_all(
            bootstrap,
            delay,
            [
                (
                    b"one-partition",
                    b"burst-%d" % i,
                    [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"0ms"), (H_ID, b"%064d" % i)],
                )
                for i in range(count)
            ],
        )
        wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") > 0, 60, "the first stored")
        pid = broker_pids()[leader_of_most(admin, target)]
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _stopped(pid), 10, "the leader stopped")
            time.sleep(1.0)  # the pause's length, not a wait on a condition
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(
            lambda: metric(bridge, "delay_bridge_delivered_total") == count, 120, "all delivered"
        )
        wait_for(
            lambda: metric(bridge, "delay_bridge_journal_written_total") >= count,
            60,
            "all journaled",
        )
        assert metric(bridge, "delay_bridge_journal_failures_total") == 0
    finally:
        bridge.kill()
    counts = journaled(bootstrap, journal)
    assert len(counts) == count and set(counts.values()) == {1}
    seen = read_committed_values(bootstrap, target, count)
    assert len(seen) == count and set(seen.values()) == {1}


def read_committed_values(bootstrap: str, topic: str, count: int) -> collections.Counter[bytes]:
    """Each value of ``topic`` (one partition) as a read_committed consumer sees it, read up to
    ``count`` records and then to the end of the partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: collections.Counter[bytes] = collections.Counter()
    at_end = False
    deadline = time.monotonic() + 60
    try:
        while not (at_end and values.total() >= count) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                at_end = msg.error() is not None
                if not at_end:
                    values[msg.value() or b""] += 1
    finally:
        consumer.close()
    return values


@pytest.mark.chaos
@pytest.mark.parametrize(
    "name", [n for n in SCENARIOS if n in KAFKA_CLUSTER_SCENARIOS and SCENARIOS[n][1] is not None]
)
def test_chaos_scenario_short(
    name: str, own: Services, cluster: dict[str, str], tmp_path: Path
) -> None:
    """The short version of a three-broker chaos scenario (testbed/brokers.py), on this
    module's cluster and the session's Redis."""
    _, quick, _ = SCENARIOS[name]
    assert quick is not None
    base_port = min(b.port for b in cluster_brokers(run_services("info", "kafka-cluster")).values())
    servers = Servers.on(own, STATE_DIR, kafka_cluster_port=base_port)
    result = run_scenario(servers, tmp_path, name, quick, seed=zlib.crc32(name.encode()))
    assert_kept(result, tmp_path)
