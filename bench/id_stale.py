"""What the id index holds while records with a delay-id are delivered: the stale entries.

    python -m bench.id_stale [--records N] [--batch B]

On one shard under a unique prefix on the local Redis (``DELAY_BRIDGE_REDIS__URL``, else
scripts/services' port), N records with a 25-byte delay-id of their own are stored, then claimed
and acknowledged B at a time until half of them are delivered, as the mover does. An
acknowledgement leaves its records' entries stale until a sweep drops them (the id index in
_lib.lua). Printed after every eighth of the records: the entries and how many are stale, the
index's ``MEMORY USAGE`` and its bytes per record still waiting. The keys are deleted after.
"""

from __future__ import annotations

import argparse
from typing import cast

from bench.local import drop, local_store
from bridge.message import Scheduled
from bridge.store import AckBatch, Shard
from bridge.store.ids import read_index

T0 = 1_900_000_000_000
SHARD = Shard("delay", 0)
LEASE = 30_000
ADD_BATCH = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    store = local_store("id-stale")
    ids = store.keys(SHARD).ids
    try:
        for first in range(0, args.records, ADD_BATCH):
            last = min(first + ADD_BATCH, args.records) - 1
            records = [
                Scheduled(i, T0 + i, "out", b"k", b"v", [], f"order-{i:019d}")
                for i in range(first, last + 1)
            ]
            store.add({SHARD: (last, records)})

        def figures(delivered: int) -> None:
            waiting = args.records - delivered
            entries = len(read_index(cast(dict[bytes, bytes], store.client.hgetall(ids))))
            used = cast(int, store.client.memory_usage(ids, samples=0))
            stale = entries - waiting
            print(
                f"{delivered:>9,} delivered  {entries:>9,} entries ({stale:,} stale)  "
                f"id index {used:>11,} B  {used / waiting:5.1f} B a waiting record"
            )

        figures(0)
        delivered, step = 0, max(1, args.records // 8)
        while delivered < args.records // 2:
            claimed = store.claim([SHARD], args.batch, LEASE, now_ms=T0 + args.records)
            if not claimed:
                break
            acks = AckBatch(members=[c.member for c in claimed], with_ids=len(claimed))
            store.ack({SHARD: acks})
            before, delivered = delivered, delivered + len(claimed)
            if delivered // step > before // step:
                figures(delivered)
    finally:
        drop(store)


if __name__ == "__main__":
    main()
