"""What one occurrence of a recurring schedule costs the bridge's Python, and the paused check.

    python -m bench.recurring_step [--schedules N] [--rounds R]

* **step**: the egress's work for one occurrence of an every-minute schedule (its step, the
  occurrence's headers and the record that carries it on: ``bridge.egress.recurring.sending``),
  and the ingress's parse of that record when it reads it back; µs each, in this process.
* **paused**: N schedules (3 shards) stored on the local Redis (``DELAY_BRIDGE_REDIS__URL``, else
  scripts/services' port) under a unique prefix, then the claim's question of which are paused
  (``Registry.mark_paused``) asked of all N, median of R rounds: µs a schedule, the bridge's and
  Redis's time together. The keys are deleted after.

Run it from two checkouts, one after the other and back, to compare code with code
(docs/bench/history.md): one run's figures alone say little on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.local import drop, local_store
from bench.schedule_memory import RULES
from bridge.egress.failures import InFlight
from bridge.egress.recurring import sending
from bridge.message import (
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_TARGET_TOPIC,
    Headers,
    Scheduled,
    parse,
)
from bridge.store import Claimed, Shard

SHARDS = 3


def schedule(partition: int, offset: int, now_ms: int, start_ms: int | None = None) -> Scheduled:
    """An every-minute schedule of 100 B, as the ingress parses it."""
    sid = f"schedule-{partition}-{offset}".encode()
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_ID, sid), (H_EVERY, b"60s")]
    if start_ms is not None:
        headers.append((H_DELIVER_AT, str(start_ms).encode()))
    record = parse(
        RULES,
        topic="delay",
        partition=partition,
        offset=offset,
        timestamp_ms=now_ms,
        key=sid,
        value=b"v" * 100,
        headers=headers,
        now_ms=now_ms,
    )
    assert isinstance(record, Scheduled) and record.recurring
    return record


def step_us(rounds: int = 20_000) -> tuple[float, float]:
    """µs an occurrence at the egress, and the ingress's parse of what carries it on."""
    now = time.time_ns() // 1_000_000
    record, shard = schedule(0, 5, now - 60_000, now - 5), Shard("delay", 0)
    started = time.perf_counter()
    for _ in range(rounds):
        inflight = InFlight(Claimed(shard, b"\0" * 8, record, False))
        sending(record, shard, now, inflight)
    egress = (time.perf_counter() - started) / rounds * 1e6
    assert inflight.onward is not None
    fields = inflight.onward[1]
    started = time.perf_counter()
    for _ in range(rounds):
        parse(
            RULES,
            topic="delay",
            partition=0,
            offset=6,
            timestamp_ms=now,
            key=fields["key"],
            value=fields["value"],
            headers=fields["headers"],
            now_ms=now,
        )
    return egress, (time.perf_counter() - started) / rounds * 1e6


def paused_us(schedules: int, rounds: int) -> float:
    """µs a schedule for the claim's paused check, median of ``rounds``."""
    store = local_store("paused")
    try:
        now = store.time_ms()
        claimed: list[Claimed] = []
        per = schedules // SHARDS
        for p in range(SHARDS):
            batch = [schedule(p, o, now) for o in range(per)]
            store.add({Shard("delay", p): (per - 1, batch)}, refer_after_ms=now + 3_600_000)
            claimed += [Claimed(Shard("delay", p), b"\0" * 8, r, False) for r in batch]
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            store.registry.mark_paused(claimed)
            took.append(time.perf_counter() - started)
        return statistics.median(took) / len(claimed) * 1e6
    finally:
        drop(store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    egress, ingress = step_us()
    print(f"step: egress {egress:.1f} µs an occurrence, ingress {ingress:.1f} µs its carry-on")
    print(f"paused: {paused_us(args.schedules, args.rounds):.2f} µs a schedule")


if __name__ == "__main__":
    main()
