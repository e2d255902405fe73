"""Gives the C heap's free pages back to the kernel once a burst has passed.

A drain moves records through the process by the hundred thousand: their Kafka messages, Redis
replies and Python objects grow the C heap, and glibc keeps what they free for later instead of
returning it. So the resident size would follow the largest burst a process has met, not what it
holds now, and it could not show a leak. ``malloc_trim`` gives those pages back: measured in
docs/bench/history.md, "The soak's bridge RSS: the heap a drain leaves".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

TRIM_INTERVAL_S = 10.0  # how often free pages go back; each pass costs a few ms, the GIL released


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Return the C heap's free pages to the kernel; True if some were."""
    if _TRIM is None:
        return False
    started = time.perf_counter()
    released = bool(_TRIM(0))
    if released:
        logger.debug("free heap pages released in %.1f ms", (time.perf_counter() - started) * 1000)
    return released


class Trimmer:
    """:func:`release_free_memory` at most every TRIM_INTERVAL_S, however often it is called."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self._last >= TRIM_INTERVAL_S:
            release_free_memory()
            self._last = time.monotonic()
