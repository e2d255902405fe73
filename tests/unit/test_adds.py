"""What the ingress keeps of cancels and replacements that found nothing while another partition
of their topic was not whole in Redis."""

from __future__ import annotations

import logging
from typing import cast

import pytest

from bridge.catchup import CatchUp
from bridge.ingress.adds import Adds
from bridge.message import Cancel
from bridge.store import Shard, Store


def test_a_catch_up_that_keeps_a_cancel_per_batch_logs_once_per_wait_and_counts_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A catch-up of records with delay-ids keeps every batch's: an INFO line per batch said the
    same thing thousands of times. Once per wait, and the gauge counts every one."""
    counts: list[int] = []
    adds = Adds(cast(Store, None), CatchUp(), kept=counts.append)
    shards = [Shard("delay", 0), Shard("delay", 1)]
    with caplog.at_level(logging.INFO, logger="bridge.ingress.adds"):
        for batch in range(100):
            adds.keep([(shards[batch % 2], Cancel(batch, f"order-{batch}"))])
        assert len(caplog.records) == 1
        assert counts == list(range(1, 101))
        adds.forget(shards)
        assert counts[-1] == 0
        adds.keep([(shards[0], Cancel(100, "order-100"))])  # the next wait says so again
        assert len(caplog.records) == 2
