"""The scripts' boundaries: each script's arguments and reply, built and read here.

A script takes its KEYS and ARGV by position and answers with a flat list (see its header). Each
is a :class:`~bridge.store.scripts.Script`: its KEYS in the script's order, named once there; its
ARGV built here from named values (``claim``'s by :class:`ClaimArgs`, ``add``'s by
:func:`add_argv`, the others' by ``<script>_argv``); its reply read into a named type — a
sentinel reply (add.lua's ``again``, ``confirm``, ``locate``; a lost shard's ``{1,
watermark}``; promote.lua's -1) into a typed outcome. Nothing else in the bridge names a
script's keys, lays out its arguments or indexes into a reply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

from bridge.message import Priority
from bridge.store.ids import id_hash
from bridge.store.keys import PerLane, offset_bytes, offset_of, text
from bridge.store.results import Lost, lost_from

# Records due within this long before a claim are "on time" and get half of every claim, so an
# overdue backlog drains without holding up records falling due now (claim.lua).
ON_TIME_WINDOW_MS = 1000


@dataclass(slots=True)
class AckBatch:
    """One shard's delivered records to acknowledge: the epoch they were claimed in, their
    offsets (8 bytes each: the claimed members), and how many of them have a caller-given
    delay-id (their id index entries go stale, to be swept: ack() in _lib.lua). The egress
    fills one per shard as delivery reports come in (bridge.egress.settle.Acked)."""

    epoch: str = ""
    members: list[bytes] = field(default_factory=list)
    with_ids: int = 0
    # Each member's target topic, in their order, or none at all: the script reads them from
    # the records (the per-target counts: the targets HASH in _lib.lua).
    targets: list[str] = field(default_factory=list)

    def argv(self) -> list[Any]:
        """As ack() in _lib.lua reads them: epoch, n, n offsets, how many have a delay-id, their
        targets."""
        members = self.members
        return [self.epoch, len(members), *members, self.with_ids, *targets_argv(self.targets)]


def targets_argv(targets: Sequence[str]) -> list[Any]:
    """Each item's target as named_targets in _lib.lua reads them: T, T names, and 2 bytes per
    item, the number of its target among them ("": none, 0)."""
    numbers: dict[str, int] = {"": 0}
    out = bytearray()
    for target in targets:
        number = numbers.get(target)
        if number is None:
            number = numbers[target] = len(numbers)
        out += _NUMBER[number] if number < len(_NUMBER) else number.to_bytes(2, "big")
    names = list(numbers)[1:]
    if len(names) > 0xFFFF:
        raise ValueError(f"{len(names)} targets in one call (at most 65535)")
    return [len(names), *names, bytes(out)]


_NUMBER = [n.to_bytes(2, "big") for n in range(256)]  # the common ones, made once


def optional(value: int | None) -> str:
    """A number a script may be given (a watermark, a time, a limit) as it takes it ("": none)."""
    return "" if value is None else str(value)


@dataclass(frozen=True, slots=True)
class ClaimArgs:
    """What one claim.lua call is asked (its ARGV, by name)."""

    limit: int
    lease_ms: int
    now_ms: int | None = None  # None: Redis TIME
    horizon: int | None = None  # records due after it stay (the ingress catching up)
    ahead_ms: int = 0  # default-id records due by now + this are leased too
    last_lane: Priority | None = None  # the lowest priority claimed from (None: all)
    last_ahead_lane: Priority | None = None  # the lowest priority claimed ahead (None: all)
    target: str = ""  # a rate-limited target whose wait index is claimed from ("": the due index)
    watermark: int | None = None  # the ingress's; a shard below it rolled back
    acks: AckBatch | None = None  # applied first, in the same call
    cap_ms: int | None = None  # now is at most this (the caller's other clocks; None: TIME alone)
    ahead_limit: int | None = None  # the most records leased ahead (None: as room allows)

    def argv(self) -> list[Any]:
        """claim.lua's ARGV."""
        return [
            self.limit,
            self.lease_ms,
            optional(self.now_ms),
            ON_TIME_WINDOW_MS,
            optional(self.horizon),
            self.ahead_ms,
            "" if self.last_lane is None else self.last_lane + 1,
            "" if self.last_ahead_lane is None else self.last_ahead_lane + 1,
            self.target,
            optional(self.watermark),
            optional(self.cap_ms),
            optional(self.ahead_limit),
            *(self.acks or AckBatch()).argv(),
        ]


class ClaimReply(NamedTuple):
    """claim.lua's reply, read."""

    now_ms: int  # the claim's now
    redelivered: int  # the first this many members were leased before (their leases ran out)
    next_due_ms: int | None  # the earliest due time left (None: none)
    next_lease_ms: int | None  # the earliest lease deadline (None: none)
    clock_ms: int  # Redis TIME at the end of the call
    epoch: str  # the shard's epoch: its acknowledgements name it
    due_lanes: frozenset[Priority]  # the lanes with records due left
    earliest: PerLane  # each lane's earliest due ms left (high, normal, low; -1)
    topic_id: str  # the incarnation the records belong to ("": not known)
    members: list[bytes]  # offset (8 bytes) + encoded record, in the order handed out

    @classmethod
    def read(cls, reply: Sequence[Any]) -> ClaimReply:
        """The reply as Redis sent it."""
        mask = int(reply[6])
        return cls(
            now_ms=int(reply[0]),
            redelivered=int(reply[1]),
            next_due_ms=_time(reply[2]),
            next_lease_ms=_time(reply[3]),
            clock_ms=int(reply[4]),
            epoch=text(reply[5]),
            due_lanes=frozenset(p for p in Priority if mask & 1 << p),
            earliest=(int(reply[7]), int(reply[8]), int(reply[9])),
            topic_id=text(reply[10]),
            members=list(reply[11:]),
        )

    def next_ms(self) -> int | None:
        """When the shard next has work: its earliest due time or lease deadline."""
        times = [t for t in (self.next_due_ms, self.next_lease_ms) if t is not None]
        return min(times) if times else None


def _time(value: Any) -> int | None:
    ms = int(value)
    return ms if ms >= 0 else None


# One record or cancel of an add.lua call, its ARGV group of five (a plain tuple: one is made per
# record ingested): its offset; its due-index score, or due ms (a reference), "" for a cancel;
# what is stored, or for a cancel where its default id's record is ("": none); the caller-given
# delay-id ("": none), or the id a cancel names; the delay-id's hash in the id index (b"": none).
AddEntry = tuple[int, int | str, bytes | str, str, bytes]


@dataclass(slots=True)
class AddEntries:
    """The entries of one add.lua call, with each one's record's target topic ("": a cancel or a
    reference, not counted in the targets HASH of _lib.lua)."""

    items: list[AddEntry] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    # The recurring schedules among them: (offset, the offset of the record it carries on from,
    # "" for one a producer wrote, "1" when it was carried on paused) — see add.lua's schedule
    # registry.
    recurring: list[tuple[int, int | str, str]] = field(default_factory=list)


def add_flags(*, across: bool, reread: int | None) -> str:
    """add.lua's flags of a shard: ``across`` its topic has other partitions, ``reread`` the
    offset up to which it is read again after Redis lost its state (see add.lua)."""
    return ("a" if across else "") + ("" if reread is None else f"r{reread}")


def add_argv(
    watermark: int | None,
    high: int,
    bucket_ms: int,
    vouched: Mapping[int, str],
    entries: AddEntries,
    *,
    replaces: Mapping[int, tuple[bytes, bool]],
    promotions: int | None = None,
    flags: str = "",
) -> list[Any]:
    """add.lua's ARGV: ``vouched`` the delay-id read in the delay topic at each offset (see
    withdraw in _lib.lua); ``replaces`` where the record each record of the batch replaces by
    its default delay-id, or exactly, waits (record offset -> a ``where``, and whether exactly:
    see ``delay-replaces``); ``promotions`` the shard's count
    of promotions read before the ``where`` were looked up (None: none was); ``flags`` what
    :func:`add_flags` says of the shard."""
    seen = "" if promotions is None else promotions
    argv: list[Any] = [optional(watermark), high, bucket_ms, seen, len(vouched)]
    for offset, delay_id in vouched.items():
        argv += (offset_bytes(offset), delay_id)
    argv.append(len(replaces))
    for offset, (named, exact) in replaces.items():
        argv += (str(offset), named, "1" if exact else "")
    argv.append(flags)
    argv += targets_argv(entries.targets)
    argv.append(len(entries.recurring))
    argv.extend(chain.from_iterable(entries.recurring))
    argv.extend(chain.from_iterable(entries.items))
    return argv


class AddReply(NamedTuple):
    """add.lua's reply, read."""

    loss: Lost | None  # the shard's state lost (nothing was added), else None
    added: int
    replaced: int
    cancelled: int
    not_found: int
    # The places in the batch of the cancels that found nothing here and of the records with a
    # caller-given id that replaced nothing here: the caller looks for theirs in the topic's other
    # partitions.
    unmatched: list[int]
    # What was withdrawn: (its offset, its due ms or -1, the place in the batch of what did it,
    # its own delay-id when what did it named it by its default id and it has one, else "").
    withdrawn: list[tuple[int, int, int, str]]
    # The records carrying a schedule on that were not stored: (their place in the batch, the
    # offset of what ended the schedule, whether that was a cancel or a one-shot record rather
    # than another schedule).
    ended: tuple[tuple[int, int, bool], ...] = ()
    in_flight: frozenset[int] = frozenset()  # of ``unmatched``: met their record in flight

    @classmethod
    def read(cls, reply: Sequence[Any]) -> AddReply:
        """The reply as Redis sent it."""
        loss = lost_from(int(reply[0]), int(reply[1]))
        if loss is not None:
            return cls(loss, 0, 0, 0, 0, [], [])
        added, replaced, cancelled, not_found, count = (int(n) for n in reply[1:6])
        end = 6 + count
        places = [int(i) for i in reply[6:end]]
        unmatched = [p if p >= 0 else -1 - p for p in places]
        flew = frozenset(-1 - p for p in places if p < 0)
        ends = int(reply[end])
        ended = tuple(
            (int(reply[i]), abs(int(reply[i + 1])), int(reply[i + 1]) < 0)
            for i in range(end + 1, end + 1 + 2 * ends, 2)
        )
        rest = reply[end + 1 + 2 * ends :]
        withdrawn = [
            (offset_of(rest[i]), int(rest[i + 1]), int(rest[i + 2]), text(rest[i + 3]))
            for i in range(0, len(rest), 4)
        ]
        return cls(None, added, replaced, cancelled, not_found, unmatched, withdrawn, ended, flew)


@dataclass(frozen=True, slots=True)
class Again:
    """add.lua: a reference was promoted since the caller looked for the records its default
    delay-ids name; nothing was written, the caller looks again."""


@dataclass(frozen=True, slots=True)
class ConfirmFirst:
    """add.lua: read these references in the delay topic first — (offset, due ms) each —
    and call again with their delay-ids vouched for; nothing was written."""

    asked: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class LocateFirst:
    """add.lua: these cancels' due-time hints found nothing: look for their records among the
    shard's whole records, and call again; nothing was written."""

    offsets: list[int]


AddOutcome = AddReply | Again | ConfirmFirst | LocateFirst


def add_outcome(reply: Any) -> AddOutcome:
    """add.lua's reply, read: its answer, or what it asks first."""
    if reply and isinstance(reply[0], bytes):
        if reply[0] == b"again":
            return Again()
        if reply[0] == b"confirm":
            pairs = range(1, len(reply), 2)
            return ConfirmFirst([(offset_of(reply[i]), int(reply[i + 1])) for i in pairs])
        if reply[0] == b"locate":
            return LocateFirst([offset_of(o) for o in reply[1:]])
    return AddReply.read(reply)


class Candidates(NamedTuple):
    """candidates.lua's reply, read."""

    found: list[list[tuple[int, int]]]  # per id hash asked, the (offset, due ms) of its entries
    stored: bool  # Redis holds the shard's state (a watermark): not lost, nor never made
    # Its owner reads it again after Redis lost it, not yet up to where it ended: not whole.
    rereading: bool = False

    @classmethod
    def read(cls, reply: Sequence[Any]) -> Candidates:
        *per_id, state = reply
        found = [[(offset_of(f[i]), int(f[i + 1])) for i in range(0, len(f), 2)] for f in per_id]
        return cls(found, int(state) > 0, int(state) == 2)


class StatsReply(NamedTuple):
    """stats.lua's reply, read: one shard's backlog figures."""

    now_ms: int
    scheduled: int  # due later
    overdue: int  # due, not claimed
    inflight: int
    oldest_due_ms: int | None  # the oldest overdue (or in flight) record's due time
    references: int
    overdue_by: PerLane  # overdue per lane: high, normal, low

    @classmethod
    def read(cls, reply: Sequence[Any]) -> StatsReply:
        """The reply as Redis sent it."""
        n = [int(v) for v in reply]
        return cls(n[0], n[1], n[2], n[3], _time(n[4]), n[5], (n[6], n[7], n[8]))


class BindReply(NamedTuple):
    """incarnation.lua's reply, read."""

    retired: bool  # the shard's state belonged to an earlier incarnation and was retired
    stored_id: str  # the topic id the shard was bound to
    records: int = 0  # records retired
    watermark: int | None = None  # the retired state's watermark

    @classmethod
    def read(cls, reply: Sequence[Any]) -> BindReply:
        """The reply as Redis sent it."""
        if int(reply[0]) == 0:
            return cls(False, text(reply[1]))
        return cls(True, text(reply[1]), int(reply[2]), _time(reply[3]))


# The other scripts' ARGV, each as its header documents it.


def low_argv(watermark: int | None, max_buckets: int, keep_ended_ms: int) -> list[Any]:
    """low.lua: the watermark the caller expects, how many buckets to look through, and how long
    the schedule registry keeps an ended schedule's marker."""
    return [optional(watermark), max_buckets, keep_ended_ms]


def release_argv(retry_in_ms: int, members: Sequence[bytes]) -> list[Any]:
    """release.lua: the back-off before the records are claimable again, their offsets."""
    return [retry_in_ms, *members]


def unclaim_argv(target: str, records: Sequence[tuple[int, bytes]]) -> list[Any]:
    """unclaim.lua: the target whose wait index they go back to ("": the due index), then each
    record's score and member."""
    return [target, *chain.from_iterable(records)]


def take_over_argv(held: Sequence[bytes]) -> list[Any]:
    """take_over.lua: the offsets whose leases stand (the caller's own in flight)."""
    return list(held)


def stats_argv(now_ms: int | None, due_by_ms: int | None) -> list[Any]:
    """stats.lua: the now to count by ("": Redis TIME) and egress.due_by_ms ("": none)."""
    return [optional(now_ms), optional(due_by_ms)]


def candidates_argv(topic: str, delay_ids: Sequence[str]) -> list[Any]:
    """candidates.lua: the delay-ids to look up in the delay topic ``topic``, each as its hash
    and itself."""
    return [x for i in delay_ids for x in (id_hash(topic, i), i)]


def promote_argv(
    field: str, data: bytes, retired: bool, members: Sequence[tuple[int, bytes]]
) -> list[Any]:
    """promote.lua: the chunk read (its field, length and first reference, which tell it has
    not changed since), whether its shard is a retired incarnation, then each record's score
    and member."""
    return [field, len(data), data[:16], "1" if retired else "0", *chain.from_iterable(members)]


def withdraw_argv(topic: str, hits: Sequence[tuple[str, bytes, int]]) -> list[Any]:
    """withdraw.lua: per record to withdraw of the delay topic ``topic``, the hash of its
    delay-id, its offset (8 bytes), its due ms and its delay-id."""
    return [x for i, o, due in hits for x in (id_hash(topic, i), o, due, i)]


def settle_argv(settled: Sequence[tuple[int, int, bytes]], leased: bool = True) -> list[Any]:
    """settle.lua: whether to forget records in flight too, then per record whose fate is sealed,
    its offset, due ms and delay-id hash (b"": its default id)."""
    return ["1" if leased else "0", *(x for o, d, h in settled for x in (offset_bytes(o), d, h))]


def incarnation_argv(topic_id: str, label: str, force: bool) -> list[Any]:
    """incarnation.lua: the topic id now ("": unknown), the label to retire under, and
    whether to retire even if the topic id is unchanged."""
    return [topic_id, label, "1" if force else "0"]


def retired_argv(label: str) -> list[Any]:
    """retired.lua: the retired incarnation's label."""
    return [label]


class LowReply(NamedTuple):
    """low.lua's reply, read."""

    loss: Lost | None  # the shard's state lost, else None
    watermark: int  # the highest offset handled (-1: none)
    low: int | None  # the lowest pending offset (None: none pending)

    @classmethod
    def read(cls, reply: Sequence[Any]) -> LowReply:
        """The reply as Redis sent it."""
        status, mark, low = reply
        return cls(lost_from(int(status), int(mark)), int(mark), offset_of(low) if low else None)


def count_of(reply: Any) -> int:
    return int(reply)


def stored_of(reply: Any) -> int | None:
    """promote.lua: records stored, or None when the chunk changed since it was read."""
    stored = int(reply)
    return None if stored < 0 else stored


class Withdrew(NamedTuple):
    """What withdraw.lua did: the offsets (8 bytes each) it withdrew; those of records named that
    it did not withdraw (in flight, or their occurrence acknowledged) but where it ended the
    schedule the registry had there; and those of records named whose schedule the registry has
    at a later record now (carried on since they were looked up: look again)."""

    withdrawn: list[bytes]
    ended: list[bytes]
    moved: list[bytes]

    @classmethod
    def read(cls, reply: Sequence[Any]) -> Withdrew:
        count = int(reply[0])
        ended = int(reply[1 + count])
        rest = 2 + count + ended
        return cls(list(reply[1 : 1 + count]), list(reply[2 + count : rest]), list(reply[rest:]))
