"""Batches of delay-topic records added per shard (add.lua).

Their cancels and replacements withdraw what they name in their own partition and in the topic's
others (:mod:`bridge.store.across`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from bridge.message import Cancel, Scheduled
from bridge.store.across import (
    Elsewhere,
    Found,
    FoundAt,
    Named,
    default_id_wheres,
    named_by_default,
    references_named,
    replaced_exactly,
    withdraw_elsewhere,
)
from bridge.store.calls import (
    AddEntries,
    AddOutcome,
    AddReply,
    ConfirmFirst,
    LocateFirst,
    add_argv,
    add_flags,
)
from bridge.store.flight import InFlight, withdraw_in_flight
from bridge.store.ids import Confirm, Schedules, id_hash, undated
from bridge.store.inventory import Inventory
from bridge.store.keys import Keys, Shard, member, reference, score
from bridge.store.redis_errors import as_store_error
from bridge.store.results import Added, Lost, Withdrawn, ended_entry, withdrawn_entry
from bridge.store.scripts import ADD, Scripts

# add.lua asks to confirm the references its id lookups found at most once per batch (only the
# ingress adds to a shard, and nothing else makes references), to locate the records whose
# cancels' due-time hints missed them once (the records it is told of then are not hints), and to
# look again for what default delay-ids name when the read-back promoted a reference meanwhile (a
# chunk at a time, a few a second at most): a sixth round is a bug.
ROUNDS = 6


def add_call(
    keys: Keys,
    inventory: Inventory,
    shard: Shard,
    batch: tuple[int, Sequence[Scheduled | Cancel]],
    *,
    expected: int | None,
    refer_after_ms: int,
    bucket_ms: int,
    vouched: Mapping[int, str],
    locate: Collection[int] = (),
    schedules: Schedules = undated,
    across: bool = False,
    reread: int | None = None,
    named: Named | None = None,
) -> tuple[list[str], list[Any]]:
    """The add.lua call (KEYS, ARGV) of one shard's ``batch`` (highest offset, records);
    ``vouched`` the delay-ids read in the delay topic at the offsets add.lua asked about (its
    references of this batch with a caller-given id are vouched for here), ``locate`` the offsets
    it could not find at the due times their cancels gave; ``schedules`` reads the record a
    default delay-id names in the delay topic (for its due time). ``across``: the topic has other
    partitions (what finds nothing here is kept in Redis until looked for there:
    :func:`_looked_across`); ``reread``: the offset up to which the shard is read again after
    Redis lost its state (see add.lua); ``named``: the batch's :func:`named_by_default`, if the
    caller has it."""
    high, records = batch
    k = keys.of(shard)
    entries = AddEntries()
    vouch = dict(vouched)
    wheres, promotions = default_id_wheres(
        inventory,
        shard,
        records,
        refer_after_ms=refer_after_ms,
        locate=locate,
        schedules=schedules,
        named_as=named,
    )
    replaces: dict[int, tuple[bytes, bool]] = {}
    for i, rec in enumerate(records):
        if isinstance(rec, Cancel):
            where = wheres.get(i, b"")
            if rec.hold is not None:  # a pause or a resume
                where = b"p" if rec.hold else b"r"
            elif rec.ends is not None:  # a schedule's end, at the record it continues
                where = b"e"
                entries.recurring.append((rec.offset, rec.ends, ""))
            elif rec.left_out is not None:  # a schedule's record a re-read left out
                where = b"s"
                entries.recurring.append((rec.offset, "", "1" if rec.left_out else ""))
            elif rec.left_withdrawn:  # the same, cancelled
                where = b"x"
            hashed = id_hash(shard.topic, rec.delay_id)
            entries.items.append((rec.offset, "", where, rec.delay_id, hashed))
            entries.targets.append("")
            continue
        given = rec.given_id(shard.topic, shard.partition) or ""
        if i in wheres:
            replaces[rec.offset] = (wheres[i], replaced_exactly(shard, rec) is not None)
        if rec.due_ms > refer_after_ms:  # its priority is read back with the record
            stored, at = reference(rec.offset, rec.due_ms), rec.due_ms
            if given:
                vouch[rec.offset] = given
            entries.targets.append("")
        else:
            stored, at = member(rec, shard.topic, shard.partition), score(rec)
            entries.targets.append(rec.target)
        hashed = id_hash(shard.topic, given) if given else b""
        entries.items.append((rec.offset, at, stored, given, hashed))
        if rec.recurring and given:
            paused = "1" if rec.carried_on_paused() else ""
            entries.recurring.append(
                (rec.offset, "" if rec.continues is None else rec.continues, paused)
            )
    return (
        ADD.keys(k),
        add_argv(
            expected,
            high,
            bucket_ms,
            vouch,
            entries,
            replaces=replaces,
            promotions=promotions,
            flags=add_flags(across=across, reread=reread),
        ),
    )


# Entries of one add.lua call at most: a call holds Redis for its whole run (a cancel costs it
# ~20 µs), and a batch of records that each cancel hundreds (the command line's bulk cancel) is
# stored in several calls, one after the other, so the mover's claims go on between them.
CALL_ENTRIES = 1000

Batches = Mapping[Shard, tuple[int, Sequence[Scheduled | Cancel]]]


def rounds(
    batches: Batches, most: int = CALL_ENTRIES
) -> list[dict[Shard, tuple[int, Sequence[Scheduled | Cancel]]]]:
    """``batches`` as calls of at most ``most`` entries per shard, made one round after the other:
    a call ends at a record's last entry (the several cancels of one record are never split, so
    a watermark never stands at an offset half applied) and is high at its last offset, but the
    shard's last, high where its batch is."""
    if all(len(records) <= most for _, records in batches.values()):
        return [dict(batches)]  # the ingress's batches (ingress.batch_size, 500): one round
    out: list[dict[Shard, tuple[int, Sequence[Scheduled | Cancel]]]] = []
    for shard, (high, records) in batches.items():
        calls: list[list[Scheduled | Cancel]] = [[]]
        for i, rec in enumerate(records):
            ends = i + 1 == len(records) or records[i + 1].offset != rec.offset
            calls[-1].append(rec)
            if ends and len(calls[-1]) >= most and i + 1 < len(records):
                calls.append([])
        for k, part in enumerate(calls):
            if k == len(out):
                out.append({})
            out[k][shard] = (high if k == len(calls) - 1 else part[-1].offset, part)
    return out


def add(
    scripts: Scripts,
    keys: Keys,
    inventory: Inventory,
    batches: Batches,
    expected: Mapping[Shard, int],
    **how: Any,
) -> Added:
    """See :meth:`bridge.store.Store.add` (``how``: its keyword arguments)."""
    total: Added | None = None
    marks = dict(expected)
    for each in rounds(batches):
        lost = {} if total is None else total.lost
        calls = {s: c for s, c in each.items() if s not in lost}
        try:
            added = _add(scripts, keys, inventory, calls, marks, **how)
        finally:
            if how.get("mover") is not None:
                how["mover"].put_backs_unmark()
        marks |= {s: high for s, (high, _) in calls.items() if s not in added.lost}
        total = added if total is None else total.plus(added)
    return total if total is not None else Added(0, {})


def _add(
    scripts: Scripts,
    keys: Keys,
    inventory: Inventory,
    batches: Batches,
    expected: Mapping[Shard, int],
    *,
    refer_after_ms: int,
    bucket_ms: int,
    partitions: Mapping[str, int],
    confirm: Confirm,
    schedules: Schedules,
    keep: Keep,
    reread: Mapping[Shard, int],
    mover: InFlight | None,
) -> Added:
    """One round of :func:`add`: a call per shard."""
    mark = mover.put_backs_mark() if mover is not None else 0  # before add.lua runs
    shards = list(batches)
    vouched: dict[Shard, dict[int, str]] = {s: {} for s in shards}
    locate: dict[Shard, set[int]] = {s: set() for s in shards}
    named = {s: named_by_default(s, batches[s][1]) for s in shards}
    for shard in shards:  # read before add.lua asks for them: one call, not two
        if far := references_named(named[shard], refer_after_ms):
            vouched[shard] |= _own_ids(confirm, shard, far)

    def call(shard: Shard) -> tuple[list[str], list[Any]]:
        return add_call(
            keys,
            inventory,
            shard,
            batches[shard],
            expected=expected.get(shard),
            refer_after_ms=refer_after_ms,
            bucket_ms=bucket_ms,
            vouched=vouched[shard],
            locate=locate[shard],
            schedules=schedules,
            across=partitions.get(shard.topic, 0) > 1,
            reread=reread.get(shard),
            named=named[shard],
        )

    replies: dict[Shard, AddOutcome] = dict(
        zip(shards, scripts.call(ADD, [call(s) for s in shards]), strict=True)
    )
    for _ in range(ROUNDS):
        again = [s for s, r in replies.items() if not isinstance(r, AddReply)]
        if not again:
            break
        for shard in again:
            asked = replies[shard]
            if isinstance(asked, LocateFirst):
                locate[shard].update(asked.offsets)
            elif isinstance(asked, ConfirmFirst):
                read = confirm(shard, asked.asked)
                vouched[shard].update({o: read[o][0] if o in read else "" for o, _ in asked.asked})
        replies.update(zip(again, scripts.call(ADD, [call(s) for s in again]), strict=True))
    else:
        raise RuntimeError(f"add.lua asked again after {ROUNDS} rounds")
    counts, lost = [0, 0, 0, 0], {}
    unmatched: list[tuple[Shard, Scheduled | Cancel]] = []
    flew: set[tuple[Shard, int, str]] = set()  # of those, the ones that met their record in flight
    withdrawn: list[Withdrawn] = []
    for shard in shards:
        r = replies[shard]
        assert isinstance(r, AddReply)  # the rounds above end on add.lua's answer
        if r.loss is not None:
            lost[shard] = r.loss
            continue
        made = (r.added, r.replaced, r.cancelled, r.not_found)
        counts = [a + b for a, b in zip(counts, made, strict=True)]
        records = batches[shard][1]
        unmatched += [(shard, records[i]) for i in r.unmatched]
        flew.update((shard, records[i].offset, records[i].delay_id) for i in r.in_flight)
        withdrawn += [
            withdrawn_entry((shard, offset, due), shard, records[by], own)
            for offset, due, by, own in r.withdrawn
        ]
        withdrawn += [
            ended_entry(shard, rec, by, cancel)
            for place, by, cancel in r.ended
            if isinstance(rec := records[place], Scheduled)
        ]
    elsewhere = withdraw_elsewhere(
        scripts, keys, unmatched, partitions, confirm=confirm, schedules=schedules
    )
    found = elsewhere.found
    withdrawn += _across(unmatched, elsewhere.ended)
    missed = _missed(unmatched, found)
    if flew and mover is not None:
        found = {**found, **withdraw_in_flight(scripts, keys, missed, flew, mover, mark, confirm)}
        missed = _missed(missed, found)
    waiting = keep(sorted({s for s, _ in missed}), elsewhere) if missed else frozenset()
    kept = tuple((s, r) for s, r in missed if s in waiting)
    looked = [(s, r) for s, r in unmatched if partitions.get(s.topic, 0) > 1]
    _looked_across(scripts, keys, looked, kept)
    missed = [(s, r) for s, r in missed if s not in waiting]
    return _added(counts, lost, unmatched, withdrawn, found, missed, kept)


# Those of the shards of cancels and replacements that found nothing whose topic is not whole in
# Redis (their entries are kept to look again), given what the look in the other partitions saw
# of them (Elsewhere: their state not held, or read again).
Keep = Callable[[Sequence[Shard], Elsewhere], Collection[Shard]]


def keep_none(shards: Sequence[Shard], looked: Elsewhere) -> Collection[Shard]:
    """:data:`Keep` of a caller that keeps nothing to look again."""
    return ()


def look_again(
    scripts: Scripts,
    keys: Keys,
    kept: Sequence[tuple[Shard, Scheduled | Cancel]],
    partitions: Mapping[str, int],
    confirm: Confirm,
    schedules: Schedules,
) -> Added:
    """See :meth:`bridge.store.Store.look_again`."""
    elsewhere = withdraw_elsewhere(
        scripts, keys, kept, partitions, confirm=confirm, schedules=schedules
    )
    found = elsewhere.found
    _looked_across(scripts, keys, kept)
    cancels = sum(isinstance(r, Cancel) for _, r in kept)
    ended = _across(kept, elsewhere.ended)
    return _added([0, 0, 0, cancels], {}, list(kept), ended, found, _missed(kept, found))


def found_here(kept: Sequence[tuple[Shard, Scheduled | Cancel]], found: FoundAt) -> Added:
    """What the cancels and replacements ``kept`` for their record in flight found in their own
    shard when they looked again (bridge.store.flight): the rest were reported missed before."""
    hit = [(s, r) for s, r in kept if (s, r.offset, r.delay_id) in found]
    return _added([0, 0, 0, sum(isinstance(r, Cancel) for _, r in hit)], {}, hit, [], found, ())


def _looked_across(
    scripts: Scripts,
    keys: Keys,
    looked: Sequence[tuple[Shard, Scheduled | Cancel]],
    kept: Sequence[tuple[Shard, Scheduled | Cancel]] = (),
) -> None:
    """What add.lua kept to look for in the topics' other partitions (the shard's withdrawing
    ZSET) was ``looked`` for: forgotten. Until then it holds the offset to commit and is handed
    back by the next add (here, or on the replica that takes the shard over), so no fault
    between add.lua and the look loses a cancel or a replacement. Only the entries at the
    offsets looked for are forgotten, but those ``kept`` to look again (a record's several
    cancels go together: kept while one of them is). The rest stay: a shard read again after a
    take-over holds its last owner's entries at offsets not read again yet, and each is looked
    for when its cancel is read (add.lua hands back one under the watermark only while its
    entry stands)."""
    if not looked:
        return
    done: dict[Shard, set[int]] = {}
    for shard, rec in looked:
        done.setdefault(shard, set()).add(rec.offset)
    for shard, rec in kept:
        if shard in done:
            done[shard].discard(rec.offset)
    # Read, then removed by name: the commands the documented ACL user has (docs/redis.md).
    spans = [(keys.of(s).withdrawing, run) for s in sorted(done) for run in _runs(done[s])]
    with as_store_error():
        pipe = scripts.client.pipeline(transaction=False)
        for key, (first, last) in spans:
            pipe.zrangebyscore(key, first, last)
        found: list[list[bytes]] = pipe.execute() if spans else []
        pipe = scripts.client.pipeline(transaction=False)
        for (key, _), members in zip(spans, found, strict=True):
            if members:
                pipe.zrem(key, *members)
        pipe.execute()


def _runs(offsets: Collection[int]) -> list[tuple[int, int]]:
    """``offsets`` as runs of consecutive ones, (first, last) each, in order: a batch's records
    looked for are mostly one run, removed in one call."""
    runs: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _own_ids(confirm: Confirm, shard: Shard, offsets: Sequence[int]) -> dict[int, str]:
    """The delay-ids of the records of ``shard`` at ``offsets``, read in the delay topic ("": none
    read there), as add.lua's {"confirm", ...} asks for a reference's own: any record there."""
    read = confirm(shard, [(o, -1) for o in offsets])
    return {o: read[o][0] if o in read else "" for o in offsets}


def _missed(
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]],
    found: FoundAt,
) -> list[tuple[Shard, Scheduled | Cancel]]:
    """The ``unmatched`` cancels and replacements that other partitions did not find a record
    for either."""
    return [(s, r) for s, r in unmatched if (s, r.offset, r.delay_id) not in found]


def _added(
    counts: list[int],
    lost: dict[Shard, Lost],
    unmatched: list[tuple[Shard, Scheduled | Cancel]],
    withdrawn: list[Withdrawn],
    found: FoundAt,
    missed: Sequence[tuple[Shard, Scheduled | Cancel]],
    kept: Sequence[tuple[Shard, Scheduled | Cancel]] = (),
) -> Added:
    """What :meth:`Store.add` did: add.lua's ``counts`` (added, replaced, cancelled, not found),
    with what the ``unmatched`` cancels and replacements ``found`` in other partitions, the
    cancels and replacements ``missed`` everywhere (the cancels are reported), and those
    ``kept`` to look again (a cancel counted when it has)."""
    withdrawn += _across(unmatched, found)
    added, replaced, cancelled, not_found = counts
    not_found -= sum(isinstance(r, Cancel) for _, r in kept)
    across = sum(
        1 for s, r in unmatched if (s, r.offset, r.delay_id) in found and isinstance(r, Cancel)
    )
    replaced += len(found) - across
    return Added(
        added,
        lost,
        replaced,
        cancelled + across,
        not_found - across,
        tuple((s, r.offset, r.delay_id) for s, r in missed if isinstance(r, Cancel)),
        tuple(withdrawn),
        tuple(kept),
    )


def _across(
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]],
    found: Mapping[tuple[Shard, int, str], tuple[Found, ...]],
) -> list[Withdrawn]:
    """What the ``unmatched`` cancels and replacements ``found`` in other partitions, as the
    journal's entries have it."""
    return [
        withdrawn_entry((there, offset, due), s, r, own)
        for s, r in unmatched
        for there, offset, due, own in found.get((s, r.offset, r.delay_id), ())
    ]
