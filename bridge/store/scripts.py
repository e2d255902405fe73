"""The Lua scripts: each one typed call, loaded once, run in one pipeline, routed by slot.

Each script is a :class:`Script` of the table below — its KEYS named once in the script's order,
its reply read by :mod:`bridge.store.calls` into a named type — and :meth:`Scripts.call` runs
it: EVALSHA in one round trip, on Redis Cluster one pipeline per master."""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import Any, Generic, TypeVar, cast

import redis
from redis.cluster import RedisCluster

from bridge.store.calls import (
    BindReply,
    Candidates,
    ClaimReply,
    LowReply,
    StatsReply,
    Withdrew,
    add_outcome,
    count_of,
    stored_of,
)
from bridge.store.keys import LANE_WIDTH, ShardKeys, text
from bridge.store.redis_errors import as_store_error

# A script call whose slot moved (Redis Cluster failover) or is moving (resharding: TRYAGAIN while
# its keys are half moved) is sent again after a pause, doubling from the first to the last, for
# up to CLUSTER_WAIT_S; the other calls' replies stand meanwhile.
CLUSTER_PAUSES_S, CLUSTER_WAIT_S = (0.02, 0.5), 5.0


R = TypeVar("R")


class Script(Generic[R]):
    """One script: its KEYS in its order, by name — a field of the shard's :class:`ShardKeys`;
    ``old.<field>`` the same of another shard (a retired incarnation's); ``retired`` the SET of
    retired incarnations — and how its reply is read. ``declares``: the wait indexes the shard's
    waits SET lists follow its own keys (see undeclared in _lib.lua)."""

    def __init__(
        self, name: str, keys: str, read: Callable[[Any], R], *, declares: bool = False
    ) -> None:
        self.name = name
        self.names = tuple(keys.split())
        self.read = read
        self.declares = declares

    def keys(
        self,
        k: ShardKeys,
        *,
        old: ShardKeys | None = None,
        retired: str = "",
        first: str | None = None,
    ) -> list[str]:
        """The call's KEYS for the shard ``k`` (``first``: another key in the first place, the
        wait index claim.lua and unclaim.lua take instead of the due index)."""
        out = [self._key(name, k, old, retired) for name in self.names]
        if first is not None:
            out[0] = first
        return out

    @staticmethod
    def _key(name: str, k: ShardKeys, old: ShardKeys | None, retired: str) -> str:
        if name == "retired":
            return retired
        if name.startswith("old."):
            assert old is not None, name
            return str(getattr(old, name[4:]))
        return str(getattr(k, name))


ADD = Script(
    "add",
    "due meta low pending ids inflight refs refs_due waits targets schedules claimed withdrawing",
    add_outcome,
    declares=True,
)
CLAIM = Script("claim", "due inflight claimed low pending ids meta waits targets", ClaimReply.read)
ACK = Script("ack", "inflight claimed low pending ids meta targets", count_of)
RELEASE = Script("release", "inflight", count_of)
TAKE_OVER = Script("take_over", "inflight", count_of)
UNCLAIM = Script("unclaim", "due inflight claimed waits", count_of)
SETTLE = Script(
    "settle", "claimed due ids low pending inflight refs waits targets", count_of, declares=True
)
STATS = Script("stats", "due inflight refs waits", StatsReply.read, declares=True)
LOW = Script("low", "meta low pending schedules withdrawing", LowReply.read)
CANDIDATES = Script("candidates", "ids pending schedules meta", Candidates.read)
PROMOTE = Script("promote", "due refs refs_due pending targets", stored_of)
WITHDRAW = Script(
    "withdraw",
    "due ids low pending inflight refs waits targets schedules",
    Withdrew.read,
    declares=True,
)
INCARNATION = Script(
    "incarnation",
    "due inflight claimed meta low pending retired old.due old.inflight old.claimed ids refs "
    "refs_due old.refs old.refs_due waits old.waits old.pending old.meta targets old.targets "
    "schedules withdrawing",
    BindReply.read,
    declares=True,
)
RETIRED = Script(
    "retired", "retired due inflight claimed refs refs_due waits pending meta targets", count_of
)
SCRIPTS: dict[str, Script[Any]] = {
    s.name: s
    for s in (
        ADD,
        CLAIM,
        ACK,
        RELEASE,
        TAKE_OVER,
        STATS,
        LOW,
        INCARNATION,
        RETIRED,
        UNCLAIM,
        PROMOTE,
        WITHDRAW,
        SETTLE,
        CANDIDATES,
    )
}

NAMES = tuple(SCRIPTS)

# One script call: the script's name, its keys, its arguments.
Call = tuple[str, list[str], list[Any]]
# Scripts that reach a shard's wait indexes through its waits SET declare them after their own
# keys (this many): Redis Cluster routes and migrates by declared keys. A call that left one out
# is answered {"undeclared", keys...} before it writes anything, and runs again with them.
OWN_KEYS = {s.name: len(s.names) for s in SCRIPTS.values() if s.declares}
UNDECLARED = b"undeclared"


def _undeclared(reply: Any) -> bool:
    return isinstance(reply, list) and bool(reply) and reply[0] == UNDECLARED


@functools.cache
def _lua(name: str) -> str:
    return resources.files("bridge.store").joinpath("lua", f"{name}.lua").read_text()


def _source(name: str) -> str:
    """A script as Redis runs it: Redis scripts cannot import, so the constants they share with
    Python and the shared helpers come first."""
    return f"local LANE = {LANE_WIDTH}\n" + _lua("_lib") + "\n" + _lua(name)


def script_names() -> dict[str, str]:
    """Each script's name by the SHA1 Redis knows it by (what EVALSHA in SLOWLOG shows)."""
    return {hashlib.sha1(_source(n).encode()).hexdigest(): n for n in NAMES}


class Scripts:
    """The store's scripts on one Redis (or Redis Cluster), each registered once."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scripts = {n: client.register_script(_source(n)) for n in NAMES}
        # The wait indexes each call declared last, by script and first key (its shard): the
        # SET lists the same targets call after call, so a call is run again only when it grew.
        self._declared: dict[tuple[str, str], list[str]] = {}
        # Calls sent again, after their connection broke (Redis Cluster, a master failing over)
        # or a NOSCRIPT reply to another: they may have run first, a claim leasing records whose
        # reply never came. The mover watches the count and ends such leases (bridge.egress).
        self.unanswered = 0

    def call(self, script: Script[R], calls: Sequence[tuple[list[str], list[Any]]]) -> list[R]:
        """Run ``script`` once per (KEYS, ARGV) of ``calls``, in one round trip: each reply read
        as the script's (see :meth:`_run`)."""
        if not calls:
            return []
        read = script.read
        return [read(r) for r in self._run([(script.name, k, a) for k, a in calls])]

    def _run(self, calls: Iterable[Call]) -> list[Any]:
        """Run script calls in one pipeline: EVALSHA only, one round trip. (A pipeline of
        registered scripts would first ask SCRIPT EXISTS, a second round trip every call.) A
        Redis that does not know a script (restarted, flushed, a replica just promoted: the
        script cache is a node's own) gets them all loaded, then the calls again: a repeated
        add, ack or release changes nothing, and records a repeated claim leased first are
        counted as :attr:`unanswered` (the mover ends their leases)."""
        calls = [self._declare(call) for call in calls]
        with as_store_error():
            try:
                replies = self._evalsha(calls)
            except redis.exceptions.NoScriptError:
                for script in self._scripts.values():  # on Redis Cluster: on every master
                    self.client.script_load(script.script)
                self.unanswered += len(calls)
                replies = self._evalsha(calls)
            for _ in range(3):  # a SET that grows between two calls: a target at a time
                again = [i for i, r in enumerate(replies) if _undeclared(r)]
                if not again:
                    return replies
                for i in again:
                    name, keys, args = calls[i]
                    waits = [text(k) for k in replies[i][1:]]
                    self._declared[name, keys[0]] = waits
                    calls[i] = (name, keys[: OWN_KEYS[name]] + waits, args)
                for i, reply in zip(again, self._evalsha([calls[i] for i in again]), strict=True):
                    replies[i] = reply
            raise redis.exceptions.ResponseError("the wait indexes kept changing under a call")

    def _declare(self, call: Call) -> Call:
        name, keys, args = call
        waits = self._declared.get((name, keys[0])) if name in OWN_KEYS else None
        return (name, keys + waits, args) if waits else call

    def _evalsha(self, calls: list[Call]) -> list[Any]:
        if isinstance(self.client, RedisCluster):
            return self._evalsha_cluster(calls)
        pipe = self.client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        replies: list[Any] = pipe.execute()
        return replies

    def _evalsha_cluster(self, calls: list[Call]) -> list[Any]:
        """Redis Cluster: the calls split by the master holding each shard's slot (every key of a
        shard shares its hash tag), one pipeline per master. Calls refused because a slot moved
        or is moving (MOVED, ASK, TRYAGAIN: a failover, a resharding) are sent again after a
        pause, with the slot map read again; the rest stand."""
        cluster = cast(RedisCluster, self.client)
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        deadline, pause = time.monotonic() + CLUSTER_WAIT_S, CLUSTER_PAUSES_S[0]
        while True:
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
                    name, keys, args = calls[i]
                    pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
                try:
                    results = pipe.execute(raise_on_error=False)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    moved += indexes  # the master is gone: its replica takes over its slots
                    self.unanswered += len(indexes)
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
            if time.monotonic() + pause > deadline:
                raise redis.exceptions.ConnectionError(
                    f"{len(moved)} script calls found no master to take them for their slot in "
                    f"{CLUSTER_WAIT_S:.0f}s (a failover or a slot migration not over)"
                )
            time.sleep(pause)
            pause = min(pause * 2, CLUSTER_PAUSES_S[1])
            cluster.nodes_manager.initialize()  # type: ignore[no-untyped-call]  # new slot map
            todo = moved
