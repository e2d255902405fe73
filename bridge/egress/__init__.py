"""Egress: due records claimed from Redis, produced to their targets, acknowledged on delivery."""

from bridge.egress.failures import InFlight
from bridge.egress.mover import Egress
from bridge.egress.outlet import Transactions, shard_transactions
from bridge.egress.owned import OwnedWatch

__all__ = ["Egress", "InFlight", "OwnedWatch", "Transactions", "shard_transactions"]
