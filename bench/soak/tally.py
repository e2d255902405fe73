"""What the soak delivered: every seq's first delivery and its lateness, binned by minute."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Message

from bench.soak.load import Load
from bridge.message import H_DUE_AT
from testbed.background import Background
from testbed.workload import CLIENT_LOG_LEVEL, seq_of


@dataclass
class Tally(Background):
    """Reads the target topic and the DLQ from their start in a thread, counting each seq's
    deliveries and binning the first one's lateness by the minute it was due."""

    bootstrap: str
    target: str
    dlq: str
    load: Load
    seen: bytearray = field(init=False)
    dead: int = 0
    early: list[int] = field(default_factory=list)
    wrong_due: int = 0  # delivered with a due-at header other than the load asked for
    duplicates: int = 0
    delivered: int = 0
    lateness: dict[int, collections.Counter[int]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    delivered_in: collections.Counter[int] = field(default_factory=collections.Counter)
    thread_name = "tally"

    def __post_init__(self) -> None:
        self.seen = bytearray(len(self.load))

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"soak-tally-{self.target}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": CLIENT_LOG_LEVEL,
            }
        )
        consumer.subscribe([self.target, self.dlq])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(1000, 0.2):
                    if msg.error() is None:
                        self._take(msg)
        finally:
            consumer.close()

    def _take(self, msg: Message) -> None:
        seq = seq_of(msg.value())
        if msg.topic() == self.dlq or seq is None or not 0 <= seq < len(self.seen):
            self.dead += 1
            return
        if self.seen[seq]:
            self.duplicates += 1
            return
        self.seen[seq] = 1
        self.delivered += 1
        due = self.load.due_ms(seq)
        header = dict(msg.headers() or []).get(H_DUE_AT)
        if header is None or int(header) != due:
            self.wrong_due += 1
        appended = msg.timestamp()[1]
        late = appended - due
        if late < 0:
            self.early.append(seq)
        self.lateness[(due - self.load.start_ms) // 60_000][max(0, late)] += 1
        self.delivered_in[(appended - self.load.start_ms) // 60_000] += 1

    def missing(self) -> int:
        return len(self.seen) - self.delivered


def quantile(counts: collections.Counter[int], q: float) -> int:
    """The ``q`` quantile (nearest rank) of the values ``counts`` holds; 0 for none."""
    total = sum(counts.values())
    rank, seen = min(total - 1, int(q * total)), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > rank:
            return value
    return 0
