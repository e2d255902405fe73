"""The delay partitions this replica's consumer is assigned and its mover does not deliver from.

The consumer hands each partition it is assigned to the mover (Egress.add_shards) and takes back
each one revoked. Should the two ever disagree for longer than a hand-over takes — a bug in that
hand-over, as when a producer fenced by this replica's own dropped a partition the group had just
assigned here again — the partition's records are read and stored but never delivered, and no
other replica may deliver them. The probes look every round: a partition assigned and not owned
for DRIFT_S is logged as an error and taken over again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Protocol

from bridge.store import Shard, shard_names

logger = logging.getLogger(__name__)

DRIFT_S = 30.0  # far longer than a hand-over (an assignment's take-over, a fenced producer's)


class Mover(Protocol):
    """The egress, as the watch sees it (bridge.egress.mover.Egress)."""

    @property
    def owned(self) -> Collection[Shard]: ...

    def add_shards(self, shards: set[Shard]) -> None: ...


class OwnedWatch:
    """Compares the consumer's assignment with the mover's partitions, each probe round."""

    def __init__(
        self,
        assigned: Callable[[], Collection[Shard]],
        mover: Mover,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._assigned = assigned  # the consumer's (another thread's: copied, maybe mid-change)
        self._mover = mover
        self._clock = clock
        self._since: dict[Shard, float] = {}  # assigned and not owned since

    def check(self) -> None:
        try:
            assigned = {s.base() for s in list(self._assigned())}
        except RuntimeError:  # changed while copied: next round
            return
        owned = {s.base() for s in self._mover.owned}
        now = self._clock()
        drift = assigned - owned
        self._since = {s: self._since.get(s, now) for s in drift}
        stuck = {s for s, since in self._since.items() if now - since >= DRIFT_S}
        if not stuck:
            return
        logger.error(
            "%s assigned to this replica's consumer and not delivered from for %.0fs (a bug in "
            "their hand-over to the mover): taken over again",
            shard_names(stuck),
            DRIFT_S,
        )
        for shard in stuck:
            del self._since[shard]
        self._mover.add_shards(stuck)
