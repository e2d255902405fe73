"""The soak's records: a preload that puts the steady backlog in place, then the steady load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

from bridge.message import H_DELIVER_AT, H_TARGET_TOPIC, Headers
from testbed.workload import Record

PRELOAD_RATE = 5000.0  # records/s
MIN_DELAY_MS = 1000


def _spread(i: int) -> float:
    """A fixed pseudo-random fraction in [0, 1) for record ``i`` (Knuth's multiplicative
    hash): the same on every read, so the due time of a seq is known without storing it."""
    return ((i * 2654435761) & 0xFFFFFFFF) / 2**32


@dataclass
class Load:
    """The records of the soak, made when the workload asks for them: seq ``i < preload`` is the
    preload (produced at ``preload_rate`` from ``start_ms``), the rest the steady load (at
    ``rate`` from ``steady_start_ms``, set when it starts)."""

    target: str
    start_ms: int
    preload: int
    steady: int
    rate: float
    max_delay_ms: int
    preload_rate: float = PRELOAD_RATE
    steady_start_ms: int = 0

    def __len__(self) -> int:
        return self.preload + self.steady

    def due_ms(self, i: int) -> int:
        """When record ``i`` is due. The steady load's: its produce time as paced plus a delay
        uniform in MIN_DELAY_MS..max_delay_ms. The preload's: the end of the preload plus a wait
        with the density of a steady backlog's remaining waits (falling linearly to
        ``max_delay_ms``), so the backlog is the steady one when the steady load starts."""
        r = _spread(i)
        if i < self.preload:  # waiting from the end of the preload, as if produced at once
            return int(
                self.start_ms
                + self.preload * 1000 / self.preload_rate
                + self.max_delay_ms * (1 - (1 - r) ** 0.5)
            )
        produced = self.steady_start_ms + (i - self.preload) * 1000 / self.rate
        return int(produced + MIN_DELAY_MS + r * (self.max_delay_ms - MIN_DELAY_MS))

    def record(self, i: int) -> Record:
        headers: Headers = [
            (H_TARGET_TOPIC, self.target.encode()),
            (H_DELIVER_AT, b"%d" % self.due_ms(i)),
        ]
        return Record(headers, key=b"k%d" % (i % 997))


class Records(Sequence[Record]):
    """``load``'s records ``first``..``first + count`` for a :class:`Workload`, made one at a
    time (the hour's eight million would not fit in memory as objects)."""

    def __init__(self, load: Load, first: int, count: int) -> None:
        self.load, self.first, self.size = load, first, count

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | Sequence[Record]:
        if isinstance(i, slice):
            raise TypeError("Records are made one at a time")
        if not 0 <= i < self.size:
            raise IndexError(i)
        return self.load.record(self.first + i)
