"""The far-future scenarios: records kept in Redis as references, their payload read back from
Kafka shortly before they are due (docs/reliability.md, "Far-future records").

- ``held``: N records due in 30 days through the bridge with its defaults: Redis memory and the
  bridge's RSS once all are stored, then a restart with all of them held: from the process start
  to the first record due meanwhile acknowledged.
- ``contiguous``: N records due at one instant, produced one after the other (contiguous
  offsets): how fast they are read back and stored whole, then delivered.
- ``scattered``: N records due at random over a spread (offsets uncorrelated with due times),
  with the default horizon, fetch-ahead and bucket width scaled to the spread as the defaults
  stand to one hour: every bucket holds the share of the log it holds at the defaults, so the
  Kafka bytes read per record are the hour's; the read-back must go 3600 / spread times faster.
  The records fall due at N / spread per second: ack lateness of records read back.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.scenarios import (
    ACK_STAMPS,
    FAR_FUTURE,
    Progress,
    Report,
    finished,
    lateness_figures,
    produce,
    read_expected,
    ready_bridge,
    settled,
    used_memory,
    wait_delivered,
)
from bridge.message import H_AFTER, H_DELIVER_AT, H_ID, H_TARGET_TOPIC, Headers
from bridge.store import Store
from testbed.checker import Expected, settle
from testbed.harness import Bridge, metric
from testbed.run import Run
from testbed.scenarios import references_waiting
from testbed.servers import Servers
from testbed.workload import Record, now_ms

KEYS = 997  # distinct keys, spread over the partitions
PROBES = 100  # records due while the bridge is stopped, in the restart case
HOUR_S = 3600.0
HORIZON_S, FETCH_AHEAD_S = 3600.0, 120.0  # the defaults, which the scattered case scales


def _keyed(headers: Headers, count: int) -> list[Record]:
    """``count`` records with ``headers`` and one of KEYS keys each (shared objects: a list of
    ten million costs its pointers only)."""
    base = [Record(headers, key=b"k%d" % i) for i in range(KEYS)]
    return (base * (count // KEYS + 1))[:count]


def held(
    servers: Servers,
    workdir: Path,
    report: Report,
    count: int,
    value_size: int,
    *,
    id_bytes: int = 0,
) -> None:
    """``count`` records of ``value_size`` B due in 30 days, the bridge's defaults (with
    ``id_bytes``, a delay-id of that length each): memory once all are stored; then the restart
    case."""
    name = f"far-future held {count:,} x {value_size} B"
    if id_bytes:
        name += f" with {id_bytes}-byte delay-ids"
    run = Run(servers, workdir, "far-held", label="bench", target_config=ACK_STAMPS, watch=False)
    store = Store(servers.redis(), run.prefix)
    try:
        bridge = ready_bridge(run)
        redis_before, rss_before = used_memory(store), bridge.memory()
        header: Headers = [(H_TARGET_TOPIC, run.target.encode()), (H_AFTER, FAR_FUTURE)]
        started = time.monotonic()
        records = (
            _keyed(header, count)
            if not id_bytes
            else [
                Record(
                    [*header, (H_ID, (b"reminder-%d" % i).rjust(id_bytes, b"0"))],
                    key=b"k%d" % (i % KEYS),
                )
                for i in range(count)
            ]
        )
        workload = produce(run, records, float("inf"), value_size=value_size)
        progress = Progress(store, run.delay).start()
        progress.wait(lambda i, s: i >= count, 3600, "far-future records stored")
        seconds = time.monotonic() - started
        finished(workload)
        references = references_waiting(store, run.delay)
        if references != count:
            report.problems.append(f"{name}: {references:,} of {count:,} kept as references")
        grown, rss = used_memory(store) - redis_before, bridge.memory()
        figures: dict[str, Any] = {
            "records": count,
            "value_bytes": value_size,
            "references": references,
            "delay_id_bytes": id_bytes,
            "seconds_to_store": round(seconds, 1),
            "stored_per_s": count / seconds,
            "redis_bytes": grown,
            "redis_bytes_per_record": grown / count,
            "bridge_rss_bytes": rss,
            "bridge_rss_before_bytes": rss_before,
            "total_mb": (grown + rss) / 1e6,
        }
        figures.update(_restart(run, store, progress, bridge, count))
        report.figures[name] = figures
    finally:
        store.client.close()
        run.close()


def _restart(
    run: Run, store: Store, progress: Progress, bridge: Bridge, first_seq: int
) -> dict[str, Any]:
    """PROBES records due a few seconds out are stored; the bridge is stopped until they are due
    and started again: from the process start to the first (and last) of them acknowledged."""
    due = now_ms() + 4000
    header: Headers = [(H_TARGET_TOPIC, run.target.encode()), (H_DELIVER_AT, b"%d" % due)]
    stored_before = progress.sample()[2]
    finished(produce(run, _keyed(header, PROBES), float("inf"), first_seq=first_seq))
    progress.wait(lambda i, s: s >= stored_before + PROBES, 60, "probes stored")
    if now_ms() >= due:
        raise RuntimeError("the probes were due before the bridge was stopped: lead too short")
    bridge.stop()
    time.sleep(max(0.0, (due + 1000 - now_ms()) / 1000))  # until they are due, not a sync
    run.checker.start()
    started_ms = now_ms()
    bridge = ready_bridge(run)
    ready_ms = now_ms()
    seqs = range(first_seq, first_seq + PROBES)
    wait_delivered(run, seqs, 60)
    expected = {s: Expected(offset="", produced_ms=0, due_ms=due) for s in seqs}
    account = settle(run.checker, expected, horizon_ms=now_ms())
    acked = sorted(min(g.timestamp_ms for g in run.checker.delivered[s]) for s in seqs)
    progress.stop()
    bridge.stop()
    return {
        "restart_start_to_ready_s": (ready_ms - started_ms) / 1000,
        "restart_start_to_first_due_acked_s": (acked[0] - started_ms) / 1000,
        "restart_start_to_last_due_acked_s": (acked[-1] - started_ms) / 1000,
        "restart_probes_lost": len(account.lost),
        "restart_probes_early": len(account.early),
    }


def contiguous(
    servers: Servers, workdir: Path, report: Report, count: int, value_size: int
) -> None:
    """``count`` records due at one instant, produced one after the other: read-back rate."""
    fetch_ahead_s = max(2.0, count / 25_000)  # twice the time the target rate needs
    horizon_s = fetch_ahead_s + 4  # buckets of 2 s

    def records(target: Headers, first_due_ms: int) -> list[Record]:
        return _keyed([*target, (H_DELIVER_AT, b"%d" % first_due_ms)], count)

    _read_back(
        servers,
        workdir,
        report,
        name=f"read-back contiguous {count:,} x {value_size} B",
        count=count,
        horizon_s=horizon_s,
        fetch_ahead_s=fetch_ahead_s,
        make=records,
        value_size=value_size,
    )


def scattered(
    servers: Servers, workdir: Path, report: Report, count: int, *, spread_s: float, value_size: int
) -> None:
    """``count`` records due at random over ``spread_s``, offsets uncorrelated with due times,
    horizon and fetch-ahead scaled to the spread as the defaults are to an hour."""
    scale = spread_s / HOUR_S
    rng = random.Random(3)

    def records(target: Headers, first_due_ms: int) -> list[Record]:
        return [
            Record(
                [
                    *target,
                    (H_DELIVER_AT, b"%d" % (first_due_ms + rng.randrange(int(spread_s * 1000)))),
                ],
                key=b"k%d" % (i % KEYS),
            )
            for i in range(count)
        ]

    name = f"read-back scattered {count:,} x {value_size} B over {spread_s:.0f} s"
    figures = _read_back(
        servers,
        workdir,
        report,
        name=name,
        count=count,
        horizon_s=HORIZON_S * scale,
        fetch_ahead_s=FETCH_AHEAD_S * scale,
        make=records,
        value_size=value_size,
    )
    figures.update(spread_s=spread_s, due_per_s=count / spread_s, hour_speed_up=1 / scale)


def _read_back(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    name: str,
    count: int,
    horizon_s: float,
    fetch_ahead_s: float,
    make: Callable[[Headers, int], list[Record]],
    value_size: int,
) -> dict[str, Any]:
    """A bridge with ``horizon_s`` and ``fetch_ahead_s``; the ``count`` records ``make(target
    header, first due ms)`` builds — the first due once all can be stored past the horizon — are
    produced, read back and delivered. The figures of the read-back and of the deliveries go to
    ``report`` under ``name`` and are returned (to add to)."""
    overrides: dict[str, object] = {
        "store__payload_horizon": f"{int(horizon_s * 1000)}ms",
        "store__fetch_ahead": f"{int(fetch_ahead_s * 1000)}ms",
    }
    run = Run(
        servers,
        workdir,
        "far-" + name.split()[1],
        label="bench",
        target_config=ACK_STAMPS,
        watch=False,
        overrides=overrides,
    )
    store = Store(servers.redis(), run.prefix)
    try:
        bridge = ready_bridge(run)
        lead_ms = int((horizon_s + count / 20_000 + 5) * 1000)  # to produce and store them all
        records = make([(H_TARGET_TOPIC, run.target.encode())], now_ms() + lead_ms)
        progress = Progress(store, run.delay).start()
        workload = produce(run, records, float("inf"), value_size=value_size)
        progress.wait(lambda i, s: i >= count, 900, f"{name}: stored")
        finished(workload)
        references = references_waiting(store, run.delay)
        if references != count:
            report.problems.append(
                f"{name}: {count - references:,} of {count:,} stored whole, not "
                "as references: the lead was too short"
            )
        deadline = time.monotonic() + 3600
        while references_waiting(store, run.delay) and time.monotonic() < deadline:
            time.sleep(0.05)
        run.checker.start()
        wait_delivered(run, range(count), 3600)
        fetched = metric(bridge, "delay_bridge_read_back_fetched_total")
        fetched_bytes = metric(bridge, "delay_bridge_read_back_fetched_bytes_total")
        read_back = metric(bridge, 'delay_bridge_read_back_total{result="stored"}')
        late = metric(bridge, 'delay_bridge_read_back_seconds_ahead_bucket{le="0.0"}')
        within_1s = metric(bridge, 'delay_bridge_read_back_seconds_ahead_bucket{le="1.0"}')
        progress.stop()
        bridge.stop()
        expected = read_expected(run)
        account = settled(run, expected, range(count), report, name)
        # Read-back progress from Redis: records stored whole (read back) and not yet delivered.
        first = progress.first(lambda i, s: i >= count and s > 0)
        peak = max(s for _, i, s in progress.samples if i >= count)
        done = progress.first(lambda i, s: i >= count and s >= peak)
        due = sorted(e.due_ms for e in expected.values() if e.due_ms is not None)
        figures = {
            "records": count,
            "value_bytes": value_size,
            "references": references,
            "read_back": read_back,
            "read_back_late": late,
            "read_back_within_1s": within_1s,
            "read_back_per_s": peak / max(1e-3, (done - first) / 1000) if peak == count else None,
            "fetched_per_record": fetched / max(1.0, read_back),
            "fetched_bytes_per_record": fetched_bytes / max(1.0, read_back),
            "first_due_minus_last_read_back_s": (due[0] - done) / 1000 if peak == count else None,
            "lost": len(account.lost),
            "early": len(account.early),
            "duplicates": account.duplicates,
            "ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
            "fetch_ahead_s": fetch_ahead_s,
            "payload_horizon_s": horizon_s,
        }
        report.figures[name] = figures
        return figures
    finally:
        store.client.close()
        run.close()
