"""The journal's format: what one Kafka record of the journal topic holds, version 1.

One journal record holds the fates of a batch of records of one delay-topic partition:

* key: ``<delay topic>:<partition>`` (UTF-8), so every entry of a partition lands on one journal
  partition, in the order it was written;
* header ``delay-journal``: the format version, ``1``;
* timestamp: when the bridge wrote it;
* value: JSON, ``{"topic": …, "partition": …, "topic_id": …, "entries": [entry, …]}``
  (``topic_id``: the Kafka topic id of the delay topic's incarnation the records belong to — the
  one Redis bound their state to when they were claimed, else the one the writer last heard —
  absent when it knew none: entries of an earlier incarnation of a topic of that name are told
  apart by it), an entry being
  ``{"fate", "offset", "id", "due", "at"}`` and, by fate, ``"target"``, ``"target_partition"``,
  ``"target_offset"`` (delivered; dead-lettered: where its DLQ copy is), ``"by"`` (cancelled,
  replaced: the origin ``topic:partition:offset`` of the record that did it), ``"reason"``
  (dead-lettered, expired). ``offset`` is the record's delay-topic offset, ``id`` its delay-id
  (the caller's, else its default ``topic:partition:offset``), ``due`` its due time and ``at``
  when its fate was sealed, both epoch milliseconds. A record may hold no entry: the writer
  trying Kafka again after it refused entries (its readiness turns green once one is taken).

A later version adds fields or fates; a reader skips what it does not know, and a record whose
version it does not know (docs/journal.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from json.encoder import encode_basestring  # a str as JSON writes it (ensure_ascii off)
from typing import Any

from bridge.message import Scheduled
from bridge.store import Withdrawn

H_JOURNAL = "delay-journal"
FORMAT_VERSION = 1
_VERSION_BYTES = str(FORMAT_VERSION).encode()


class Fate(StrEnum):
    """How a record's life ended (``trace`` adds "waiting" and "in-flight" for the living)."""

    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    REPLACED = "replaced"
    DEAD_LETTERED = "dead-lettered"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Entry:
    """One record's fate (see the module's docstring for the fields)."""

    fate: Fate
    offset: int
    delay_id: str
    due_ms: int
    at_ms: int
    target: str = ""
    target_partition: int = -1
    target_offset: int = -1
    by: str = ""
    reason: str = ""

    def as_json(self) -> dict[str, Any]:
        """The entry as the journal stores it: the fields its fate has, no empty ones."""
        out: dict[str, Any] = {
            "fate": self.fate.value,
            "offset": self.offset,
            "id": self.delay_id,
            "due": self.due_ms,
            "at": self.at_ms,
        }
        if self.target:
            out["target"] = self.target
            out["target_partition"] = self.target_partition
            out["target_offset"] = self.target_offset
        if self.by:
            out["by"] = self.by
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Entry | None:
        """An entry as stored; None for a fate this version does not know."""
        try:
            fate = Fate(raw["fate"])
        except ValueError:
            return None
        return cls(
            fate,
            int(raw["offset"]),
            str(raw["id"]),
            int(raw["due"]),
            int(raw["at"]),
            str(raw.get("target", "")),
            int(raw.get("target_partition", -1)),
            int(raw.get("target_offset", -1)),
            str(raw.get("by", "")),
            str(raw.get("reason", "")),
        )


# An entry built per record is its JSON text, written as _dumps writes its dict (the same bytes,
# a unit test holds them equal): a dict and the encoder's walk of it cost five times as much. The
# fates' values are read once (an enum member's .value is a property call).
_DELIVERED, _DEAD_LETTERED = Fate.DELIVERED.value, Fate.DEAD_LETTERED.value
_EXPIRED, _CANCELLED, _REPLACED = Fate.EXPIRED.value, Fate.CANCELLED.value, Fate.REPLACED.value


def delivered_entry(
    record: Scheduled, at_ms: int, target: str, placed: tuple[int, int], reason: str = ""
) -> str:
    """A delivered record's entry as the journal stores it, or a dead-lettered (or expired) one's
    with its ``reason`` (``target`` the DLQ): built per record, so its JSON text, not an
    :class:`Entry`."""
    fate, tail = _DELIVERED, ""
    if reason:  # an expired record's reason and fate share their name
        fate = _EXPIRED if reason == _EXPIRED else _DEAD_LETTERED
        tail = ',"reason":' + encode_basestring(reason)
    return (
        f'{{"fate":"{fate}","offset":{record.offset},"id":{encode_basestring(record.delay_id)},'
        f'"due":{record.due_ms},"at":{at_ms},"target":{encode_basestring(target)},'
        f'"target_partition":{placed[0]},"target_offset":{placed[1]}{tail}}}'
    )


def withdrawn_entry(withdrawn: Withdrawn, at_ms: int, by: str) -> str:
    """What a cancel or a replacement withdrew, as the journal stores its entry (``by``: the
    origin of the record that did it): built per record, so its JSON text."""
    fate = _CANCELLED if withdrawn.cancelled else _REPLACED
    return (
        f'{{"fate":"{fate}","offset":{withdrawn.offset},'
        f'"id":{encode_basestring(withdrawn.delay_id)},"due":{withdrawn.due_ms},"at":{at_ms},'
        f'"by":{encode_basestring(by)}}}'
    )


def journal_key(topic: str, partition: int) -> bytes:
    """The key of a delay-topic partition's journal records."""
    return f"{topic}:{partition}".encode()


def field_bytes(name: str, value: str | int) -> bytes:
    """``"name":value`` as :func:`encode_entries` writes it: bytes the value of any journal record
    holding an entry with that field contains (a filter before decoding, never a match itself)."""
    return _dumps({name: value})[1:-1]


# Each entry's offset as _dumps writes it ("offset" is no other field's name, and the quotes of a
# string's own bytes are escaped): found without decoding the record.
_OFFSET_FIELDS = re.compile(rb'"offset":(\d+)')


def offset_needles(offsets: Iterable[int]) -> frozenset[bytes]:
    """``offsets`` as :func:`may_hold` looks for them."""
    return frozenset(b"%d" % o for o in offsets)


def may_hold(value: bytes, needles: frozenset[bytes]) -> bool:
    """Whether a journal record's value may hold an entry for one of the offsets ``needles``
    stands for (:func:`offset_needles`): a filter before decoding (an entry costs under a tenth of
    its decoding), never a match itself."""
    return not needles.isdisjoint(_OFFSET_FIELDS.findall(value))


def _text(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _dumps(value: dict[str, Any]) -> bytes:
    return _text(value).encode()


def encode_entries(
    topic: str, partition: int, entries: Sequence[Entry | str], topic_id: str = ""
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """One journal record: its key, value and headers. ``entries``: :class:`Entry` objects, or
    the JSON text :func:`delivered_entry` and :func:`withdrawn_entry` build per record."""
    head: dict[str, Any] = {"topic": topic, "partition": partition}
    if topic_id:
        head["topic_id"] = topic_id
    texts = [_text(e.as_json()) if isinstance(e, Entry) else e for e in entries]
    value = f'{_text(head)[:-1]},"entries":[{",".join(texts)}]}}'
    return (
        journal_key(topic, partition),
        value.encode(),
        [(H_JOURNAL, _VERSION_BYTES)],
    )


@dataclass(frozen=True, slots=True)
class Batch:
    """A journal record read back: the delay-topic partition its entries are of."""

    topic: str
    partition: int
    entries: list[Entry]
    topic_id: str = ""  # "" when the writer knew none


def decode_entries(
    value: bytes | None, headers: list[tuple[str, bytes | None]] | None
) -> Batch | None:
    """A journal record's entries; None for a record that is not one this version reads."""
    version = dict(headers or ()).get(H_JOURNAL)
    if version != _VERSION_BYTES or value is None:
        return None
    try:
        raw = json.loads(value)
        entries = [e for e in map(Entry.from_json, raw["entries"]) if e is not None]
        return Batch(
            str(raw["topic"]), int(raw["partition"]), entries, str(raw.get("topic_id", ""))
        )
    except (ValueError, KeyError, TypeError):
        return None
