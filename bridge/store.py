"""The Redis store: one shard per delay-topic partition, every read-then-write a Lua script.

Per shard, all keys are ``<prefix>:{<topic>:<partition>}:<name>``: they share one hash tag, so the
multi-key scripts run on Redis Cluster, and every key starts with the prefix, so one ACL key
pattern ``~<prefix>:*`` covers a deployment (keys of earlier builds, named
``{<prefix>:<topic>:<partition>}:<name>``, are moved by :meth:`Store.relocate`):

* ``…:schedule``  ZSET member → due ms: the records waiting. A member *is* the record: its
  offset as 8 big-endian bytes, then the encoded record (:func:`bridge.message.encode`). Records
  with the same due time sort in offset order, and each costs Redis one entry (an index beside a
  HASH of records cost about 70 bytes more per record);
* ``…:leases``    ZSET offset (8 bytes) → lease deadline ms, and ``…:claimed`` HASH offset →
  member: the records in flight (a few batches per bridge), addressed by offset so that
  acknowledging a record sends 8 bytes, not the record;
* ``…:meta``      HASH ``ingested`` → the highest offset handled (the ingest watermark);
* ``…:pending``   HASH offset bucket (``offset // 256`` as 7 bytes) → 32-byte bitmap of its
  offsets still pending, and ``…:low`` the ZSET of those buckets (all scored 0, so sorted by
  offset): the lowest pending offset — the one to commit — is read without scanning records.

The ingest watermark lets a restarted consumer resume right after what Redis holds; the committed
Kafka offset is the lowest offset still pending, so a Redis that lost its data is rebuilt by
re-reading the delay topic from there (:mod:`bridge.ingress`).

Calls over several shards go out in one pipeline: one round trip per batch, never per record.
Shards written in the earlier layout (``…:due``/``…:inflight`` of offsets beside a ``…:records``
HASH) are moved into this one by :meth:`Store.upgrade` before the ingress computes their low
offset or the egress claims from them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple, cast

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from bridge.errors import StoreError, WriteRefused
from bridge.message import Cancel, Scheduled, decode, encode

logger = logging.getLogger(__name__)

_OFFSET = struct.Struct(">Q")
_KEY_NAMES = ("schedule", "leases", "claimed", "meta", "low", "pending", "ids")
_LEGACY_KEY_NAMES = ("due", "inflight", "records")
# Every key a shard may have, and how relocate.lua merges two copies of it (the first three are
# all a retired incarnation has).
_RELOCATED = (("schedule", "zset"), ("leases", "zset"), ("claimed", "hash"), ("meta", "meta"),
              ("low", "zset"), ("pending", "bitmaps"), ("retired", "set"), ("due", "zset"),
              ("inflight", "zset"), ("records", "hash"))  # fmt: skip
CLUSTER_ATTEMPTS = 3  # tries of a script call whose slot moved (Redis Cluster failover, resharding)
# Records due within this long before a claim are "on time" and get half of every claim, so an
# overdue backlog drains without holding up records falling due now (claim.lua).
ON_TIME_WINDOW_MS = 1000


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

    def all(self) -> tuple[str, ...]:
        return (self.due, self.inflight, self.claimed, self.meta, self.low, self.pending,
                self.ids)  # fmt: skip


@dataclass(frozen=True)
class LegacyKeys:
    """The keys of one shard in the earlier layout (see upgrade.lua)."""

    due: str
    inflight: str
    records: str


@dataclass(slots=True)
class Claimed:
    """A record handed out by :meth:`Store.claim`, leased until acknowledged or expired. One
    per claimed record, so not frozen (see :class:`Scheduled`); treat it as immutable."""

    shard: Shard
    member: bytes  # the in-flight member, the offset's 8 bytes: what ack and release take
    record: Scheduled
    redelivery: bool

    def given_id(self) -> str | None:
        """The record's delay-id if its producer gave one (only those are in the id index)."""
        return self.record.given_id(self.shard.topic, self.shard.partition)


class Bound(NamedTuple):
    """What :meth:`Store.bind` did to a shard: whether it ``replaced`` the state of an earlier
    incarnation (bound to ``stored_id``, up to ``watermark``), and the ``retired`` shard now
    holding that incarnation's ``records`` (None when it held none)."""

    replaced: bool
    stored_id: str
    records: int = 0
    watermark: int | None = None
    retired: Shard | None = None


class Lost(NamedTuple):
    """Redis no longer holds what was written to a shard: its state is gone (``watermark`` is
    None) or its watermark went back to ``watermark``."""

    watermark: int | None


@dataclass(frozen=True)
class Added:
    """What :meth:`Store.add` did: records stored, waiting records replaced by a later one with
    their delay-id, cancels applied and cancels that found nothing waiting, and the shards it
    refused as lost."""

    count: int
    lost: dict[Shard, Lost]
    replaced: int = 0
    cancelled: int = 0
    not_found: int = 0
    # (shard, offset, delay-id) of the first few cancels per shard that found nothing
    missed: tuple[tuple[Shard, int, str], ...] = ()


@dataclass(frozen=True)
class Lows:
    """What :meth:`Store.lows` found: the offset to commit per shard, and the lost shards."""

    offsets: dict[Shard, int]
    lost: dict[Shard, Lost]


@dataclass(frozen=True)
class Backlog:
    """What waits in a set of shards, for the gauges."""

    now_ms: int
    scheduled: int
    overdue: int
    inflight: int
    oldest_due_ms: int | None


class Claims(list[Claimed]):
    """The records a claim handed out, with Redis's clock at the claim (``now_ms``), its clock
    when the claim ended (``clock_ms``) and the local ``time.monotonic()`` when the reply came in
    (``received``: later than Redis read ``clock_ms``, so Redis's clock carried on from there is
    never ahead of Redis's) and, per shard claimed from, its earliest due time or lease deadline
    left (``next_ms``; None: nothing)."""

    def __init__(
        self,
        records: list[Claimed],
        now_ms: int,
        next_ms: dict[Shard, int | None],
        received: float,
        clock_ms: int,
    ) -> None:
        super().__init__(records)
        self.now_ms = now_ms
        self.next_ms = next_ms
        self.received = received
        self.clock_ms = clock_ms


def _ack_args(
    shard: Shard,
    members: Mapping[Shard, Sequence[bytes]],
    ids: Mapping[Shard, Sequence[tuple[str, bytes]]],
) -> list[Any]:
    """A shard's acknowledgements as ack() in _lib.lua reads them: n, n offsets, then (delay-id,
    offset) pairs."""
    batch = members.get(shard, ())
    return [len(batch), *batch, *(x for pair in ids.get(shard, ()) for x in pair)]


def offset_bytes(offset: int) -> bytes:
    """A delay-topic offset as the 8 bytes that start its member (and order its bucket)."""
    return _OFFSET.pack(offset)


def member(record: Scheduled, topic: str, partition: int) -> bytes:
    """The due-index member of a record: its offset, then the encoded record."""
    return _OFFSET.pack(record.offset) + encode(record, topic, partition)


def offset_of(member: bytes) -> int:
    """The delay-topic offset of a member (or of its first 8 bytes)."""
    return int(_OFFSET.unpack_from(member)[0])


def _tag(prefix: str, topic: str, partition: str) -> str:
    """A shard's key prefix: the deployment's prefix, then the shard's hash tag (with an empty
    ``partition``: the text every shard key of ``topic`` starts with, up to its partition)."""
    head = f"{prefix}:{{{topic}:"
    return f"{head}{partition}}}" if partition else head


def glob_escape(raw: bytes) -> bytes:
    """``raw`` with Redis glob's special characters escaped (for SCAN's MATCH)."""
    return b"".join(b"\\" + bytes((c,)) if c in b"*?[]\\^" else bytes((c,)) for c in raw)


def _glob(text: str) -> str:
    return glob_escape(text.encode()).decode()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _expected(watermark: int | None) -> str:
    return "" if watermark is None else str(watermark)


def _lost(status: int, watermark: int) -> Lost | None:
    # The scripts' status codes: 0 fine, 1 state missing, 2 watermark went back.
    if status == 1:
        return Lost(None)
    if status == 2:
        return Lost(watermark)
    return None


def describe_redis_error(exc: redis.RedisError) -> str:
    """One line naming what Redis's failure means, so an operator need not decode it: a read-only
    replica, a missing ACL permission or a full memory are not outages."""
    text = " ".join(str(exc).split())
    if isinstance(exc, redis.exceptions.ReadOnlyError) or "READONLY" in text:
        return (f"redis is read-only (READONLY): the bridge talks to a replica, not the master "
                f"(after a failover?): {text}")  # fmt: skip
    if isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        return f"redis refused permission (NOPERM): the ACL user lacks a command or key: {text}"
    if isinstance(exc, redis.exceptions.AuthenticationError) or "WRONGPASS" in text:
        return f"redis refused the credentials (check redis.url and redis.password): {text}"
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM"):
        return f"redis is out of memory (OOM): it refuses writes at maxmemory: {text}"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return f"redis is loading its data set: {text}"
    if isinstance(exc, redis.exceptions.ClusterDownError) or text.startswith("CLUSTERDOWN"):
        return (f"redis cluster is down (CLUSTERDOWN): a slot has no reachable master until "
                f"a replica takes over or the master returns: {text}")  # fmt: skip
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return f"redis unreachable: {text}"
    return f"redis: {text}"


@contextlib.contextmanager
def as_store_error() -> Iterator[None]:
    """Redis failures leave the store as :class:`StoreError`, the one error callers handle."""
    try:
        yield
    except redis.RedisError as exc:
        text = str(exc)
        refused = isinstance(
            exc, redis.exceptions.OutOfMemoryError | redis.exceptions.ReadOnlyError
        )
        if refused or "OOM command not allowed" in text or "READONLY" in text:
            raise WriteRefused(describe_redis_error(exc)) from exc
        raise StoreError(describe_redis_error(exc)) from exc
    except redis.exceptions.RedisClusterException as exc:
        # redis-py's cluster client's own errors (a slot no node serves, no node answers while it
        # learns the slot map) are not RedisError, yet are as passing as a lost connection.
        raise StoreError(f"redis cluster has no master for every slot: {exc}") from exc
    except (OSError, ValueError) as exc:
        # redis-py's cluster client may close a connection another thread is reading while it
        # learns a new slot map after a failover; that call failed, the next one goes through.
        raise StoreError(f"redis connection closed under the call: {exc!r}") from exc
    except AttributeError as exc:
        # The same race inside redis-py's hiredis parser: the closing thread drops the parser's
        # reader, the reading one then reads through None (redis-py #4003). Not ours: re-raised.
        if not _raised_in_redis_client(exc):
            raise
        raise StoreError(f"redis connection closed under the call: {exc!r}") from exc


_REDIS_CLIENT_DIR = os.path.dirname(redis.__file__) + os.sep


def _raised_in_redis_client(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside redis-py's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_REDIS_CLIENT_DIR)


def _lua(name: str) -> str:
    return resources.files("bridge").joinpath("lua", f"{name}.lua").read_text()


def _script(client: redis.Redis, name: str) -> Script:
    # Redis scripts cannot import; the shared helpers are prepended instead.
    return client.register_script(_lua("_lib") + "\n" + _lua(name))


class Store:
    """Scheduled records in Redis, addressed by shard."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._add = _script(client, "add")
        self._claim = _script(client, "claim")
        self._ack = _script(client, "ack")
        self._release = _script(client, "release")
        self._take_over = _script(client, "take_over")
        self._stats = _script(client, "stats")
        self._low = _script(client, "low")
        self._upgrade = _script(client, "upgrade")
        self._incarnation = _script(client, "incarnation")
        self._retired = _script(client, "retired")
        self._relocate = _script(client, "relocate")
        self._unclaim = _script(client, "unclaim")
        self._relocation_denied = False
        self._scripts = (self._add, self._claim, self._ack, self._release, self._take_over,
                         self._stats, self._low, self._upgrade, self._incarnation,
                         self._retired, self._relocate, self._unclaim)  # fmt: skip

    def keys(self, shard: Shard) -> ShardKeys:
        """The only place key names are built (with :meth:`legacy_keys`)."""
        return ShardKeys(*self._names(shard, _KEY_NAMES))

    def legacy_keys(self, shard: Shard) -> LegacyKeys:
        """The shard's keys in the earlier layout, which :meth:`upgrade` empties."""
        return LegacyKeys(*self._names(shard, _LEGACY_KEY_NAMES))

    def retired_set(self, shard: Shard) -> str:
        """The SET of a shard's retired incarnation labels."""
        return self._names(shard.base(), ("retired",))[0]

    def _names(
        self, shard: Shard, names: Sequence[str], *, before_prefix: bool = False
    ) -> list[str]:
        # Every key starts with the prefix (one ACL pattern "~<prefix>:*" covers a deployment),
        # then the shard's hash tag, so a shard's keys share one Redis Cluster slot.
        if before_prefix:  # the names of the builds before that (see relocate.lua)
            tag = f"{{{self.prefix}:{shard.topic}:{shard.partition}}}"
        else:
            tag = _tag(self.prefix, shard.topic, str(shard.partition))
        if shard.incarnation:
            tag = f"{tag}:retired:{shard.incarnation}"
        return [f"{tag}:{name}" for name in names]

    def relocate(self, shards: Sequence[Shard]) -> int:
        """Move the shards' keys from the names before every key started with the prefix (see
        relocate.lua); returns how many keys moved. A no-op on Redis Cluster, where those builds
        did not run."""
        if isinstance(self.client, RedisCluster) or not shards or self._relocation_denied:
            return 0
        try:
            with as_store_error():
                pipe = self.client.pipeline(transaction=False)
                for shard in shards:
                    pipe.smembers(self._names(shard, ("retired",), before_prefix=True)[0])
                labels = pipe.execute()
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
                raise
            # A least-privilege user limited to "~<prefix>:*" sees no older names, and needs not.
            logger.info("not looking for keys under the names of earlier builds: %s", exc)
            self._relocation_denied = True
            return 0
        calls: list[tuple[Script, list[str], list[Any]]] = []
        for shard, retired in zip(shards, labels, strict=True):
            keys: list[str] = []
            kinds: list[str] = []
            for incarnation in ["", *(_text(label) for label in retired)]:
                one = Shard(shard.topic, shard.partition, incarnation)
                names = _RELOCATED if not incarnation else _RELOCATED[:3]
                olds = self._names(one, [n for n, _ in names], before_prefix=True)
                news = self._names(one, [n for n, _ in names])
                for (_, kind), old, new in zip(names, olds, news, strict=True):
                    keys += [old, new]
                    kinds.append(kind)
            calls.append((self._relocate, keys, kinds))
        return sum(int(n) for n in self._run(calls))

    def _run(self, calls: Iterable[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        """Run script calls in one pipeline: EVALSHA only, one round trip. (A pipeline of
        registered scripts would first ask SCRIPT EXISTS, a second round trip every call.) A
        Redis that does not know a script (restarted, flushed) gets them all loaded, then the
        calls again: a repeated add, ack or release changes nothing, and records a repeated
        claim leased first are handed out again when the lease ends, as after a lost reply."""
        calls = list(calls)
        with as_store_error():
            try:
                return self._evalsha(calls)
            except redis.exceptions.NoScriptError:
                for script in self._scripts:  # on Redis Cluster: on every master
                    self.client.script_load(script.script)
                return self._evalsha(calls)

    def _evalsha(self, calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        if isinstance(self.client, RedisCluster):
            return self._evalsha_cluster(calls)
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies: list[Any] = pipe.execute()
        return replies

    def _evalsha_cluster(self, calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        """Redis Cluster: the calls split by the master holding each shard's slot (every key of a
        shard shares its hash tag), one pipeline per master. Calls refused because a slot moved
        (MOVED/ASK, a failover) are sent again once the client has the new slot map; the rest
        stand."""
        cluster = cast(RedisCluster, self.client)
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for _ in range(CLUSTER_ATTEMPTS):
            by_node: dict[str, tuple[Any, list[int]]] = {}
            for i in todo:
                node = cluster.get_node_from_key(calls[i][1][0])  # type: ignore[no-untyped-call]
                by_node.setdefault(node.name, (node, []))[1].append(i)
            moved: list[int] = []
            for node, indexes in by_node.values():
                # A node learnt from a MOVED reply (another thread's call) has no connection yet.
                connection = cluster.get_redis_connection(node)
                pipe = connection.pipeline(transaction=False)
                for i in indexes:
                    script, keys, args = calls[i]
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                try:
                    results = pipe.execute(raise_on_error=False)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    moved += indexes  # the master is gone: its replica takes over its slots
                    continue
                for i, result in zip(indexes, results, strict=True):
                    if isinstance(
                        result,
                        redis.exceptions.AskError
                        | redis.exceptions.MovedError
                        | redis.exceptions.TryAgainError
                        | redis.exceptions.ClusterDownError,
                    ):
                        moved.append(i)
                    elif isinstance(result, Exception):
                        raise result
                    else:
                        replies[i] = result
            if not moved:
                return replies
            cluster.nodes_manager.initialize()  # type: ignore[no-untyped-call]  # new slot map
            todo = moved
        raise redis.exceptions.ConnectionError(
            f"{len(todo)} script calls found no master for their slot in {CLUSTER_ATTEMPTS} tries"
        )

    def probe_key(self) -> str:
        """The key :meth:`probe` writes."""
        return f"{self.prefix}:probe"

    def probe(self) -> None:
        """Write to Redis; raise :class:`StoreError` naming the cause unless it takes writes."""
        with as_store_error():
            self.client.set(self.probe_key(), b"1", px=60_000)

    def add(
        self,
        batches: Mapping[Shard, tuple[int, Sequence[Scheduled | Cancel]]],
        expected: Mapping[Shard, int] | None = None,
    ) -> Added:
        """Store records per shard and move each shard's watermark to the batch's high offset.

        ``batches`` maps a shard to (highest offset handled, records to store); ``expected`` the
        watermark the caller last saw per shard. A shard whose state Redis lost is refused whole
        and reported in :attr:`Added.lost`.
        """
        expected = expected or {}
        shards = list(batches)
        calls = []
        for shard in shards:
            high, records = batches[shard]
            k = self.keys(shard)
            args: list[Any] = [_expected(expected.get(shard)), high]
            for rec in records:
                if isinstance(rec, Cancel):
                    args += [rec.offset, "", "", rec.delay_id]
                    continue
                args += [rec.offset, rec.due_ms, member(rec, shard.topic, shard.partition),
                         rec.given_id(shard.topic, shard.partition) or ""]  # fmt: skip
            keys = [k.due, k.meta, k.low, k.pending, k.ids, k.inflight]
            calls.append((self._add, keys, args))
        counts, lost, missed = [0, 0, 0, 0], {}, []
        for shard, reply in zip(shards, self._run(calls), strict=True):
            loss = _lost(int(reply[0]), int(reply[1]))
            if loss is None:
                counts = [a + int(b) for a, b in zip(counts, reply[1:5], strict=True)]
                missed += [(shard, int(reply[i]), _text(reply[i + 1]))
                           for i in range(5, len(reply), 2)]  # fmt: skip
            else:
                lost[shard] = loss
        added, replaced, cancelled, not_found = counts
        return Added(added, lost, replaced, cancelled, not_found, tuple(missed))

    def upgrade(self, shards: Sequence[Shard], batch: int = 1000) -> int:
        """Move the shards' records from the earlier layout into this one, ``batch`` records per
        shard and round trip, until none is left. Returns how many moved; a shard with nothing
        to move costs one script call that finds the old keys empty."""
        moved, todo = 0, list(shards)
        while todo:
            calls: list[tuple[Script, list[str], list[Any]]] = []
            for shard in todo:
                old, k = self.legacy_keys(shard), self.keys(shard)
                keys = [old.due, old.inflight, old.records, k.due, k.inflight, k.claimed, k.low,
                        k.pending]  # fmt: skip
                calls.append((self._upgrade, keys, [batch]))
            replies = self._run(calls)
            moved += sum(int(n) for n, _ in replies)
            todo = [s for s, (_, left) in zip(todo, replies, strict=True) if int(left)]
        return moved

    def bind(
        self, topic_ids: Mapping[Shard, str], force: Sequence[Shard] = ()
    ) -> dict[Shard, Bound]:
        """Bind each shard to its topic's current incarnation (Kafka's topic id).

        A shard bound to another topic id — its topic was deleted and created again — or named in
        ``force`` (its offsets went back) has its records moved to a retired shard, which the
        mover drains, and starts empty, to be read from the beginning of the log.
        """
        shards = list(topic_ids)
        labels = {s: uuid.uuid4().hex[:12] for s in shards}
        calls: list[tuple[Script, list[str], list[Any]]] = []
        for shard in shards:
            k, old = self.keys(shard), self.keys(Shard(shard.topic, shard.partition, labels[shard]))
            keys = [k.due, k.inflight, k.claimed, k.meta, k.low, k.pending, self.retired_set(shard),
                    old.due, old.inflight, old.claimed, k.ids]  # fmt: skip
            args = [topic_ids[shard], labels[shard], "1" if shard in force else "0"]
            calls.append((self._incarnation, keys, args))
        out = {}
        for shard, reply in zip(shards, self._run(calls) if calls else [], strict=True):
            stored = _text(reply[1])
            if int(reply[0]) == 0:
                out[shard] = Bound(False, stored)
                continue
            moved, mark = int(reply[2]), int(reply[3])
            retired = Shard(shard.topic, shard.partition, labels[shard]) if moved else None
            out[shard] = Bound(True, stored, moved, None if mark < 0 else mark, retired)
        return out

    def retired(self, shards: Sequence[Shard]) -> set[Shard]:
        """The retired incarnations of ``shards`` that still hold records."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.smembers(self.retired_set(shard))
            replies = pipe.execute()
        return {Shard(s.topic, s.partition, _text(label))
                for s, labels in zip(shards, replies, strict=True) for label in labels}  # fmt: skip

    def forget_retired(self, shard: Shard) -> bool:
        """Drop a retired incarnation with nothing left in it; returns whether it was dropped."""
        k = self.keys(shard)
        keys = [self.retired_set(shard), k.due, k.inflight, k.claimed]
        return bool(int(self._run([(self._retired, keys, [shard.incarnation])])[0]))

    def lows(self, expected: Mapping[Shard, int | None], max_buckets: int = 64) -> Lows:
        """The offset to commit for each shard: its lowest pending offset, else watermark + 1.

        A shard Redis holds nothing for is left out, unless the caller expected a watermark for
        it: then, like a watermark below the expected one, it is reported in :attr:`Lows.lost`.
        Records still in the earlier layout are moved first, so they hold the low offset down.
        """
        shards = list(expected)
        self.upgrade(shards)
        calls: list[tuple[Script, list[str], list[Any]]] = []
        for shard in shards:
            k = self.keys(shard)
            args = [_expected(expected[shard]), max_buckets]
            calls.append((self._low, [k.meta, k.low, k.pending], args))
        offsets, lost = {}, {}
        for shard, (status, mark, low) in zip(
            shards, self._run(calls) if calls else [], strict=True
        ):
            loss = _lost(int(status), int(mark))
            if loss is None:
                offsets[shard] = offset_of(low) if low else int(mark) + 1
            elif loss.watermark is not None or expected[shard] is not None:
                lost[shard] = loss
        return Lows(offsets, lost)

    def claim(
        self,
        shards: Sequence[Shard],
        limit: int,
        lease_ms: int,
        now_ms: int | None = None,
        horizons: Mapping[Shard, int] | None = None,
        *,
        ahead_ms: int = 0,
        acks: Mapping[Shard, Sequence[bytes]] | None = None,
        ids: Mapping[Shard, Sequence[tuple[str, bytes]]] | None = None,
    ) -> Claims:
        """Lease up to ``limit`` due records from each shard: expired leases first, then on-time
        and overdue records sharing the rest (see claim.lua); from a shard in ``horizons`` only
        records due by its horizon (see bridge.catchup). The reply also says when each shard
        next has work, so the mover plans its sleep without another call. ``acks`` (and ``ids``)
        of a shard claimed from are applied first in the same call, as :meth:`ack` would. With
        ``ahead_ms``, records with the default delay-id due within that much of now are leased too
        (room permitting): the caller produces them when they fall due."""
        if not shards:
            now = self.time_ms() if now_ms is None else now_ms
            return Claims([], now, {}, time.monotonic(), now)
        now_arg = "" if now_ms is None else str(now_ms)
        horizons = horizons or {}
        calls = []
        for shard in shards:
            k = self.keys(shard)
            horizon = horizons.get(shard)
            args = [limit, lease_ms, now_arg, ON_TIME_WINDOW_MS,
                    "" if horizon is None else horizon, ahead_ms,
                    *_ack_args(shard, acks or {}, ids or {})]  # fmt: skip
            keys = [k.due, k.inflight, k.claimed, k.low, k.pending, k.ids]
            calls.append((self._claim, keys, args))
        out: list[Claimed] = []
        next_ms: dict[Shard, int | None] = {}
        replies = self._run(calls)
        received = time.monotonic()  # before decoding: each record decoded would lag the clock
        for shard, reply in zip(shards, replies, strict=True):
            redelivered = int(reply[1])
            times = [int(t) for t in reply[2:4] if int(t) >= 0]
            next_ms[shard] = min(times) if times else None
            for i, item in enumerate(reply[5:]):
                record = decode(item[8:], shard.topic, shard.partition, offset_of(item))
                out.append(Claimed(shard, item[:8], record, i < redelivered))
        # The last script ran last (one Redis; on a Cluster, one master's clock, as now_ms is).
        return Claims(out, int(replies[0][0]), next_ms, received, int(replies[-1][4]))

    def ack(
        self,
        members: Mapping[Shard, Sequence[bytes]],
        ids: Mapping[Shard, Sequence[tuple[str, bytes]]] | None = None,
    ) -> int:
        """Remove records Kafka acknowledged; ``ids`` names those of them with a caller-given
        delay-id (delay-id, member), which leave the id index too. Returns how many were still
        there."""
        calls: list[tuple[Script, list[str], list[Any]]] = []
        for shard, batch in members.items():
            if batch:
                k = self.keys(shard)
                keys = [k.inflight, k.claimed, k.low, k.pending, k.ids]
                calls.append((self._ack, keys, _ack_args(shard, members, ids or {})))
        return sum(int(n) for n in self._run(calls)) if calls else 0

    def release(self, members: Mapping[Shard, Sequence[bytes]], retry_in_ms: int = 0) -> int:
        """End the leases of unacknowledged records so they are claimable at once, or after
        ``retry_in_ms`` (a back-off)."""
        calls: list[tuple[Script, list[str], list[Any]]] = [
            (self._release, [self.keys(s).inflight], [retry_in_ms, *m])
            for s, m in members.items()
            if m
        ]
        return sum(int(n) for n in self._run(calls)) if calls else 0

    def unclaim(self, claimed: Iterable[Claimed]) -> int:
        """Put claimed records back among the waiting ones, as if never claimed: a cancel or a
        replacement reaches them again (see unclaim.lua). Returns how many were put back."""
        args: dict[Shard, list[Any]] = {}
        for c in claimed:
            args.setdefault(c.shard, []).extend((c.record.due_ms, c.member))
        calls: list[tuple[Script, list[str], list[Any]]] = []
        for shard, pairs in args.items():
            keys = self.keys(shard)
            calls.append((self._unclaim, [keys.due, keys.inflight, keys.claimed], pairs))
        return sum(int(n) for n in self._run(calls)) if calls else 0

    def take_over(self, held: Mapping[Shard, Sequence[bytes]]) -> int:
        """End the leases in each shard except the ``held`` offsets (the caller's own in-flight
        records), so the new owner of a partition redelivers what its earlier owner left at once
        (see take_over.lua). Returns how many leases ended."""
        calls: list[tuple[Script, list[str], list[Any]]] = [
            (self._take_over, [self.keys(s).inflight], list(offsets)) for s, offsets in held.items()
        ]
        return sum(int(n) for n in self._run(calls)) if calls else 0

    def is_pending(self, shard: Shard, offset: int) -> bool:
        """Whether the record at ``offset`` is still held (due later, overdue or in flight)."""
        key = offset_bytes(offset)
        with as_store_error():
            bitmap = cast(bytes | None, self.client.hget(self.keys(shard).pending, key[:7]))  # type: ignore[arg-type]
        return bitmap is not None and bool(bitmap[key[7] // 8] & 1 << key[7] % 8)

    def watermarks(self, shards: Sequence[Shard]) -> dict[Shard, int]:
        """The ingest watermark of each shard that has one."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hget(self.keys(shard).meta, "ingested")
            values = pipe.execute()
        return {s: int(v) for s, v in zip(shards, values, strict=True) if v is not None}

    def stored_shards(self, topic: str) -> list[Shard]:
        """The live shards of ``topic`` that Redis holds state for, by partition: what the
        operator commands read when Kafka cannot say which partitions the topic has."""
        pattern = f"{_tag(_glob(self.prefix), _glob(topic), '*')}:meta"
        with as_store_error():
            names = [_text(k) for k in self.client.scan_iter(match=pattern, count=1000)]
        head = _tag(self.prefix, topic, "")
        partitions = {n[len(head) : n.index("}", len(head))] for n in names if n.startswith(head)}
        return [Shard(topic, p) for p in sorted(int(p) for p in partitions if p.isdigit())]

    def eviction_policy(self) -> str | None:
        """Redis's ``maxmemory-policy`` (None if it names none); raises :class:`StoreError`
        when it cannot be read (CONFIG is often denied on managed Redis)."""
        with as_store_error():
            reply = cast(dict[str, str], self.client.config_get("maxmemory-policy"))
        return reply.get("maxmemory-policy")

    def time_ms(self) -> int:
        """Redis's clock."""
        with as_store_error():
            seconds, micros = cast(tuple[int, int], self.client.time())
        return seconds * 1000 + micros // 1000

    def backlog(
        self, shards: Sequence[Shard], now_ms: int | None = None, due_by_ms: int | None = None
    ) -> Backlog:
        """Scheduled, overdue and in-flight counts and the oldest overdue due time, summed; with
        ``due_by_ms`` (``EgressConfig.due_by_ms``), a record in flight counts in the oldest from
        its lease deadline minus that, a time by which it was due (stats.lua)."""
        if not shards:
            return Backlog(self.time_ms() if now_ms is None else now_ms, 0, 0, 0, None)
        args = ["" if now_ms is None else str(now_ms), "" if due_by_ms is None else str(due_by_ms)]
        calls: list[tuple[Script, list[str], list[Any]]] = [
            (self._stats, [self.keys(s).due, self.keys(s).inflight], args) for s in shards
        ]
        replies = [[int(v) for v in reply] for reply in self._run(calls)]
        oldest = [r[4] for r in replies if r[4] >= 0]
        return Backlog(
            now_ms=replies[0][0],
            scheduled=sum(r[1] for r in replies),
            overdue=sum(r[2] for r in replies),
            inflight=sum(r[3] for r in replies),
            oldest_due_ms=min(oldest) if oldest else None,
        )
