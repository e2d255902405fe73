"""``delay-bridge dlq replay``: dead-lettered records sent back to their delay topic.

The records go back to the delay topic they came from, so the bridge validates and schedules them
again — after the target topic was created, the allow-list widened, or a producer's mistake
understood.

A replayed record has its original key, value and headers, minus what the DLQ added
(``delay-error``, ``delay-error-detail``, ``delay-origin``), and goes to the delay topic its
``delay-origin`` names (an ``expired`` one due now, however late: ``delay-after: 0`` and
``delay-max-lateness: 0`` instead of its own); a record from anywhere else is skipped and counted.
The DLQ is read up to where it ends when the command starts, in the consumer group
``<kafka.group_id>.dlq-replay``, whose offsets are committed once the replayed records are
acknowledged: a second run starts where the first stopped, and replays nothing twice. Records
the filters (``--reason``, ``--since``, ``--until``) leave out are passed over in that group too —
the summary says how many, and that ``--from-beginning`` (read the whole DLQ again, whatever the
group committed) with filters that select them gets them back; ``--dry-run`` reads and counts
without producing or committing anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.config import Config, consumer_settings, producer_settings
from bridge.errors import BridgeError
from bridge.kafka import produce
from bridge.message import (
    H_AFTER,
    H_DELIVER_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_MAX_LATENESS,
    H_ORIGIN,
    Headers,
    Reason,
    wire_headers,
)
from bridge.ops.dlq import Filters, dead_letters
from bridge.ops.records import KAFKA_TIMEOUT_S, topic_partitions

DLQ_HEADERS = frozenset({H_ERROR, H_ERROR_DETAIL, H_ORIGIN})
EVERY = Filters()  # no filter: every dead letter
# An expired record is replayed to be delivered now, however late: its due time and max
# lateness give way to these.
EXPIRED_TIMING = frozenset({H_DELIVER_AT, H_AFTER, H_MAX_LATENESS})
DELIVER_NOW: Headers = [(H_AFTER, b"0"), (H_MAX_LATENESS, b"0")]


def replayed_headers(headers: Headers, reason: str) -> Headers:
    """A DLQ record's headers as it goes back to its delay topic: without what the DLQ added,
    and, ``expired``, due now with no max lateness."""
    dropped = DLQ_HEADERS | EXPIRED_TIMING if reason == Reason.EXPIRED else DLQ_HEADERS
    kept = [(k, v) for k, v in headers if k not in dropped]
    return [*kept, *DELIVER_NOW] if reason == Reason.EXPIRED else kept


@dataclass
class Replayed:
    """What a replay did: records replayed by reason, left out by the filters, and skipped
    because their origin is not a configured delay topic (or unreadable)."""

    replayed: Counter[str] = field(default_factory=Counter)
    left_out: int = 0
    not_ours: int = 0
    dry_run: bool = False
    group: str = ""

    @property
    def found(self) -> bool:
        return True  # an empty replay is an answer too: nothing was dead-lettered since

    def lines(self) -> list[str]:
        return self.summary().splitlines()

    def as_json(self) -> dict[str, Any]:
        return {
            "replayed": dict(sorted(self.replayed.items())),
            "left_out": self.left_out,
            "not_ours": self.not_ours,
            "dry_run": self.dry_run,
            "group": self.group,
        }

    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(self.replayed.items()))
        line = f"{verb} {sum(self.replayed.values())}" + (f" ({reasons})" if reasons else "")
        line += f"; {self.left_out} left out by the filters"
        line += f"; {self.not_ours} skipped: their origin is not a configured delay topic"
        if self.left_out and not self.dry_run:
            line += (
                f"\n{self.left_out} left out are passed over for good in the group "
                f"{self.group}: replay them with --from-beginning and filters that select "
                "them (e.g. --reason)"
            )
        return line


def replay(
    config: Config,
    *,
    filters: Filters = EVERY,
    limit: int | None = None,
    dry_run: bool = False,
    from_beginning: bool = False,
    progress: Callable[[int], None] = lambda n: None,
) -> Replayed:
    """Replay the DLQ's records as the module docstring says; returns what was done."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    dlq = config.topics.dead_letter
    group = f"{config.kafka.group_id}.dlq-replay"
    consumer = Consumer(
        {
            **consumer_settings(config),
            "group.id": group,
            "log_level": 0,
            "enable.auto.commit": "false",
            "statistics.interval.ms": "0",
        }
    )
    producer = None if dry_run else Producer({**producer_settings(config), "log_level": 0})
    done = Replayed(dry_run=dry_run, group=group)
    failures: list[str] = []
    try:
        tps = topic_partitions(consumer, dlq, "DLQ topic")
        starts = consumer.committed(tps, timeout=KAFKA_TIMEOUT_S)
        if from_beginning:
            starts = [TopicPartition(dlq, tp.partition, 0) for tp in starts]
        next_offsets: dict[int, int] = {}
        for letter in dead_letters(consumer, starts):
            next_offsets[letter.partition] = letter.offset + 1
            if not filters.match(letter):
                done.left_out += 1
                continue
            topic, reason = letter.origin_topic, letter.reason
            if topic not in config.topics.delay:
                done.not_ours += 1
                continue
            if producer is not None:
                kept = replayed_headers(letter.headers, reason)

                def report(err: object, _msg: object) -> None:
                    if err is not None:
                        failures.append(str(err))

                produce(
                    producer,
                    topic,
                    value=letter.value,
                    key=letter.key,
                    headers=wire_headers(kept),
                    on_delivery=report,
                )
                producer.poll(0)
            done.replayed[reason or "(no reason)"] += 1
            progress(sum(done.replayed.values()))
            if limit is not None and sum(done.replayed.values()) >= limit:
                break
        if producer is not None:
            remaining = producer.flush(KAFKA_TIMEOUT_S * 3)
            if failures or remaining:
                why = failures[0] if failures else f"{remaining} records not acknowledged"
                raise BridgeError(f"replay stopped, nothing committed: producing failed: {why}")
            if next_offsets:
                consumer.commit(
                    offsets=[TopicPartition(dlq, p, o) for p, o in next_offsets.items()],
                    asynchronous=False,
                )
        return done
    except KafkaException as exc:
        raise BridgeError(f"replay failed: {exc.args[0].str()}") from None
    finally:
        consumer.close()
