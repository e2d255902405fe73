"""What the store's calls return: claimed records, and the outcome of adds, binds and reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from bridge.message import Cancel, Priority, Scheduled
from bridge.store.keys import PerLane, Shard


@dataclass(slots=True)
class Claimed:
    """A record handed out by :meth:`Store.claim`, leased until acknowledged or expired. One
    per claimed record, so not frozen (see :class:`Scheduled`); treat it as immutable."""

    shard: Shard
    member: bytes  # the in-flight member, the offset's 8 bytes: what ack and release take
    record: Scheduled
    redelivery: bool
    # The shard's epoch when it was claimed: its acknowledgement names it, so one that comes after
    # the shard's state was retired (its topic recreated) leaves the new records alone.
    epoch: str = ""
    # The topic id of the incarnation it belongs to ("": not known): its journal entry names it,
    # so a take-over of a retired incarnation tells its entries from the new one's at its offsets.
    topic_id: str = ""
    # A recurring schedule the shard's registry says is paused (Registry.mark_paused): its
    # occurrence is skipped and the schedule carried on.
    paused: bool = False

    def given_id(self) -> str | None:
        """The record's delay-id if its producer gave one (only those are in the id index)."""
        return self.record.given_id(self.shard.topic, self.shard.partition)


class Bound(NamedTuple):
    """What :meth:`Store.bind` did to a shard: whether it ``replaced`` the state of an earlier
    incarnation (bound to ``stored_id``, up to ``watermark``), and the ``retired`` shard now
    holding that incarnation's ``records`` (None when it held none)."""

    replaced: bool
    stored_id: str
    records: int = 0
    watermark: int | None = None
    retired: Shard | None = None


class Lost(NamedTuple):
    """Redis no longer holds what was written to a shard: its state is gone (``watermark`` is
    None) or its watermark went back to ``watermark``."""

    watermark: int | None


class Withdrawn(NamedTuple):
    """A waiting record a cancel or a replacement withdrew: where it was (its ``shard`` and
    ``offset``), its due time (-1: a reference) and delay-id, and the record that did it."""

    shard: Shard
    offset: int
    due_ms: int
    delay_id: str
    by: Shard
    by_offset: int
    cancelled: bool  # else replaced


def ended_entry(shard: Shard, record: Scheduled, by: int, cancelled: bool) -> Withdrawn:
    """A record carrying a schedule on that add.lua did not store, its schedule ended (or moved
    to another record) by the record at offset ``by`` of the same shard: journaled as that
    record's withdrawal, so a rebuild does not store it either."""
    return Withdrawn(shard, record.offset, record.due_ms, record.delay_id, shard, by, cancelled)


def withdrawn_entry(
    where: tuple[Shard, int, int], by: Shard, record: Scheduled | Cancel, own_id: str = ""
) -> Withdrawn:
    """What ``record`` (of shard ``by``) withdrew ``where`` (shard, offset, due ms): named by the
    delay-id of its own (``own_id``) when it has one, else by the one ``record`` named."""
    shard, offset, due = where
    cancel = isinstance(record, Cancel) and not record.replaces
    return Withdrawn(shard, offset, due, own_id or record.delay_id, by, record.offset, cancel)


@dataclass(frozen=True)
class Added:
    """What :meth:`Store.add` did: records stored, waiting records replaced by a later one with
    their delay-id, cancels applied and cancels that found nothing waiting, and the shards it
    refused as lost."""

    count: int
    lost: dict[Shard, Lost]
    replaced: int = 0
    cancelled: int = 0
    not_found: int = 0
    # (shard, offset, delay-id) of the first few cancels per shard that found nothing
    missed: tuple[tuple[Shard, int, str], ...] = ()
    withdrawn: tuple[Withdrawn, ...] = ()  # what the cancels and replacements withdrew
    # Cancels and replacements that found nothing while another partition of their topic was not
    # whole in Redis: kept to look again (Store.add's ``keep``), a cancel not counted yet.
    kept: tuple[tuple[Shard, Scheduled | Cancel], ...] = ()

    def plus(self, later: Added) -> Added:
        """This and what a ``later`` call of the same batch did."""
        return Added(
            self.count + later.count,
            self.lost | later.lost,
            self.replaced + later.replaced,
            self.cancelled + later.cancelled,
            self.not_found + later.not_found,
            self.missed + later.missed,
            self.withdrawn + later.withdrawn,
            self.kept + later.kept,
        )


@dataclass(frozen=True)
class Lows:
    """What :meth:`Store.lows` found: per shard its lowest pending offset (else watermark + 1)
    and its watermark + 1, and the lost shards."""

    offsets: dict[Shard, int]
    lost: dict[Shard, Lost]
    ends: dict[Shard, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Backlog:
    """What waits in a set of shards, for the gauges."""

    now_ms: int
    scheduled: int
    overdue: int
    inflight: int
    oldest_due_ms: int | None
    references: int = 0  # far-future records held as references
    overdue_by: dict[Priority, int] = field(default_factory=dict)  # ``overdue`` by priority


class Claims(list[Claimed]):
    """The records a claim handed out, with Redis's clock at the claim (``now_ms``), its clock
    when the claim ended (``clock_ms``) and the local ``time.monotonic()`` when the reply came in
    (``received``: later than Redis read ``clock_ms``, so Redis's clock carried on from there is
    never ahead of Redis's) and, per shard claimed from, its earliest due time or lease deadline
    left (``next_ms``; None: nothing), the priorities it still has records due of
    (``due_lanes``; a shard with none is left out) and the earliest due time left in each of
    its lanes, high, normal and low (``earliest``; -1: none)."""

    def __init__(
        self,
        records: list[Claimed],
        now_ms: int,
        next_ms: dict[Shard, int | None],
        received: float,
        clock_ms: int,
        *,
        due_lanes: dict[Shard, frozenset[Priority]] | None = None,
        earliest: dict[Shard, PerLane] | None = None,
    ) -> None:
        super().__init__(records)
        self.now_ms = now_ms
        self.next_ms = next_ms
        self.received = received
        self.clock_ms = clock_ms
        self.due_lanes = due_lanes or {}
        self.earliest = earliest or {}


def lost_from(status: int, watermark: int) -> Lost | None:
    """A script's status as a :class:`Lost` (None: the shard is fine)."""
    # The scripts' status codes: 0 fine, 1 state missing, 2 watermark went back.
    if status == 1:
        return Lost(None)
    if status == 2:
        return Lost(watermark)
    return None
