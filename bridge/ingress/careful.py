"""A batch the ingress failed on with a bug, handled again one offset at a time.

The record it fails on is dead-lettered, and the rest of the batch, its partition and every other
go on.
DESIGN: one bad record never blocks another. The parser turns its own failures into ``bad-header``
(:func:`bridge.dialects.parse_record`); this is the same for what comes after it (storing a
record, withdrawing what it names, counting it). A failure that is not a bug — Redis or Kafka
away, a store refusing writes — is no record's fault: the batch is read again later, as always.
A record is dead-lettered only when handling its offset alone fails with a bug twice in a row,
so a failure that passes (a race the code did not foresee) costs a retry, never a record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from confluent_kafka import KafkaException, Message
from redis.exceptions import RedisError

from bridge.errors import BridgeError
from bridge.ingress.batch import Batch, coords
from bridge.message import Cancel, Reason, Rejected, Scheduled
from bridge.store import Shard

logger = logging.getLogger(__name__)

Handle = Callable[[list[Message], Batch], None]


def is_bug(exc: BaseException) -> bool:
    """Whether ``exc`` is the bridge's own failure, not its servers' (or a record's refusal)."""
    return not isinstance(exc, BridgeError | KafkaException | RedisError | OSError)


def one_offset_at_a_time(
    handle: Handle, marks: Mapping[Shard, int], messages: list[Message], batch: Batch
) -> int:
    """Handle ``batch`` (``messages`` parsed) one offset of one partition at a time; an offset
    whose handling fails with a bug twice is dead-lettered as ``bad-header`` instead (the error in
    its detail). ``marks`` tell how far each partition is stored: an offset stored before the
    failure (it came after, counting or telling the egress) is not handled again. Returns how
    many were dead-lettered. Raises what is not a bug: the caller reads the batch again from
    where it stands then (each offset handled before it is stored)."""
    at = {coords(m): m for m in messages}
    dead = 0
    for piece in pieces(batch):
        [(shard, (high, records))] = piece.stored.items()
        failure: Exception | None = None
        for _ in range(2):
            if marks.get(shard, -1) >= high:
                failure = None
                break
            try:
                handle(messages, _copy(piece))
            except Exception as exc:
                if not is_bug(exc):
                    raise
                logger.warning("storing offset %d of %s failed: %r", high, shard, exc)
                failure = exc
            else:
                failure = None
                break
        if failure is None:
            continue
        offsets = sorted({r.offset for r in records} | {coords(m)[2] for m, _ in piece.rejected})
        logger.error(
            "storing offset %s of %s failed twice: dead-lettered as bad-header",
            offsets,
            shard,
            exc_info=failure,
        )
        why = Rejected(
            Reason.BAD_HEADER,
            f"the bridge failed to store it (a bug): {type(failure).__name__}: {failure}",
        )
        piece.rejected += [(at[shard.topic, shard.partition, r.offset], why) for r in records]
        piece.stored[shard] = (high, [])
        handle(messages, piece)
        dead += len({r.offset for r in records})
    return dead


def _copy(batch: Batch) -> Batch:
    """A batch :meth:`Ingress._handle` may change, leaving ``batch`` as it was."""
    return Batch(dict(batch.stored), list(batch.rejected), dict(batch.low), dict(batch.newest_ms))


def pieces(batch: Batch) -> Iterator[Batch]:
    """``batch`` as batches of one offset each, partition by partition in offset order (a
    parser-rejected record is one too), the last of a partition high where the batch was."""
    rejected: dict[Shard, dict[int, list[tuple[Message, Rejected]]]] = {}
    for msg, why in batch.rejected:
        topic, partition, offset = coords(msg)
        rejected.setdefault(Shard(topic, partition), {}).setdefault(offset, []).append((msg, why))
    for shard, (high, records) in batch.stored.items():
        at: dict[int, list[Scheduled | Cancel]] = {}
        for rec in records:
            at.setdefault(rec.offset, []).append(rec)
        theirs = rejected.pop(shard, {})
        offsets = sorted(at.keys() | theirs.keys())
        if not offsets or offsets[-1] < high:
            offsets.append(high)
        for i, offset in enumerate(offsets):
            last = i == len(offsets) - 1
            yield Batch(
                stored={shard: (high if last else offset, at.get(offset, []))},
                rejected=theirs.get(offset, []),
                low={shard: offset},
                newest_ms={s: t for s, t in batch.newest_ms.items() if last and s == shard},
            )
    for shard, theirs in rejected.items():  # not in stored: never so from parse_batch
        for offset, those in sorted(theirs.items()):
            yield Batch(stored={shard: (offset, [])}, rejected=those, low={shard: offset})
