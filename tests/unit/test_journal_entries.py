"""The journal's format, version 1: what a journal record holds, and what a reader skips."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import KafkaException, Producer
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from bridge.health import Readiness
from bridge.journal import (
    H_JOURNAL,
    Entry,
    Fate,
    Journal,
    decode_entries,
    delivered_entry,
    encode_entries,
    field_bytes,
    journal_key,
    may_hold,
    offset_needles,
)
from bridge.journal.entries import _dumps, withdrawn_entry
from bridge.journal.writer import RECORD_BYTES
from bridge.message import Scheduled
from bridge.metrics import Metrics
from bridge.store import Shard, Withdrawn

RECORD = Scheduled(7, 1_800_000_000_000, "orders", b"k", b"v", [], "order-1")


def test_a_batch_goes_out_keyed_by_its_delay_partition_and_comes_back_as_written() -> None:
    entries = [
        Entry(Fate.CANCELLED, 3, "a", 10, 20, by="delay:0:9"),
        Entry(Fate.DEAD_LETTERED, 4, "delay:0:4", 10, 30, "delay.dlq", 0, 55, reason="too-large"),
        Entry(Fate.DELIVERED, 7, "order-1", 1_800_000_000_000, 1_800_000_000_004, "orders", 2, 9),
    ]
    key, value, headers = encode_entries("delay", 0, entries)
    assert key == journal_key("delay", 0) == b"delay:0"
    assert headers == [(H_JOURNAL, b"1")]
    batch = decode_entries(value, list(headers))
    assert batch is not None and (batch.topic, batch.partition) == ("delay", 0)
    assert batch.entries == entries


def test_the_hot_path_entry_is_the_documented_one() -> None:
    built = delivered_entry(RECORD, 1_800_000_000_004, "orders", (2, 9))
    assert Entry.from_json(json.loads(built)) == Entry(
        Fate.DELIVERED, 7, "order-1", 1_800_000_000_000, 1_800_000_000_004, "orders", 2, 9
    )
    dead = delivered_entry(RECORD, 5, "delay.dlq", (0, 1), "delivery-failed")
    got = Entry.from_json(json.loads(dead))
    assert got is not None and (got.fate, got.reason) == (Fate.DEAD_LETTERED, "delivery-failed")


@settings(max_examples=300, deadline=None)
@given(
    delay_id=st.text(st.characters(codec="utf-8"), max_size=40),
    target=st.text(st.characters(codec="utf-8"), min_size=1, max_size=20),
    by=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    numbers=st.tuples(*[st.integers(-1, 2**63 - 1)] * 5),
    reason=st.sampled_from(["", "delivery-failed", "expired", "too-large"]),
    cancelled=st.booleans(),
)
def test_an_entry_built_as_text_is_the_bytes_the_json_encoder_writes(
    delay_id: str,
    target: str,
    by: str,
    numbers: tuple[int, int, int, int, int],
    reason: str,
    cancelled: bool,
) -> None:
    """The hot path writes an entry's JSON by hand; a reader (trace's byte filter included)
    sees exactly what the encoder would have written, whatever the id holds."""
    offset, due, at, partition, target_offset = numbers
    record = Scheduled(offset, due, "orders", None, None, [], delay_id)
    text = delivered_entry(record, at, target, (partition, target_offset), reason)
    fate = Fate.EXPIRED if reason == "expired" else Fate.DEAD_LETTERED if reason else Fate.DELIVERED
    entry = Entry(fate, offset, delay_id, due, at, target, partition, target_offset, reason=reason)
    assert text.encode() == _dumps(entry.as_json())
    withdrawn = Withdrawn(Shard("delay", 0), offset, due, delay_id, Shard("delay", 1), 5, cancelled)
    text = withdrawn_entry(withdrawn, at, by)
    fate = Fate.CANCELLED if cancelled else Fate.REPLACED
    assert text.encode() == _dumps(Entry(fate, offset, delay_id, due, at, by=by).as_json())
    _, value, _ = encode_entries("delay", 0, [text, Entry(fate, 1, "x", 2, 3, by="d:0:1")], "id")
    assert json.loads(value)["entries"][0] == json.loads(text)


def test_a_stored_entry_has_only_the_fields_of_its_fate() -> None:
    _, value, _ = encode_entries("delay", 1, [Entry(Fate.CANCELLED, 3, "a", 10, 20, by="d:1:4")])
    assert json.loads(value) == {
        "topic": "delay",
        "partition": 1,
        "entries": [
            {"fate": "cancelled", "offset": 3, "id": "a", "due": 10, "at": 20, "by": "d:1:4"}
        ],
    }


def test_a_reader_skips_fates_and_versions_it_does_not_know() -> None:
    value = json.dumps(
        {
            "topic": "d",
            "partition": 0,
            "entries": [
                {"fate": "teleported", "offset": 1, "id": "x", "due": 1, "at": 2},
                {
                    "fate": "expired",
                    "offset": 2,
                    "id": "y",
                    "due": 1,
                    "at": 2,
                    "reason": "expired",
                    "new_field": True,
                },
            ],
        }
    ).encode()
    batch = decode_entries(value, [(H_JOURNAL, b"1")])
    assert batch is not None and [e.fate for e in batch.entries] == [Fate.EXPIRED]
    assert decode_entries(value, [(H_JOURNAL, b"2")]) is None
    assert decode_entries(value, []) is None
    assert decode_entries(b"not json", [(H_JOURNAL, b"1")]) is None


def test_the_bytes_a_scan_filters_on_are_in_every_record_that_holds_the_entry() -> None:
    """``trace`` decodes only the journal records holding these bytes: a mismatch with the
    encoder (quotes, non-ASCII, spacing) would hide a record's fate."""
    odd = 'order "7" ✓ \\ 🙂'
    entries = [Entry(Fate.REPLACED, 12, odd, 10, 20, by="delay:0:13")]
    _, value, _ = encode_entries("delay", 0, entries)
    assert field_bytes("id", odd) in value and field_bytes("offset", 12) in value
    assert field_bytes("id", "order") not in value  # a prefix of the id is not its field
    built = delivered_entry(RECORD, 5, "orders", (0, 1))
    _, value, _ = encode_entries("delay", 0, [built])
    assert field_bytes("id", "order-1") in value and field_bytes("offset", 7) in value


def test_a_record_is_passed_over_undecoded_only_when_it_holds_none_of_the_offsets() -> None:
    """may_hold finds every entry's offset in the record as written — not another field's
    number, nor one inside a delay-id — so a take-over skips no record it needs."""
    tricky = ['"offset":9', 'x\\"offset\\":9', "9"]
    entries = [
        Entry(Fate.DELIVERED, o, tricky[o % 3], 9, 9, "out", 9, 9, "9") for o in (3, 40, 512)
    ]
    entries.append(Entry(Fate.CANCELLED, 2**40, "", 9, 9, by="9"))
    _, value, _ = encode_entries("orders", 0, entries)
    for offset in (3, 40, 512, 2**40):
        assert may_hold(value, offset_needles([offset])), offset
        assert may_hold(value, offset_needles([7, offset, 8])), offset
    assert not may_hold(value, offset_needles([9, 4, 51, 5120, 0]))
    assert not may_hold(value, offset_needles([]))


def test_a_batch_names_its_topic_s_incarnation_when_the_writer_knew_it() -> None:
    entries = [Entry(Fate.CANCELLED, 3, "a", 10, 20, by="delay:0:9")]
    _, value, headers = encode_entries("delay", 0, entries, "Zx9-id")
    batch = decode_entries(value, list(headers))
    assert batch is not None and batch.topic_id == "Zx9-id" and batch.entries == entries
    _, value, headers = encode_entries("delay", 0, entries)
    assert b"topic_id" not in value  # none known: none written, and read back as ""
    batch = decode_entries(value, list(headers))
    assert batch is not None and batch.topic_id == ""


def test_entries_are_pending_until_kafka_takes_or_refuses_them() -> None:
    """``delay_bridge_journal_pending``: how far the journal trails the deliveries. A producer
    with no broker to reach refuses the entry after its message timeout."""
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "200", "log_level": 0}
    )
    metrics, readiness = Metrics(CollectorRegistry()), Readiness()
    journal = Journal(producer, "delay.journal", metrics, readiness, lambda: {"delay": "id-1"})
    journal.write(Shard("delay", 0), [Entry(Fate.DELIVERED, 7, "a", 1, 2, "out", 0, 3)] * 2)
    assert metrics.journal_pending._value.get() == 2
    producer.flush(10)
    assert metrics.journal_pending._value.get() == 0
    assert metrics.journal_failures._value.get() == 2
    assert any("journal delay.journal refused 2 entries" in p for p in readiness.problems())


def test_a_batch_of_entries_over_a_record_s_size_is_journaled_in_several() -> None:
    """2,000 deliveries with 64-byte ids and target names made one journal record of 1.1 MB,
    over the producer's message.max.bytes (1 MB): refused at once, the whole batch was counted
    as failed (and an exactly-once transaction committed without its journal). The entries go
    in records of RECORD_BYTES each."""
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "200", "log_level": 0}
    )
    metrics, readiness = Metrics(CollectorRegistry()), Readiness()
    journal = Journal(producer, "delay.journal", metrics, readiness)
    entries = [Entry(Fate.DELIVERED, o, "i" * 64, 1, 2, "t" * 64, 0, o) for o in range(8000)]
    assert len(encode_entries("delay", 0, entries)[1]) > 1_000_000
    journal.write(Shard("delay", 0), entries)
    assert metrics.journal_failures._value.get() == 0  # none refused at once
    assert metrics.journal_pending._value.get() == 8000
    assert len(producer) >= len(encode_entries("delay", 0, entries)[1]) // RECORD_BYTES


def test_a_transaction_s_journal_refused_at_once_raises() -> None:
    """Through a shard's transactional producer an entry Kafka refuses at once raises: the
    transaction aborts rather than commit without its journal."""
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "message.max.bytes": "10000", "log_level": 0}
    )
    metrics, readiness = Metrics(CollectorRegistry()), Readiness()
    journal = Journal(producer, "delay.journal", metrics, readiness)
    huge = [Entry(Fate.DEAD_LETTERED, 1, "a", 1, 2, reason="x" * 20_000)]
    journal.write(Shard("delay", 0), huge)  # the stage's own producer: counted, not raised
    assert metrics.journal_failures._value.get() == 1
    with pytest.raises(KafkaException):
        journal.write(Shard("delay", 0), huge, producer)
