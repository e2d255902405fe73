"""Redis bytes per recurring schedule: the store alone, no Kafka.

    python -m bench.schedule_memory [--schedules N] [--partitions P]

Stores N schedules on P shards under a unique prefix on the local Redis
(``DELAY_BRIDGE_REDIS__URL``, else scripts/services' port), 500 per shard per call as the
ingress does, each read from its headers by the ingress's own parser, and prints Redis's
``used_memory`` growth per schedule — its record and its entry in the shard's schedule registry —
for two kinds: every minute with 100 B of payload (due within the payload horizon: stored whole)
and daily at 09:00 Europe/Paris with 10 KiB (due further out: a reference, its payload left in the
delay topic). Then deletes the keys.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import cast

from bench.local import drop, local_store
from bridge.config.schema import StoreConfig
from bridge.message import (
    H_CRON,
    H_EVERY,
    H_ID,
    H_TARGET_TOPIC,
    H_TIMEZONE,
    Headers,
    Rules,
    Scheduled,
    parse,
    parse_duration_ms,
)
from bridge.store import Shard, Store

KINDS: dict[str, tuple[Headers, bytes]] = {
    "every minute, 100 B (whole)": ([(H_EVERY, b"1m")], b"v" * 100),
    "daily 09:00 Europe/Paris, 10 KiB (a reference)": (
        [(H_CRON, b"0 9 * * *"), (H_TIMEZONE, b"Europe/Paris")],
        b"v" * 10_240,
    ),
}
RULES = Rules(
    delay_topics=frozenset({"delay"}),
    default_targets={},
    allowed_targets=(re.compile(".*"),),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("365d"),
    max_record_bytes=1_000_000,
)


def per_schedule(
    store: Store, headers: Headers, value: bytes, schedules: int, partitions: int
) -> tuple[float, float]:
    """Redis bytes per schedule of this kind, and schedules stored per second."""
    config, client = StoreConfig(), store.client
    now = store.time_ms()
    settled = time.monotonic() + 30  # what an earlier kind's keys held, freed in the background
    memory = cast(dict[str, int], client.info("memory"))
    while memory.get("lazyfree_pending_objects") and time.monotonic() < settled:
        time.sleep(0.1)
        memory = cast(dict[str, int], client.info("memory"))
    used = memory["used_memory"]
    started, offset, added = time.monotonic(), 0, 0
    while added < schedules:
        batches: dict[Shard, tuple[int, list[Scheduled]]] = {}
        for p in range(partitions):
            records = []
            for o in range(offset, offset + 500):
                sid = f"schedule-{p}-{o}".encode()
                own: Headers = [(H_TARGET_TOPIC, b"out"), (H_ID, sid), *headers]
                record = parse(
                    RULES,
                    topic="delay",
                    partition=p,
                    offset=o,
                    timestamp_ms=now,
                    key=sid,
                    value=value,
                    headers=own,
                    now_ms=now,
                )
                assert isinstance(record, Scheduled) and record.recurring
                records.append(record)
            batches[Shard("delay", p)] = (offset + 499, records)
        offset += 500
        store.add(batches, refer_after_ms=now + config.payload_horizon, bucket_ms=config.bucket_ms)
        added += 500 * partitions
    seconds = time.monotonic() - started
    grown = cast(dict[str, int], client.info("memory"))["used_memory"] - used
    return grown / added, added / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    for kind, (headers, value) in KINDS.items():
        store = local_store("schedules")
        try:
            size, rate = per_schedule(store, headers, value, args.schedules, args.partitions)
        finally:
            drop(store)
        print(
            f"{args.schedules:,} schedules {kind}: {size:.0f} bytes each in Redis ({rate:,.0f}/s)"
        )


if __name__ == "__main__":
    main()
