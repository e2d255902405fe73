"""The rebuild at scale: Redis lost while it holds millions of waiting records.

``count`` records wait (nine in ten far-future, kept as references; one in ten due within the
payload horizon, held whole), then a thousandth as many probes (10,000 at most) due over the
seconds after the loss (PROBE_SPREAD_S at most, one per 30,000 records);
then every key of the bridge's prefix is deleted, as a Redis that lost its data would have it.
The bridge (its defaults, the journal on) finds each shard's state missing and reads the delay
topic again from the rebuild point its commit names (offset 0: nothing was delivered). Measured:
from the loss until each shard's watermark is back at its log end, the records stored again
(every reference and whole record, counted), the probes' lateness (they fall due during the
rebuild and are the last records of the log), 0 lost, 0 delivered twice, and the ceiling: the
same topic read by a bare consumer with the bridge's consumer settings, nothing else done.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.scenarios import (
    ACK_STAMPS,
    FAR_FUTURE,
    NEAR,
    Progress,
    Report,
    finished,
    lateness_figures,
    produce,
    ready_bridge,
    settled,
    wait_delivered,
)
from bridge.config import consumer_settings, from_mapping
from bridge.message import H_AFTER, H_DELIVER_AT, H_TARGET_TOPIC, Headers
from bridge.store import Shard, Store
from testbed.checker import Expected, log_end
from testbed.run import PARTITIONS, Run
from testbed.scenarios import references_waiting
from testbed.services import holds_within
from testbed.workload import Record, now_ms

KEYS = 997  # distinct keys, spread over the partitions
MAX_PROBES = 10_000
PROBE_SPREAD_S = 300.0  # at most: the probes fall due over the goal for the rebuild
VALUE_BYTES = 100


def rebuild(servers: Any, workdir: Path, report: Report, count: int) -> None:
    """See the module docstring; figures under ``rebuild <count>``."""
    name = f"rebuild {count:,}"
    run = Run(servers, workdir, "rebuild", label="bench", target_config=ACK_STAMPS, watch=False)
    store = Store(servers.redis(), run.prefix)
    shards = [Shard(run.delay, p) for p in range(PARTITIONS)]
    try:
        bridge = ready_bridge(run)
        whole, probe_count = count // 10, max(100, min(MAX_PROBES, count // 1000))
        target: Headers = [(H_TARGET_TOPIC, run.target.encode())]
        far = [Record([*target, (H_AFTER, FAR_FUTURE)], key=b"k%d" % i) for i in range(KEYS)]
        near = [Record([*target, (H_AFTER, NEAR)], key=b"k%d" % i) for i in range(KEYS)]
        # Shared objects, mixed one in ten whole: a list of ten million costs its pointers only.
        records = [near[i % KEYS] if i % 10 == 0 else far[i % KEYS] for i in range(count)]
        started = time.monotonic()
        progress = Progress(store, run.delay).start()
        finished(produce(run, records, float("inf"), value_size=VALUE_BYTES), 3600)
        progress.wait(lambda i, s: i >= count, 3600, "the records stored")
        store_s = time.monotonic() - started
        # The probes: due from a few seconds after the loss on, produced last.
        lead_ms = 5000
        first_due = now_ms() + lead_ms
        rng = random.Random(5)
        spread_ms = int(min(PROBE_SPREAD_S, count / 30_000) * 1000) + 1
        dues = sorted(first_due + rng.randrange(spread_ms) for _ in range(probe_count))
        probes = [
            Record([*target, (H_DELIVER_AT, b"%d" % due)], key=b"p%d" % i)
            for i, due in enumerate(dues)
        ]
        finished(produce(run, probes, float("inf"), first_seq=count, value_size=VALUE_BYTES))
        progress.wait(lambda i, s: i >= count + probe_count, 120, "the probes stored")
        ends = _log_ends(run, shards)
        run.checker.start()
        if now_ms() >= first_due:
            report.problems.append(f"{name}: the probes came due before the loss")
        lost_ms = now_ms()
        deleted = _wipe(store, run.prefix)
        rebuilt = _wait_rebuilt(store, shards, ends, timeout_s=3600)
        done_ms = max(rebuilt.values())
        references = references_waiting(store, run.delay)
        seqs = range(count, count + probe_count)
        wait_delivered(run, seqs, spread_ms / 1000 + 600)
        expected = {
            count + i: Expected(offset="", produced_ms=0, due_ms=due) for i, due in enumerate(dues)
        }
        account = settled(run, expected, seqs, report, name)
        held_whole = _waiting_whole(store, shards)
        progress.stop()
        bridge.stop()
        others = len(run.checker.delivered) - len(seqs)
        if others:
            report.problems.append(f"{name}: {others:,} records due later delivered")
        if references != count - whole:
            report.problems.append(f"{name}: {references:,} of {count - whole:,} references")
        if held_whole != whole:
            report.problems.append(f"{name}: {held_whole:,} of {whole:,} whole records waiting")
        ceiling_s = _bare_read_s(run, ends)
        rebuild_s = (done_ms - lost_ms) / 1000
        report.figures[name] = {
            "records": count,
            "references": count - whole,
            "whole": whole,
            "probes": probe_count,
            "value_bytes": VALUE_BYTES,
            "partitions": PARTITIONS,
            "keys_deleted": deleted,
            "seconds_to_store": round(store_s, 1),
            "rebuild_s": round(rebuild_s, 1),
            "rebuild_s_by_partition": [round((rebuilt[s] - lost_ms) / 1000, 1) for s in shards],
            "rebuild_per_s": (count + probe_count) / rebuild_s,
            "bare_read_s": round(ceiling_s, 1),
            "bare_read_per_s": (count + probe_count) / ceiling_s,
            "rebuild_vs_bare_read": ceiling_s / rebuild_s,
            "references_after": references,
            "whole_after": held_whole,
            "probes_lost": len(account.lost),
            "probes_early": len(account.early),
            "probes_duplicates": account.duplicates,
            "later_records_delivered": others,
            "probe_lateness_ms": lateness_figures(account.stamp_lateness_ms),
        }
    finally:
        store.client.close()
        run.close()


def _log_ends(run: Run, shards: list[Shard]) -> dict[Shard, int]:
    consumer = Consumer({"bootstrap.servers": run.servers.bootstrap, "group.id": run.prefix})
    try:
        return {s: log_end(consumer, TopicPartition(s.topic, s.partition)) for s in shards}
    finally:
        consumer.close()


def _wipe(store: Store, prefix: str) -> int:
    """Delete every key of the bridge's prefix; how many there were."""
    keys = list(store.client.scan_iter(match=f"{prefix}:*", count=10_000))
    for i in range(0, len(keys), 1000):
        store.client.unlink(*keys[i : i + 1000])
    return len(keys)


def _wait_rebuilt(
    store: Store, shards: list[Shard], ends: dict[Shard, int], timeout_s: float
) -> dict[Shard, int]:
    """When (epoch ms) each shard's watermark was back at its log end, sampled every 50 ms."""
    done: dict[Shard, int] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(shards):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rebuilt {len(done)} of {len(shards)} shards")
        marks = store.inventory.watermarks([s for s in shards if s not in done])
        for shard, mark in marks.items():
            if mark >= ends[shard] - 1:
                done[shard] = now_ms()
        time.sleep(0.05)  # sampling the watermarks, not waiting on one condition
    return done


def _waiting_whole(store: Store, shards: list[Shard], settle_s: float = 30.0) -> int:
    """Records held whole in Redis (due index and in flight), references left out.

    A probe the checker saw delivered can still be in flight for a moment: its lease goes when
    the delivery report's ack lands. So the count waits (``settle_s`` at most) until nothing is
    overdue or in flight; what is left then is counted as held.
    """

    def settled() -> bool:
        backlog = store.backlog(shards, now_ms())
        return backlog.overdue + backlog.inflight == 0

    holds_within(settled, settle_s)
    backlog = store.backlog(shards, now_ms())
    return backlog.scheduled + backlog.overdue + backlog.inflight


def _bare_read_s(run: Run, ends: dict[Shard, int]) -> float:
    """Seconds a bare consumer with the bridge's consumer settings takes to read the delay
    topic up to ``ends``: the ceiling of a rebuild."""
    config = from_mapping({}, env={})
    settings = {**consumer_settings(config), "bootstrap.servers": run.servers.bootstrap}
    settings.update({"group.id": f"{run.prefix}-bare", "enable.auto.commit": "false"})
    consumer = Consumer(settings)
    try:
        consumer.assign([TopicPartition(s.topic, s.partition, 0) for s in ends])
        left = {s.partition: end for s, end in ends.items()}
        started = time.monotonic()
        while left:
            for message in consumer.consume(10_000, 1.0):
                partition, offset = message.partition(), message.offset()
                if (
                    partition is not None
                    and offset is not None
                    and offset + 1 >= left.get(partition, 1 << 62)
                ):
                    left.pop(partition)
            if time.monotonic() - started > 3600:
                raise TimeoutError("the bare read took over an hour")
        return time.monotonic() - started
    finally:
        consumer.close()
