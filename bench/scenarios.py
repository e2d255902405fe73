"""The scenarios. Each runs the real bridge process (``delay-bridge run``) on the local Kafka and
Redis with topics, group and key prefix of its own, and measures from outside it: progress from
Redis (the shards' watermarks and record counts, sampled every 10 ms), deliveries from a consumer
on the target topic, and acknowledgement times from the target topic's ``LogAppendTime`` — the
broker's clock at the append the producer's delivery report confirms.

The workload, the checker and the topic/bridge plumbing are the chaos harness's
(:mod:`tests.chaos`): every delivered record is also checked against its due time, so a benchmark
run that delivers early or loses a record says so.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka.cimpl import NewTopic
from redis.cluster import RedisCluster

from bench.ceilings import bare_store
from bridge.config import consumer_settings, from_mapping
from bridge.kafka import headers_of
from bridge.message import H_AFTER, H_DELIVER_AT, H_ID, H_TARGET_TOPIC, Headers, record_size
from bridge.store import Shard, Store
from testbed import run as runs
from testbed.checker import (
    Account,
    Expected,
    expectations,
    quantile,
    read_topic,
    settle,
    wait_seen,
)
from testbed.harness import Bridge, bridge_env, metric, wait_ready
from testbed.run import PARTITIONS, Run, Topics
from testbed.servers import Servers
from testbed.services import ROOT
from testbed.workload import Record, Workload, now_ms, steady, value_of

SAMPLE_S = 0.01
QUANTILES = (0.5, 0.9, 0.99, 0.999)
ACK_STAMPS = {"message.timestamp.type": "LogAppendTime"}
FAR_FUTURE = b"30d"
NEAR = b"50m"  # within the default payload horizon (1 h): held whole


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does (the issue's quick and full sizes)."""

    throughput: int
    values: tuple[int, ...]
    precision_s: float
    backlog: int
    catchup: int
    cluster: int  # records due at once on each Redis of the cluster scenario
    # The longest delay of the steady loads (precision, cost per record, cluster), from 1 s: the
    # issue's loads use 10 s; the harness's own test, shorter, so that its runs drain sooner.
    max_delay_ms: int = 10_000
    # far-future: (records, value bytes) held due in 30 days; records read back due at one
    # instant (contiguous) and due at random over ``spread_s`` (scattered).
    held: tuple[tuple[int, int], ...] = ((100_000, 1024), (1_000_000, 100))
    contiguous: int = 200_000
    scattered: int = 100_000
    spread_s: float = 50.0
    # recovery: the consumer's session.timeout.ms (None: the bridge's default, what the figures
    # are about; the harness's own test shortens it, since it checks the contract only).
    session_ms: int | None = None
    # priority: records due at one instant (10% high, 30% low, 60% normal), drained without a
    # limit and at max_rate (records/s), while live high records arrive at live_rate.
    priority: int = 300_000
    max_rate: int = 20_000
    live_rate: float = 200.0
    # trace: journal entries written over two days before the traced records are looked up.
    journal: int = 1_000_000
    # bulk: far-future records of one customer cancelled by a key prefix under live traffic.
    bulk: int = 1_000_000
    # rebuild: records waiting (one in ten whole, the rest references) when Redis is lost.
    rebuild: int = 10_000_000
    # recurring: schedules, each every this many seconds, measured over this many seconds.
    recurring: tuple[int, int, float] = (100_000, 60, 180.0)


QUICK = Sizes(
    throughput=50_000,
    values=(100, 1024),
    precision_s=20,
    backlog=100_000,
    catchup=100_000,
    cluster=50_000,
    bulk=100_000,
    rebuild=1_000_000,
    recurring=(10_000, 10, 30.0),
)
FULL = Sizes(
    throughput=500_000,
    values=(100, 1024),
    precision_s=60,
    backlog=1_000_000,
    catchup=100_000,
    cluster=200_000,
    held=((1_000_000, 1024), (10_000_000, 100)),
    contiguous=1_000_000,
    scattered=1_000_000,
    spread_s=500.0,
    journal=10_000_000,
)


@dataclass
class Report:
    """What the scenarios measured, by name; serialised as the JSON result."""

    figures: dict[str, Any] = field(default_factory=dict)
    series: dict[str, Any] = field(default_factory=dict)  # for the plots only
    problems: list[str] = field(default_factory=list)  # lost, early, misrouted: correctness


# ---------------------------------------------------------------- measuring from outside


class Progress:
    """Samples the shards' ingest watermarks and stored-record counts every 10 ms.

    ``ingested`` is the records handled so far (offsets up to the watermarks), ``stored`` the
    records Redis holds; ``ingested - stored`` is what left Redis, i.e. was acknowledged.
    """

    def __init__(self, store: Store, topic: str, partitions: int = PARTITIONS) -> None:
        self.store = store
        self.shards = [Shard(topic, p) for p in range(partitions)]
        self.samples: list[tuple[int, int, int]] = []  # (epoch ms, ingested, stored)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> Progress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def sample(self) -> tuple[int, int, int]:
        """(epoch ms, ingested, stored) now."""
        pipe = self.store.client.pipeline(transaction=False)
        for shard in self.shards:
            keys = self.store.keys(shard)
            pipe.hget(keys.meta, "ingested")
            pipe.zcard(keys.due)
            pipe.zcard(keys.inflight)
        replies = pipe.execute()
        ingested = sum(int(m) + 1 for m in replies[0::3] if m is not None)
        return now_ms(), ingested, sum(int(n) for n in replies[1::3] + replies[2::3])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(SAMPLE_S)

    def latest(self) -> tuple[int, int, int]:
        return self.samples[-1] if self.samples else (now_ms(), 0, 0)

    def wait(self, done: Callable[[int, int], bool], timeout: float, what: str) -> None:
        """Wait until ``done(ingested, stored)`` holds for the latest sample."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, ingested, stored = self.latest()
            if done(ingested, stored):
                return
            time.sleep(SAMPLE_S)
        raise TimeoutError(f"{what} not reached within {timeout:.0f}s: {self.latest()}")

    def first(self, pred: Callable[[int, int], bool]) -> int:
        """The time of the first sample for which ``pred(ingested, stored)`` holds."""
        return next(t for t, i, s in self.samples if pred(i, s))


def lateness_figures(values: list[int]) -> dict[str, int]:
    out = {f"p{q * 100:g}": quantile(values, q) for q in QUANTILES}
    out["max"] = max(values, default=0)
    return out


def check(report: Report, name: str, account: Account) -> None:
    """Correctness travels with every figure: lost, early and misrouted records are problems."""
    for what, items in (
        ("lost", account.lost),
        ("early", account.early),
        ("misrouted", account.misrouted),
    ):
        if items:
            report.problems.append(f"{name}: {len(items)} {what}, e.g. {items[:3]}")


def settled(
    run: Run, expected: dict[int, Expected], seqs: range, report: Report, name: str
) -> Account:
    """Settle the records ``seqs`` (all due by now) against the checker."""
    account = settle(run.checker, {s: expected[s] for s in seqs}, horizon_ms=now_ms())
    check(report, name, account)
    return account


def read_expected(run: Run) -> dict[int, Expected]:
    """What every delay-topic record of the run asks for (reads the whole topic: once a run)."""
    return expectations(read_topic(run.servers.bootstrap, run.delay, run.partitions), run.rules())


def wait_delivered(run: Run, seqs: range, timeout: float) -> None:
    """Wait until the checker saw every seq in ``seqs`` (delivered or dead-lettered)."""
    missing = wait_seen(run.checker, seqs, timeout)
    if missing:
        raise TimeoutError(f"{len(missing)} of {len(seqs)} records not delivered in {timeout:.0f}s")


def ready_bridge(run: Run, instance: str = "") -> Bridge:
    """Start a bridge of the run (static group member ``instance`` if given) and wait until it
    answers /readyz."""
    bridge = run.bridge(instance)
    if not wait_ready(bridge):
        raise RuntimeError(f"the bridge did not become ready:\n{bridge.output()[-2000:]}")
    return bridge


def due_now(count: int, target: str, id_bytes: int = 0) -> list[Record]:
    """``count`` records due at once, each with a delay-id of its own ``id_bytes`` long if
    given."""
    header: Headers = [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"0ms")]
    if not id_bytes:
        return [Record(header, key=b"k%d" % (i % 997)) for i in range(count)]
    return [
        Record([*header, (H_ID, (b"order-%d" % i).rjust(id_bytes, b"0"))], key=b"k%d" % (i % 997))
        for i in range(count)
    ]


def produce(
    run: Run, records: list[Record], rate: float, first_seq: int = 0, value_size: int | None = None
) -> Workload:
    return Workload(
        run.servers.bootstrap, run.delay, records, rate, value_size=value_size, first_seq=first_seq
    ).start()


def finished(workload: Workload, timeout: float = 600) -> None:
    workload.join(timeout)
    if workload.failed:
        raise RuntimeError(f"the workload could not produce: {workload.failed[:3]}")


# ---------------------------------------------------------------- 1 + 2: throughput and ceilings


def journal_bytes(run: Run) -> int:
    """What the run's journal holds, as its records' keys, values and headers (librdkafka
    compresses nothing by default: about what the log stores, less the batches' own headers)."""
    return sum(
        len(msg.key() or b"")
        + len(msg.value() or b"")
        + sum(len(k) + len(v or b"") for k, v in headers_of(msg))
        for msg in read_topic(run.servers.bootstrap, run.journal, run.partitions)
    )


def throughput(
    servers: Servers,
    workdir: Path,
    count: int,
    value_size: int,
    report: Report,
    *,
    overrides: dict[str, object] | None = None,
    tag: str = "",
    id_bytes: int = 0,
    ceilings: bool = True,
    replicas: int = 1,
    partitions: int = PARTITIONS,
) -> float:
    """``count`` records due at once (each with a delay-id ``id_bytes`` long if given: then
    without the ceilings, which such records do not change), produced before the bridge starts
    (configured with ``overrides``, its figures named with ``tag``); the bare pipe reads the same
    delay topic first (``ceilings``). ``replicas``: bridges started side by side, each a static
    member of the group, on a delay topic of ``partitions``. Returns the end-to-end rate
    (records/s); the CPU time of the bridges and of Redis per record over the run is among the
    figures."""
    name = f"throughput-{value_size}{tag}"
    run = Run(
        servers,
        workdir,
        name,
        label="bench",
        target_config=ACK_STAMPS,
        watch=False,
        overrides=overrides,
        topics=Topics(partitions=partitions),
    )
    store = Store(servers.redis(), run.prefix)
    try:
        records = due_now(count, run.target, id_bytes)
        finished(produce(run, records, float("inf"), value_size=value_size))
        pipe = None if id_bytes or not ceilings else _bare_pipe(run, count)
        progress = Progress(store, run.delay, partitions).start()
        redis_cpu = redis_cpu_s(store.client)
        bridges = [run.bridge(f"r{n}" if replicas > 1 else "") for n in range(replicas)]
        progress.wait(lambda i, s: i >= count and s == 0, 600, f"{name}: all acknowledged")
        progress.stop()
        cpu_s = sum(b.cpu_seconds() for b in bridges) + redis_cpu_s(store.client) - redis_cpu
        for bridge in bridges:
            bridge.stop()
        started = progress.first(lambda i, s: i > 0)
        ingested = progress.first(lambda i, s: i >= count)
        acked_first = progress.first(lambda i, s: i - s > 0)
        acked = progress.first(lambda i, s: i >= count and s == 0)
        rates = {
            "records": count,
            "value_bytes": value_size,
            "delay_id_bytes": id_bytes,
            "replicas": replicas,
            "partitions": partitions,
            "ingest_per_s": count / max(1e-3, (ingested - started) / 1000),
            "egress_per_s": count / max(1e-3, (acked - acked_first) / 1000),
            "end_to_end_per_s": count / max(1e-3, (acked - started) / 1000),
            "cpu_ms_per_record": cpu_s * 1000 / count,
        }
        if pipe is not None:
            rates["bare_pipe_per_s"] = count / max(
                1e-3, (pipe["last_ms"] - pipe["first_ms"]) / 1000
            )
            ceiling = bare_store(
                store,
                run.config(),
                topic=f"{run.delay}-bare",
                count=count,
                value_size=value_size,
                target=run.target,
            )
            rates.update(ceiling)
            rates["end_to_end_vs_pipe"] = rates["end_to_end_per_s"] / rates["bare_pipe_per_s"]
            rates["ingest_vs_store_add"] = rates["ingest_per_s"] / rates["bare_store_add_per_s"]
            rates["egress_vs_store_claim_ack"] = (
                rates["egress_per_s"] / rates["bare_store_claim_ack_per_s"]
            )
        run.checker.start()  # only now: reading the target meanwhile would compete for the CPU
        wait_delivered(run, range(count), 300)
        account = settled(run, read_expected(run), range(count), report, name)
        rates["duplicates"] = account.duplicates
        if runs.JOURNAL:
            rates["journal_bytes_per_record"] = journal_bytes(run) / count
        report.figures[name] = rates
        report.series[name] = [((t - started) / 1000, i, i - s) for t, i, s in progress.samples]
        return float(rates["end_to_end_per_s"])
    finally:
        store.client.close()
        run.close()


REPLICA_PARTITIONS = 6  # the delay topic of the replicas scenario: three partitions each


def replicas(servers: Servers, workdir: Path, count: int, report: Report) -> float:
    """``count`` records of 100 B due at once, drained by one bridge and then by two replicas
    side by side (the chart's default, ``replicaCount: 2``), each on a delay topic of
    REPLICA_PARTITIONS; figures ``replicas-1`` and ``replicas-2``. Returns the two replicas'
    end-to-end rate over the one bridge's: what a second process buys on the same machine."""
    rates = [
        throughput(
            servers,
            workdir,
            count,
            100,
            report,
            tag=f"-replicas-{n}",
            ceilings=False,
            replicas=n,
            partitions=REPLICA_PARTITIONS,
        )
        for n in (1, 2)
    ]
    for n in (1, 2):
        report.figures[f"replicas-{n}"] = report.figures.pop(f"throughput-100-replicas-{n}")
        report.series.pop(f"throughput-100-replicas-{n}", None)
    ratio = rates[1] / rates[0]
    report.figures["replicas-2"]["end_to_end_vs_one"] = ratio
    return ratio


def _bare_pipe(run: Run, count: int) -> dict[str, int]:
    target = f"pipe-{run.uid}"
    for future in run.admin.create_topics([NewTopic(target, PARTITIONS, 1)]).values():
        future.result(timeout=30)
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.pipe",
                str(run.config_file),
                run.delay,
                target,
                str(count),
            ],
            cwd=ROOT,
            env=bridge_env(run.servers.bootstrap, run.servers.redis_url),
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
    finally:
        run.admin.delete_topics([target])
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["acked"] != count:
        raise RuntimeError(f"the bare pipe acknowledged {result['acked']} of {count}")
    return result


# ---------------------------------------------------------------- 3 + 4: precision and backlog


def precision_and_backlog(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    rate: float,
    seconds: float,
    backlog: int,
    max_delay_ms: int,
) -> None:
    """Steady load at ``rate`` with delays uniform in 1 s to ``max_delay_ms`` for ``seconds``
    (precision); then
    ``backlog`` far-future records into the same shards (memory per record); then the same load
    again (lateness with the backlog)."""
    run = Run(servers, workdir, "precision", label="bench", target_config=ACK_STAMPS)
    store = Store(servers.redis(), run.prefix)
    try:
        bridge = ready_bridge(run)
        count = int(rate * seconds)
        phases: dict[str, range] = {}
        seq = 0
        for phase in ("without backlog", "with backlog"):
            if phase == "with backlog":
                report.figures["backlog"] = _load_backlog(run, store, backlog, seq)
                seq += backlog
            records = steady(count, run.target, max_delay_ms, seed=seq, min_delay_ms=1000)
            finished(produce(run, records, rate, first_seq=seq), seconds * 3 + 60)
            phases[phase] = range(seq, seq + count)
            wait_delivered(run, phases[phase], 120)
            seq += count
        # The same again with a caller-given delay-id on each: what the id index costs; then
        # records due within the payload horizon (held whole), without and with one.
        report.figures["backlog with ids"] = _load_backlog(run, store, backlog, seq, ids=True)
        seq += backlog
        for name, ids in (("near-term backlog", False), ("near-term backlog with ids", True)):
            report.figures[name] = _load_backlog(run, store, backlog, seq, ids=ids, after=NEAR)
            seq += backlog
        bridge.stop()
        expected = read_expected(run)
        for phase, seqs in phases.items():
            account = settled(run, expected, seqs, report, f"precision {phase}")
            report.figures[f"precision {phase}"] = {
                "rate_per_s": rate,
                "seconds": seconds,
                "records": count,
                "early": len(account.early),
                "lost": len(account.lost),
                "duplicates": account.duplicates,
                "ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
                "consumer_lateness_ms": lateness_figures(account.lateness_ms),
            }
            report.series[f"precision {phase}"] = {
                "ack": account.stamp_lateness_ms,
                "consumer": account.lateness_ms,
            }
        base = report.figures["precision without backlog"]["ack_lateness_ms"]["p99"]
        with_ = report.figures["precision with backlog"]["ack_lateness_ms"]["p99"]
        report.figures["backlog"]["p99_ratio"] = with_ / max(1, base)
    finally:
        store.client.close()
        run.close()


def _load_backlog(
    run: Run,
    store: Store,
    count: int,
    first_seq: int,
    *,
    ids: bool = False,
    after: bytes = FAR_FUTURE,
) -> dict[str, Any]:
    """Produce ``count`` records due ``after`` (30 days: kept as references), with a 31-byte
    delay-id each if ``ids``; measure Redis's memory once all are stored."""
    before = used_memory(store)
    progress = Progress(store, run.delay)
    # By the watermarks, not by what Redis holds: records of an earlier phase may still be
    # leaving Redis (acknowledgements are applied once per tick), which the count would subtract.
    ingested_before = progress.sample()[1]
    header: Headers = [(H_TARGET_TOPIC, run.target.encode()), (H_AFTER, after)]
    records = [
        Record(
            [*header, *([(H_ID, (b"reminder-%d" % i).rjust(31, b"0"))] if ids else [])],
            key=b"k%d" % (i % 997),
        )
        for i in range(count)
    ]
    started = time.monotonic()
    finished(produce(run, records, float("inf"), first_seq=first_seq), 900)
    progress.start().wait(lambda i, s: i >= ingested_before + count, 900, "backlog stored")
    progress.stop()
    seconds = time.monotonic() - started
    grown = used_memory(store) - before
    payload = record_size(b"k1", value_of(first_seq), records[0].headers)
    return {
        "records": count,
        "seconds_to_store": round(seconds, 1),
        "redis_bytes_per_record": grown / count,
        "payload_bytes": payload,
        "overhead_bytes": grown / count - payload,
    }


def used_memory(store: Store) -> int:
    """Redis's ``used_memory``."""
    return int(cast(dict[str, Any], store.client.info("memory"))["used_memory"])


# ---------------------------------------------------------------- 5: catch-up


def catch_up(servers: Servers, workdir: Path, count: int, live_rate: float, report: Report) -> None:
    """``count`` records come due while the bridge is stopped; it is started again with live
    traffic (delays uniform in 1-3 s) arriving: drain time, lateness of the drained records, and
    of the live ones that fall due during the drain."""
    run = Run(servers, workdir, "catchup", label="bench", target_config=ACK_STAMPS)
    store = Store(servers.redis(), run.prefix)
    try:
        bridge = ready_bridge(run)
        lead_ms = 3000 + count // 10  # time to produce and store them all first
        due_ms = now_ms() + lead_ms
        header: Headers = [(H_TARGET_TOPIC, run.target.encode())]
        rng = random.Random(7)
        records = [
            Record(
                [*header, (H_DELIVER_AT, str(due_ms + rng.randint(0, 2000)).encode())],
                key=b"k%d" % (i % 997),
            )
            for i in range(count)
        ]
        progress = Progress(store, run.delay).start()
        finished(produce(run, records, float("inf")), 600)
        progress.wait(lambda i, s: s >= count, 600, "catch-up backlog stored")
        if now_ms() > due_ms:
            report.problems.append("catch-up: storing the backlog took longer than its lead")
        bridge.stop()
        stopped_ms = now_ms()
        time.sleep(max(0.0, (due_ms + 3000 - now_ms()) / 1000))  # all come due while stopped
        restarted_ms = now_ms()
        bridge = ready_bridge(run)
        ready_ms = now_ms()
        live_seconds = max(5.0, count / max(live_rate, 1) / 2)
        live = steady(int(live_rate * live_seconds), run.target, 3000, seed=11, min_delay_ms=1000)
        finished(produce(run, live, live_rate, first_seq=count), live_seconds * 3 + 60)
        wait_delivered(run, range(count + len(live)), 300)
        progress.stop()
        bridge.stop()
        expected = read_expected(run)
        drained = settled(run, expected, range(count), report, "catch-up backlog")
        seen = run.checker.delivered
        drain_end = max(min(g.seen_ms for g in seen[s]) for s in range(count))
        drain_start = min(min(g.seen_ms for g in seen[s]) for s in range(count))
        during = {
            s: e
            for s, e in expected.items()
            if s >= count and e.due_ms is not None and e.due_ms <= drain_end
        }
        live_account = settle(run.checker, during, horizon_ms=now_ms())
        check(report, "catch-up live", live_account)
        on_time = sum(1 for v in live_account.stamp_lateness_ms if v <= 250)
        report.figures["catch-up"] = {
            "records": count,
            "stopped_s": round((restarted_ms - stopped_ms) / 1000, 1),
            "start_to_ready_s": round((ready_ms - restarted_ms) / 1000, 2),
            "drain_s_from_start": round((drain_end - restarted_ms) / 1000, 2),
            "drain_s_from_first_delivery": round((drain_end - drain_start) / 1000, 2),
            "drain_per_s": count / max(1e-3, (drain_end - drain_start) / 1000),
            "drained_lateness_ms": lateness_figures(drained.stamp_lateness_ms),
            "live_rate_per_s": live_rate,
            "live_due_during_drain": len(during),
            "live_on_time_250ms": on_time,
            "live_lateness_ms": lateness_figures(live_account.stamp_lateness_ms),
        }
        report.series["catch-up"] = {
            "backlog": sorted(
                (min(g.seen_ms for g in seen[s]) - restarted_ms) / 1000 for s in range(count)
            ),
            "live": [
                (e.due_ms - restarted_ms, min(g.seen_ms for g in seen[s]) - e.due_ms)
                for s, e in during.items()
                if s in seen and e.due_ms is not None
            ],
        }
    finally:
        store.client.close()
        run.close()


# ---------------------------------------------------------------- 6: Redis Cluster and standalone


def redis_modes(
    servers: Servers,
    workdir: Path,
    count: int,
    seconds: float,
    report: Report,
    *,
    max_delay_ms: int,
) -> None:
    """The same two loads on the standalone Redis and on a 3-master Redis Cluster (3 replicas,
    ``scripts/services up redis-cluster``), one after the other in this run: ``count`` records due
    at once (end-to-end rate), then ``seconds`` of records due in 1 s to ``max_delay_ms`` at half
    the standalone rate (lateness at the acknowledgement). Figures per mode and the
    cluster/standalone ratios."""
    info = servers.up_set("redis-cluster")
    try:
        cluster = {"redis__url": info["url"], "redis__cluster": True}
        alone = _one_mode(
            servers,
            workdir,
            "standalone",
            overrides={},
            count=count,
            seconds=seconds,
            rate=None,
            report=report,
            max_delay_ms=max_delay_ms,
        )
        rate = alone["precision_rate_per_s"]  # the same load on both
        on_cluster = _one_mode(
            servers,
            workdir,
            "cluster",
            overrides=cluster,
            count=count,
            seconds=seconds,
            rate=rate,
            report=report,
            max_delay_ms=max_delay_ms,
        )
    finally:
        servers.down_set("redis-cluster")
    report.figures["redis modes"] = {
        "standalone": alone,
        "cluster": on_cluster,
        "end_to_end_ratio": on_cluster["end_to_end_per_s"] / alone["end_to_end_per_s"],
        "p99_ratio": on_cluster["ack_lateness_ms"]["p99"] / max(1, alone["ack_lateness_ms"]["p99"]),
    }


def _one_mode(
    servers: Servers,
    workdir: Path,
    mode: str,
    *,
    overrides: dict[str, object],
    count: int,
    seconds: float,
    rate: float | None,
    report: Report,
    max_delay_ms: int,
) -> dict[str, Any]:
    run = Run(
        servers,
        workdir,
        f"redis-{mode}",
        label="bench",
        target_config=ACK_STAMPS,
        watch=False,
        overrides=overrides,
    )
    url = cast(str, overrides.get("redis__url", servers.redis_url))
    client = RedisCluster.from_url(url) if overrides else servers.redis()  # type: ignore[no-untyped-call]
    store = Store(client, run.prefix)
    try:
        finished(produce(run, due_now(count, run.target), float("inf")))
        progress = Progress(store, run.delay).start()
        bridge = run.bridge()
        progress.wait(lambda i, s: i >= count and s == 0, 600, f"{mode}: all acknowledged")
        progress.stop()
        started = progress.first(lambda i, s: i > 0)
        acked = progress.first(lambda i, s: i >= count and s == 0)
        end_to_end = count / max(1e-3, (acked - started) / 1000)
        rate = rate or end_to_end / 2
        run.checker.start()
        late = int(rate * seconds)
        records = steady(late, run.target, max_delay_ms, seed=count, min_delay_ms=1000)
        finished(produce(run, records, rate, first_seq=count), seconds * 3 + 60)
        wait_delivered(run, range(count + late), 300)
        bridge.stop()
        expected = read_expected(run)
        settled(run, expected, range(count), report, f"redis {mode}: due at once")
        account = settled(run, expected, range(count, count + late), report, f"redis {mode}")
        return {
            "records": count,
            "end_to_end_per_s": end_to_end,
            "precision_rate_per_s": rate,
            "precision_records": late,
            "early": len(account.early),
            "ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
        }
    finally:
        client.close()
        run.close()


# ---------------------------------------------------------------- 7: recovery after a SIGKILL

# The bridge's own defaults (session.timeout.ms, egress.lease 30 s), not the chaos harness's
# shortened ones: recovery must not rest on short timeouts.
DEFAULT_TIMEOUTS: dict[str, object] = {"kafka__consumer": {}, "egress__lease": "30s"}
SESSION_TIMEOUT_S = int(consumer_settings(from_mapping({}, env={}))["session.timeout.ms"]) / 1000


def recovery(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    rate: float,
    seconds: float,
    session_ms: int | None = None,
) -> None:
    """Steady load at ``rate`` (delays uniform in 1-3 s) for ``seconds``; half-way through a
    bridge is SIGKILLed. ``restart``: one replica, started again at once under its instance id.
    ``takeover``: two replicas, the killed one stays dead and the other takes its partitions
    over. The baseline, in the same run: the restart as a dynamic member (no instance id), which
    waits for its dead self's session. Figures: from the kill until every record due by then
    was acknowledged on its target (the records the dead process held in flight), and the
    lateness of the records due in the 10 s after the kill."""
    seconds = max(seconds, 4.0)  # records due (1 s at least) and in flight at the kill
    cases = (
        ("restart", 1, True, "pod"),
        ("restart, dynamic member", 1, True, ""),
        ("takeover", 2, False, "pod"),
    )
    overrides = dict(DEFAULT_TIMEOUTS)
    if session_ms is not None:
        heartbeat = min(3000, session_ms // 3)
        overrides["kafka__consumer"] = {
            "session.timeout.ms": str(session_ms),
            "heartbeat.interval.ms": str(heartbeat),
        }
    for name, replicas, restart, instance in cases:
        run = Run(
            servers,
            workdir,
            name.split(",")[0],
            label="bench",
            target_config=ACK_STAMPS,
            overrides=overrides,
        )
        ids = [f"{instance}-{i}" if instance else "" for i in range(replicas)]
        try:
            bridges = [ready_bridge(run, ids[i]) for i in range(replicas)]
            count = int(rate * seconds)
            workload = produce(
                run, steady(count, run.target, 3000, seed=replicas, min_delay_ms=1000), rate
            )
            time.sleep(seconds / 2)  # the fault's moment, not a synchronisation
            killed_ms = now_ms()
            bridges[0].kill()
            if restart:
                bridges[0] = run.bridge(ids[0])
            finished(workload, seconds * 3 + 60)
            wait_delivered(run, range(count), 120)
            for bridge in bridges:
                bridge.stop()
            expected = read_expected(run)
            account = settled(run, expected, range(count), report, name)
            first = {
                s: min(g.timestamp_ms for g in got) for s, got in run.checker.delivered.items()
            }
            due_by_kill = [
                s for s, e in expected.items() if e.due_ms is not None and e.due_ms <= killed_ms
            ]
            window = range(killed_ms + 1, killed_ms + 10_001)
            after = [
                first[s] - e.due_ms
                for s, e in expected.items()
                if e.due_ms is not None and e.due_ms in window
            ]
            report.figures[name] = {
                "rate_per_s": rate,
                "records": count,
                "replicas": replicas,
                "lost": len(account.lost),
                "early": len(account.early),
                "duplicates": account.duplicates,
                "kill_to_last_due_acked_s": round(
                    max(0, max((first[s] for s in due_by_kill), default=0) - killed_ms) / 1000, 2
                ),
                "due_after_kill_lateness_ms": lateness_figures(after),
            }
        finally:
            run.close()


# ---------------------------------------------------------------- 8: what a record costs


STEADY_RATE = 2000.0  # records/s: a moderate steady load, where per-record costs show
COALESCING_OFF: dict[str, object] = {
    "egress__tick": "0ms",
    "ingress__linger": "0ms",
    "ingress__hold": "0ms",
    "egress__ahead": "0ms",
}


def steady_cost(
    servers: Servers, workdir: Path, report: Report, *, seconds: float, max_delay_ms: int
) -> None:
    """2,000 records/s with delays uniform in 1 s to ``max_delay_ms``, twice in this run: with
    the claim tick, claims ahead, ingest linger and hold switched off (the baseline: a Redis call
    for every due millisecond), then with the defaults (see :func:`steady`)."""
    for name, overrides in (("coalescing off", COALESCING_OFF), ("defaults", {})):
        steady_load(
            servers,
            workdir,
            report,
            f"steady {name}",
            overrides,
            seconds=seconds,
            max_delay_ms=max_delay_ms,
        )
    off, on = report.figures["steady coalescing off"], report.figures["steady defaults"]
    report.figures["steady defaults"]["cpu_vs_off"] = on["cpu_ms_per_record"] / max(
        1e-9, off["cpu_ms_per_record"]
    )


def steady_load(
    servers: Servers,
    workdir: Path,
    report: Report,
    name: str,
    overrides: dict[str, object],
    *,
    seconds: float,
    max_delay_ms: int,
) -> None:
    """2,000 records/s with delays uniform in 1 s to ``max_delay_ms``, the bridge configured with
    ``overrides``: per record over ``seconds`` / 2 of steady state (from the longest delay and a
    second on, the load going on ``seconds`` / 2 after), the bridge's CPU time
    (/proc/<pid>/stat), Redis's (INFO cpu) and the Redis calls (script calls and the readiness
    probe's SET: INFO commandstats); lateness at the acknowledgement (the target's append time)
    and as the checker, a read_committed consumer, saw the record, over the whole run."""
    # The measurement starts once records fall due as fast as they arrive: before that the
    # bridge stores more records than it delivers, and dividing its CPU time by the records
    # delivered would overstate each one's cost (1.2-1.4x from 3 s in).
    steady_from_s = max_delay_ms / 1000 + 1
    run = Run(
        servers, workdir, "cost", label="bench", target_config=ACK_STAMPS, overrides=overrides
    )
    client = servers.redis()
    try:
        bridge = ready_bridge(run)
        count = int(STEADY_RATE * (steady_from_s + seconds))
        records = steady(count, run.target, max_delay_ms, seed=5, min_delay_ms=1000)
        workload = produce(run, records, STEADY_RATE)
        time.sleep(steady_from_s)  # the measurement window, not synchronisation
        before = _costs(client, bridge)
        time.sleep(seconds / 2)
        after = _costs(client, bridge)
        finished(workload, seconds * 3 + 60)
        wait_delivered(run, range(count), 120)
        bridge.stop()
        account = settled(run, read_expected(run), range(count), report, name)
        delivered = after["delivered"] - before["delivered"]
        per = {
            k: (after[k] - before[k]) / max(1, delivered)
            for k in ("bridge_cpu_s", "redis_cpu_s", "redis_calls")
        }
        report.figures[name] = {
            "rate_per_s": STEADY_RATE,
            "records": count,
            "measured_records": delivered,
            "bridge_cpu_ms_per_record": per["bridge_cpu_s"] * 1000,
            "redis_cpu_ms_per_record": per["redis_cpu_s"] * 1000,
            "cpu_ms_per_record": (per["bridge_cpu_s"] + per["redis_cpu_s"]) * 1000,
            "redis_calls_per_record": per["redis_calls"],
            # Where the bridge's share goes: µs per record by thread (db-egress, db-sender, …;
            # librdkafka's rdk:*), those under 0.5 µs left out.
            "threads_us_per_record": _per_thread(before, after, delivered),
            "early": len(account.early),
            "lost": len(account.lost),
            "duplicates": account.duplicates,
            "ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
            "seen_lateness_ms": lateness_figures(account.lateness_ms),
        }
    finally:
        client.close()
        run.close()


def redis_cpu_s(client: Any) -> float:
    """Redis's CPU time so far, user and system (``INFO cpu``)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _per_thread(
    before: dict[str, float], after: dict[str, float], delivered: float
) -> dict[str, float]:
    """Each thread name's CPU µs per record delivered between two :func:`_costs`, most first."""
    per = {
        k.removeprefix("thread:"): (v - before.get(k, 0.0)) * 1e6 / max(1.0, delivered)
        for k, v in after.items()
        if k.startswith("thread:")
    }
    return {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.5}


def _costs(client: Any, bridge: Bridge) -> dict[str, float]:
    """The bridge's CPU seconds (in all, and per thread name as ``thread:<name>``), Redis's, the
    Redis calls so far and the records delivered."""
    stats = client.info("commandstats")
    calls = sum(
        int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval", "set")
    )
    return {
        **{f"thread:{n}": s for n, s in bridge.thread_cpu_seconds().items()},
        "bridge_cpu_s": bridge.cpu_seconds(),
        "redis_cpu_s": redis_cpu_s(client),
        "redis_calls": float(calls),
        "delivered": metric(bridge, "delay_bridge_delivered_total"),
    }
