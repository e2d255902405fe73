"""A bridge process a test starts with this folder on PYTHONPATH and ``CLOCK_SHIFT_MS`` set reads
this host's wall clock (``time.time``, ``time.time_ns``) moved by that many milliseconds, as a pod
whose clock is off would. The monotonic clock and the C libraries' clocks stay: librdkafka's timed
waits go by the kernel's wall clock, so moving the whole process's (LD_PRELOAD,
testbed/clock/shift.c) would stretch them by the shift and break its group membership, which a pod
whose clock is off does not see."""

import os
import time

_SHIFT_MS = int(os.environ.get("CLOCK_SHIFT_MS", "0"))

if _SHIFT_MS:
    _time_ns, _time = time.time_ns, time.time
    setattr(time, "time_ns", lambda: _time_ns() + _SHIFT_MS * 1_000_000)  # noqa: B010
    setattr(time, "time", lambda: _time() + _SHIFT_MS / 1000)  # noqa: B010
