"""Ingress: the delay topics consumed, valid records stored in Redis, the rest dead-lettered."""

from bridge.ingress.adds import TopicReads
from bridge.ingress.consumer import Ingress
from bridge.ingress.dead_letter import DeadLetters
from bridge.ingress.membership import Owner, TopicFacts
from bridge.ingress.restarts import closing_aside
from bridge.ingress.settled import Settled
from bridge.ingress.unowned import ReplicaView, Unowned, replica_id

__all__ = [
    "DeadLetters",
    "Ingress",
    "Owner",
    "ReplicaView",
    "Settled",
    "TopicFacts",
    "TopicReads",
    "Unowned",
    "closing_aside",
    "replica_id",
]
