"""A loop's slow turns, logged with where the time went; and its thread, named for the system.

How an operator sees the bridge itself hold records up (a Redis call that took a second, a thread
that woke a second late because the process got no core or no GIL), apart from Redis or Kafka
being slow to answer — and, by the thread's name (:func:`name_os_thread`), which loop spends the
CPU."""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

SLOW_S = 0.25  # a turn this much longer than the wait it asked for is logged
WAKING = "waking"  # the part of a turn spent past the end of its wait
PR_SET_NAME = 15  # prctl(2): the calling thread's name


class Turns:
    """One loop's turns. :meth:`begin` starts one (judging the turn before), :meth:`mark` ends a
    named part of it, :meth:`waits` names how long it then means to sleep. A turn that ran SLOW_S
    past that sleep is logged at WARNING, naming its parts and how late the thread woke."""

    def __init__(self, loop: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.loop = loop
        self.clock = clock
        self._began = self._marked = clock()
        self._parts: dict[str, float] = {}  # seconds per part, in the order first marked
        self._wait_s = 0.0
        self.slowest_s = 0.0  # the longest turn past its wait so far (read by tests)

    def begin(self) -> None:
        now = self.clock()
        if self._parts or self._wait_s:
            # Its work, and how much later than asked it woke (woken early: not at all).
            late = max(0.0, now - self._marked - self._wait_s)
            self._parts[WAKING] = late
            self._judge(self._marked - self._began + late)
        self._began = self._marked = now
        self._parts, self._wait_s = {}, 0.0

    def mark(self, part: str) -> None:
        now = self.clock()
        self._parts[part] = self._parts.get(part, 0.0) + now - self._marked
        self._marked = now

    def waits(self, seconds: float) -> float:
        """The turn now sleeps ``seconds`` (returned, to pass on to the wait)."""
        self._wait_s = max(0.0, seconds)
        return seconds

    def _judge(self, over_s: float) -> None:
        self.slowest_s = max(self.slowest_s, over_s)
        if over_s < SLOW_S:
            return
        parts = ", ".join(
            f"{name} {seconds * 1000:,.0f} ms"
            for name, seconds in self._parts.items()
            if seconds >= 0.0005
        )
        logger.warning(
            "the %s loop's turn ran %s ms past its %s ms wait: %s",
            self.loop,
            f"{over_s * 1000:,.0f}",
            f"{self._wait_s * 1000:,.0f}",
            parts,
        )


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (``db-`` and its first 12 characters: Linux keeps 15) as
    the operating system sees it, so ``top -H``, ``/proc/<pid>/task/*/comm`` and profilers tell
    the bridge's loops apart by their CPU; nothing where the system has no such call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, f"db-{name}"[:15].encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass
