"""The scripts read a stored record's delay-id as Python's decode does (stored_id in _lib.lua), on
a real Redis: what an id index that keeps a hash of the id checks a match against."""

from __future__ import annotations

import struct
from typing import cast

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.message import H_ID, H_TARGET_TOPIC, Headers, Priority, Scheduled, encode
from bridge.store.keys import LANE_WIDTH
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

READ_ID = (
    f"local LANE = {LANE_WIDTH}\n"
    + (ROOT / "bridge" / "store" / "lua" / "_lib.lua").read_text()
    + "\nreturn stored_id(ARGV[1]) or false"
)


def _read(client: redis.Redis, rec: Scheduled) -> str | None:
    member = struct.pack(">Q", rec.offset) + encode(rec, "delay", 3)
    got = cast(bytes | None, client.register_script(READ_ID)(args=[member]))
    return None if got is None else got.decode()


headers_st = st.lists(
    st.tuples(
        st.sampled_from(["", "trace", H_TARGET_TOPIC, H_ID]),
        st.one_of(st.none(), st.binary(max_size=30)),
    ),
    max_size=5,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    offset=st.integers(0, 2**40),
    key=st.one_of(st.none(), st.binary(max_size=20)),
    value=st.one_of(st.none(), st.binary(max_size=100)),
    headers=headers_st,
    delay_id=st.text(min_size=1, max_size=40),
    priority=st.sampled_from(Priority),
    stored=st.one_of(st.none(), st.integers(0, 2**50)),
)
def test_the_scripts_read_the_delay_id_a_stored_record_carries(
    redis_client: redis.Redis,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    delay_id: str,
    priority: Priority,
    stored: int | None,
) -> None:
    target = "orders"
    for rec in (
        Scheduled(offset, 1, target, key, value, headers, delay_id, stored, priority=priority),
        # The id from its header (ID_IN_HEADER), the target from its own (TARGET_IN_HEADER).
        Scheduled(
            offset,
            1,
            target,
            key,
            value,
            [*headers, (H_ID, delay_id.encode()), (H_TARGET_TOPIC, target.encode())],
            delay_id,
            stored,
        ),
        # The default delay-id: none given.
        Scheduled(offset, 1, target, key, value, headers, f"delay:3:{offset}", stored),
    ):
        assert _read(redis_client, rec) == rec.given_id("delay", 3)


@pytest.mark.parametrize(
    "rec",
    [
        # Lengths past 65,534 bytes: four-byte lengths (WIDE_LENGTHS).
        Scheduled(7, 1, "t", b"k" * 70_000, b"v", [(H_ID, b"order-7")], "order-7"),
        Scheduled(7, 1, "t", b"k", b"v" * 70_000, [("h", b"x")], "order-8"),
        # More headers than two bytes count (MANY_HEADERS), the id's after all of them.
        Scheduled(7, 1, "t", None, b"v", [*[("", None)] * 65_536, (H_ID, b"last")], "last"),
        # An empty delay-id.
        Scheduled(7, 1, "t", None, b"v", [(H_ID, None)], ""),
    ],
    ids=["wide-key", "wide-value", "many-headers", "empty-id"],
)
def test_the_scripts_read_the_delay_id_of_long_and_odd_records(
    redis_client: redis.Redis, rec: Scheduled
) -> None:
    assert _read(redis_client, rec) == rec.given_id("delay", 3)
