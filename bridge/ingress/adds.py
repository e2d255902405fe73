"""The ingress's adds to the store, and the cancels and replacements they keep to look again.

What each add did is counted and journaled.

A cancel, or a record replacing another by its delay-id, looks for that record in its own
partition, then in its topic's others. When Redis lost a partition's state, the loss is found at
that partition's next add or at the next second's check, and its rebuild then reads it again up
to where it ended: until both are done, the records it held are not there to be found, and a
cancel or a replacement read meanwhile from another partition would find nothing and be done
with, while the rebuild brings its record back to be delivered. Such a cancel or replacement is
kept here instead (the replacement is stored all the same), and looks again once every other
partition of its topic this replica owns is whole: what the add looked in tells which have no
state in Redis, and the catch-up which are read behind their end, so keeping costs no call of its
own. add.lua keeps it in Redis as well until then (the shard's withdrawing ZSET), which holds its
partition's commit and resume point at it: a replica that dies meanwhile, or a Redis that loses
this partition too, reads it again.

A partition of the topic owned by another replica is known here by what Redis says of it: its
re-read after a loss is waited for (meta "reread", which its owner's first add of the re-read
sets), and so is the second or so before its owner finds the loss: Redis then holds no state of
it at all, and its log in Kafka holding records tells it from a partition that never had any.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from bridge.catchup import KEPT_ELSEWHERE, CatchUp
from bridge.errors import BridgeError
from bridge.message import Cancel, Scheduled, format_time_ms
from bridge.store import (
    Added,
    Confirm,
    Elsewhere,
    Logged,
    Schedules,
    Shard,
    Store,
    not_whole,
    shard_names,
    unconfirmed,
    undated,
    unlogged,
)

logger = logging.getLogger(__name__)

LOOK_INTERVAL_S = 1.0  # how often kept cancels ask Redis whether their topics are whole
# A partition whose re-read after a loss ended claims nothing until the cancels kept in its
# topic's other partitions looked again, this long at most (their replica may be gone).
KEPT_WAIT_S = 3 * LOOK_INTERVAL_S


@dataclass(frozen=True)
class TopicReads:
    """What the ingress reads in the delay topic while it stores (see :meth:`Store.add`):
    ``confirm`` reads the schedules the id index points at, ``schedules`` the records default
    delay-ids name (for their due times), ``logged`` which partitions hold records."""

    confirm: Confirm = unconfirmed
    schedules: Schedules = undated
    logged: Logged = unlogged


NO_READS = TopicReads()  # nothing read: the id index's candidates stand unconfirmed


class Adds:
    """Adds batches to the store; keeps the cancels to look again, by the shard they were read
    from."""

    def __init__(
        self,
        store: Store,
        catch_up: CatchUp,
        *,
        partitions: Callable[[], Mapping[str, int]] = dict,
        counted: Callable[[], Collection[str]] | None = None,
        reads: TopicReads = NO_READS,
        report: Callable[[Added], None] = lambda added: None,
        kept: Callable[[int], None] = lambda count: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``partitions``: each delay topic's partition count; ``counted``: the topics whose
        count Kafka told (None: all of them) — the others' may fall short, so what a cancel
        finds nowhere in them is kept until it did; ``reads``: what is read in the delay topic
        (:class:`TopicReads`); ``report`` counts and journals what the cancels did; ``kept`` is
        told how many cancels are kept whenever that changes."""
        self._store = store
        self._catch_up = catch_up  # the shards read behind their end, and the known watermarks
        self._partitions = partitions
        self._counted = counted
        self._reads = reads
        self._report = report
        self.by_shard: dict[Shard, list[Scheduled | Cancel]] = {}
        self._kept = kept
        self._clock = clock
        self._looked = 0.0  # when kept cancels last asked whether their topics are whole
        # Shards whose catch-up ended held until the cancels kept elsewhere in their topic
        # looked again (:meth:`let_go`): until when at most.
        self._ended: dict[Shard, float] = {}
        self._stamped: dict[Shard, int] = {}  # the earliest kept timestamps written to Redis
        self._caps: dict[Shard, int] = {}  # see :meth:`look_elsewhere`
        self._capped: set[Shard] = set()  # of those, the shards capped by cancels kept

    def add(
        self,
        batches: Mapping[Shard, tuple[int, Sequence[Scheduled | Cancel]]],
        expected: Mapping[Shard, int],
        refer_after_ms: int | None,
        bucket_ms: int,
    ) -> Added:
        """:meth:`Store.add` these ``batches``; what it did is reported, its cancels that found
        nothing while their topic was not whole are kept."""
        added = self._store.add(
            batches,
            expected,
            refer_after_ms=refer_after_ms,
            bucket_ms=bucket_ms,
            partitions=self._partitions(),
            confirm=self._reads.confirm,
            schedules=self._reads.schedules,
            keep=self.waiting,
            reread=self._catch_up.rereads(),
            mover=self._catch_up,
        )
        self._report(added)
        self.keep(added.kept)
        return added

    def waiting(self, shards: Sequence[Shard], looked: Elsewhere | None = None) -> frozenset[Shard]:
        """Those of ``shards`` whose topic has another partition not whole in Redis, or whose
        partition count Kafka has not told (what :meth:`Store.add` is given as ``keep``, with
        what its look in the other partitions saw; without it, read in Redis)."""
        catch_up = self._catch_up
        inventory, partitions = self._store.inventory, self._partitions()
        waiting = not_whole(
            inventory, shards, catch_up.ends, catch_up.marks, partitions, looked, self._reads.logged
        )
        if self._counted is None:
            return waiting
        counted = self._counted()
        return waiting | {s for s in shards if s.topic not in counted}

    def keep(self, kept: Sequence[tuple[Shard, Scheduled | Cancel]]) -> None:
        """Keep these cancels and replacements (:attr:`Added.kept`) until their topics are
        whole."""
        if not kept:
            return
        if not self.by_shard:  # once per wait, not per batch: a catch-up keeps one per record
            logger.info(
                "cancels and replacements found nothing while another partition of their topic "
                "is not whole in Redis: they look there again once it is "
                "(delay_bridge_cancels_kept counts them)"
            )
        for shard, cancel in kept:
            self.by_shard.setdefault(shard, []).append(cancel)
        self._told()

    def forget(self, shards: Collection[Shard]) -> None:
        """These shards are read again, or are no longer owned here: their cancels are read
        again (add.lua hands them back), here or where they are owned now."""
        forgotten = [s for s in shards if self.by_shard.pop(s, None) is not None]
        if forgotten:
            self._told()

    def reread_over(self, shards: Collection[Shard]) -> None:
        """These shards, read again after Redis lost their state, reached where they ended: so
        Redis says (add.lua says so at a record there or after it; a partition that ends with a
        transaction's marker has none), and other replicas' cancels wait for them no more."""
        if not shards:
            return
        try:
            self._store.inventory.reread_over(sorted(shards))
        except BridgeError as exc:  # the next add there says so
            logger.warning("the end of a re-read not written to redis yet: %s", exc)

    def let_go(self) -> None:
        """The shards whose catch-up ended held (``KEPT_ELSEWHERE``: a re-read after a loss, or
        one while cancels were kept here) are claimed from once no other partition of their
        topic keeps a cancel or replacement (its ``withdrawing`` ZSET, here or at another
        replica): those waited for the catch-up's end, and look again within LOOK_INTERVAL_S
        of it, before the record they name is claimed. KEPT_WAIT_S at most: a replica gone
        keeps its own until its partition's next owner reads them again."""
        held = self._catch_up.holding(KEPT_ELSEWHERE)
        now = self._clock()
        self._ended = {s: self._ended.get(s, now + KEPT_WAIT_S) for s in held}
        if not held:
            return
        partitions = self._partitions()
        others = {
            s: [Shard(s.topic, p) for p in range(partitions.get(s.topic, 0)) if p != s.partition]
            for s in held
        }
        wanted = sorted({o for v in others.values() for o in v})
        try:
            kept: Collection[Shard] | None = self._store.kept.read(wanted).keys()
        except BridgeError as exc:
            logger.warning("the cancels kept elsewhere not read in redis yet: %s", exc)
            kept = None
        for shard, until in list(self._ended.items()):
            keeping = kept is None or any(o in kept for o in others[shard])
            if keeping and now < until:
                continue
            if keeping:
                logger.warning(
                    "%s[%d] is claimed from again while its topic's other partitions still keep "
                    "cancels or replacements, %.0f s after its catch-up ended",
                    shard.topic,
                    shard.partition,
                    KEPT_WAIT_S,
                )
            del self._ended[shard]
            self._catch_up.hold(shard, False, KEPT_ELSEWHERE)

    def look_elsewhere(self) -> None:
        """The shards read again after a loss claim nothing due after the earliest cancel or
        replacement kept in their topic's other partitions, here or at another replica (what
        Redis says of them: :mod:`bridge.store.kept`), or, while none is, after Redis's clock
        as it last said so (:meth:`CatchUp.kept_elsewhere`). Where a partition keeps some and
        no timestamp is written, a shard stays where it was."""
        rereads = self._catch_up.rereads()
        if not rereads:
            if self._caps:
                self._caps = {}
                self._catch_up.kept_elsewhere({})
            return
        partitions = self._partitions()
        others = {
            s: [Shard(s.topic, p) for p in range(partitions.get(s.topic, 0)) if p != s.partition]
            for s in rereads
        }
        try:  # the clock first: a cancel kept after it is not in what is read after it
            now_ms = self._store.time_ms()
            kept = self._store.kept.read(sorted({o for v in others.values() for o in v}))
        except BridgeError as exc:  # the caps stand
            logger.debug("the cancels kept elsewhere not read in redis: %s", exc)
            return
        caps: dict[Shard, int] = {}
        for shard, around in others.items():
            was = self._caps.get(shard, -1)
            keeping = [o for o in around if o in kept]
            caps[shard] = min([now_ms, *(was if (t := kept[o]) is None else t for o in keeping)])
            if bool(keeping) != (shard in self._capped):
                self._say_capped(shard, keeping, caps[shard])
        self._capped &= caps.keys()
        self._caps = caps
        self._catch_up.kept_elsewhere(caps)

    def _say_capped(self, shard: Shard, keeping: Sequence[Shard], cap_ms: int) -> None:
        if not keeping:
            self._capped.discard(shard)
            logger.info(
                "%s, read again after a loss, claims by its re-read again: no cancel kept "
                "elsewhere waits for it",
                shard,
            )
            return
        self._capped.add(shard)
        logger.info(
            "%s, read again after a loss, claims nothing due after %s yet: %s keep cancels or "
            "replacements that wait for this re-read to end",
            shard,
            "its start" if cap_ms < 0 else format_time_ms(cap_ms),
            shard_names(keeping),
        )

    def caught_up(self, over: Collection[Shard]) -> None:
        """After a batch is applied, or none came: ``over``, the shards whose re-read after a
        loss ended now (:meth:`reread_over`); the cancels kept look again, the shards read
        again look at what other partitions keep (:meth:`look_elsewhere`), the shards whose
        re-read ended are let go once they did (:meth:`let_go`)."""
        self.reread_over(over)
        self.look_again()
        self.look_here()
        self.look_elsewhere()
        self.let_go()

    def look_here(self) -> None:
        """The cancels and replacements kept for their record in flight look in their shard
        again once the mover put records back there (bridge.claiming's ``keep_missed``)."""
        ready = self._catch_up.missed_put_back(self._clock())
        if not ready:
            return
        try:
            added = self._store.look_here(ready, self._reads.confirm)
        except BridgeError as exc:  # looked again at the next put-back, or forgotten
            logger.warning("cancels kept for their record in flight did not look again: %s", exc)
            return
        self._catch_up.found_missed(
            [
                (s, r)
                for s, r in ready
                if any(w.by == s and w.by_offset == r.offset for w in added.withdrawn)
            ]
        )
        self._report(added)

    def _told(self) -> None:
        self._kept(sum(len(cs) for cs in self.by_shard.values()))
        earliest = {
            shard: min(c.timestamp_ms for c in kept)
            for shard, kept in self.by_shard.items()
            if kept
        }
        firsts: dict[str, int] = {}
        for shard, first in earliest.items():
            firsts[shard.topic] = min(first, firsts.get(shard.topic, first))
        self._catch_up.kept(firsts)
        changed: dict[Shard, int | None] = {
            s: t for s, t in earliest.items() if self._stamped.get(s) != t
        }
        changed.update((s, None) for s in self._stamped.keys() - earliest.keys())
        try:  # for the replicas reading other partitions again (look_elsewhere)
            self._store.kept.write(changed)
        except BridgeError as exc:  # written at the next change; read meanwhile as unwritten
            logger.warning("the earliest cancel kept not written to redis: %s", exc)
            return
        self._stamped = earliest

    def look_again(self) -> None:
        """The cancels whose topics are whole again look there (asked at most once a
        second)."""
        if not self.by_shard:
            return
        now = self._clock()
        if now - self._looked < LOOK_INTERVAL_S:
            return
        self._looked = now
        try:
            waiting = self.waiting(sorted(self.by_shard))
            ready = [(s, c) for s, cs in self.by_shard.items() if s not in waiting for c in cs]
            if not ready:
                return
            added = self._store.look_again(
                ready,
                self._partitions(),
                confirm=self._reads.confirm,
                schedules=self._reads.schedules,
            )
        except BridgeError as exc:  # Redis, or Kafka for the records the id index names
            logger.warning("cancels and replacements kept did not look again yet: %s", exc)
            return
        self.forget({s for s, _ in ready})
        logger.info(
            "%d cancels and replacements kept looked again: %d found their record",
            len(ready),
            added.cancelled + added.replaced,
        )
        self._report(added)
