"""claim.lua's boundary: its arguments and its reply as named types, built and read here only.

The script takes its arguments by position and answers with a flat list (see its header); nothing
else in the bridge indexes into either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from bridge.message import Priority
from bridge.store.keys import text

# Records due within this long before a claim are "on time" and get half of every claim, so an
# overdue backlog drains without holding up records falling due now (claim.lua).
ON_TIME_WINDOW_MS = 1000


@dataclass(frozen=True, slots=True)
class AckBatch:
    """One shard's delivered records to acknowledge: the epoch they were claimed in, their
    offsets (8 bytes each: the claimed members), and (delay-id, offset) for those with a
    caller-given delay-id, which leave the id index with them (ack() in _lib.lua)."""

    epoch: str = ""
    members: Sequence[bytes] = ()
    ids: Sequence[tuple[str, bytes]] = ()

    def argv(self) -> list[Any]:
        """As ack() in _lib.lua reads them: epoch, n, n offsets, then (delay-id, offset) pairs."""
        return [self.epoch, len(self.members), *self.members,
                *(x for pair in self.ids for x in pair)]  # fmt: skip


NO_ACKS = AckBatch()


def watermark_arg(watermark: int | None) -> str:
    """A watermark the caller expects, as the scripts take it ("": none known)."""
    return "" if watermark is None else str(watermark)


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
    acks: AckBatch = NO_ACKS  # applied first, in the same call

    def argv(self) -> list[Any]:
        """claim.lua's ARGV."""
        return [
            self.limit,
            self.lease_ms,
            "" if self.now_ms is None else self.now_ms,
            ON_TIME_WINDOW_MS,
            "" if self.horizon is None else self.horizon,
            self.ahead_ms,
            "" if self.last_lane is None else self.last_lane + 1,
            "" if self.last_ahead_lane is None else self.last_ahead_lane + 1,
            self.target,
            watermark_arg(self.watermark),
            *self.acks.argv(),
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
    earliest: tuple[int, int, int]  # each lane's earliest due ms left (high, normal, low; -1)
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
            members=list(reply[10:]),
        )

    def next_ms(self) -> int | None:
        """When the shard next has work: its earliest due time or lease deadline."""
        times = [t for t in (self.next_due_ms, self.next_lease_ms) if t is not None]
        return min(times) if times else None


def _time(value: Any) -> int | None:
    ms = int(value)
    return ms if ms >= 0 else None
