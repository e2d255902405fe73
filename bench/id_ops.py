"""What records with a delay-id cost the store's calls: schedules, replacements, cancels, claims.

    python -m bench.id_ops [--rounds N] [--batch B] [--ids I] [--without-ids]

On one shard under a unique prefix on the local Redis (``DELAY_BRIDGE_REDIS__URL``, else
scripts/services' port), I records with a delay-id of their own each wait (the index holds I
entries); then each round adds a batch of B new schedules with fresh ids, a batch of B
replacements of waiting ids, a batch of B cancels of waiting ids, and claims B due records with
ids, acknowledging the previous claim's (carried by the claim, as the mover sends them).
Prints the median time per batch of each and Redis's CPU per batch. The keys are deleted after.
``--without-ids``: the schedules alone, of records without a delay-id of their own (what an id's
cost is measured against).

Run it from two checkouts, one after the other and back, to compare code with code
(docs/bench/history.md): one run's figures alone say little on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.local import drop, local_store
from bench.scenarios import redis_cpu_s
from bridge.message import Cancel, Scheduled, origin
from bridge.store import AckBatch, Claimed, Shard

T0 = 1_900_000_000_000
SHARD = Shard("delay", 0)
LEASE = 30_000


def _acks(claimed: list[Claimed]) -> AckBatch:
    """The acknowledgement of ``claimed`` as the mover sends it: how many have a delay-id where
    the store counts them, else (the store before the sweep) each id's hash, or the id itself
    (the store before the hashed index), with its offset."""
    members = [c.member for c in claimed]
    if "with_ids" in AckBatch.__dataclass_fields__:
        return AckBatch("", members, sum(1 for c in claimed if c.given_id() is not None))
    try:
        from bridge.store import id_hash  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        pairs: list[Any] = [(str(c.given_id()), c.member) for c in claimed]
    else:
        pairs = [(id_hash(SHARD.topic, str(c.given_id())), c.member) for c in claimed]
    return AckBatch("", members, pairs)  # type: ignore[arg-type,unused-ignore]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--ids", type=int, default=200_000)
    parser.add_argument("--without-ids", action="store_true")
    args = parser.parse_args()
    store = local_store("id-ops")
    client = store.client
    offset, waiting = 0, 0  # the next offset; ids "id-<n>" for n < waiting are (or were) waiting

    def schedule(n: int, due: int) -> Scheduled:
        nonlocal offset
        offset += 1
        if args.without_ids:
            home = (SHARD.topic, SHARD.partition)
            own = origin(*home, offset - 1)
            return Scheduled(
                offset - 1, due, "out", b"k", b"v" * 100, [], own, default_of=home, timestamp_ms=T0
            )
        return Scheduled(
            offset - 1, due, "out", b"k", b"v" * 100, [], f"id-{n:024d}", timestamp_ms=T0
        )

    def add(records: list[Scheduled | Cancel]) -> None:
        store.add({SHARD: (records[-1].offset, records)})

    def fresh() -> None:
        nonlocal waiting
        add([schedule(waiting + i, T0 + 10**9 + waiting + i) for i in range(args.batch)])
        waiting += args.batch

    def replace() -> None:
        add([schedule(n, T0 + 10**9 + n + 1) for n in range(waiting - args.batch, waiting)])

    def cancel() -> None:
        nonlocal waiting, offset
        first = offset
        offset += args.batch
        add([Cancel(first + i, f"id-{waiting - 1 - i:024d}") for i in range(args.batch)])
        waiting -= args.batch

    acks: list[Claimed] = []

    def claim() -> None:  # the earliest due: the oldest ids, which the other steps leave alone
        nonlocal acks
        batch = _acks(acks)
        acks = store.claim([SHARD], args.batch, LEASE, now_ms=T0 + 2 * 10**9, acks={SHARD: batch})

    try:
        while waiting < args.ids:
            fresh()
        store.claim([SHARD], 1, LEASE, now_ms=T0)  # the epoch: "" until the first claim
        steps: dict[str, Callable[[], None]] = {
            "schedule (fresh ids)": fresh,
            "replace": replace,
            "cancel": cancel,
            "claim and ack": claim,
        }
        if args.without_ids:
            steps = {"schedule (no ids)": fresh}
        times: dict[str, list[float]] = {name: [] for name in steps}
        cpu: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                cpu_before, start = redis_cpu_s(client), time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(redis_cpu_s(client) - cpu_before)
        print(f"batches of {args.batch}, {args.ids:,} ids waiting, {args.rounds} rounds")
        for name in steps:
            took_ms = statistics.median(times[name]) * 1000
            cpu_ms = statistics.mean(cpu[name]) * 1000
            print(f"{name:22} {took_ms:7.2f} ms per batch, Redis CPU {cpu_ms:6.2f} ms")
    finally:
        drop(store)


if __name__ == "__main__":
    main()
