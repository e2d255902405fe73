"""Where the egress's records leave by.

A producer as is (at-least-once: :class:`Direct`), or the owned shards' Kafka transactions (exactly
once: :class:`Transactions`, each shard's in :mod:`.transactions`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.config import Config, transactional_id, transactional_settings
from bridge.egress.committed import Committed
from bridge.egress.failures import Ident, InFlight
from bridge.egress.transactions import (
    ABANDONED,
    CALL_TIMEOUT_S,
    INIT_TIMEOUT_S,
    Outgoing,
    Report,
    Settings,
    ShardTransaction,
)
from bridge.health import Readiness
from bridge.journal import Journal, Reconcile
from bridge.kafka import produce_fields
from bridge.metrics import Metrics
from bridge.store import Shard, Store

logger = logging.getLogger(__name__)

COMMIT_WAIT_S = 0.005  # how often a wait for commits looks again
# What was committed is remembered for two leases, and a minute at least: a Redis replica that
# lagged this long and lost acknowledgements, not ingested records, brings them back (see
# bridge.egress.committed).
KEEP_COMMITTED_S = 60.0


class Outlet(Protocol):
    # Records unacknowledged at shutdown stay leased for the next owner, who reconciles them
    # with the journal (their transaction may yet commit): not released.
    exactly_once: bool

    def send(
        self, ident: Ident, inflight: InFlight, topic: str, report: Report, fields: dict[str, Any]
    ) -> None:
        """Produce a claimed record (``fields``: ``Producer.produce``'s keyword arguments, which
        the outlet may add to); ``report`` is called with its delivery report. Raises
        KafkaException if it is refused at once (too large)."""

    def poll(self, timeout_s: float) -> None:
        """Serve delivery reports, waiting up to ``timeout_s`` for the first."""

    def flush(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the delivery reports of every record sent."""

    def stop(self) -> None:
        """No more records are sent (shutdown, after the last flush)."""


class Direct:
    """At-least-once: records go out through the producer, reported when Kafka has them."""

    exactly_once = False

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def send(
        self, ident: Ident, inflight: InFlight, topic: str, report: Report, fields: dict[str, Any]
    ) -> None:
        onward = inflight.onward
        if onward is None:
            fields["on_delivery"] = report
            produce_fields(self.producer, topic, fields)
            return
        # A recurring schedule's occurrence and the record carrying it on: one report for both.
        both = Both(report)
        produce_fields(self.producer, topic, {**fields, "on_delivery": both.first})
        produce_fields(self.producer, onward[0], {**onward[1], "on_delivery": both.second})

    def poll(self, timeout_s: float) -> None:
        self.producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> None:
        self.producer.flush(timeout_s)

    def stop(self) -> None:
        pass


class Both:
    """Two records' delivery reports as one (an occurrence and the record carrying its schedule
    on, see bridge.egress.recurring): reported once both are in — the first error, else the
    first record's message."""

    __slots__ = ("_err", "_left", "_msg", "_report")

    def __init__(self, report: Report) -> None:
        self._report = report
        self._err: KafkaError | None = None
        self._msg: Message | None = None
        self._left = 2

    def first(self, err: KafkaError | None, msg: Message | None) -> None:
        self._msg = msg
        self._took(err)

    def second(self, err: KafkaError | None, msg: Message | None) -> None:
        self._took(err)

    def _took(self, err: KafkaError | None) -> None:
        if err is not None and self._err is None:
            self._err = err
        self._left -= 1
        if self._left == 0:
            self._report(self._err, None if self._err is not None else self._msg)


def shard_transactions(
    config: Config,
    metrics: Metrics,
    readiness: Readiness,
    *,
    journal: Journal | None,
    store: Store,
    reconcile: Reconcile | None,
    on_fatal: Callable[[KafkaError], None],
    log: logging.Logger,
) -> Transactions | None:
    """The shards' transactions (None: at-least-once, egress.exactly_once is off); their
    producers log through ``log``."""
    if not config.egress.exactly_once:
        return None
    assert journal is not None  # the config needs one (bridge.config.loader)

    def producer(shard: Shard) -> Producer:
        tid = transactional_id(config.kafka.group_id, shard.topic, shard.partition)
        return Producer({**transactional_settings(config, tid), "logger": log})

    settings = Settings(
        producer,
        journal,
        metrics,
        readiness,
        period_s=config.egress.transaction / 1000,
        dead_letter=config.topics.dead_letter,
        clock_ms=lambda: time.time_ns() // 1_000_000,
        on_fatal=on_fatal,
        committed=Committed(
            store,
            keep_s=max(KEEP_COMMITTED_S, 2 * config.egress.lease / 1000),
            journal=reconcile,
            metrics=metrics,
        ),
    )
    return Transactions(settings)


class Transactions:
    """The owned shards' transactions: the egress's outlet with exactly-once delivery."""

    exactly_once = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._shards: dict[Shard, ShardTransaction] = {}
        self._closed: dict[Shard, ShardTransaction] = {}  # at a revoke: perhaps not ended yet
        self.reports = threading.Event()  # set when a shard hands reports on
        # Producers starting (open, on the mover's thread) and fencing (fence, on the ingress's)
        # by partition: a fence never fences a producer this replica starts.
        self._state = threading.Condition()
        self._starting: set[Shard] = set()
        self._fencing: set[Shard] = set()

    def open(self, shards: Iterable[Shard]) -> dict[Shard, str]:
        """Start the producers of ``shards`` (taken over) that have none, all at once: each
        start waits for Kafka to fence the earlier owner, and for a fence of the partition under
        way here (:meth:`fence`). Returns those that did not start (by partition: why); the
        others are kept (a partition revoked while its producer started: its take-over closes
        it, bridge.egress.takeover)."""
        failed: dict[Shard, str] = {}
        with self._state:
            bases = {s.base() for s in shards}
            self._state.wait_for(lambda: not bases & self._fencing, INIT_TIMEOUT_S)
            for shard in bases & self._fencing:
                failed[shard] = f"a fence of its earlier owner did not end in {INIT_TIMEOUT_S:.0f}s"
            new = {s for s in bases if not self._live(s) and s not in failed}
            self._starting |= new
        for shard in new:  # a producer closed at a revoke ends before the next one starts
            closed = self._closed.pop(shard, None)
            if closed is not None:
                closed.join(INIT_TIMEOUT_S)
        started: dict[Shard, ShardTransaction] = {}

        def start(shard: Shard) -> None:
            try:
                txn = ShardTransaction(shard, self.settings, self.reports.set)
                txn.start()
                started[shard] = txn
            except KafkaException as exc:
                failed[shard] = str(exc.args[0].str() if exc.args else exc)

        try:
            _each_at_once(start, sorted(new))
        finally:
            with self._state:
                self._shards.update(started)
                self._starting -= new
                self._state.notify_all()
        return failed

    def fence(self, shards: Iterable[Shard]) -> None:
        """Fence the earlier owners of ``shards`` that this replica has no producer for, all at
        once: a producer with each one's transactional id starts and is dropped. Kafka aborts
        what an earlier owner left open, which holds a read of the journal (read_committed)
        back until then: a rebuild reads it before the shard's own producer starts (open). One
        whose producer starts meanwhile is left to that start, which fences the earlier owner as
        well: a fence after it would fence this replica's own producer."""
        with self._state:
            new = sorted(
                b
                for b in {s.base() for s in shards}
                if not self._live(b) and b not in self._starting | self._fencing
            )
            self._fencing.update(new)

        def fence_one(shard: Shard) -> None:
            try:
                self.settings.producer(shard).init_transactions(INIT_TIMEOUT_S)
            except KafkaException as exc:
                logger.warning(
                    "%s: its earlier owner not fenced before the journal is read (%s): what that "
                    "one left open holds the read back",
                    shard,
                    exc.args[0].str() if exc.args else exc,
                )

        try:
            _each_at_once(fence_one, new)
        finally:
            with self._state:
                self._fencing.difference_update(new)
                self._state.notify_all()

    def _live(self, shard: Shard) -> bool:
        txn = self._shards.get(shard)
        return txn is not None and not txn.ended

    def send(
        self, ident: Ident, inflight: InFlight, topic: str, report: Report, fields: dict[str, Any]
    ) -> None:
        """Produce a claimed record in its shard's next transaction."""
        item = Outgoing(ident, inflight, topic, fields, report)
        txn = self._shards.get(ident[0].base())
        if txn is None:
            report(ABANDONED, None)
            self.reports.set()
        else:
            txn.send(item)

    def close(self, shards: Iterable[Shard]) -> None:
        """End the transactions of revoked shards (what is open commits if it can), on their
        threads: a take-over of one of them waits for its end (:meth:`open`)."""
        with self._state:  # a take-over's open finds it closing, and waits for its end
            bases = {s.base() for s in shards} & self._shards.keys()
            closing = {s: self._shards.pop(s) for s in bases}
            self._closed.update(closing)
        for txn in closing.values():
            txn.close()

    def poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a shard to hand reports on (they are queued already)."""
        if self.reports.wait(timeout_s):
            self.reports.clear()

    def flush(self, timeout_s: float) -> None:
        """Commit what is open now and wait up to ``timeout_s`` for it (shutdown)."""
        self.commit_now(set(self._shards), timeout_s)

    def commit_now(self, bases: set[Shard], timeout_s: float) -> bool:
        """Commit what the transactions of these partitions hold now, and wait up to
        ``timeout_s`` until they hold nothing; returns whether they do."""
        txns = [t for s, t in list(self._shards.items()) if s in bases]
        for txn in txns:
            txn.commit_soon()
        deadline = time.monotonic() + timeout_s
        while not all(t.idle() for t in txns):
            if time.monotonic() >= deadline:
                return False
            time.sleep(COMMIT_WAIT_S)
        return True

    def stop(self, timeout_s: float = 2 * CALL_TIMEOUT_S) -> None:
        """End every shard's transactions, waiting up to ``timeout_s`` (shutdown, after
        :meth:`flush`): what is still open aborts."""
        self.close(list(self._shards))
        deadline = time.monotonic() + timeout_s
        for txn in self._closed.values():
            txn.join(deadline - time.monotonic())


def _each_at_once(call: Callable[[Shard], None], shards: Sequence[Shard]) -> None:
    """``call`` each shard on a thread of its own, all at once; returns when all have returned
    (each waits on Kafka: a producer's start, one after another, would add up)."""
    threads = [threading.Thread(target=call, args=(s,)) for s in shards]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
