"""Delay partitions a stable consumer group leaves to no member, and the member that rejoins.

Under cooperative-sticky assignment Kafka's classic group protocol moves a partition in two
rebalances: in the first its owner gives it up, and the owner's rejoin starts the second, which
assigns it on. A static member (``kafka.group_instance_id``) that stops or crashes between the two
is replaced by its next process without a rebalance — Kafka hands a static member rejoining a
stable group its last assignment — so the partition it gave up belongs to nobody until the group
next rebalances, which may be never: its records wait in Kafka, unread. (Seen in ``make test``'s
rebalance storm: a SIGTERM landing between the two steps left a partition unowned for good.)

Every replica describes its group on each probe round. Once the group has been stable with a delay
partition owned by no member for UNOWNED_S, the member owning the fewest partitions (the lowest
member id among equals) leaves the group and joins it again: a member leaving starts a rebalance,
which assigns every partition. UNOWNED_S outlasts what a live member takes between the two steps
(its revoked partitions' records in flight are waited for up to 5 s) and a delay topic's new
partitions waiting for the consumers' metadata refresh (10 s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from bridge.store import Shard, shard_names

logger = logging.getLogger(__name__)

UNOWNED_S = 15.0  # a partition of a stable group owned by nobody this long is rejoined for
REJOIN_EVERY_S = 30.0  # a replica asks for a rejoin at most this often
DESCRIBE_TIMEOUT_S = 2.0  # within a probe round


@dataclass(frozen=True)
class Group:
    """A consumer group as Kafka described it."""

    stable: bool
    members: Mapping[str, frozenset[Shard]]  # member id -> the partitions assigned to it

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
        """The member owning the fewest partitions, the lowest member id among equals: the one
        whose rejoin costs the least."""
        return min(self.members, key=lambda m: (len(self.members[m]), m))


def describe_group(admin: AdminClient, group_id: str) -> Group | None:
    """The group as Kafka describes it, or None if Kafka did not answer."""
    try:
        futures = admin.describe_consumer_groups([group_id], request_timeout=DESCRIBE_TIMEOUT_S)
        description = futures[group_id].result(timeout=DESCRIBE_TIMEOUT_S + 1)
    except (KafkaException, TimeoutError) as exc:
        logger.debug("could not describe consumer group %s: %s", group_id, exc)
        return None
    return Group(
        stable=description.state == ConsumerGroupState.STABLE,
        members={
            m.member_id: frozenset(
                Shard(tp.topic, tp.partition) for tp in m.assignment.topic_partitions
            )
            for m in description.members
        },
    )


class Unowned:
    """Watches the group for delay partitions no member owns (see the module's text)."""

    def __init__(
        self,
        describe: Callable[[], Group | None],
        partitions: Callable[[], Mapping[str, int]],
        rejoin: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
        unowned_s: float = UNOWNED_S,
    ) -> None:
        self._describe = describe
        self._partitions = partitions  # delay topic -> partition count, as Kafka last said
        self._rejoin = rejoin  # (member id, why): that member leaves and joins again
        self._clock = clock
        self.unowned_s = unowned_s
        self._since: dict[Shard, float] = {}  # unowned in a stable group since (monotonic)
        self._next_rejoin = 0.0

    def check(self) -> None:
        """Describe the group once; ask its least-loaded member to rejoin if it is due."""
        group = self._describe()
        if group is None:
            return  # no answer: what was seen so far stands
        if not group.stable or not group.members:
            self._since.clear()  # rebalancing: it assigns what it can
            return
        now = self._clock()
        unowned = group.unowned(self._partitions())
        self._since = {s: self._since.get(s, now) for s in unowned}
        if not unowned or now < self._next_rejoin:
            return
        waited = now - min(self._since.values())
        if waited < self.unowned_s:
            return
        member = group.least_loaded()
        why = (
            f"{shard_names(unowned)} owned by no member of the stable consumer group for "
            f"{waited:.0f}s (a member stopped between the two rebalances that move a partition); "
            f"member {member}, which owns the fewest partitions, leaves the group and joins it "
            "again so that they are assigned"
        )
        logger.warning("%s", why)
        self._next_rejoin = now + REJOIN_EVERY_S
        self._since.clear()
        self._rejoin(member, why)
