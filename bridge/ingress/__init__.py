"""Ingress: the delay topics consumed, valid records stored in Redis, the rest dead-lettered."""

from bridge.ingress.consumer import Ingress
from bridge.ingress.restarts import closing_aside
from bridge.ingress.settled import Settled
from bridge.ingress.unowned import Unowned, describe_group

__all__ = ["Ingress", "Settled", "Unowned", "closing_aside", "describe_group"]
