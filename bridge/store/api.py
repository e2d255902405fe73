"""The store API: records added, claimed, acknowledged and released per shard, and what waits.

One shard per delay-topic partition (key names: :mod:`bridge.store.keys`); every read-then-write
is a Lua script, and calls over several shards go out in one pipeline: one round trip per batch,
never per record.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import redis
from redis.cluster import RedisCluster

from bridge.message import Cancel, Priority, Scheduled
from bridge.store.adding import Keep, found_here, keep_none, look_again
from bridge.store.adding import add as add_batches
from bridge.store.calls import (
    AckBatch,
    ClaimArgs,
    ClaimReply,
    low_argv,
    release_argv,
    settle_argv,
    stats_argv,
    take_over_argv,
    unclaim_argv,
)
from bridge.store.flight import InFlight, Named, withdraw_here
from bridge.store.ids import Confirm, Schedules, id_hash, unconfirmed, undated
from bridge.store.inventory import Inventory
from bridge.store.kept import Kept
from bridge.store.keys import (
    Keys,
    PerLane,
    Shard,
    ShardKeys,
    score,
    stored_record,
)
from bridge.store.layout import Layout
from bridge.store.redis_errors import as_store_error
from bridge.store.references import References
from bridge.store.registry import KEEP_ENDED_MS, Registry
from bridge.store.results import (
    Added,
    Backlog,
    Claimed,
    Claims,
    Lows,
)
from bridge.store.scripts import (
    ACK,
    CLAIM,
    LOW,
    RELEASE,
    SETTLE,
    STATS,
    TAKE_OVER,
    UNCLAIM,
    Scripts,
)
from bridge.store.targets import Targets

# Records a settle.lua call forgets at most: a re-read's journal may name hundreds of thousands,
# and one call holds Redis for all of them (the calls go in one pipeline).
SETTLE_CHUNK = 2_000


def _claims(
    shards: Sequence[Shard], read: Sequence[ClaimReply], *, one_clock: bool = True
) -> Claims:
    """The claim.lua replies of ``shards`` (one each, in order) as :class:`Claims`;
    ``one_clock``: all from one Redis (not a Cluster's several masters)."""
    received = time.monotonic()  # before decoding: each record decoded would lag the clock
    out: list[Claimed] = []
    next_ms: dict[Shard, int | None] = {}
    due_lanes: dict[Shard, frozenset[Priority]] = {}
    earliest: dict[Shard, PerLane] = {}
    for shard, r in zip(shards, read, strict=True):
        next_ms[shard] = r.next_ms()
        if r.due_lanes:
            due_lanes[shard] = r.due_lanes
        earliest[shard] = r.earliest
        for i, item in enumerate(r.members):
            record = stored_record(item, shard, r.now_ms)
            out.append(Claimed(shard, item[:8], record, i < r.redelivered, r.epoch, r.topic_id))
    # One Redis runs the scripts one after the other: its clock at the end of the last is the
    # latest reading. On Redis Cluster each ran by its own master's clock: the earliest reading
    # is the one the mover carries on (records claimed ahead are produced by it), so no master's
    # clock sees a record leave early; the claim's now is the earliest start either way.
    ends = [r.clock_ms for r in read]
    return Claims(
        out,
        min(r.now_ms for r in read),
        next_ms,
        received,
        ends[-1] if one_clock else min(ends),
        due_lanes=due_lanes,
        earliest=earliest,
    )


class Store:
    """Scheduled records in Redis, addressed by shard."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._keys = Keys(prefix)
        self.scripts = Scripts(client)
        self.layout = Layout(client, self._keys, self.scripts)
        self.references = References(client, self._keys, self.scripts)
        self.inventory = Inventory(client, self._keys, self.scripts)
        self.targets = Targets(client, self._keys, self.scripts)
        self.registry = Registry(client, self._keys)
        self.kept = Kept(client, self._keys)  # the earliest timestamps of the cancels kept
        self._one_clock = not isinstance(client, RedisCluster)

    def keys(self, shard: Shard) -> ShardKeys:
        """The shard's Redis keys."""
        return self._keys.of(shard)

    def probe_key(self) -> str:
        """The key :meth:`probe` writes."""
        return f"{self.prefix}:probe"

    def probe(self) -> None:
        """Write to Redis; raise :class:`StoreError` naming the cause unless it takes writes."""
        with as_store_error():
            self.client.set(self.probe_key(), b"1", px=60_000)

    def add(
        self,
        batches: Mapping[Shard, tuple[int, Sequence[Scheduled | Cancel]]],
        expected: Mapping[Shard, int] | None = None,
        *,
        refer_after_ms: int | None = None,
        bucket_ms: int = 60_000,
        partitions: Mapping[str, int] | None = None,
        confirm: Confirm = unconfirmed,
        schedules: Schedules = undated,
        keep: Keep = keep_none,
        reread: Mapping[Shard, int] | None = None,
        mover: InFlight | None = None,
    ) -> Added:
        """Store records per shard and move each shard's watermark to the batch's high offset.

        ``batches`` maps a shard to (highest offset handled, records to store); ``expected`` the
        watermark the caller last saw per shard. A shard whose state Redis lost is refused whole
        and reported in :attr:`Added.lost`. A record due after ``refer_after_ms`` is kept as a
        reference (:mod:`bridge.store.references`) in a time bucket ``bucket_ms`` wide. A cancel
        or a record with a caller-given id that finds nothing in its own shard withdraws what it
        names in the other partitions of its topic (``partitions``: topic -> partition count;
        see withdraw.lua), if stamped no later; add.lua keeps those until this is done (a fault
        in between loses none: the next add of the shard, here or on the replica that takes it
        over, hands them back). ``confirm`` reads in the delay topic the records the id index
        gives as candidates where Redis cannot tell (:mod:`bridge.store.ids`), ``schedules`` the
        record a default delay-id names (its due time, and its own delay-id for the journal;
        without it, Redis's whole records are scanned for it). A cancel or a replacement that
        finds nothing in a shard ``keep`` names (its topic not whole in Redis) is kept
        (:attr:`Added.kept`, and in Redis) to :meth:`look_again`. A cancel by its delay-id
        that finds nothing in a shard ``reread`` names (read again after Redis lost its state,
        up to the offset given, which Redis keeps) ends a schedule of that id the registry has
        no word of. One that meets its record in flight: ``mover``, :mod:`bridge.store.flight`."""
        return add_batches(
            self.scripts,
            self._keys,
            self.inventory,
            batches,
            expected or {},
            refer_after_ms=refer_after_ms if refer_after_ms is not None else 2**63,
            bucket_ms=bucket_ms,
            partitions=partitions or {},
            confirm=confirm,
            schedules=schedules,
            keep=keep,
            reread=reread or {},
            mover=mover,
        )

    def look_again(
        self,
        kept: Sequence[tuple[Shard, Scheduled | Cancel]],
        partitions: Mapping[str, int],
        *,
        confirm: Confirm = unconfirmed,
        schedules: Schedules = undated,
    ) -> Added:
        """What :meth:`add` kept looks in its topic's other partitions, now whole; forgotten."""
        return look_again(self.scripts, self._keys, kept, partitions, confirm, schedules)

    def look_here(self, kept: Sequence[Named], confirm: Confirm) -> Added:
        """Cancels kept for their record in flight look in their shard again (.flight)."""
        return found_here(kept, withdraw_here(self.scripts, self._keys, kept, confirm=confirm))

    def lows(self, expected: Mapping[Shard, int | None], max_buckets: int = 64) -> Lows:
        """Each shard's lowest pending offset, else watermark + 1 (where its rebuild would start),
        and its watermark + 1 (where its reading resumes).

        A shard Redis holds nothing for is left out, unless the caller expected a watermark for
        it: then, like a watermark below the expected one, it is reported in :attr:`Lows.lost`.
        """
        shards = list(expected)
        calls = [
            (LOW.keys(self.keys(s)), low_argv(expected[s], max_buckets, KEEP_ENDED_MS))
            for s in shards
        ]
        offsets, lost, ends = {}, {}, {}
        for shard, r in zip(shards, self.scripts.call(LOW, calls), strict=True):
            if r.loss is None:
                ends[shard] = r.watermark + 1
                offsets[shard] = ends[shard] if r.low is None else r.low
            elif r.loss.watermark is not None or expected[shard] is not None:
                lost[shard] = r.loss
        return Lows(offsets, lost, ends)

    def claim(
        self,
        shards: Sequence[Shard],
        limit: int,
        lease_ms: int,
        now_ms: int | None = None,
        horizons: Mapping[Shard, int] | None = None,
        *,
        ahead_ms: int = 0,
        acks: Mapping[Shard, AckBatch] | None = None,
        lanes: Mapping[Shard, Priority] | None = None,
        ahead_lanes: Priority | None = None,
        watermarks: Mapping[Shard, int] | None = None,
        cap_ms: int | None = None,
        ahead_limit: int | None = None,
    ) -> Claims:
        """Lease up to ``limit`` due records from each shard: expired leases first, then on-time
        and overdue records sharing the rest (see claim.lua); from a shard in ``horizons`` only
        records due by its horizon (see bridge.catchup). The reply also says when each shard
        next has work, so the mover plans its sleep without another call. The ``acks`` of a shard
        claimed from are applied first in the same call, as :meth:`ack` would. With
        ``ahead_ms``, records with the default delay-id due within that much of now are leased
        too (room permitting, at most ``ahead_limit`` per shard): the caller produces them when
        they fall due. A shard in ``lanes`` gives only records of that priority or higher, and
        only records of ``ahead_lanes`` or higher are claimed ahead; the reply says which
        priorities still have records due and each lane's earliest due time (:class:`Claims`).
        From a shard whose Redis watermark is below its ``watermarks`` entry (the ingress's; Redis
        rolled back) nothing new is claimed until the ingress has read it again (see claim.lua).
        The claim decides by Redis TIME, or by ``cap_ms`` when that is earlier (the caller's other
        clocks: a step of Redis's host clock makes nothing early)."""
        if not shards:
            now = self.time_ms() if now_ms is None else now_ms
            return Claims([], now, {}, time.monotonic(), now)
        horizons, lanes, watermarks = horizons or {}, lanes or {}, watermarks or {}
        calls = []
        for shard in shards:
            k = self.keys(shard)
            args = ClaimArgs(
                limit,
                lease_ms,
                now_ms,
                horizons.get(shard),
                ahead_ms,
                lanes.get(shard),
                ahead_lanes,
                watermark=watermarks.get(shard),
                acks=(acks or {}).get(shard),
                cap_ms=cap_ms,
                ahead_limit=ahead_limit,
            )
            calls.append((CLAIM.keys(k), args.argv()))
        claims = _claims(shards, self.scripts.call(CLAIM, calls), one_clock=self._one_clock)
        self.registry.mark_paused(claims)
        return claims

    def claim_waiting(
        self,
        limits: Mapping[tuple[Shard, str], int],
        lease_ms: int,
        now_ms: int | None = None,
        horizons: Mapping[Shard, int] | None = None,
        lanes: Mapping[str, Priority] | None = None,
        *,
        watermarks: Mapping[Shard, int] | None = None,
        cap_ms: int | None = None,
    ) -> dict[str, Claims]:
        """Lease due records from the wait indexes of rate-limited targets: up to ``limits[shard,
        target]`` from each, only records of ``lanes[target]`` or higher priority, and from a
        shard in ``horizons`` only records due by its horizon, and ``watermarks``, as
        :meth:`claim` does. Returns
        each target's claims; their ``due_lanes`` and ``earliest`` tell of the target's wait
        index in each shard."""
        horizons, lanes, watermarks = horizons or {}, lanes or {}, watermarks or {}
        pairs = list(limits)
        calls = []
        for shard, target in pairs:
            k = self.keys(shard)
            args = ClaimArgs(
                limits[shard, target],
                lease_ms,
                now_ms,
                horizons.get(shard),
                last_lane=lanes.get(target),
                target=target,
                watermark=watermarks.get(shard),
                cap_ms=cap_ms,
            )
            calls.append((CLAIM.keys(k, first=self._keys.wait(shard, target)), args.argv()))
        grouped: dict[str, tuple[list[Shard], list[ClaimReply]]] = {}
        for (shard, target), reply in zip(pairs, self.scripts.call(CLAIM, calls), strict=True):
            shards, replies = grouped.setdefault(target, ([], []))
            shards.append(shard)
            replies.append(reply)
        got = {t: _claims(*group, one_clock=self._one_clock) for t, group in grouped.items()}
        for claims in got.values():
            self.registry.mark_paused(claims)
        return got

    def ack(self, acks: Mapping[Shard, AckBatch]) -> int:
        """Remove records Kafka acknowledged (:class:`AckBatch`): the id index entries of those
        with a caller-given delay-id go stale, to be swept, and records claimed before their
        shard's state was retired (another epoch than the batch's, :attr:`Claimed.epoch`) are
        left alone. Returns how many were still there."""
        calls = [(ACK.keys(self.keys(s)), b.argv()) for s, b in acks.items() if b.members]
        return sum(self.scripts.call(ACK, calls))

    def settle(
        self, shard: Shard, settled: Iterable[tuple[int, int, str]], *, leased: bool = True
    ) -> int:
        """Forget the records of ``shard`` whose fate is sealed elsewhere — (offset, due ms,
        delay-id) each, as the journal has them — waiting or, with ``leased``, in flight (see
        settle.lua): what a rollback of Redis put back after their delivery, a call per
        SETTLE_CHUNK of them. Returns how many were still there."""
        given = [(o, due, id_hash(shard.topic, i) if i else b"") for o, due, i in settled]
        keys, chunks = SETTLE.keys(self.keys(shard)), range(0, len(given), SETTLE_CHUNK)
        calls = [(keys, settle_argv(given[i : i + SETTLE_CHUNK], leased)) for i in chunks]
        return sum(self.scripts.call(SETTLE, calls)) if calls else 0

    def release(self, members: Mapping[Shard, Sequence[bytes]], retry_in_ms: int = 0) -> int:
        """End the leases of unacknowledged records so they are claimable at once, or after
        ``retry_in_ms`` (a back-off)."""
        calls = [
            (RELEASE.keys(self.keys(s)), release_argv(retry_in_ms, m))
            for s, m in members.items()
            if m
        ]
        return sum(self.scripts.call(RELEASE, calls))

    def unclaim(self, claimed: Iterable[Claimed], wait: bool = False) -> int:
        """Put claimed records back among the waiting ones, as if never claimed: a cancel or a
        replacement reaches them again (see unclaim.lua). With ``wait``, into their target's
        wait index instead of the due index: records of a rate-limited target beyond its rate
        (:meth:`claim`'s ``waiting``). Returns how many were put back."""
        back: dict[tuple[Shard, str], list[tuple[int, bytes]]] = {}
        for c in claimed:
            target = c.record.target if wait else ""
            back.setdefault((c.shard, target), []).append((score(c.record), c.member))
        calls = [
            (
                UNCLAIM.keys(self.keys(shard), first=self._keys.wait(shard, t) if t else None),
                unclaim_argv(t, records),
            )
            for (shard, t), records in back.items()
        ]
        return sum(self.scripts.call(UNCLAIM, calls))

    def take_over(self, held: Mapping[Shard, Sequence[bytes]]) -> int:
        """End the leases in each shard except the ``held`` offsets (the caller's own in-flight
        records), so the new owner of a partition redelivers what its earlier owner left at once
        (see take_over.lua). Returns how many leases ended."""
        calls = [(TAKE_OVER.keys(self.keys(s)), take_over_argv(o)) for s, o in held.items()]
        return sum(self.scripts.call(TAKE_OVER, calls))

    def eviction_policy(self) -> str | None:
        """Redis's ``maxmemory-policy`` (None if it names none); raises :class:`StoreError`
        when it cannot be read (CONFIG is often denied on managed Redis)."""
        with as_store_error():
            reply = cast(dict[str, str], self.client.config_get("maxmemory-policy"))
        return reply.get("maxmemory-policy")

    def time_ms(self) -> int:
        """Redis's clock."""
        with as_store_error():
            seconds, micros = cast(tuple[int, int], self.client.time())
        return seconds * 1000 + micros // 1000

    def backlog(
        self, shards: Sequence[Shard], now_ms: int | None = None, due_by_ms: int | None = None
    ) -> Backlog:
        """Scheduled, overdue and in-flight counts and the oldest overdue due time, summed; with
        ``due_by_ms`` (``EgressConfig.due_by_ms``), a record in flight counts in the oldest from
        its lease deadline minus that, a time by which it was due (stats.lua)."""
        if not shards:
            return Backlog(self.time_ms() if now_ms is None else now_ms, 0, 0, 0, None)
        args = stats_argv(now_ms, due_by_ms)
        replies = self.scripts.call(STATS, [(STATS.keys(self.keys(s)), args) for s in shards])
        oldest = [r.oldest_due_ms for r in replies if r.oldest_due_ms is not None]
        return Backlog(
            now_ms=replies[0].now_ms,
            scheduled=sum(r.scheduled for r in replies),
            overdue=sum(r.overdue for r in replies),
            inflight=sum(r.inflight for r in replies),
            oldest_due_ms=min(oldest) if oldest else None,
            references=sum(r.references for r in replies),
            overdue_by={p: sum(r.overdue_by[p] for r in replies) for p in Priority},
        )
