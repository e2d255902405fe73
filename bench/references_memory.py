"""Redis bytes per far-future record kept as a reference: the store alone, no Kafka.

    python -m bench.references_memory [--records N] [--partitions P] [--days D] [--with-ids]

Adds N records of 1 KiB (``--with-ids``: each with a delay-id of its own, ``--id-bytes`` long,
31 by default) due uniformly over D
days (after the default payload horizon) to P shards under a unique prefix on the local Redis
(``DELAY_BRIDGE_REDIS__URL``, else scripts/services' port), 500 per shard per call as the ingress
does, and prints Redis's ``used_memory`` growth per record; then deletes the keys. The
whole-pipeline figures (bridge RSS, read-back rates) are for ``make bench``.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import cast

from bench.local import drop, local_store
from bridge.config.schema import StoreConfig
from bridge.message import Scheduled
from bridge.store import Shard

DAY_MS = 86_400_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--with-ids", action="store_true", help="a delay-id of its own each")
    parser.add_argument("--id-bytes", type=int, default=31, help="the length of each delay-id")
    args = parser.parse_args()
    store, config, rng = local_store("refs"), StoreConfig(), random.Random(1)
    client = store.client
    now = store.time_ms()
    horizon = now + config.payload_horizon
    used = cast(dict[str, int], client.info("memory"))["used_memory"]
    started, offsets = time.monotonic(), [0] * args.partitions
    added = 0
    while added < args.records:
        batches: dict[Shard, tuple[int, list[Scheduled]]] = {}
        for p in range(args.partitions):
            records = []
            for o in range(offsets[p], offsets[p] + 500):
                due = horizon + rng.randrange(args.days * DAY_MS)
                given = f"reminder-{p}-{o}".rjust(args.id_bytes, "0")
                delay_id = given if args.with_ids else f"delay:{p}:{o}"
                records.append(Scheduled(o, due, "out", b"k", b"v" * 1024, [], delay_id))
            offsets[p] += 500
            batches[Shard("delay", p)] = (offsets[p] - 1, records)
        store.add(batches, refer_after_ms=horizon, bucket_ms=config.bucket_ms)
        added += 500 * args.partitions
    seconds = time.monotonic() - started
    grown = cast(dict[str, int], client.info("memory"))["used_memory"] - used
    ids = f" with a {args.id_bytes}-byte delay-id each" if args.with_ids else ""
    print(
        f"{added:,} references{ids} over {args.days} days in {args.partitions} partitions "
        f"({config.bucket_ms // 60_000} min buckets): {grown / added:.1f} bytes each in Redis "
        f"(used_memory +{grown:,}); stored at {added / seconds:,.0f}/s"
    )
    drop(store)


if __name__ == "__main__":
    main()
