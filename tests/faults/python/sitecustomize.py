"""A bridge process a test starts with this folder on PYTHONPATH and ``STORE_FAULT_VALUE`` set
fails to store any batch of a partition that holds a record with that value, as a bug in the
bridge would (a ``ValueError`` while add.lua's arguments are made): the ingress must dead-letter
that record alone and store the rest (bridge.ingress.careful). With ``ACROSS_FAULTS=N``, the
first N looks for what cancels name in other partitions fail as a broker bounce would (a
``KafkaFault``), after add.lua stored their batch. With ``TXN_FAULT_PARTITION=P``, the
transactional producer of each delay-topic partition P does not start (as an ACL refusing its
transactional id would). With ``JOURNAL_HANG_AFTER=N``, the N-th transaction to journal its
records stalls once its journal entries are at the broker, before its commit (a process that
stops mid-commit: the test SIGKILLs it), leaving that transaction open in the journal. With ``JOURNAL_LOSE_WITHDRAWN=1``, what cancels and
replacements withdrew is never journaled, as when the process is SIGKILLed after add.lua applied
them and before the journal's producer had the entries written. With
``REDIS_LOADING_AT_ASSIGNMENT_S=T``, every Redis command fails as Redis answers while it loads its
data set (LOADING) for T seconds from the ingress's first assignment on: a Redis restarting from
its AOF as a new owner takes a partition over. With ``JOURNAL_FATES_FAIL=N``, the first N reads of
the journal for a partition read again fail as a journal partition without a leader would. With
``OWNED_DROP_PARTITION=P``, the mover is not handed delay-topic partition P at its first
assignment, as a bug in the hand-over would have it, and ``OWNED_DRIFT_S`` replaces how long the
probes wait before they take it over again (bridge.egress.owned). With ``HOLD_CLAIMED_VALUE=V`` and
``HOLD_DIR=D``, the first claim holding a record of value V stops the mover before it produces
anything (the record in flight in Redis) until the test makes ``D/release``, having made
``D/held``; with ``HOLD_BULK_DIR=D``, a bulk cancel, fire or reschedule of the command line stops
the same way once it took its snapshot, before it looks for what it matches. With
``HOLD_UNCLAIM_VALUE=V`` (and ``HOLD_DIR=D``), the first put-back of each claimed record of value
V (bridge.catchup's ``past``; with ``HOLD_UNCLAIM_WAIT=1``, into its target's wait index instead:
a rate-limited target's, bridge.egress.rate) waits, once it made ``D/held``, until the ingress
has applied the record after it in its partition (five seconds at most): as a mover descheduled
between its claim and its put-back would. With ``LATE_TAKE_BACK_MS=T``, the mover answers the ingress's
take-backs (bridge.catchup's ``take_back``) T ms late, as a mover descheduled while a record
claimed ahead falls due would. With ``SLOW_REREAD_MS=T``, each add of a partition read again after
Redis lost its state waits T ms first, as a slow Redis or a busy core would make that re-read."""

import os
from typing import Any

_VALUE = os.environ.get("STORE_FAULT_VALUE", "").encode()

if _VALUE:
    from bridge.message import Scheduled
    from bridge.store import adding

    _add_call = adding.add_call

    def _failing(*args: Any, **kwargs: Any) -> Any:
        _, records = args[3]
        if any(isinstance(r, Scheduled) and r.value == _VALUE for r in records):
            raise ValueError("a record this bridge cannot store (injected by the test)")
        return _add_call(*args, **kwargs)

    setattr(adding, "add_call", _failing)  # noqa: B010

_ACROSS = [int(os.environ.get("ACROSS_FAULTS", "0"))]

if _ACROSS[0]:
    from bridge.errors import KafkaFault
    from bridge.message import Cancel
    from bridge.store import adding

    _withdraw_elsewhere = getattr(adding, "withdraw_elsewhere")  # noqa: B009

    def _bouncing(scripts: Any, keys: Any, unmatched: Any, *args: Any, **kwargs: Any) -> Any:
        if _ACROSS[0] > 0 and any(isinstance(r, Cancel) for _, r in unmatched):
            _ACROSS[0] -= 1
            raise KafkaFault("the broker did not answer (injected by the test)")
        return _withdraw_elsewhere(scripts, keys, unmatched, *args, **kwargs)

    setattr(adding, "withdraw_elsewhere", _bouncing)  # noqa: B010

_TXN_PARTITION = os.environ.get("TXN_FAULT_PARTITION", "")

if _TXN_PARTITION:
    from confluent_kafka import KafkaError, KafkaException

    from bridge.egress import transactions

    _start = transactions.ShardTransaction.start

    def _refused(self: Any) -> None:
        if str(self.shard.partition) == _TXN_PARTITION:
            raise KafkaException(
                KafkaError(
                    KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorized (injected by the test)"
                )
            )
        _start(self)

    setattr(transactions.ShardTransaction, "start", _refused)  # noqa: B010

_HANG = [int(os.environ.get("JOURNAL_HANG_AFTER", "0"))]

if _HANG[0]:
    import time

    from bridge.journal import writer

    _delivered = writer.Journal.delivered

    def _stalling(self: Any, shard: Any, fates: Any, producer: Any = None) -> None:
        _delivered(self, shard, fates, producer)
        _HANG[0] -= 1
        if _HANG[0] == 0 and producer is not None:
            producer.flush(10)
            time.sleep(3600)  # the commit never comes

    setattr(writer.Journal, "delivered", _stalling)  # noqa: B010

if os.environ.get("JOURNAL_LOSE_WITHDRAWN"):
    from bridge.journal import writer as lost_writer

    def _lost(self: Any, records: Any, at_ms: int) -> None:
        return None

    setattr(lost_writer.Journal, "withdrawn", _lost)  # noqa: B010

_LOADING_S = float(os.environ.get("REDIS_LOADING_AT_ASSIGNMENT_S", "0"))

if _LOADING_S:
    import time as loading_time

    import redis

    from bridge.ingress import membership

    _until = [0.0]
    _on_assign = membership.Membership._on_assign
    _send: Any = redis.connection.AbstractConnection.send_packed_command

    def _assigning(self: Any, consumer: Any, partitions: Any) -> None:
        if not _until[0]:
            _until[0] = loading_time.monotonic() + _LOADING_S
        _on_assign(self, consumer, partitions)

    def _loading(self: Any, command: Any, check_health: bool = True) -> None:
        if _until[0] and loading_time.monotonic() < _until[0]:
            raise redis.exceptions.BusyLoadingError(
                "Redis is loading the dataset in memory (injected by the test)"
            )
        _send(self, command, check_health)

    setattr(membership.Membership, "_on_assign", _assigning)  # noqa: B010
    setattr(redis.connection.AbstractConnection, "send_packed_command", _loading)  # noqa: B010

_FATES_FAIL = [int(os.environ.get("JOURNAL_FATES_FAIL", "0"))]

if _FATES_FAIL[0]:
    from bridge.errors import BridgeError
    from bridge.journal import reader as journal_reader

    _fates = journal_reader.JournalReader.fates

    def _unreadable(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _FATES_FAIL[0] > 0:
            _FATES_FAIL[0] -= 1
            raise BridgeError("the journal's partition has no leader (injected by the test)")
        return _fates(self, *args, **kwargs)

    setattr(journal_reader.JournalReader, "fates", _unreadable)  # noqa: B010

_DROP = os.environ.get("OWNED_DROP_PARTITION", "")

if _DROP:
    from bridge.egress import mover, owned

    owned.DRIFT_S = float(os.environ.get("OWNED_DRIFT_S", owned.DRIFT_S))
    _add_shards = mover.Egress.add_shards
    _dropped: list[bool] = []

    def _dropping(self: Any, shards: Any) -> None:
        if not _dropped and any(str(s.partition) == _DROP for s in shards):
            _dropped.append(True)
            shards = {s for s in shards if str(s.partition) != _DROP}
        _add_shards(self, shards)

    setattr(mover.Egress, "add_shards", _dropping)  # noqa: B010


def _hold(directory: str) -> None:
    """Say so in ``directory`` (``held``), then wait there for ``release`` (a minute at most)."""
    import pathlib
    import time as hold_time

    folder = pathlib.Path(directory)
    (folder / "held").touch()
    deadline = hold_time.monotonic() + 60
    while not (folder / "release").exists() and hold_time.monotonic() < deadline:
        hold_time.sleep(0.02)


_HOLD_VALUE = os.environ.get("HOLD_CLAIMED_VALUE", "").encode()

if _HOLD_VALUE:
    from bridge.egress import sender

    _dispatch = sender.Sender.dispatch
    _held_once: list[bool] = []

    def _holding(self: Any, claimed: Any, *args: Any) -> None:
        if not _held_once and any(c.record.value == _HOLD_VALUE for c in claimed):
            _held_once.append(True)
            _hold(os.environ["HOLD_DIR"])
        _dispatch(self, claimed, *args)

    setattr(sender.Sender, "dispatch", _holding)  # noqa: B010

_HOLD_BULK = os.environ.get("HOLD_BULK_DIR", "")

if _HOLD_BULK:
    from bridge.ops import acts

    _matches = getattr(acts, "matches")  # noqa: B009

    def _matching_later(*args: Any, **kwargs: Any) -> Any:
        _hold(_HOLD_BULK)
        return _matches(*args, **kwargs)

    setattr(acts, "matches", _matching_later)  # noqa: B010

_HOLD_UNCLAIM = os.environ.get("HOLD_UNCLAIM_VALUE", "").encode()

if _HOLD_UNCLAIM:
    import pathlib
    import time as unclaim_time

    from bridge.store import api

    _unclaim = api.Store.unclaim
    _unclaimed: set[Any] = set()  # each record's first put-back only
    _UNCLAIM_WAIT = os.environ.get("HOLD_UNCLAIM_WAIT") == "1"

    def _unclaim_later(self: Any, claimed: Any, wait: bool = False) -> int:
        claimed = list(claimed)
        held = [c for c in claimed if c.record.value == _HOLD_UNCLAIM]
        if (
            held
            and wait == _UNCLAIM_WAIT
            and (held[0].shard, held[0].record.offset) not in _unclaimed
        ):
            _unclaimed.add((held[0].shard, held[0].record.offset))
            (pathlib.Path(os.environ["HOLD_DIR"]) / "held").touch()
            shard, after = held[0].shard, held[0].record.offset + 1
            deadline = unclaim_time.monotonic() + 5
            while unclaim_time.monotonic() < deadline:
                if self.inventory.watermarks([shard]).get(shard, -1) >= after:
                    break
                unclaim_time.sleep(0.01)
        return int(_unclaim(self, claimed, wait))

    setattr(api.Store, "unclaim", _unclaim_later)  # noqa: B010

_LATE_TAKE_BACK_MS = float(os.environ.get("LATE_TAKE_BACK_MS", "0"))

if _LATE_TAKE_BACK_MS:
    import time as take_back_time

    from bridge.egress import sender

    _take_back = sender.Sender.take_back

    def _take_back_late(self: Any, asks: Any) -> None:
        asks = list(asks)
        if asks:
            take_back_time.sleep(_LATE_TAKE_BACK_MS / 1000)
        _take_back(self, asks)

    setattr(sender.Sender, "take_back", _take_back_late)  # noqa: B010

_SLOW_REREAD_MS = float(os.environ.get("SLOW_REREAD_MS", "0"))

if _SLOW_REREAD_MS:
    import time as reread_time

    from bridge.store import api as reread_api

    _add = reread_api.Store.add

    def _add_slowly(self: Any, batches: Any, *args: Any, **kwargs: Any) -> Any:
        if set(kwargs.get("reread") or ()) & set(batches):
            reread_time.sleep(_SLOW_REREAD_MS / 1000)
        return _add(self, batches, *args, **kwargs)

    setattr(reread_api.Store, "add", _add_slowly)  # noqa: B010
