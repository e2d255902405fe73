"""Exactly-once egress: a shard's deliveries commit in one Kafka transaction with their journal.

With ``egress.exactly_once``, a shard's deliveries, their DLQ copies and their journal entries
commit in one Kafka transaction, and Redis acknowledges them only after the commit.

Each shard (delay-topic partition) has a transactional producer of its own, with the id
``<group>.<topic>.<partition>``, on a thread of its own (:class:`ShardTransaction`): records handed
to it go into its open transaction, which commits every ``egress.transaction``; only then are their
delivery reports handed on. A replica that takes a shard over starts the shard's producer first
(``init_transactions``): Kafka fences the earlier owner (whatever it commits from then on fails)
and aborts the transaction it left open, and only then is the journal read (bridge.journal
.reconcile). Why an id per shard, not the group-metadata fencing of KIP-447: docs/exactly-once.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.egress.committed import Committed
from bridge.egress.failures import Ident, InFlight
from bridge.health import Readiness
from bridge.journal import Journal
from bridge.kafka import produce_fields
from bridge.metrics import Metrics
from bridge.store import Shard

logger = logging.getLogger(__name__)

# Each call that waits for the transaction coordinator (commit, abort) waits this long, and is
# tried again after RETRY_S; starting a producer waits INIT_TIMEOUT_S (Kafka fences the earlier
# owner and aborts what it left open meanwhile). A commit waits FLUSH_S at a time for its
# records' acknowledgements (the records handed over meanwhile join the open transaction), and
# once STALL_S overdue /readyz says why (a broker fault is seconds).
CALL_TIMEOUT_S, RETRY_S, INIT_TIMEOUT_S = 5.0, 0.5, 30.0
FLUSH_S, STALL_S = 0.2, 5.0
IDLE_S = 1.0  # a shard's thread wakes this often with nothing to do
# A transaction holds this many records at most: the rest go in the next. While acknowledgements
# lag (a leader election) a transaction grew to every record claimed meanwhile, and its journal
# with it; each is a commit the broker must take as a whole.
MAX_RECORDS = 5_000

# What the records of a transaction that was aborted were refused with for the abort's sake, not
# their own: they are produced again in the next transaction.
_NOT_THEIRS = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._STATE})

# A record's delivery report: Kafka's error, and the record as Kafka took it (None: not taken).
Report = Callable[[KafkaError | None, Message | None], None]

# The report of a record whose shard's transactions ended (fenced, revoked) before it committed:
# it stays leased in Redis for the shard's next owner.
ABANDONED = KafkaError(KafkaError._FENCED, "the shard's producer ended before a commit", fatal=True)


@dataclass(slots=True, eq=False)
class Outgoing:
    """A record handed to a shard's transaction: where it goes, and what became of it."""

    ident: Ident
    inflight: InFlight
    topic: str
    fields: dict[str, Any]  # Producer.produce's: key, value, headers, timestamp, on_delivery
    report: Report
    err: KafkaError | None = None
    msg: Message | None = None  # as Kafka took it
    at_ms: int = 0  # when Kafka took it (epoch ms)


@dataclass
class Settings:
    """What every shard's transaction shares."""

    producer: Callable[[Shard], Producer]  # a shard's transactional producer, not started
    journal: Journal
    metrics: Metrics
    readiness: Readiness
    period_s: float  # egress.transaction
    dead_letter: str
    clock_ms: Callable[[], int]
    # A shard's thread stopped on a bug: the bridge stops (see Service._on_producer_error).
    on_fatal: Callable[[KafkaError], None]
    # A shard's producer ended on a fatal Kafka error, the shard not revoked (set by the egress:
    # TakeOver.ended; called on the shard's thread): fenced (True) by a newer producer — another
    # replica's, most likely, whose revoke is on its way; else its state is lost (an abort Kafka
    # refused). Either way the shard is taken over again with a new producer, once fenced later.
    on_ended: Callable[[Shard, bool], None] = lambda shard, fenced: None
    committed: Committed | None = None  # what was committed lately (a claim of it again)


def kafka_error(exc: BaseException | None) -> KafkaError | None:
    """The KafkaError ``exc`` carries, or was raised from (the client raises a producer's fatal
    error from flush and poll, and a delivery callback run meanwhile may wrap it)."""
    while exc is not None:
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            return exc.args[0]
        exc = exc.__cause__ or exc.__context__
    return None


class ShardTransaction:
    """One shard's transactional producer and its open transaction, run on a thread of its own:
    the only thread that calls the producer once it is started."""

    def __init__(self, shard: Shard, settings: Settings, on_reports: Callable[[], None]) -> None:
        self.shard = shard
        self.s = settings
        self.on_reports = on_reports  # reports were handed on: wake the mover
        self.producer = settings.producer(shard)
        self.check = f"transactions {shard}"  # its /readyz check
        self._cond = threading.Condition()
        self._queue: list[Outgoing] = []  # handed over, not produced yet
        self._pending: set[Ident] = set()  # queued or in the open transaction
        self._items: list[Outgoing] = []  # in the open transaction
        self._open = False
        self._committing = False  # its journal entries are produced: only the commit is left
        self._aborting = False  # an abort Kafka did not answer in time: only the abort is left
        self._commit_at = 0.0  # monotonic: when the open transaction is to commit
        self._retry_at = 0.0  # monotonic: a commit that could not be made is tried again then
        self._trying_since = 0.0  # monotonic: when the commit was first tried (0: not yet)
        self._closing = False
        self.ended = False
        self._thread = threading.Thread(target=self._run, name=f"txn {shard}", daemon=True)

    def start(self) -> None:
        """Start the producer (fencing the shard's earlier owner) and the thread; raises
        KafkaException if Kafka does not answer in INIT_TIMEOUT_S."""
        self.producer.init_transactions(INIT_TIMEOUT_S)
        self._thread.start()

    def send(self, item: Outgoing) -> None:
        """Produce ``item`` in the next transaction (not again if it is already on its way: a
        record claimed again after its lease ran out)."""
        with self._cond:
            if self.ended:
                item.report(ABANDONED, None)
                return
            if item.ident in self._pending:
                return
            self._pending.add(item.ident)
            self._queue.append(item)
            self._cond.notify()

    def close(self) -> None:
        """Commit what is open (one try), end the producer, abandon what is left: on its thread,
        which :meth:`join` waits for."""
        with self._cond:
            self._closing = True
            self._cond.notify()

    def join(self, timeout_s: float) -> None:
        self._thread.join(max(0.0, timeout_s))

    def commit_soon(self) -> None:
        """Commit the open transaction now rather than when its period ends (shutdown)."""
        with self._cond:
            self._commit_at = 0.0
            self._cond.notify()

    def idle(self) -> bool:
        """Nothing is queued or in a transaction."""
        return self.ended or not self._pending

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except Exception as exc:
            err = kafka_error(exc)  # flush and poll raise the producer's fatal error
            if err is not None and err.fatal():
                self._fatal(err)
                return
            # A bug: the records stay leased for whoever claims them next.
            logger.exception("%s: transactions stopped", self.shard)
            self._end(KafkaError(KafkaError._FAIL, repr(exc), fatal=True), "stopped")

    def _turn(self) -> bool:
        with self._cond:
            if not (self._queue or self._closing or self._due()):
                at = max(self._commit_at, self._retry_at)
                wait = IDLE_S if not self._open else max(0.0, at - time.monotonic())
                self._cond.wait(min(IDLE_S, wait))
            batch: list[Outgoing] = []
            if not (self._committing or self._aborting):
                batch, self._queue = self._queue, []
            closing = self._closing
        if batch:
            self._produce(batch)
        self.producer.poll(0)
        if self._open and (closing or self._due()):
            self._commit()
        if closing and not self.ended:
            self._end(ABANDONED, "closed", abort=self._open)
        return not self.ended

    def _due(self) -> bool:
        now = time.monotonic()
        return self._open and now >= self._commit_at and now >= self._retry_at

    def _produce(self, batch: list[Outgoing]) -> None:
        room = MAX_RECORDS - len(self._items)
        if len(batch) > room:  # the rest wait for the next transaction, which is due now
            with self._cond:
                self._queue[:0] = batch[max(room, 0) :]
            batch, self._commit_at = batch[: max(room, 0)], 0.0
            if not batch:
                return
        if not self._open:
            self.producer.begin_transaction()
            self._open, self._commit_at = True, time.monotonic() + self.s.period_s
        for n, item in enumerate(batch):
            try:
                # Its report, this transaction's (produced again in the next, the next's). Not
                # kept in item.fields: the callback holds the item, and a cycle per record left
                # every record to the cycle collector (its collections held the interpreter for
                # 100-200 ms at 3,667 records/s).
                report = functools.partial(self._reported, item)
                produce_fields(self.producer, item.topic, {**item.fields, "on_delivery": report})
                onward = item.inflight.onward  # a schedule carried on: in the same transaction
                if onward is not None:
                    report = functools.partial(self._reported_onward, item)
                    produce_fields(self.producer, onward[0], {**onward[1], "on_delivery": report})
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.fatal():
                    raise
                if err.code() == KafkaError._STATE or err.txn_requires_abort():
                    # The transaction failed already: it is aborted at once, these go in the next.
                    with self._cond:
                        self._queue[:0] = batch[n:]
                    self._commit_at = self._retry_at = 0.0
                    return
                with self._cond:  # refused locally (too large): not in the transaction
                    self._pending.discard(item.ident)
                item.report(err, None)
                self.on_reports()
                continue
            self._items.append(item)

    def _reported(self, item: Outgoing, err: KafkaError | None, msg: Message) -> None:
        # A schedule's record carried on may have failed first (_reported_onward): kept.
        item.err = err if err is not None else item.err
        item.msg, item.at_ms = msg, self.s.clock_ms()
        if err is None:  # for its journal entry
            item.inflight.placed = (msg.partition() or 0, msg.offset() or 0)

    def _reported_onward(self, item: Outgoing, err: KafkaError | None, msg: Message) -> None:
        if err is not None and item.err is None:  # the transaction aborts: both go again
            item.err = err

    def _commit(self) -> None:
        """Commit the open transaction, with the journal entries of its records; abort it if one
        of them failed (those are reported, the others produced again in the next)."""
        if self._aborting:
            self._abort("an abort that had timed out, resumed")
            return
        if not self._committing:
            self._trying_since = self._trying_since or time.monotonic()
            left = self.producer.flush(FLUSH_S)
            if left:  # Kafka has not taken them yet: try again (the transaction stays open)
                self._not_committing(f"{left} records not acknowledged by Kafka", retry_s=0.0)
                return
            if any(i.err is not None for i in self._items):
                self._abort("a record was refused")
                return
            dlq = self.s.dead_letter
            fates = [
                (o.inflight.claimed.topic_id, o.inflight.fate(o.at_ms, dlq)) for o in self._items
            ]
            try:
                self.s.journal.delivered(self.shard, fates, self.producer)
            except KafkaException as exc:  # never committed without its journal
                self._abort(f"its journal was refused: {exc.args[0].str()}")
                return
            self._committing = True
        try:
            self.producer.commit_transaction(CALL_TIMEOUT_S)
        except KafkaException as exc:
            self._failed(exc.args[0], "commit")
            return
        items, self._items = self._items, []
        self._open = self._committing = False
        self._trying_since = self._retry_at = 0.0
        if self.s.committed is not None:
            self.s.committed.add(i.inflight.claimed for i in items)
        with self._cond:
            self._pending.difference_update(i.ident for i in items)
        for i in items:
            i.report(None, i.msg)
        self.s.metrics.transactions.labels(result="committed").inc()
        self.s.readiness.ok(self.check)
        self.on_reports()

    def _fatal(self, err: KafkaError) -> None:
        self._end(err, "fenced" if err.code() == KafkaError._FENCED else "failed")

    def _failed(self, err: KafkaError, what: str) -> None:
        if err.fatal():
            self._fatal(err)
        elif err.txn_requires_abort():
            self._abort(f"{what} failed: {err.str()}")
        else:  # retriable (a timeout): the same call again
            self._not_committing(f"{what} failed: {err.str()}")

    def _not_committing(self, why: str, retry_s: float = RETRY_S) -> None:
        """Try again in ``retry_s``; once the commit was first tried STALL_S ago, /readyz and the
        log say why."""
        now = time.monotonic()
        if self._trying_since and now - self._trying_since > STALL_S:
            detail = f"{self.shard}: transaction cannot commit: {why}"
            self.s.readiness.fail(self.check, detail)
            logger.warning("%s; trying again", detail)  # rate-limited (bridge.logs)
        self._retry_at = now + retry_s

    def _abort(self, why: str) -> None:
        try:
            self.producer.abort_transaction(CALL_TIMEOUT_S)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                self._fatal(err)
            else:  # it goes on in the background: only the abort is called again
                self._aborting = True
                self._not_committing(f"abort failed: {err.str()}")
            return
        self._aborting = False
        items, self._items = self._items, []
        self._open = self._committing = False
        self._trying_since = self._retry_at = 0.0
        failed = [i for i in items if i.err is not None and i.err.code() not in _NOT_THEIRS]
        again = [i for i in items if i.err is None or i.err.code() in _NOT_THEIRS]
        for i in again:
            i.err, i.msg = None, None
        with self._cond:
            self._queue[:0] = again
            self._pending.difference_update(i.ident for i in failed)
        for i in failed:
            assert i.err is not None
            i.report(i.err, None)
        self.s.metrics.transactions.labels(result="aborted").inc()
        logger.warning(
            "%s: transaction aborted (%s): %d records produced again, %d failed",
            self.shard,
            why,
            len(again),
            len(failed),
        )
        self.on_reports()

    def _end(self, err: KafkaError, why: str, abort: bool = False) -> None:
        """The producer is done with (fenced, failed, closed): what it holds is abandoned, leased
        in Redis for the shard's next owner (or this replica's next take-over of it)."""
        if abort:  # unblocks read_committed consumers at once, not after transaction.timeout.ms
            try:
                self.producer.abort_transaction(CALL_TIMEOUT_S)
            except KafkaException as exc:
                logger.warning("%s: open transaction not aborted: %s", self.shard, exc)
        with self._cond:
            self.ended = True
            items, self._items, self._queue = self._items + self._queue, [], []
            self._pending.clear()
        for i in items:
            i.report(ABANDONED, None)
        self.s.readiness.ok(self.check)
        # Once closed (revoked), its end is no news: the shard may be this replica's again, with
        # a new producer that fenced this one.
        if why != "closed" and not self._closing:
            if why == "fenced":
                self.s.metrics.transactions.labels(result="fenced").inc()
            logger.error(
                "%s: the transactional producer %s (%s); %d records left leased for the "
                "shard's next owner%s",
                self.shard,
                why,
                err.str(),
                len(items),
                "" if why != "failed" else ": this replica, with a new producer",
            )
            if why == "stopped":  # a bug: the process stops, its supervisor starts it again
                self.s.on_fatal(err)
            else:
                self.s.on_ended(self.shard, why == "fenced")
        self.on_reports()
