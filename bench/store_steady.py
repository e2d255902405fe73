"""What Redis spends per record in the bridge's steady pattern, the store alone.

    python -m bench.store_steady [--seconds S] [--ahead MS] [--no-acks] [--rate R]

On three shards under a unique prefix on the local Redis (``DELAY_BRIDGE_REDIS__URL``, else
scripts/services' port), records arrive at R a second (2,000) with delays uniform in 1-10 s, added
as the ingress adds them (a batch per shard every 100 ms: its hold), while a claim of every shard
every 20 ms takes what is due and, with ``--ahead``, what falls due within that many ms (100:
egress.ahead's default), carrying the acknowledgements of the claim before it as the mover does.
From the longest delay and a second on (when records fall due as fast as they arrive) it counts
the time Redis spent in the scripts (``INFO commandstats``: EVALSHA) per record claimed, for the
adds and for the claims with their acknowledgements, and prints both. The keys are deleted after.

This is the Redis part of ``bench.ab steady`` without the bridge's threads and Kafka around it: a
change to a script is measured here in seconds, run from two checkouts one after the other and
back (docs/bench/history.md, "Where the steady load's Redis time goes").
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import Any

from bench.local import drop, local_store
from bridge.message import H_DELIVER_AT, H_TARGET_TOPIC, Headers, Scheduled, origin
from bridge.store import AckBatch, Shard, Store

SHARDS = tuple(Shard("delay", p) for p in range(3))
HOLD_S, CLAIM_EVERY_S = 0.1, 0.02  # the ingress's hold; a claim per mover tick, about
MIN_DELAY_MS, MAX_DELAY_MS = 1_000, 10_000
CLAIM_LIMIT, LEASE_MS = 170, 30_000  # per shard: the mover's room split over three shards
TARGET = "bench-target"


@dataclass
class Spent:
    """Redis's script time (µs) in the adds and in the claims, and the records claimed."""

    add_us: int = 0
    claim_us: int = 0
    claimed: int = 0

    def line(self) -> str:
        per = max(1, self.claimed)
        return (
            f"{self.claimed:,} records claimed: Redis µs per record in adds "
            f"{self.add_us / per:.2f}, in claims with their acknowledgements "
            f"{self.claim_us / per:.2f}"
        )


def script_us(client: Any) -> int:
    """Redis's time in scripts so far (µs)."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


class Load:
    """Records arriving at ``rate`` a second, each shard's taken in offset order."""

    def __init__(self, rate: float, seed: int = 5) -> None:
        self.rate = rate
        self.rng = random.Random(seed)
        self.offsets = dict.fromkeys(SHARDS, 0)
        self.marks: dict[Shard, int] = {}

    def batch(self, now_ms: int) -> dict[Shard, tuple[int, list[Scheduled]]]:
        """A hold's worth of records, by shard, as the ingress passes them to :meth:`Store.add`."""
        batches: dict[Shard, list[Scheduled]] = {s: [] for s in SHARDS}
        for i in range(int(self.rate * HOLD_S)):
            shard = SHARDS[i % len(SHARDS)]
            offset = self.offsets[shard]
            self.offsets[shard] = offset + 1
            due = now_ms + self.rng.randint(MIN_DELAY_MS, MAX_DELAY_MS)
            headers: Headers = [
                (H_TARGET_TOPIC, TARGET.encode()),
                (H_DELIVER_AT, str(due).encode()),
            ]
            batches[shard].append(
                Scheduled(
                    offset,
                    due,
                    TARGET,
                    b"k%d" % (i % 997),
                    b"x" * 100,
                    headers,
                    origin(shard.topic, shard.partition, offset),
                )
            )
        return {s: (recs[-1].offset, recs) for s, recs in batches.items() if recs}


def run(store: Store, seconds: float, rate: float, ahead_ms: int, acks: bool) -> Spent:
    """The steady pattern for ``seconds`` (bounded), measured from MAX_DELAY_MS + 1 s on."""
    load, spent = Load(rate), Spent()
    started = time.monotonic()
    measured_from = started + MAX_DELAY_MS / 1000 + 1
    next_add = next_claim = started
    carried: dict[Shard, AckBatch] = {}
    while (now := time.monotonic()) < started + seconds:
        measuring = now >= measured_from
        if now >= next_add:
            next_add += HOLD_S
            batches = load.batch(int(time.time() * 1000))
            before = script_us(store.client)
            store.add(batches, dict(load.marks))
            load.marks.update({s: high for s, (high, _) in batches.items()})
            if measuring:
                spent.add_us += script_us(store.client) - before
        if now >= next_claim:
            next_claim += CLAIM_EVERY_S
            before = script_us(store.client)
            claims = store.claim(
                SHARDS, CLAIM_LIMIT, LEASE_MS, ahead_ms=ahead_ms, acks=carried if acks else None
            )
            if measuring:
                spent.claim_us += script_us(store.client) - before
                spent.claimed += len(claims)
            carried = {}
            for item in claims:  # with each one's target, as the mover names them (Acked)
                batch = carried.setdefault(item.shard, AckBatch(item.epoch))
                batch.members.append(item.member)
                batch.targets.append(item.record.target)
        time.sleep(max(0.0, min(next_add, next_claim) - time.monotonic()))
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_steady", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long (default 20)")
    parser.add_argument("--rate", type=float, default=2000.0, help="records a second (2,000)")
    parser.add_argument("--ahead", type=int, default=100, help="claim ahead, ms (default 100)")
    parser.add_argument("--no-acks", action="store_true", help="claims carry no acknowledgements")
    args = parser.parse_args()
    if args.seconds <= MAX_DELAY_MS / 1000 + 1:
        parser.error(
            f"--seconds must exceed {MAX_DELAY_MS // 1000 + 1}: nothing is measured before"
        )
    store = local_store("store-steady")
    try:
        print(run(store, min(args.seconds, 600.0), args.rate, args.ahead, not args.no_acks).line())
    finally:
        drop(store)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
