"""Egress: due records claimed from Redis, produced to their targets, acknowledged on delivery."""

from bridge.egress.failures import InFlight
from bridge.egress.mover import Egress

__all__ = ["Egress", "InFlight"]
