"""A claim's replies read into Claims: which clock the mover carries on (Redis Cluster's several
masters against one Redis)."""

from __future__ import annotations

from bridge.store import Shard
from bridge.store.api import _claims
from bridge.store.calls import ClaimReply

A, B = Shard("delay", 0), Shard("delay", 1)


def reply(start_ms: int, end_ms: int) -> ClaimReply:
    # now, redelivered, earliest due left, earliest lease, clock at the end, epoch, lanes due,
    # earliest due per lane, topic id: nothing claimed, nothing left
    return ClaimReply.read([start_ms, 0, -1, -1, end_ms, b"", 0, -1, -1, -1, b""])


def test_on_redis_cluster_the_mover_carries_on_the_earliest_master_clock() -> None:
    """Each shard's claim runs by its master's clock; carrying on the last reply's, a record
    claimed ahead from a master whose clock is behind could be produced early by its clock."""
    claims = _claims([A, B], [reply(1_000, 1_004), reply(1_900, 1_905)], one_clock=False)
    assert (claims.now_ms, claims.clock_ms) == (1_000, 1_004)
    claims = _claims([A, B], [reply(1_900, 1_905), reply(1_000, 1_004)], one_clock=False)
    assert (claims.now_ms, claims.clock_ms) == (1_000, 1_004)


def test_on_one_redis_the_clock_is_read_at_the_end_of_the_last_script() -> None:
    claims = _claims([A, B], [reply(1_000, 1_004), reply(1_004, 1_009)])
    assert (claims.now_ms, claims.clock_ms) == (1_000, 1_009)
