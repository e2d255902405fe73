"""What the ingress keeps of cancels and replacements that found nothing while another partition
of their topic was not whole in Redis."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import cast

import pytest

from bridge.catchup import CatchUp
from bridge.errors import StoreError
from bridge.ingress.adds import Adds
from bridge.message import Cancel
from bridge.store import Shard, Store


def test_a_catch_up_that_keeps_a_cancel_per_batch_logs_once_per_wait_and_counts_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A catch-up of records with delay-ids keeps every batch's: an INFO line per batch said the
    same thing thousands of times. Once per wait, and the gauge counts every one."""
    counts: list[int] = []
    written: dict[Shard, int | None] = {}
    store = SimpleNamespace(kept=SimpleNamespace(write=written.update))
    adds = Adds(cast(Store, store), CatchUp(), kept=counts.append)
    shards = [Shard("delay", 0), Shard("delay", 1)]
    with caplog.at_level(logging.INFO, logger="bridge.ingress.adds"):
        for batch in range(100):
            cancel = Cancel(batch, f"order-{batch}", timestamp_ms=1_000 + batch)
            adds.keep([(shards[batch % 2], cancel)])
        assert len(caplog.records) == 1
        assert counts == list(range(1, 101))
        # Each shard's earliest kept timestamp, for the replicas reading others again.
        assert written == {shards[0]: 1_000, shards[1]: 1_001}
        adds.forget(shards)
        assert counts[-1] == 0
        assert written == {shards[0]: None, shards[1]: None}
        adds.keep([(shards[0], Cancel(100, "order-100"))])  # the next wait says so again
        assert len(caplog.records) == 2


def test_a_re_read_is_capped_at_the_earliest_cancel_its_topics_other_partitions_keep(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The shards read again look at what the topic's other partitions keep in Redis: none, and
    their cap is Redis's clock; some with a timestamp written, the earliest; some without one
    (written a moment after the add), the cap stays where it was, as it does when Redis fails.
    The log says when a re-read waits for cancels kept elsewhere, and when no longer."""
    read_again, kept_by_other, unwritten = Shard("delay", 0), Shard("delay", 1), Shard("delay", 2)
    catch_up = CatchUp()
    catch_up.start(read_again, 0, 100, again=True)
    catch_up.read(read_again, 50_000)
    keeping: dict[Shard, int | None] = {}
    clock = [10_000]

    def read(shards: list[Shard]) -> dict[Shard, int | None]:
        assert shards == [kept_by_other, unwritten]  # the topic's other partitions
        if clock[0] < 0:
            raise StoreError("redis is down")
        return {s: t for s, t in keeping.items() if s in shards}

    store = SimpleNamespace(time_ms=lambda: clock[0], kept=SimpleNamespace(read=read))
    adds = Adds(cast(Store, store), catch_up, partitions=lambda: {"delay": 3})
    adds.look_elsewhere()
    assert catch_up.horizons() == {read_again: 10_000}
    keeping[kept_by_other] = 7_000
    clock[0] = 20_000
    with caplog.at_level(logging.INFO, logger="bridge.ingress.adds"):
        adds.look_elsewhere()
        adds.look_elsewhere()
    assert catch_up.horizons() == {read_again: 7_000}
    [line] = [r.getMessage() for r in caplog.records]
    assert "delay[0], read again after a loss, claims nothing due after 1970-01-01T00:00:07" in line
    assert "delay[1] keep cancels" in line
    keeping.clear()
    keeping[unwritten] = None
    adds.look_elsewhere()
    assert catch_up.horizons() == {read_again: 7_000}
    keeping.clear()
    clock[0] = -1
    adds.look_elsewhere()
    assert catch_up.horizons() == {read_again: 7_000}
    clock[0] = 30_000
    with caplog.at_level(logging.INFO, logger="bridge.ingress.adds"):
        adds.look_elsewhere()
    assert catch_up.horizons() == {read_again: 30_000}
    assert "claims by its re-read again" in caplog.records[-1].getMessage()
    catch_up.reached(read_again, 100)
    adds.look_elsewhere()  # no re-read left: nothing read in Redis
    assert catch_up.horizons() == {read_again: -1}  # held as it ended (KEPT_ELSEWHERE)
