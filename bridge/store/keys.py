"""Where a shard lives in Redis: its key names and the encoding of its members.

Per shard, all keys are ``<prefix>:{<topic>:<partition>}:<name>``: they share one hash tag, so the
multi-key scripts run on Redis Cluster, and every key starts with the prefix, so one ACL key
pattern ``~<prefix>:*`` covers a deployment:

* ``…:schedule``  ZSET member → score: the records waiting. A member *is* the record: its
  offset as 8 big-endian bytes, then the encoded record (:func:`bridge.message.encode`). The score
  is the due ms plus the base of the record's priority lane (:func:`score`): each lane is a run of
  scores of its own, high before normal before low, so a claim reads a lane's due records by
  score and records with the same due time and priority sort in offset order. A normal record's
  score is its due ms, as before lanes existed. Each record costs Redis one entry (an index beside a
  HASH of records cost about 70 bytes more per record);
* ``…:leases``    ZSET offset (8 bytes) → lease deadline ms, and ``…:claimed`` HASH offset →
  member: the records in flight (a few batches per bridge), addressed by offset so that
  acknowledging a record sends 8 bytes, not the record;
* ``…:meta``      HASH ``ingested`` → the highest offset handled (the ingest watermark),
  ``topic_id`` → the delay topic's incarnation, ``epoch`` → the label of the state's last retire
  (acknowledgements name the epoch their records were claimed in);
* ``…:pending``   HASH offset bucket (``offset // 256`` as 7 bytes) → 32-byte bitmap of its
  offsets still pending, and ``…:low`` the ZSET of those buckets (all scored 0, so sorted by
  offset): the lowest pending offset — the one to commit — is read without scanning records;
* ``…:ids``       the delay-id index: only records with a caller-given delay-id, 17 bytes each
  (a 5-byte hash of the id, the offset, the due ms), packed into bucket fields by linear hashing
  (:mod:`bridge.store.ids`, the id index in _lib.lua);
* ``…:refs``      HASH: records due too far out to keep whole (``store.payload_horizon``) as
  references, 16 bytes each (the offset and the due ms, both 8 big-endian bytes), appended in
  offset order to a chunk of their time bucket (field ``<bucket start ms>``; a full chunk is
  renamed ``<bucket start ms>.<n>``), plus the fields ``count`` (references waiting), ``seq`` and
  ``promoted`` (promotions so far: a cancel looked up before one looks again, see add.lua);
  a reference is pending like a record, so a cancel clears its bit and it is never read back;
* ``…:refs-due``  ZSET chunk field → its bucket's start ms: which chunks to read back when;
* ``…:wait:<target>`` ZSET, scored like the due index: the due records of a target held to
  ``egress.max_rate_per_target``, moved there from the due index when a claim took more of them
  than the target's rate allowed, and claimed from there at that rate (so they hold up no other
  target's records); ``…:waits`` the SET of the targets that have one.;
* ``…:targets``   HASH target topic → how many of the shard's records for it Redis holds whole
  (waiting, or in flight: not references), kept by the scripts that store and forget records
  (the targets HASH in _lib.lua): what ``limits.max_waiting_per_target`` and
  ``delay_bridge_waiting_messages`` read;
* ``…:schedules`` HASH id hash → where each recurring schedule of the shard is: the offset of the
  record that holds it, or ``-`` and the offset of the cancel or record that ended it (the
  schedule registry of add.lua): a record the bridge writes to carry a schedule on
  (``delay-continues``) is stored only while the schedule is still at the record it continues.
* ``…:withdrawing`` ZSET ``<offset>:<k>`` (the k-th entry at that offset) → the offset: the cancels
  and replacements add.lua found nothing for in the shard, kept until the ingress has looked for
  them in the topic's other partitions (while one of those is not whole in Redis, until it is);
  the lowest holds the offset to commit and to resume from. A ZSET, not a field of the meta
  HASH as before: one string of them all was read and written whole by every add, which made a
  catch-up of records with delay-ids quadratic (meta ``withdrawing``, left by earlier code, is
  moved here by the next add and read until then); ``…:kept`` HASH ``at`` → the earliest record
  timestamp among them as their keeper wrote it (:mod:`bridge.store.kept`).

The ingest watermark lets a restarted consumer resume right after what Redis holds; the committed
Kafka offset is the lowest offset still pending, so a Redis that lost its data is rebuilt by
re-reading the delay topic from there (:mod:`bridge.ingress`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from typing import NamedTuple

from bridge.message import (
    Priority,
    Reason,
    Scheduled,
    dead_letter_when_due,
    decode,
    encode,
    format_time_ms,
    origin,
    parse_origin,
)

# The width of a priority lane's run of scores: above any due ms (the year 9999 is 2.5e14 ms), and
# every score (|score| < 2^50) is an exact double. The scripts get it as LANE (scripts._source).
LANE_WIDTH = 2**49
LANE_BASES = {Priority.HIGH: -LANE_WIDTH, Priority.NORMAL: 0, Priority.LOW: LANE_WIDTH}
_OFFSET = struct.Struct(">Q")
_REFERENCE = struct.Struct(">Qq")
REFERENCE_BYTES = _REFERENCE.size
# Each ShardKeys field and the name its key has in Redis, the one mapping between the two: the
# field says what the code does with the key (the due index, the records in flight), the name is
# what an operator sees (delay_bridge_scheduled_messages counts what "schedule" holds).
_KEY_NAMES = {
    "due": "schedule",
    "inflight": "leases",
    "claimed": "claimed",
    "meta": "meta",
    "low": "low",
    "pending": "pending",
    "ids": "ids",
    "refs": "refs",
    "refs_due": "refs-due",
    "waits": "waits",
    "targets": "targets",
    "schedules": "schedules",
    "withdrawing": "withdrawing",
}


class Shard(NamedTuple):
    """One delay-topic partition's slice of the store; with an ``incarnation`` label, the records
    left from an earlier incarnation of its topic (see :meth:`Store.bind`), which the mover
    delivers but nothing adds to."""

    topic: str
    partition: int
    incarnation: str = ""

    def base(self) -> Shard:
        """The live shard of this partition."""
        return Shard(self.topic, self.partition)

    def __str__(self) -> str:
        name = f"{self.topic}[{self.partition}]"
        return f"{name} (retired incarnation {self.incarnation})" if self.incarnation else name


def shard_names(shards: Iterable[Shard]) -> str:
    """The shards named in order, for a log line: ``delay[0], delay[1]``."""
    return ", ".join(str(s) for s in sorted(shards))


@dataclass(frozen=True)
class ShardKeys:
    """The Redis keys of one shard."""

    due: str
    inflight: str
    claimed: str
    meta: str
    low: str
    pending: str
    ids: str  # the id index: only records with a caller-given delay-id
    refs: str  # references (far-future records) in chunks, with their count
    refs_due: str  # chunk -> its bucket's start ms
    waits: str  # the targets with a wait index (see Keys.wait)
    targets: str  # target -> records held whole, waiting or in flight (quotas)
    schedules: str  # the schedule registry: id hash -> the record a recurring schedule is at
    withdrawing: str  # cancels and replacements still to be looked for in the other partitions

    def all(self) -> tuple[str, ...]:
        """The shard's fixed keys (not its wait indexes, named by :attr:`waits`)."""
        return astuple(self)


class Keys:
    """The only place key names are built, under one deployment's prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._of: dict[Shard, ShardKeys] = {}

    def of(self, shard: Shard) -> ShardKeys:
        """The shard's keys."""
        keys = self._of.get(shard)
        if keys is None:  # built once a shard: every store call asks
            names = self.names(shard, list(_KEY_NAMES.values()))
            keys = self._of[shard] = ShardKeys(**dict(zip(_KEY_NAMES, names, strict=True)))
        return keys

    def wait(self, shard: Shard, target: str) -> str:
        """The wait index of ``target``'s records in ``shard`` (wait_key in _lib.lua)."""
        return self.names(shard, (f"wait:{target}",))[0]

    def kept(self, shard: Shard) -> str:
        """The earliest record timestamp among the cancels ``shard`` keeps (bridge.store.kept)."""
        return self.names(shard, ("kept",))[0]

    def retired_set(self, shard: Shard) -> str:
        """The SET of a shard's retired incarnation labels."""
        return self.names(shard.base(), ("retired",))[0]

    def names(self, shard: Shard, names: Sequence[str]) -> list[str]:
        """Keys of ``shard`` with these names."""
        # Every key starts with the prefix (one ACL pattern "~<prefix>:*" covers a deployment),
        # then the shard's hash tag, so a shard's keys share one Redis Cluster slot.
        tag = _tag(self.prefix, shard.topic, str(shard.partition))
        if shard.incarnation:
            tag = f"{tag}:retired:{shard.incarnation}"
        return [f"{tag}:{name}" for name in names]

    def meta_pattern(self, topic: str) -> str:
        """A SCAN pattern matching the meta key of every live shard of ``topic``."""
        return f"{_tag(_glob(self.prefix), _glob(topic), '*')}:meta"

    def partition_of(self, name: str, topic: str) -> str | None:
        """The partition text in a shard key of ``topic`` (None: not one)."""
        head = _tag(self.prefix, topic, "")
        return name[len(head) : name.index("}", len(head))] if name.startswith(head) else None


def offset_bytes(offset: int) -> bytes:
    """A delay-topic offset as the 8 bytes that start its member (and order its bucket)."""
    return _OFFSET.pack(offset)


def member(record: Scheduled, topic: str, partition: int) -> bytes:
    """The due-index member of a record: its offset, then the encoded record."""
    return _OFFSET.pack(record.offset) + encode(record, topic, partition)


def stored_record(item: bytes, shard: Shard, now_ms: int) -> Scheduled:
    """The record a due-index member of ``shard`` holds; one whose encoding does not decode (a
    corrupted or foreign value: the store writes none) is bound for the DLQ as payload-missing
    at ``now_ms``, so that it never stops a loop or a listing."""
    offset = offset_of(item)
    try:
        return decode(item[8:], shard.topic, shard.partition, offset)
    except Exception as exc:  # whatever the bytes: a record's fate, not the process's
        where = origin(shard.topic, shard.partition, offset)
        detail = (
            f"its copy in Redis, read at {format_time_ms(now_ms)}, does not decode "
            f"({exc}); the record stays in the delay topic at {where}"
        )
        return dead_letter_when_due(
            shard.topic,
            shard.partition,
            offset,
            now_ms,
            reason=Reason.PAYLOAD_MISSING,
            detail=detail,
        )


def score(record: Scheduled) -> int:
    """A record's score in the due index: its due ms in its priority's lane."""
    return record.due_ms + LANE_BASES[record.priority]


# A figure per priority lane, in the order high, normal, low: the earliest due ms of each (-1:
# none), or a count of each.
PerLane = tuple[int, int, int]


def lane_firsts(records: Iterable[tuple[Priority, int]]) -> PerLane:
    """The earliest due ms of each lane — high, normal, low; -1: none — among (priority, due ms)
    pairs."""
    first = [-1, -1, -1]
    for priority, due in records:
        if first[priority] < 0 or due < first[priority]:
            first[priority] = due
    return first[0], first[1], first[2]


def lane_of(score_value: float) -> Priority:
    """The priority whose lane a due-index score is in."""
    return (
        Priority.HIGH
        if score_value < 0
        else Priority.LOW
        if score_value >= LANE_WIDTH
        else (Priority.NORMAL)
    )


def due_of(score_value: float) -> int:
    """The due ms a due-index score stands for, whatever its lane."""
    return int(score_value) - LANE_BASES[lane_of(score_value)]


def reference(offset: int, due_ms: int) -> bytes:
    """A far-future record as Redis keeps it until it is read back: offset and due ms."""
    return _REFERENCE.pack(offset, due_ms)


def references_in(chunk: bytes) -> list[tuple[int, int]]:
    """The (offset, due ms) of each reference in a chunk, in the order they were added."""
    return [(int(o), int(d)) for o, d in _REFERENCE.iter_unpack(chunk)]


def where(offset: bytes, due_ms: int) -> bytes:
    """Where a record waits, as add.lua takes it for a cancel of a default delay-id (where in
    _lib.lua): the offset's 8 bytes, then the due ms (-1: in no index)."""
    return offset + str(due_ms).encode()


def default_id_offset(shard: Shard, delay_id: str) -> int | None:
    """The offset a default delay-id ``<topic>:<partition>:<offset>`` of ``shard`` names (None:
    not one of its default ids)."""
    parts = parse_origin(delay_id)
    if parts is None or parts[0] != shard.topic or parts[1] != shard.partition:
        return None
    return parts[2]


def offset_of(member: bytes) -> int:
    """The delay-topic offset of a member (or of its first 8 bytes)."""
    return int(_OFFSET.unpack_from(member)[0])


def glob_escape(raw: bytes) -> bytes:
    """``raw`` with Redis glob's special characters escaped (for SCAN's MATCH)."""
    return b"".join(b"\\" + bytes((c,)) if c in b"*?[]\\^" else bytes((c,)) for c in raw)


def text(value: bytes | str) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else value


def _tag(prefix: str, topic: str, partition: str) -> str:
    """A shard's key prefix: the deployment's prefix, then the shard's hash tag (with an empty
    ``partition``: the text every shard key of ``topic`` starts with, up to its partition)."""
    head = f"{prefix}:{{{topic}:"
    return f"{head}{partition}}}" if partition else head


def _glob(raw: str) -> str:
    return glob_escape(raw.encode()).decode()
