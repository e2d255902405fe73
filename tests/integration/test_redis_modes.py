"""The bridge on the Redis that teams run: through Sentinel (and across its failovers), and over
TLS with a client certificate — each on real servers that scripts/services starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis
from redis.cluster import RedisCluster

from bridge.message import H_AFTER, H_CANCEL, H_ID, H_TARGET_TOPIC, Cancel, Headers, Scheduled
from bridge.store import Shard, Store
from testbed.harness import Bridge, Setup, metric, produce_all
from testbed.scenarios import sentinel_master
from tests.conftest import ROOT, delete_keys, run_services, started, wait_for
from tests.integration.conftest import documented_acl_rules

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sentinel_set() -> Iterator[dict[str, str]]:
    """A master, a replica and three sentinels of this module's own (failovers change them)."""
    yield started("sentinel")
    run_services("down", "sentinel")


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[dict[str, str]]:
    yield started("redis-tls")
    run_services("down", "redis-tls")


def records(setup: Setup, count: int, tag: str) -> list[tuple[bytes, bytes, Headers]]:
    target = setup.targets[0].encode()
    return [
        (
            f"k{i}".encode(),
            f"{tag}-{i}".encode(),
            [(H_TARGET_TOPIC, target), (H_AFTER, f"{(i % 30) * 100}ms".encode())],
        )
        for i in range(count)
    ]


def delivers_all(setup: Setup, count: int, tag: str) -> None:
    """Produce ``count`` records and assert each one arrives."""
    batch = records(setup, count, tag)
    produce_all(setup.services.bootstrap, setup.delay, batch)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= count, 60, f"every {tag} record")
    finally:
        collector.close()
    assert {r.value for r in collector.records} == {value for _, value, _ in batch}


def test_through_sentinel_across_failovers(
    setup: Setup, sentinel_set: dict[str, str], bridges: list[Bridge]
) -> None:
    bridge = setup.bridge(
        redis__sentinel__nodes=sentinel_set["sentinels"],
        redis__url="redis://ignored-with-sentinels:1/0",
    )
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready through the sentinels")
    collector = setup.collector()
    sentinel = redis.Redis.from_url("redis://" + sentinel_set["sentinels"].split(",")[0])
    try:
        expected: set[bytes] = set()
        for round_ in range(2):  # two failovers, each with records waiting and arriving
            batch = records(setup, 200, f"r{round_}")
            expected |= {value for _, value, _ in batch}
            produce_all(setup.services.bootstrap, setup.delay, batch)
            before = sentinel_master(sentinel_set["sentinels"])
            sentinel.execute_command("SENTINEL", "FAILOVER", "mymaster")  # type: ignore[no-untyped-call]
            wait_for(
                lambda: sentinel_master(sentinel_set["sentinels"]) != before,  # noqa: B023
                60,
                "the sentinels to promote the replica",
            )
            collector.until(
                lambda rs: expected <= {r.value for r in rs},  # noqa: B023
                90,
                f"every record after failover {round_ + 1}",
            )
        wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready on the new master")
    finally:
        collector.close()
        sentinel.close()
    by_value: dict[bytes | None, set[str]] = {}
    for r in collector.of(setup.targets[0]):
        by_value.setdefault(r.value, set()).add(r.delay_id)
    assert set(by_value) == expected
    assert all(len(ids) == 1 for ids in by_value.values()), "a duplicate had another delay-id"
    assert "loop crashed" not in bridge.output()


def test_over_tls_with_a_client_certificate(
    setup: Setup, tls_redis: dict[str, str], bridges: list[Bridge]
) -> None:
    bridge = setup.bridge(
        redis__url=tls_redis["url"],
        redis__tls__ca_file=tls_redis["ca_file"],
        redis__tls__cert_file=tls_redis["cert_file"],
        redis__tls__key_file=tls_redis["key_file"],
    )
    bridges.append(bridge.start())
    delivers_all(setup, 50, "tls")
    client = redis.Redis.from_url(tls_redis["url"], ssl_ca_certs=tls_redis["ca_file"])
    try:
        assert delete_keys(client, setup.unique) > 0  # it was this Redis that held them
    finally:
        client.close()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[dict[str, str]]:
    """Three masters and three replicas of this module's own."""
    yield started("redis-cluster")
    run_services("down", "redis-cluster")


def test_on_a_redis_cluster_with_a_master_failing_over(
    setup: Setup, redis_cluster: dict[str, str], bridges: list[Bridge]
) -> None:
    # The default 30 s lease: a record whose claim or release got no answer while the cluster
    # was down is claimed again once it answers, not when its lease runs out.
    bridge = setup.bridge(redis__url=redis_cluster["url"], redis__cluster="true")
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready on the cluster")
    client = RedisCluster.from_url(redis_cluster["url"])  # type: ignore[no-untyped-call]
    collector = setup.collector()
    try:
        first = records(setup, 200, "before")
        produce_all(setup.services.bootstrap, setup.delay, first)
        collector.until(lambda rs: len(rs) >= 100, 60, "records moving")
        # The partitions' keys are spread over the masters by their hash tags.
        keys = list(client.scan_iter(match=f"*{setup.unique}*"))
        assert len({client.get_node_from_key(k).name for k in keys}) >= 2
        # A master holding shards fails over to its replica (CLUSTER FAILOVER on the replica).
        meta = next(k for k in keys if k.endswith(b":meta"))
        master = client.get_node_from_key(meta)
        wait_for(lambda: _replica_port(master.port) is not None, 30, "the master's replica")
        replica = redis.Redis(port=_replica_port(master.port) or 0)
        replica.execute_command("CLUSTER", "FAILOVER")  # type: ignore[no-untyped-call]
        wait_for(
            lambda: cast(dict[str, Any], replica.info("replication"))["role"] == "master",
            30,
            "the replica promoted",
        )
        replica.close()
        second = records(setup, 200, "after")
        produce_all(setup.services.bootstrap, setup.delay, second)
        expected = {value for _, value, _ in first + second}
        collector.until(
            lambda rs: expected <= {r.value for r in rs}, 20, "every record, well within the lease"
        )
    finally:
        collector.close()
        delete_keys_cluster(client, setup.unique)
        client.close()
    assert "loop crashed" not in bridge.output()


def test_on_a_redis_cluster_with_a_slot_nobody_serves(
    setup: Setup, redis_cluster: dict[str, str], bridges: list[Bridge]
) -> None:
    """A master and its replica both gone leave their slots unserved: the cluster refuses every
    command (cluster-require-full-coverage) and redis-py's cluster client raises exceptions of
    its own, outside RedisError. Here the slot of a shard is taken from every node. The bridge
    stays up, /readyz names the fault, and once the slot is served again every record arrives."""
    # The default 30 s lease: a record whose claim or release got no answer while the cluster
    # was down is claimed again once it answers, not when its lease runs out.
    bridge = setup.bridge(redis__url=redis_cluster["url"], redis__cluster="true")
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready on the cluster")
    client = RedisCluster.from_url(redis_cluster["url"])  # type: ignore[no-untyped-call]
    collector = setup.collector()
    ports = [int(n.split(":")[1]) for n in redis_cluster["nodes"].split(",")]
    slot = owner = -1
    try:
        first = records(setup, 200, "before")
        produce_all(setup.services.bootstrap, setup.delay, first)
        collector.until(lambda rs: len(rs) >= 20, 60, "records moving")
        meta = next(k for k in client.scan_iter(match=f"*{setup.unique}*") if k.endswith(b":meta"))
        slot, owner = client.keyslot(meta), int(client.get_node_from_key(meta).port)
        for port in ports:  # masters and replicas alike forget who serves it
            _cli(port, "cluster", "delslots", str(slot))

        def says_cluster_down() -> bool:
            assert bridge.proc is not None and bridge.proc.poll() is None, bridge.output()[-3000:]
            status, body = bridge.get("/readyz")
            return status == 503 and "redis cluster" in body and "mover" in body

        wait_for(says_cluster_down, 30, "/readyz to name the cluster fault in the mover")
        errors = "delay_bridge_redis_errors_total"
        wait_for(
            lambda: says_cluster_down() and metric(bridge, errors) >= 5,
            30,
            "the mover to keep backing off, alive",
        )
        _serve(owner, slot, ports)
        slot = -1
        second = records(setup, 200, "after")
        produce_all(setup.services.bootstrap, setup.delay, second)
        expected = {value for _, value, _ in first + second}
        collector.until(
            lambda rs: expected <= {r.value for r in rs}, 20, "every record, well within the lease"
        )
        wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "ready again")
    finally:
        if slot >= 0:
            _serve(owner, slot, ports)
        collector.close()
        delete_keys_cluster(client, setup.unique)
        client.close()
    assert "loop crashed" not in bridge.output()


def test_a_cluster_node_known_without_a_connection(
    redis_cluster: dict[str, str], unique: str
) -> None:
    """redis-py adds a node it learns from a MOVED reply to its map without a connection; a
    store call that lands on it (another thread's call taught the client) connects to it."""
    client = RedisCluster.from_url(redis_cluster["url"])  # type: ignore[no-untyped-call]
    store = Store(client, f"test-{unique}")
    shard = Shard(f"t-{unique}", 0)
    try:
        assert store.claim([shard], 10, 1000) == []
        for node in client.get_nodes():
            node.redis_connection.close()
            node.redis_connection = None  # as redis-py leaves a node it learns from MOVED
        assert store.claim([shard], 10, 1000) == []
        assert all(
            node.redis_connection is not None
            for node in client.get_nodes()
            if node.name == client.get_node_from_key(store.keys(shard).due).name
        )
    finally:
        delete_keys_cluster(client, unique)
        client.close()


def test_an_unreachable_cluster_at_start_up_is_one_line(setup: Setup) -> None:
    """redis-py's cluster client needs the slot map as it is made; with no node to ask, the
    bridge exits with one line naming the cause (no traceback), for its restart policy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = setup.bridge(redis__url=f"redis://:secret@127.0.0.1:{port}/0", redis__cluster="true").env
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "secret" not in out, out
    assert f"delay-bridge: redis cluster at redis://:***@127.0.0.1:{port}/0 gave no slot map" in out


def _serve(owner: int, slot: int, ports: list[int]) -> None:
    """Give ``slot`` back to the master on port ``owner``; wait until every node is content."""
    _cli(owner, "cluster", "addslots", str(slot))
    wait_for(
        lambda: all("cluster_state:ok" in _cli(p, "cluster", "info") for p in ports),
        30,
        "the cluster to serve every slot again",
    )


def _cli(port: int, *args: str) -> str:
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True
    ).stdout


def _replica_port(master_port: int) -> int | None:
    """The port of a replica of the master on ``master_port``, as CLUSTER NODES tells it."""

    def cli(*args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(master_port), *args], capture_output=True, text=True, check=True
        ).stdout

    master_id = cli("cluster", "myid").strip()
    for line in cli("cluster", "nodes").splitlines():
        _, address, flags, of, *_ = line.split()
        if "slave" in flags and of == master_id and "fail" not in flags:
            return int(address.split("@")[0].rsplit(":", 1)[1])
    return None


def delete_keys_cluster(client: RedisCluster, marker: str) -> None:
    for key in list(client.scan_iter(match=f"*{marker}*")):
        client.delete(key)


def test_as_the_least_privileged_acl_user_the_docs_document(
    setup: Setup, acl_user: Callable[..., str], bridges: list[Bridge]
) -> None:
    rules = documented_acl_rules(f"test-{setup.unique}")
    # Records past the payload horizon are kept as references (add.lua and promote.lua count
    # them), and cancels and replacements look for them (withdraw in _lib.lua).
    bridge = setup.bridge(
        redis__url=acl_user("least", *rules), store__payload_horizon="4s", store__fetch_ahead="2s"
    )
    bridges.append(bridge.start())
    target = setup.targets[0].encode()
    far = [(H_TARGET_TOPIC, target), (H_AFTER, b"7s")]
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            *[(b"k", f"far-{i}".encode(), [*far, (H_ID, f"far-{i}".encode())]) for i in range(6)],
            (b"k", b"", [(H_CANCEL, b"far-0")]),
            (b"k", b"far-1-again", [*far, (H_ID, b"far-1")]),
        ],
    )
    delivers_all(setup, 60, "acl")
    collector = setup.collector()
    try:
        far_values = [b"far-1-again", b"far-2", b"far-3", b"far-4", b"far-5"]
        collector.until(lambda rs: set(far_values) <= {r.value for r in rs}, 60, "far records")
    finally:
        collector.close()
    values = [r.value or b"" for r in collector.records]
    assert sorted(v for v in values if v.startswith(b"far")) == far_values
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "ready")
    refusals = ("NOPERM", "can't run this command")  # the second: Redis's words in a script
    denied = [x for x in bridge.output().splitlines() if any(r in x for r in refusals)]
    expected = (
        "could not check that Redis does not evict",
        "names of earlier builds",
        "not sampling delay_bridge_stored_bytes",
    )
    assert all(any(e in line for e in expected) for line in denied), denied


class _Migration:
    """A slot half moved from its master to another, as a resharding does it: CLUSTER SETSLOT
    IMPORTING on the new master and MIGRATING on the old, then MIGRATE of ``first`` (the rest of
    the slot's ``keys`` stay). :meth:`start` finishes it in a thread once the old master refused a
    call with TRYAGAIN (the operator's next move): the rest migrated, the slot given to the new
    master. Each command's answer is checked (redis-cli exits 0 on an error reply)."""

    def __init__(self, client: RedisCluster, keys: list[str], first: list[str]) -> None:
        source = client.get_node_from_key(first[0])  # type: ignore[no-untyped-call]
        self.source, self.keys, self.first = source.port, keys, first
        masters = sorted(n.port for n in client.get_primaries())  # type: ignore[no-untyped-call]
        self.dest = next(p for p in masters if p != self.source)
        self.ids = {p: _cli(p, "cluster", "myid").strip() for p in masters}
        self.slot = str(client.keyslot(first[0]))  # type: ignore[no-untyped-call]
        _ok(self.dest, "cluster", "setslot", self.slot, "importing", self.ids[self.source])
        _ok(self.source, "cluster", "setslot", self.slot, "migrating", self.ids[self.dest])
        self._migrate(first)
        self.refused = _tryagains(self.source)
        self.thread = threading.Thread(target=self._finish)

    def _migrate(self, keys: list[str]) -> None:
        _ok(self.source, "migrate", "127.0.0.1", str(self.dest), "", "0", "5000", "keys", *keys)

    def _finish(self) -> None:
        wait_for(lambda: _tryagains(self.source) > self.refused, 10, "a call refused, TRYAGAIN")
        self._migrate([k for k in self.keys if k not in self.first])
        for port in self.ids:
            _ok(port, "cluster", "setslot", self.slot, "node", self.ids[self.dest])

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join(15)
        assert not self.thread.is_alive()


def _ok(port: int, *args: str) -> None:
    answer = _cli(port, *args).strip()
    assert answer == "OK", f"redis-cli -p {port} {' '.join(args)}: {answer}"


def test_a_slot_migrating_under_a_store_call_is_waited_for(
    redis_cluster: dict[str, str], unique: str
) -> None:
    """A slot moved to another master (resharding: CLUSTER SETSLOT … MIGRATING, then MIGRATE of
    its keys one by one) while a shard's keys are half moved: its script is refused with TRYAGAIN.
    Three tries in a row without a pause, then the whole multi-shard pipeline failed, the other
    shards' replies (a claim's leased records) with it. The call now waits for the move."""
    client = RedisCluster.from_url(redis_cluster["url"])  # type: ignore[no-untyped-call]
    store = Store(client, f"test-{unique}")
    moving, staying = Shard(f"t-{unique}", 0), Shard(f"t-{unique}", 1)
    due = 1_800_000_000_000
    try:
        for shard in (moving, staying):
            store.add({shard: (0, [Scheduled(0, due, "out", b"k", b"v", [], "id")])})
        keys = [k.decode() for k in client.scan_iter(match=f"*{moving.topic}:0*")]
        migration = _Migration(client, keys, keys[:1])  # half moved: one key at the destination
        migration.start()
        claimed = store.claim([moving, staying], 10, 30_000, now_ms=due)
        migration.join()
        assert sorted(c.shard for c in claimed) == [moving, staying]
    finally:
        delete_keys_cluster(client, unique)
        client.close()


def _tryagains(port: int) -> int:
    """How many commands the node on ``port`` refused with TRYAGAIN (INFO errorstats)."""
    for line in _cli(port, "info", "errorstats").splitlines():
        if line.startswith("errorstat_TRYAGAIN:count="):
            return int(line.split("=", 1)[1].split(",")[0])
    return 0


def test_a_retire_during_a_slot_migration_keeps_the_records_waiting_for_their_rate(
    redis_cluster: dict[str, str], unique: str
) -> None:
    """A shard's wait index (records held for their target's rate) is reached through its waits
    SET, and was not declared to Redis: with the index already moved to the new master and the SET
    not yet, the retire of a recreated topic saw no index, moved the SET and left the index under
    the live shard's name, listed nowhere: its records were never delivered."""
    client = RedisCluster.from_url(redis_cluster["url"])  # type: ignore[no-untyped-call]
    store = Store(client, f"test-{unique}")
    shard = Shard(f"t-{unique}", 0)
    due = 1_800_000_000_000
    try:
        store.layout.bind({shard: "first"})
        store.add(
            {shard: (1, [Scheduled(o, due, "slow", b"k", b"v", [], f"id-{o}") for o in (0, 1)])}
        )
        claimed = store.claim([shard], 10, 30_000, now_ms=due)
        assert store.unclaim(claimed, wait=True) == 2  # both wait for their target's rate
        wait_index = store.layout.keys.wait(shard, "slow")
        keys = [k.decode() for k in client.scan_iter(match=f"*{shard.topic}:0*")]
        migration = _Migration(client, keys, [wait_index])
        migration.start()
        bound = store.layout.bind({shard: "second"})[shard]  # the topic was recreated
        migration.join()
        assert bound.retired is not None and bound.records == 2
        assert not client.exists(wait_index)  # nothing left under the live shard's name
        claims = store.claim_waiting({(bound.retired, "slow"): 10}, 30_000, now_ms=due)
        assert sorted(c.record.offset for c in claims["slow"]) == [0, 1]
    finally:
        delete_keys_cluster(client, unique)
        client.close()


def test_a_cancel_during_a_slot_migration_reaches_a_record_waiting_for_its_rate(
    redis_cluster: dict[str, str], unique: str
) -> None:
    """add.lua reached a shard's wait indexes (records held for their target's rate) through its
    waits SET without declaring them: with every declared key still on the old master and the
    wait index moved already, Redis refused the script ("a non local key") and the whole batch
    failed until the migration was over; declared, the call is refused with TRYAGAIN and waits."""
    client = RedisCluster.from_url(redis_cluster["url"])  # type: ignore[no-untyped-call]
    store = Store(client, f"test-{unique}")
    shard = Shard(f"t-{unique}", 0)
    due = 1_800_000_000_000

    def rec(offset: int, target: str, at: int = due) -> Scheduled:
        return Scheduled(offset, at, target, b"k", b"v", [], f"id-{offset}")

    try:
        store.layout.bind({shard: "first"})
        # Every key add.lua declares exists: records due and in flight, an id, a reference.
        store.add(
            {
                shard: (
                    3,
                    [rec(0, "slow"), rec(1, "out"), rec(2, "out"), rec(3, "out", due + 86_400_000)],
                )
            },
            refer_after_ms=due + 3_600_000,
        )
        claimed = store.claim([shard], 2, 30_000, now_ms=due)
        assert {c.record.target for c in claimed} == {"slow", "out"}
        assert store.unclaim([c for c in claimed if c.record.target == "slow"], wait=True) == 1
        wait_index = store.layout.keys.wait(shard, "slow")
        keys = [k.decode() for k in client.scan_iter(match=f"*{shard.topic}:0*")]
        migration = _Migration(client, keys, [wait_index])
        migration.start()
        added = store.add({shard: (4, [Cancel(4, "id-0")])})
        migration.join()
        assert added.cancelled == 1, added
        assert not client.exists(wait_index)
    finally:
        delete_keys_cluster(client, unique)
        client.close()
