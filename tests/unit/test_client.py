"""bridge.client: the headers a producer builds, checked with the bridge's own rules."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest

from bridge import client
from bridge.client import cancel_headers, delay_headers, partition_for
from bridge.dialects import parse_record
from bridge.message import Cancel, Rules, Scheduled, parse_duration_ms
from tests.conftest import ROOT

NOW = 1_790_000_000_000
RULES = Rules(
    frozenset({"delay"}), {}, (re.compile(".*"),), "delay.dlq", parse_duration_ms("365d"), 1_000_000
)


def scheduled(headers: list[tuple[str, bytes]]) -> Scheduled | Cancel:
    """What the bridge makes of a record with these headers (timestamp NOW, key b"k")."""
    return parse_record(
        RULES,
        topic="delay",
        partition=0,
        offset=5,
        timestamp_ms=NOW,
        key=b"k",
        value=b"v",
        headers=list(headers),
        now_ms=NOW,
    )


@pytest.mark.parametrize(
    ("kwargs", "due"),
    [
        ({"after": 1500}, NOW + 1500),
        ({"after": "1h30m"}, NOW + 5_400_000),
        ({"after": timedelta(minutes=2, milliseconds=5)}, NOW + 120_005),
        ({"after": 0}, NOW),
        ({"at": 1_790_000_100_123}, 1_790_000_100_123),
        (
            {"at": "2026-09-21T14:15:00.5+02:00"},
            int(datetime(2026, 9, 21, 12, 15, 0, 500_000, tzinfo=UTC).timestamp()) * 1000 + 500,
        ),
        ({"at": datetime(2027, 1, 1, tzinfo=UTC)}, 1_798_761_600_000),
        (
            {"at": datetime(2027, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)), microsecond=7000)},
            1_798_761_600_007,
        ),
        # A part below a millisecond rounds up (as the header does): the natural
        # datetime.now(UTC) + timedelta(...) is never early, and never refused.
        ({"at": datetime(2027, 1, 1, microsecond=7001, tzinfo=UTC)}, 1_798_761_600_008),
        ({"after": timedelta(microseconds=1500)}, NOW + 2),
    ],
)
def test_the_bridge_reads_the_due_time_it_was_given(kwargs: dict[str, object], due: int) -> None:
    rec = scheduled(delay_headers("orders.expired", **kwargs))  # type: ignore[arg-type]
    assert isinstance(rec, Scheduled)
    assert rec.due_ms == due and rec.target == "orders.expired"


def test_id_and_target_key_travel_with_the_record() -> None:
    rec = scheduled(delay_headers("t", after="1s", delay_id="expire-7", target_key="order-7"))
    assert isinstance(rec, Scheduled)
    assert rec.delay_id == "expire-7" and rec.delivered_key() == b"order-7"
    assert scheduled(cancel_headers("expire-7")) == Cancel(5, "expire-7")
    many = scheduled(cancel_headers("expire-7", "expire-8", "expire-9"))
    assert isinstance(many, Cancel)
    assert [c.delay_id for c in many.each()] == ["expire-7", "expire-8", "expire-9"]


def test_a_priority_travels_with_the_record() -> None:
    for name in ("high", "normal", "low"):
        rec = scheduled(delay_headers("t", after="1s", priority=name))
        assert isinstance(rec, Scheduled) and rec.priority.label == name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of after= (a delay) or at="),
        ({"after": "1s", "at": 1_790_000_000_000}, "exactly one of"),
        ({"after": "soon"}, "not a duration"),
        ({"after": -1}, "negative"),
        ({"after": True}, "not a delay"),
        ({"after": 1.5}, "give milliseconds, a duration or a timedelta"),
        ({"at": 1_790_000_000}, "looks like epoch seconds"),
        ({"at": "tomorrow"}, "not a time"),
        ({"at": datetime(2030, 1, 1)}, "has no timezone"),
        ({"after": "1s", "delay_id": ""}, "delay_id must be 1 to 256 bytes"),
        ({"after": "1s", "delay_id": "x" * 257}, "delay_id must be 1 to 256 bytes"),
        ({"after": "1s", "delay_id": 7}, "delay_id must be text"),
        ({"after": "1s", "priority": "urgent"}, "delay-priority must be one of high, normal, low"),
        ({"after": "1s", "priority": 1}, "priority 1 is not one of high, normal, low"),
    ],
)
def test_what_the_bridge_would_refuse_is_a_value_error(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        delay_headers("t", **kwargs)  # type: ignore[arg-type]


def test_a_bad_target_or_cancel_id_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a legal topic name"):
        delay_headers("no spaces", after=0)
    with pytest.raises(ValueError, match="delay_id must be 1 to 256 bytes"):
        cancel_headers("")


@pytest.mark.parametrize(
    "target",
    [
        "__consumer_offsets",
        "__transaction_state",
        "__x",
        "a b",
        ".",
        "..",
        "x" * 250,
        "é",
        "orders",
        "_one-underscore",
        "a.b_c-9",
        "x" * 249,
    ],
)
def test_a_target_is_refused_exactly_when_the_bridge_would_dead_letter_it(target: str) -> None:
    """Whatever the config allows, the bridge dead-letters illegal and internal targets; the
    helper refuses those, with the bridge's words, and nothing else."""
    bridge = RULES.target_refusal(target)
    if bridge is None:
        assert scheduled(delay_headers(target, after=0)).target == target  # type: ignore[union-attr]
    else:
        with pytest.raises(ValueError, match=re.escape(bridge)):
            delay_headers(target, after=0)


@pytest.mark.parametrize(
    ("key", "murmur2"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"abc", 479470107),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ],
)
def test_murmur2_is_kafkas(key: bytes, murmur2: int) -> None:
    """The vectors of Kafka's own UtilsTest.testMurmur2."""
    assert client.murmur2(key) == murmur2
    assert partition_for(key, 7) == (murmur2 & 0x7FFFFFFF) % 7
    assert partition_for(key.decode(), 7) == partition_for(key, 7)


@pytest.mark.parametrize("partitions", [0, -1, True, 2.0])
def test_partition_for_needs_a_partition_count(partitions: object) -> None:
    with pytest.raises(ValueError, match="partition count"):
        partition_for(b"k", partitions)  # type: ignore[arg-type]


def test_importable_with_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "for name in ('redis', 'prometheus_client', 'confluent_kafka', 'yaml'):\n"
        "    sys.modules[name] = None  # any import of it fails\n"
        "from bridge.client import delay_headers, cancel_headers, partition_for\n"
        "print(delay_headers('t', after='1s', delay_id='x'), cancel_headers('x'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "delay-cancel" in proc.stdout
