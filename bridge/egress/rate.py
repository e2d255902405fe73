"""egress.max_rate: a token bucket that bounds how many records the mover claims per second."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from bridge.metrics import Metrics
from bridge.store import Claims

# The bucket holds at most this long's worth: a claim after a quiet spell takes no more than a
# tenth of a second of records at once, and a drain runs at the rate from its first second.
BURST_S = 0.1
# At the rate, a claim takes at least this long's worth: a few claims of many records rather than
# a claim per token.
STEP_S = 0.01


class RateLimit:
    """Records the mover may claim now; claims take what they got (a claim of one record per
    shard may overdraw it: the next waits the longer)."""

    def __init__(self, per_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s = per_s
        self.clock = clock
        self.burst = max(1.0, per_s * BURST_S)
        self.step = max(1.0, per_s * STEP_S)
        self._tokens = self.burst
        self._at = clock()

    def allowance(self) -> int:
        """Records that may be claimed now (0 until the bucket holds a step's worth)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        tokens = self._tokens + 1e-9  # what float sums of elapsed time lose
        return int(tokens) if tokens >= self.step else 0

    def take(self, records: int) -> None:
        """``records`` were claimed."""
        self._tokens -= records

    def wait_s(self) -> float:
        """Until the bucket holds a step's worth again."""
        return max(0.0, (self.step - self._tokens) / self.per_s)

    def count(self, claims: Claims, metrics: Metrics | None) -> None:
        """Take a claim's records from the bucket. With ``metrics``, the limit cut the claim
        short: if records are still due after it, each of its records waited for the rate
        (``delay_bridge_rate_limited_total``, by target)."""
        self.take(len(claims))
        if metrics is not None and claims.due_lanes:
            for target, n in Counter(c.record.target for c in claims).items():
                metrics.rate_limited.labels(target_topic=target).inc(n)
