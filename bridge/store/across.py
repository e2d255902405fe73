"""A schedule's identity is (delay topic, delay-id): cancels and replacements across partitions.

add.lua applies a cancel or a replacement in its own partition's shard, in offset order. One that
finds nothing there (a producer whose partitioner differs from the schedule's, a topic that gained
partitions since) withdraws what it names in the topic's other partitions, if that record is
stamped no later than itself: a schedule produced after a cancel stands. Such a cancel is applied
when the ingress reads it, so it wins against its record's due time only if read before then (the
same partition gives the stronger guarantee: see docs/cancel-replace.md).

The id index keeps a hash of each id, not the id nor the record's timestamp: the other partitions'
indexes give candidates (candidates.lua, one call per partition in one round trip), each is read
in the delay topic (:data:`bridge.store.ids.Confirm`: its delay-id and timestamp decide), and
withdraw.lua runs only where one is confirmed. A record with its own id first seen, the usual case,
costs a bucket lookup per other partition and no read. A schedule that the partition's owner
(another replica) carried on between the look and the withdrawal is looked for again where it is
now (withdraw.lua names it), up to :data:`LOOKS` times.

A default delay-id, ``<topic>:<partition>:<offset>``, is not in the id index: a cancel of one,
in the partition it names, finds its record by offset and the due time it gives, or else the due
time the record read at that offset asks for (:data:`bridge.store.ids.Schedules`), which add.lua
checks (:func:`default_id_wheres`).

A cancel that finds nothing anywhere while another partition of its topic is not whole in Redis
(lost, or read again) is kept to look again: :func:`not_whole` says which.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from bridge.message import (
    H_DUE_AT,
    H_REPLACES,
    Cancel,
    Headers,
    Scheduled,
    parse_count,
    parse_origin,
)
from bridge.store.calls import candidates_argv, withdraw_argv
from bridge.store.ids import Confirm, Logged, Schedules, unlogged
from bridge.store.inventory import Inventory
from bridge.store.keys import Keys, Shard, default_id_offset, offset_bytes, offset_of, where
from bridge.store.scripts import CANDIDATES, WITHDRAW, Scripts

# Where a cancel or replacement found its record in another partition: (shard, offset, due ms,
# the record's own delay-id when it was named by another: its default id; else "").
Found = tuple[Shard, int, int, str]
Asked = tuple[Shard, int, str]  # a cancel or replacement: its shard, offset and delay-id
# Each cancel or replacement with the records it found.
FoundAt = dict[Asked, tuple[Found, ...]]
# What withdraw.lua is asked to withdraw in one partition: offset (8 bytes) -> the cancel's or
# replacement's shard and record, the due time there, and the record's own delay-id (or "").
Hits = dict[bytes, tuple[Shard, "Scheduled | Cancel", int, str]]
LOOKS = 3  # looks by the id index at most, while a schedule found is carried on meanwhile


class Elsewhere(NamedTuple):
    """What :func:`withdraw_elsewhere` did: for the (shard, offset, delay-id) of each cancel or
    replacement that withdrew records, where they were (:data:`FoundAt`); the other partitions
    it looked in whose state Redis does not hold (lost, or never made); those their owners read
    again after Redis lost them, not yet up to where they ended; and where each ended the
    schedule the registry had at a record it did not withdraw (in flight, or its occurrence
    acknowledged): journaled as that record's withdrawal, so that a rebuild that does not read
    the cancel again ends the schedule there too."""

    found: FoundAt
    unstored: frozenset[Shard]
    rereading: frozenset[Shard] = frozenset()
    ended: Mapping[Asked, tuple[Found, ...]] = MappingProxyType({})


class Did(NamedTuple):
    """What withdraw.lua did for a look: :attr:`Elsewhere.found` and :attr:`Elsewhere.ended`, and
    the cancels and replacements that found a schedule carried on since they looked."""

    found: FoundAt
    ended: FoundAt
    moved: set[Asked]


def withdraw_elsewhere(
    scripts: Scripts,
    keys: Keys,
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]],
    partitions: Mapping[str, int],
    *,
    confirm: Confirm,
    schedules: Schedules | None = None,
) -> Elsewhere:
    """Withdraw what ``unmatched`` cancels and replacements name in the other partitions of
    their topic — by the id index, and a default delay-id of another partition at its offset
    (``schedules``: read there; without it, not looked for) —; returns what it found, and
    where it could not have (:class:`Elsewhere`)."""
    found_at: FoundAt = {}
    ended: FoundAt = {}
    unstored: set[Shard] = set()
    rereading: set[Shard] = set()
    looking = list(unmatched)
    # A schedule its owner (another replica) carried on between the look and the withdrawal is
    # looked for again where it is now, a few times at most.
    for _ in range(LOOKS):
        did = look(scripts, keys, looking, partitions, confirm, unstored, rereading)
        _join(found_at, did.found)
        _join(ended, did.ended)
        looking = [(s, r) for s, r in looking if (s, r.offset, r.delay_id) in did.moved]
        if not looking:
            break
    if schedules is not None:
        left = [(s, r) for s, r in unmatched if (s, r.offset, r.delay_id) not in found_at]
        did = _withdraw_origins(scripts, keys, left, partitions, schedules)
        _join(found_at, did.found)
        _join(ended, did.ended)
    return Elsewhere(found_at, frozenset(unstored), frozenset(rereading), ended)


def _join(found_at: FoundAt, more: Mapping[Asked, tuple[Found, ...]]) -> None:
    """Add to ``found_at`` what a further look found."""
    for key, found in more.items():
        found_at[key] = found_at.get(key, ()) + found


def look(
    scripts: Scripts,
    keys: Keys,
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]],
    partitions: Mapping[str, int],
    confirm: Confirm,
    unstored: set[Shard],
    rereading: set[Shard],
    asked: Sequence[tuple[Shard, list[tuple[Shard, Scheduled | Cancel]]]] | None = None,
) -> Did:
    """One look by the id index in the other partitions (or where ``asked`` says: each
    partition with what to look for there), adding to ``unstored`` and ``rereading``
    (:class:`Elsewhere`)."""
    if asked is None:
        asked = _elsewhere(unmatched, partitions)
    if not asked:
        return Did({}, {}, set())
    lookups = [
        (
            CANDIDATES.keys(keys.of(there)),
            candidates_argv(there.topic, [r.delay_id for _, r in theirs]),
        )
        for there, theirs in asked
    ]
    planned: list[tuple[Shard, Hits]] = []
    for (there, theirs), reply in zip(asked, scripts.call(CANDIDATES, lookups), strict=True):
        candidates = reply.found
        if not reply.stored:
            unstored.add(there)
        if reply.rereading:
            rereading.add(there)
        if not any(candidates):
            continue
        read = confirm(there, sorted({c for found in candidates for c in found}))
        hits: Hits = {}
        for (s, r), found in zip(theirs, candidates, strict=True):
            for offset, due in found:
                delay_id, stamped = read.get(offset, ("", 0))
                mine = there == s and offset == r.offset  # a replacement is not its own record
                if delay_id == r.delay_id and stamped <= r.timestamp_ms and not mine:
                    hits.setdefault(offset_bytes(offset), (s, r, due, ""))
        planned.append((there, hits))
    return withdraw_hits(scripts, keys, planned)


def _elsewhere(
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]], partitions: Mapping[str, int]
) -> list[tuple[Shard, list[tuple[Shard, Scheduled | Cancel]]]]:
    """Each other partition of their topics, with the ``unmatched`` to look for there."""
    by_topic: dict[str, list[tuple[Shard, Scheduled | Cancel]]] = {}
    for shard, rec in unmatched:
        if partitions.get(shard.topic, 0) > 1:
            by_topic.setdefault(shard.topic, []).append((shard, rec))
    asked: list[tuple[Shard, list[tuple[Shard, Scheduled | Cancel]]]] = []
    for topic, items in by_topic.items():
        for partition in range(partitions[topic]):
            theirs = [(s, r) for s, r in items if s.partition != partition]
            if theirs:
                asked.append((Shard(topic, partition), theirs))
    return asked


def _withdraw_origins(
    scripts: Scripts,
    keys: Keys,
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]],
    partitions: Mapping[str, int],
    schedules: Schedules,
) -> Did:
    """What :func:`withdraw_elsewhere` withdraws for the cancels and replacements that name a
    default delay-id of another partition (not in its id index): the record at that offset, read
    once in the delay topic for its due time, delay-id and timestamp (stamped no later than the
    one that names it), whatever its own delay-id — as a default id names its record in its own
    partition."""
    named: dict[Shard, dict[int, list[tuple[Shard, Scheduled | Cancel]]]] = {}
    for s, r in unmatched:
        parts = parse_origin(r.delay_id)
        if parts is None or parts[0] != s.topic or parts[1] == s.partition:
            continue
        if isinstance(r, Scheduled) and r.default_of is not None:
            continue  # its own default id
        if parts[1] < partitions.get(s.topic, 0):
            named.setdefault(Shard(s.topic, parts[1]), {}).setdefault(parts[2], []).append((s, r))
    planned: list[tuple[Shard, Hits]] = []
    for there, by_offset in named.items():
        hits: Hits = {}
        for offset, rec in sorted(schedules(there, sorted(by_offset)).items()):
            # The first that names it and was stamped no earlier than it.
            namers = [(s, r) for s, r in by_offset[offset] if rec.timestamp_ms <= r.timestamp_ms]
            if namers:
                hits[offset_bytes(offset)] = (*namers[0], rec.due_ms, rec.delay_id)
        planned.append((there, hits))
    # A record named by its default id ends its schedule only while waiting or in flight, as
    # in its own partition (add.lua): one whose schedule moved on since is not looked for again.
    return withdraw_hits(scripts, keys, planned)


def withdraw_hits(scripts: Scripts, keys: Keys, planned: Sequence[tuple[Shard, Hits]]) -> Did:
    """withdraw.lua for each partition's ``planned`` hits, in one round trip."""
    calls: list[tuple[list[str], list[Any]]] = []
    done: list[tuple[Shard, Hits]] = []
    for there, hits in planned:
        if hits:
            args = withdraw_argv(
                there.topic,
                [(own or r.delay_id, offset, due) for offset, (_, r, due, own) in hits.items()],
            )
            calls.append((WITHDRAW.keys(keys.of(there)), args))
            done.append((there, hits))
    found_at: FoundAt = {}
    ended: FoundAt = {}
    moved: set[Asked] = set()
    for (there, hits), did in zip(done, scripts.call(WITHDRAW, calls), strict=True):
        for into, offsets in ((found_at, did.withdrawn), (ended, did.ended)):
            for offset in offsets:
                s, r, due, own = hits[offset]
                _join(into, {(s, r.offset, r.delay_id): ((there, offset_of(offset), due, own),)})
        for offset in did.moved:
            s, r, _, _ = hits[offset]
            moved.add((s, r.offset, r.delay_id))
    return Did(found_at, ended, moved - set(found_at) - set(ended))


def replaced_exactly(shard: Shard, record: Scheduled | Cancel) -> int | None:
    """The offset of the record ``record`` replaces exactly (``delay-replaces``: an earlier
    record of its own partition, the command line's fire and reschedule name theirs so): that
    record only, and nothing if it no longer waits. None: no such header, or one naming another
    partition or a later offset (then a replacement by its delay-id as any other)."""
    if isinstance(record, Cancel):
        return None
    for name, value in record.headers:
        if name == H_REPLACES:
            named = parse_origin((value or b"").decode("utf-8", "replace"))
            if named is not None and named[:2] == (shard.topic, shard.partition):
                return named[2] if named[2] < record.offset else None
            return None
    return None


def due_hint(headers: Headers) -> int | None:
    """The ``delay-due-at`` of a record that replaces another by its default delay-id: the due
    time of the record it replaces, as the command line gives it (None: none, or not a time)."""
    for name, value in headers:
        if name == H_DUE_AT:
            return parse_count(value)
    return None


# The records of a shard that the cancels and replacements of a batch name by their default
# delay-ids or exactly (see default_id_wheres), by their place in the batch, and the due time each
# gives for its record (None: none).
Named = tuple[dict[int, int], dict[int, int | None]]


def named_by_default(shard: Shard, batch: Sequence[Scheduled | Cancel]) -> Named:
    """The :data:`Named` of ``batch``, read from ``shard``."""
    named: dict[int, int] = {}  # its place -> the offset the default id names
    hints: dict[int, int | None] = {}
    for i, c in enumerate(batch):
        if isinstance(c, Scheduled) and c.default_of is not None:
            continue  # its own default id (the parser says so): no other record's
        if isinstance(c, Cancel) and (
            c.hold is not None or c.ends is not None or c.left_out is not None or c.left_withdrawn
        ):
            continue  # a pause, a resume, an end, a record left out: never by a default id
        o = replaced_exactly(shard, c)
        if o is None:
            o = default_id_offset(shard, c.delay_id)
        if o is None or o >= c.offset:
            continue
        named[i] = o
        hints[i] = c.due_ms if isinstance(c, Cancel) else due_hint(c.headers)
    return named, hints


def references_named(named: Named, refer_after_ms: int) -> list[int]:
    """Of the records ``named``, those with a due time past ``refer_after_ms``: kept as
    references (a reference turns whole only as its due time nears), their own delay-ids in the
    delay topic alone. add.lua asks for the rest it finds references."""
    by_place, hints = named
    far = {o for i, o in by_place.items() if (h := hints[i]) is not None and h > refer_after_ms}
    return sorted(far)


def default_id_wheres(
    inventory: Inventory,
    shard: Shard,
    batch: Sequence[Scheduled | Cancel],
    *,
    refer_after_ms: int,
    locate: Collection[int] = (),
    schedules: Schedules | None = None,
    named_as: Named | None = None,
) -> tuple[dict[int, bytes], int | None]:
    """For each cancel of the ``batch`` that names a default delay-id of ``shard``, each
    record that has one as its delay-id (it replaces that record) and each that names the record
    it replaces exactly (:func:`replaced_exactly`), keyed by its place in the
    batch (a record with several cancels is a cancel each, at one offset),
    where the record named waits (a ``where`` of add.lua): earlier in the batch (kept as a
    reference if due after ``refer_after_ms``), at the due time its cancel gives
    (``delay-due-at``: a hint add.lua checks), or else at the due time the record asks for,
    read at its offset in the delay topic (``schedules``: a hint too), or, when the topic no
    longer holds it, in Redis (:meth:`Inventory.wholes`, all in one pass over the shard's whole
    records) — as for the offsets add.lua could not ``locate`` at their hints; due -1 when in no
    index (a reference, or gone). Then the shard's
    promotions counted before Redis was looked at (None: it was not): a reference promoted since
    is whole where a -1 does not look, so add.lua answers "again" when the count moved."""
    named, hints = named_as or named_by_default(shard, batch)
    if not named:
        return {}, None
    scheduled = {r.offset: r for r in batch if isinstance(r, Scheduled)}
    dues: dict[int, int] = {}
    for target in set(named.values()):
        rec = scheduled.get(target)
        if rec is not None:
            dues[target] = -1 if rec.due_ms > refer_after_ms else rec.due_ms
    for place, o in named.items():
        if o not in dues and o not in locate and (hint := hints[place]) is not None:
            dues[o] = hint
    unread = sorted({o for o in named.values() if o not in dues and o not in locate})
    if unread and schedules is not None:
        dues |= {o: rec.due_ms for o, rec in schedules(shard, unread).items()}
    wanted = {o for o in named.values() if o not in dues}
    promotions = inventory.promotions(shard) if wanted else None
    dues |= inventory.wholes(shard, wanted) if wanted else {}
    return {c: where(offset_bytes(o), dues[o]) for c, o in named.items()}, promotions


def not_whole(
    inventory: Inventory,
    shards: Sequence[Shard],
    reading: Callable[[], Collection[Shard]],
    known: Mapping[Shard, int],
    partitions: Mapping[str, int],
    looked: Elsewhere | None = None,
    logged: Logged = unlogged,
) -> frozenset[Shard]:
    """Those of ``shards`` whose topic has another partition Redis does not hold whole yet: one
    ``reading`` (read here behind its end: after a rebuild, it has not reached the records a
    cancel may name), one ``known`` (the caller's watermarks) whose watermark Redis lost since
    (its rebuild is yet to start), one another replica reads again after Redis lost it, not yet
    up to where it ended (meta "reread"), or one Redis holds no state of whose log holds records
    (``logged``, read in Kafka): another replica's, lost, before its owner finds out. ``looked``:
    what the caller's look in the other partitions just saw of them; without it, read in Redis
    (``partitions``: each topic's partition count)."""
    if not shards:
        return frozenset()
    topics = {s.topic for s in shards}
    behind = {s.base() for s in reading()}
    others = [s for s in known if s.topic in topics and s.base() not in behind]
    mine = {s.base() for s in known}
    if looked is not None:
        behind |= {s.base() for s in others if s in looked.unstored}
        behind |= {s.base() for s in looked.rereading if s.topic in topics}
        unstored = {s.base() for s in looked.unstored if s.topic in topics}
    else:
        if others:
            held = inventory.watermarks(others)
            behind |= {s.base() for s in others if s not in held}
        theirs = [
            there
            for topic in sorted(topics)
            for p in range(partitions.get(topic, 0))
            if (there := Shard(topic, p)) not in mine | behind
        ]
        rereading, unstored = inventory.rereading(theirs)
        behind |= rereading
    if unstored := unstored - mine - behind:
        behind |= set(logged(sorted(unstored)))
    return frozenset(s for s in shards if any(o.topic == s.topic and o != s.base() for o in behind))
