"""What a bulk cancel costs the store: cancels of references by their default delay-ids.

    python -m bench.bulk_store [--records N] [--batch B] [--whole W]

On one shard under a unique prefix on the local Redis (``DELAY_BRIDGE_REDIS__URL``, else
scripts/services' port), W records due within the hour are held whole (the live backlog), then N
records due in a month are stored as references (no delay-id of their own), then cancelled by
their default delay-ids with their due times as hints (as the command line's bulk cancel sends
them), B cancels a call, their own delay-ids read as the ingress reads them in the delay topic
(here from memory). Prints the cancels' rate and Redis's CPU per cancel; the keys are deleted
after. Run it from two checkouts, alternating, to compare code.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from bench.local import drop, local_store
from bench.scenarios import redis_cpu_s
from bridge.message import Cancel, Scheduled, origin
from bridge.store import Shard

T0 = 1_900_000_000_000
SHARD = Shard("delay", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--whole", type=int, default=0)
    args = parser.parse_args()
    store = local_store("bulk-store")
    n, batch, w = args.records, args.batch, args.whole

    def due(offset: int) -> int:
        return T0 + 10**9 + offset * 7

    def read(shard: Shard, asked: Sequence[tuple[int, int]]) -> dict[int, tuple[str, int]]:
        # The references' own delay-ids as the bridge reads them in the delay topic (none here).
        return {o: (origin(shard.topic, shard.partition, o), T0) for o, _ in asked}

    try:
        for first in range(0, w, 1000):
            live = [
                Scheduled(
                    o,
                    T0 + 60_000 + o,
                    "out",
                    b"live",
                    b"",
                    [],
                    origin("delay", 0, o),
                    default_of=("delay", 0),
                    timestamp_ms=T0,
                )
                for o in range(first, min(first + 1000, w))
            ]
            store.add({SHARD: (live[-1].offset, live)})
        for first in range(w, w + n, 1000):
            records = [
                Scheduled(
                    o,
                    due(o),
                    "out",
                    b"k%d" % o,
                    b"",
                    [],
                    origin("delay", 0, o),
                    default_of=("delay", 0),
                    timestamp_ms=T0,
                )
                for o in range(first, min(first + 1000, w + n))
            ]
            store.add({SHARD: (records[-1].offset, records)}, refer_after_ms=T0 + 1000)
        started, cpu = time.perf_counter(), redis_cpu_s(store.client)
        for first in range(w, w + n, batch):
            named = range(first, min(first + batch, w + n))
            cancels = [Cancel(n + o, origin("delay", 0, o), T0, due(o)) for o in named]
            store.add({SHARD: (n + named[-1], cancels)}, refer_after_ms=T0 + 1000, confirm=read)
        seconds, cpu = time.perf_counter() - started, redis_cpu_s(store.client) - cpu
        left = store.inventory.count(SHARD) - w
        print(
            f"{n:,} cancels of references beside {w:,} records held whole, {batch} a call: "
            f"{seconds:.2f} s ({n / seconds:,.0f}/s), Redis CPU {cpu / n * 1e6:.1f} µs a "
            f"cancel; {left} left waiting"
        )
    finally:
        drop(store)


if __name__ == "__main__":
    main()
