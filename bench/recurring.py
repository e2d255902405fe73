"""Recurring schedules under load: many schedules firing beside a steady one-shot load.

``python -m bench recurring``: N schedules, each every E seconds, their first occurrences spread
evenly over one interval (so N / E occurrences fall due each second), produced before the bridge
starts, exactly once on; beside them 2,000 one-shot records a second. Over the measured window (S
seconds, from the second interval on), each occurrence expected is looked for on the target topic
by a ``read_committed`` consumer: lateness at the acknowledgement (the target's ``LogAppendTime``
less the occurrence's instant), occurrences missed, early and delivered twice. The one-shot records
go through the chaos harness's checker as every scenario's do.
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer

from bench.scenarios import (
    ACK_STAMPS,
    Report,
    finished,
    lateness_figures,
    produce,
    read_expected,
    ready_bridge,
    settled,
)
from bridge.kafka import headers_of
from bridge.kafka import produce as produce_one
from bridge.message import H_DELIVER_AT, H_EVERY, H_ID, H_OCCURRENCE, H_TARGET_TOPIC, Headers
from testbed.run import Run
from testbed.servers import Servers
from testbed.workload import CLIENT_LOG_LEVEL, now_ms, steady

ONE_SHOT_RATE = 2000.0
VALUE = b"x" * 100
SETTLE_S = 30.0  # how long after the window the last occurrences may still come in


def recurring(
    servers: Servers,
    workdir: Path,
    report: Report,
    *,
    schedules: int,
    every_s: int,
    seconds: float,
    max_delay_ms: int,
) -> None:
    """The scenario (see the module); figures ``recurring <N> every <E>s``."""
    name = f"recurring {schedules:,} every {every_s}s"
    run = Run(
        servers,
        workdir,
        "recurring",
        label="bench",
        target_config=ACK_STAMPS,
        overrides={"egress__exactly_once": True},
    )
    every_ms = every_s * 1000
    try:
        made = time.monotonic()
        first = _produce_schedules(run, schedules, every_ms)
        produced_s = time.monotonic() - made
        ready_bridge(run)
        start, end = first + every_ms, first + every_ms + int(seconds * 1000)
        count = int(ONE_SHOT_RATE * ((end - now_ms()) / 1000 + 1))
        one_shots = produce(run, steady(count, run.target, max_delay_ms, 7, 1000), ONE_SHOT_RATE)
        expected = _expected(schedules, first, every_ms, start, end)
        seen, twice = _occurrences(run, set(expected), end)
        finished(one_shots, seconds * 3 + 120)
        shots = read_expected(run)  # the one-shot records produced (all, unless it fell behind)
        account = settled(run, shots, range(len(shots)), report, name)
        late = [seen[key] - key[1] for key in expected if key in seen]
        missed = sum(1 for key in expected if key not in seen)
        early = sum(1 for key in expected if key in seen and seen[key] < key[1])
        report.figures[name] = {
            "schedules": schedules,
            "every_s": every_s,
            "occurrences_per_s": schedules / every_s,
            "one_shot_per_s": ONE_SHOT_RATE,
            "one_shots": len(shots),
            "produced_schedules_s": round(produced_s, 1),
            "expected": len(expected),
            "delivered": len(expected) - missed,
            "missed": missed,
            "early": early,
            "twice": twice,
            "ack_lateness_ms": lateness_figures(late),
            "one_shot_ack_lateness_ms": lateness_figures(account.stamp_lateness_ms),
        }
        for what, n in (("missed", missed), ("early", early), ("twice", twice)):
            if n:
                report.problems.append(f"{name}: {n} occurrences {what}")
    finally:
        run.close()


def _produce_schedules(run: Run, schedules: int, every_ms: int) -> int:
    """Produce the schedules, the first occurrences spread over one interval starting far enough
    ahead that all are stored first; returns that start (epoch ms)."""
    first = (now_ms() + 20_000 + schedules // 10) // 1000 * 1000
    producer = Producer(
        {
            "bootstrap.servers": run.servers.bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    for i in range(schedules):
        headers: Headers = [
            (H_TARGET_TOPIC, run.target.encode()),
            (H_EVERY, f"{every_ms}ms".encode()),
            (H_ID, b"s%d" % i),
            (H_DELIVER_AT, b"%d" % (first + i * every_ms // schedules)),
        ]
        produce_one(producer, run.delay, key=b"s%d" % i, value=VALUE, headers=headers)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the schedules were not all produced")
    return first


def _expected(
    schedules: int, first: int, every_ms: int, start: int, end: int
) -> list[tuple[str, int]]:
    """Every (delay-id, occurrence) due in ``start`` .. ``end``."""
    out = []
    for i in range(schedules):
        at = first + i * every_ms // schedules
        at += max(0, (start - at + every_ms - 1) // every_ms) * every_ms
        while at < end:
            out.append((f"s{i}", at))
            at += every_ms
    return out


def _occurrences(
    run: Run, expected: set[tuple[str, int]], end: int
) -> tuple[dict[tuple[str, int], int], int]:
    """Each ``expected`` occurrence the target topic holds, with its append time (the first
    seen), and how many of them came more than once: read until all have come and a second more
    has passed (a second copy would be in by then), or SETTLE_S after ``end``."""
    consumer = Consumer(
        {
            "bootstrap.servers": run.servers.bootstrap,
            "group.id": f"recurring-{run.uid}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    consumer.subscribe([run.target])
    seen: dict[tuple[str, int], int] = {}
    twice = 0
    deadline, all_in = end / 1000 + SETTLE_S, None
    try:
        while time.time() < deadline and (all_in is None or time.time() < all_in + 1):
            for msg in consumer.consume(1000, 0.2):
                headers = dict(headers_of(msg))
                occurrence = headers.get(H_OCCURRENCE)
                if msg.error() is not None or occurrence is None:
                    continue
                key = ((headers.get(H_ID) or b"").decode(), int(occurrence))
                if key not in expected:
                    continue
                if key in seen:
                    twice += 1
                else:
                    seen[key] = msg.timestamp()[1]
            if all_in is None and len(seen) == len(expected):
                all_in = time.time()
    finally:
        consumer.close()
    return seen, twice
