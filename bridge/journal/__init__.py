"""The journal: every record's fate on a Kafka topic, written by the stages, read by ``trace``."""

from bridge.journal.entries import (
    FORMAT_VERSION,
    H_JOURNAL,
    Batch,
    Entry,
    Fate,
    decode_entries,
    delivered_entry,
    encode_entries,
    field_bytes,
    journal_key,
    may_hold,
    offset_needles,
)
from bridge.journal.reader import CLOCK_SLACK_MS, JournalReader, Sought
from bridge.journal.reconcile import Reconcile
from bridge.journal.writer import Journal

__all__ = [
    "CLOCK_SLACK_MS",
    "FORMAT_VERSION",
    "H_JOURNAL",
    "Batch",
    "Entry",
    "Fate",
    "Journal",
    "JournalReader",
    "Reconcile",
    "Sought",
    "decode_entries",
    "delivered_entry",
    "encode_entries",
    "field_bytes",
    "journal_key",
    "may_hold",
    "offset_needles",
]
