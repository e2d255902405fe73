"""Delay partitions a stable consumer group leaves to no member, and the member that rejoins.

Under cooperative-sticky assignment Kafka's classic group protocol moves a partition in two
rebalances: in the first its owner gives it up, and the owner's rejoin starts the second, which
assigns it on. A static member (``kafka.group_instance_id``) that stops or crashes between the two
is replaced by its next process without a rebalance — Kafka hands a static member rejoining a
stable group its last assignment — so the partition it gave up belongs to nobody until the group
next rebalances, which may be never: its records wait in Kafka, unread. (Seen in ``make test``'s
rebalance storm: a SIGTERM landing between the two steps left a partition unowned for good.)

Each replica says in Redis, on each probe round, whether its consumer is in its group and what it
owns (bridge.store.replicas), and reads what the others said. Once every replica has said it is in
the group and a delay partition has been owned by none of them for UNOWNED_S, the replica owning
the fewest partitions (the lowest id among equals) leaves the group and joins it again: a member
leaving starts a rebalance, which assigns every partition. UNOWNED_S outlasts what a live member
takes between the two steps (its revoked partitions' records in flight are waited for up to 5 s)
and a delay topic's new partitions waiting for the consumers' metadata refresh (10 s). A replica's
last word stands for a group session, as Kafka keeps a member that long: a member named in the
config that stops says what it owned as it closed (Kafka keeps those partitions its own), one that
leaves the group as it stops (named by the bridge, or dynamic) that it owns nothing, and one
killed what it said last. The replicas' words are kept per consumer group
(bridge.store.replicas): deployments sharing a Redis prefix do not read each other's. Kafka's
own description of the group is not asked for: librdkafka's admin client can abort the process
when a broker goes away in the middle of a DescribeConsumerGroups (confluentinc/librdkafka#4605;
two of three brokers killed, in make test).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from bridge.errors import StoreError
from bridge.store import Replicas, Shard, shard_names

logger = logging.getLogger(__name__)

UNOWNED_S = 15.0  # a partition of a stable group owned by nobody this long is rejoined for
REJOIN_EVERY_S = 30.0  # a replica asks for a rejoin at most this often


@dataclass(frozen=True)
class Group:
    """The consumer group as its replicas said it."""

    stable: bool  # every replica's consumer is in the group
    members: Mapping[str, frozenset[Shard]]  # replica id -> the partitions assigned to it

    def unowned(self, partitions: Mapping[str, int]) -> set[Shard]:
        """The partitions of these topics (topic -> partition count) assigned to no member."""
        owned = frozenset().union(*self.members.values())
        return {
            Shard(topic, p)
            for topic, count in partitions.items()
            for p in range(count)
            if Shard(topic, p) not in owned
        }

    def least_loaded(self) -> str:
        """The member owning the fewest partitions, the lowest id among equals: the one whose
        rejoin costs the least."""
        return min(self.members, key=lambda m: (len(self.members[m]), m))


def replica_id() -> str:
    """This process's id among the replicas: its host (the pod's name) and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ReplicaView:
    """The group as the replicas say it in Redis (bridge.store.replicas); this replica says its
    part first."""

    def __init__(
        self,
        replicas: Replicas,
        me: str,
        joined: Callable[[], bool],
        owned: Callable[[], Collection[Shard]],
        alive_ms: int,
    ) -> None:
        self.replicas = replicas
        self.me = me
        self._joined = joined  # whether this replica's consumer is in its group
        self._owned = owned  # the delay partitions assigned to it
        self.alive_ms = alive_ms  # a replica silent longer than this is gone (a group session)

    def __call__(self) -> Group | None:
        """The group now, or None if Redis did not answer."""
        try:
            self.replicas.say(self.me, self._joined(), self._owned())
            alive = self.replicas.alive(self.alive_ms)
        except StoreError as exc:
            logger.debug("the replicas' partitions not read: %s", exc)
            return None
        return Group(
            stable=all(r.joined for r in alive.values()),
            members={m: r.owned for m, r in alive.items()},
        )

    def last_word(self, owned: Collection[Shard]) -> None:
        """This replica stops, still owning ``owned`` in Kafka's eyes: a member named in the
        config keeps its partitions for a group session, or until its next process takes them,
        and its word stands as long; with nothing owned (the member left the group) it is taken
        out."""
        try:
            if owned:
                self.replicas.say(self.me, True, owned)
            else:
                self.replicas.forget(self.me)
        except StoreError as exc:
            logger.debug("could not say in Redis what this replica leaves: %s", exc)


class Unowned:
    """Watches the group for delay partitions no member owns (see the module's text)."""

    def __init__(
        self,
        view: Callable[[], Group | None],
        partitions: Callable[[], Mapping[str, int]],
        rejoin: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
        unowned_s: float = UNOWNED_S,
    ) -> None:
        self._view = view  # the group now (None: not known)
        self._partitions = partitions  # delay topic -> partition count, as Kafka last said
        self._rejoin = rejoin  # (member, why): that member leaves the group and joins again
        self._clock = clock
        self.unowned_s = unowned_s
        self._since: dict[Shard, float] = {}  # unowned in a stable group since (monotonic)
        self._next_rejoin = 0.0
        # What the last rejoin was for: unowned again after it, they are assigned to a member
        # that says nothing in Redis (alive in Kafka: the sticky assignor keeps them there), and
        # another rejoin would change nothing. Only partitions not among them ask again.
        self._tried: frozenset[Shard] = frozenset()
        self._told = False  # that a rejoin for them changed nothing

    def check(self) -> None:
        """Look at the group once; have its least-loaded member rejoin if it is due."""
        group = self._view()
        if group is None:
            return  # no answer: what was seen so far stands
        if not group.stable or not group.members:
            self._since.clear()  # a member joining or rejoining: the rebalance assigns
            return
        now = self._clock()
        unowned = group.unowned(self._partitions())
        self._since = {s: self._since.get(s, now) for s in unowned}
        if not unowned or now < self._next_rejoin:
            return
        if unowned <= self._tried:
            if not self._told:
                self._told = True
                logger.warning(
                    "%s still owned by no replica that says so in Redis after a rejoin: their "
                    "owner is in the group but cannot write to Redis; no rejoin would move them",
                    shard_names(unowned),
                )
            return
        waited = now - min(self._since[s] for s in unowned - self._tried)
        if waited < self.unowned_s:
            return
        member = group.least_loaded()
        why = (
            f"{shard_names(unowned)} owned by no member of the consumer group for {waited:.0f}s "
            "(a member stopped between the two rebalances that move a partition); replica "
            f"{member}, which owns the fewest partitions, leaves the group and joins it again so "
            "that they are assigned"
        )
        logger.warning("%s", why)
        self._next_rejoin = now + REJOIN_EVERY_S
        self._since.clear()
        self._tried, self._told = frozenset(unowned), False
        self._rejoin(member, why)
