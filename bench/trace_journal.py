"""The trace scenario: how long ``delay-bridge trace`` takes to tell the fate of a record delivered
a day ago, on a journal holding N entries (10,000,000 in the full run) written over two days.

The journal is written here, not by a bridge (a bridge would take hours to deliver that many):
batches of 500 entries of one delay-topic partition, in the bridge's format and keyed as it keys
them, stamped evenly over the two days, so every entry sits on the journal partition the traced
record's does — the worst case for the search. The traced records are two real delay-topic
records, due a day ago: one delivered 4 ms after its due time, one an hour after (a bridge that
was down for that hour; the search then reads the hour of entries in between). Timed as an
operator runs it, the command's process from start to exit, next to the process of
``delay-bridge --version`` in the same run (interpreter start and imports: what no search can
save). Traced by a delay-id of the caller's, with no origin to go by, the search reads every
journal partition from ``--since`` on: measured once with ``--since 25h``.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.scenarios import Report
from bridge.journal import Entry, Fate, encode_entries
from bridge.kafka import produce
from bridge.message import H_DELIVER_AT, H_ID, H_TARGET_TOPIC
from testbed.harness import bridge_env
from testbed.run import Run
from testbed.servers import Servers
from testbed.services import ROOT
from testbed.workload import now_ms

PER_RECORD = 500  # entries per journal record: a busy acknowledgement's worth
SPAN_MS = 2 * 24 * 3600 * 1000
DAY_MS = 24 * 3600 * 1000
HOUR_MS = 3600 * 1000
RUNS = 3  # each command is timed this many times; the median is reported
TRACED_OFFSET = 10**9  # the traced deliveries' target offsets: no filler entry's (< 10**8)


def trace(servers: Servers, workdir: Path, report: Report, entries: int) -> None:
    """Fill a journal with ``entries`` and time ``trace`` on the records delivered a day ago."""
    run = Run(servers, workdir, "trace", label="bench", watch=False)
    try:
        run.recreate(run.journal, {"compression.type": "zstd"})
        due = now_ms() - DAY_MS
        _produce_traced(run, due)
        written = _fill(run, entries, due)
        env = bridge_env(servers.bootstrap, servers.redis_url)
        env["DELAY_BRIDGE_CONFIG"] = str(run.config_file)
        baseline = _timed(env, ["--version"], RUNS)[0]
        figures: dict[str, Any] = {"entries": written, "process_start_s": baseline}
        stored = _stored_bytes(servers, run.journal)
        if stored:
            figures["stored_bytes_per_entry"] = round(stored / written, 1)
        for label, offset in (("on_time", 0), ("hour_late", 1)):
            seconds, out = _timed(
                env, ["trace", "--origin", f"{run.delay}:0:{offset}", "--json"], RUNS
            )
            _check(report, label, out, TRACED_OFFSET + offset)
            figures[f"{label}_s"] = seconds
        seconds, out = _timed(env, ["trace", "--id", "reminder-0", "--since", "25h", "--json"], 1)
        _check(report, "by caller id", out, TRACED_OFFSET)
        figures["by_id_since_25h_s"] = seconds
        report.figures[f"trace, {written:,} journal entries"] = figures
    finally:
        run.close()


def _produce_traced(run: Run, due: int) -> None:
    """The two traced records: delay-topic partition 0, offsets 0 and 1, due ``due``."""
    producer = Producer({"bootstrap.servers": run.servers.bootstrap})
    for n in range(2):
        headers = [
            (H_TARGET_TOPIC, run.target.encode()),
            (H_DELIVER_AT, str(due).encode()),
            (H_ID, f"reminder-{n}".encode()),
        ]
        produce(
            producer,
            run.delay,
            value=b"v",
            key=b"k",
            partition=0,
            headers=headers,
            timestamp=due - 1,
        )
        producer.flush(30)


def _fill(run: Run, entries: int, due: int) -> int:
    """Write ``entries`` filler entries (and the two traced ones) to the journal; how many."""
    producer = Producer(
        {
            "bootstrap.servers": run.servers.bootstrap,
            "compression.type": "zstd",
            "linger.ms": "50",
            "batch.size": "4000000",
            "message.max.bytes": "4000000",
            "partitioner": "murmur2_random",
        }
    )
    written = 0
    for stamp, batch in _batches(run.target, entries, due):
        key, value, headers = encode_entries(run.delay, 0, batch)
        produce(producer, run.journal, value=value, key=key, headers=headers, timestamp=stamp)
        producer.poll(0)
        written += len(batch)
    if producer.flush(120) != 0:
        raise RuntimeError("the journal could not be written")
    return written


def _batches(target: str, entries: int, due: int) -> Iterator[tuple[int, list[Entry]]]:
    """(timestamp, entries) of each journal record, stamped evenly over SPAN_MS before now; the
    traced records' deliveries in the records written 4 ms and an hour after ``due``."""
    records = max(1, entries // PER_RECORD)
    start = now_ms() - SPAN_MS
    traced = {0: due + 4, 1: due + HOUR_MS}
    rng = random.Random(7)
    targets = [f"{target}-{n}" for n in range(8)]
    for i in range(records):
        stamp = start + i * SPAN_MS // records
        first = 2 + i * PER_RECORD
        # As varied as real entries, so the broker's compression is not flattered: a caller's
        # random id or the default one, delays of up to a day, eight targets, their offsets.
        batch = [
            Entry(
                Fate.DELIVERED,
                o,
                f"{rng.getrandbits(64):016x}" if o % 2 else f"{target}:0:{o}",
                stamp - rng.randrange(DAY_MS),
                stamp + rng.randrange(20),
                targets[o % 8],
                o % 6,
                rng.randrange(10**8),
            )
            for o in range(first, first + PER_RECORD)
        ]
        for offset, at in list(traced.items()):
            if at <= stamp:
                batch.append(
                    Entry(
                        Fate.DELIVERED,
                        offset,
                        f"reminder-{offset}",
                        due,
                        at,
                        target,
                        0,
                        TRACED_OFFSET + offset,
                    )
                )
                del traced[offset]
        yield stamp, batch


def _stored_bytes(servers: Servers, topic: str) -> int:
    """The bytes the local broker's log segments of ``topic`` hold (0 when its log directory is
    not where ``scripts/services`` puts it)."""
    data = servers.state_dir / "kafka" / "data"
    return sum(f.stat().st_size for f in data.glob(f"{topic}-*/*.log"))


def _timed(env: dict[str, str], args: list[str], runs: int) -> tuple[float, dict[str, Any]]:
    """The median wall time of ``delay-bridge ARGS`` over ``runs``, and its last JSON output."""
    times: list[float] = []
    out: dict[str, Any] = {}
    for _ in range(runs):
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "bridge", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        times.append(time.monotonic() - started)
        if proc.returncode != 0:
            raise RuntimeError(f"delay-bridge {' '.join(args)}: {proc.stderr.strip()[-500:]}")
        out = json.loads(proc.stdout) if proc.stdout.startswith("{") else {}
    return round(statistics.median(times), 3), out


def _check(report: Report, label: str, out: dict[str, Any], offset: int) -> None:
    delivered = out.get("delivered") or {}
    if out.get("fate") != "delivered" or delivered.get("offset") != offset:
        report.problems.append(f"trace ({label}) did not find the delivery: {out}")
