"""Egress: due records claimed from Redis, produced to their targets, acknowledged on delivery."""

from bridge.egress.mover import Egress
from bridge.egress.settle import InFlight

__all__ = ["Egress", "InFlight"]
