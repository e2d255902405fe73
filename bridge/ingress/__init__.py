"""Ingress: the delay topics consumed, valid records stored in Redis, the rest dead-lettered."""

from bridge.ingress.consumer import Ingress
from bridge.ingress.restarts import closing_aside
from bridge.ingress.settled import Settled
from bridge.ingress.unowned import ReplicaView, Unowned, replica_id

__all__ = ["Ingress", "ReplicaView", "Settled", "Unowned", "closing_aside", "replica_id"]
