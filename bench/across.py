"""What looking for a delay-id in its topic's other partitions costs an add: the store alone.

    python -m bench.across [--rounds N] [--partitions P] [--batch B]

Adds batches of B records, each with a delay-id of its own (first seen, so none replaces a
record in its own partition and every one is looked for in the other P - 1), to one shard under
a unique prefix on the local Redis (``DELAY_BRIDGE_REDIS__URL``, else scripts/services' port),
alternating a batch told the topic's partition count with one told none (no lookup elsewhere),
and prints the median time per batch of each and their ratio; Redis's CPU per batch likewise.
Then deletes the keys. The other shards hold as many ids, so each lookup is a real miss.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.local import drop, local_store
from bench.scenarios import redis_cpu_s
from bridge.message import Scheduled
from bridge.store import Shard

T0 = 1_900_000_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    store, topic = local_store("across"), "delay"
    client = store.client
    offsets = dict.fromkeys(range(args.partitions), 0)

    def batch(partition: int) -> tuple[int, list[Scheduled]]:
        first = offsets[partition]
        offsets[partition] += args.batch
        records = [
            Scheduled(
                o, T0 + o, "out", b"k", b"v" * 100, [], f"id-{partition}-{o}", timestamp_ms=T0
            )
            for o in range(first, first + args.batch)
        ]
        return records[-1].offset, records

    try:
        for partition in range(1, args.partitions):  # the others hold ids too
            store.add({Shard(topic, partition): batch(partition)})
        times: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 * args.rounds):
            across = i % 2 == 0
            work = {Shard(topic, 0): batch(0)}
            counts = {topic: args.partitions} if across else {}
            cpu_before, start = redis_cpu_s(client), time.perf_counter()
            store.add(work, partitions=counts)
            times[across].append(time.perf_counter() - start)
            cpu[across].append(redis_cpu_s(client) - cpu_before)
        for across, label in ((False, "own partition only"), (True, "and the others")):
            took_ms = statistics.median(times[across]) * 1000
            cpu_ms = statistics.mean(cpu[across]) * 1000
            print(f"{label:18} {took_ms:6.2f} ms per batch, Redis CPU {cpu_ms:5.2f} ms")
        ratio = statistics.median(times[True]) / statistics.median(times[False])
        print(
            f"batches of {args.batch}; ratio (and the others / own only): {ratio:.2f}x, "
            f"{args.partitions - 1} other partitions"
        )
    finally:
        drop(store)


if __name__ == "__main__":
    main()
