"""The local services the benches run on: Kafka and Redis as scripts/services runs them, and a
store under a prefix of its own, dropped after, for the store-only benches.

``DELAY_BRIDGE_REDIS__URL`` names the Redis, else scripts/services' port (16379).
"""

from __future__ import annotations

import os
import uuid

import redis

from bridge.store import Store
from testbed.servers import Servers

RECOVERY_RATE = 2000.0  # records/s: the steady load the recovery figures are measured under


def local_servers() -> Servers:
    """The services ``scripts/services`` runs by default (its env overrides apply)."""
    return Servers.local()


def local_redis() -> redis.Redis:
    """A client of the local Redis."""
    return redis.Redis.from_url(
        os.environ.get("DELAY_BRIDGE_REDIS__URL", "redis://127.0.0.1:16379/0")
    )


def local_store(name: str) -> Store:
    """A store on the local Redis under the unique prefix ``bench-<name>-<8 hex digits>``."""
    return Store(local_redis(), f"bench-{name}-{uuid.uuid4().hex[:8]}")


def drop(store: Store) -> None:
    """Delete every key of ``store``'s prefix and close its client."""
    try:
        for key in store.client.scan_iter(match=f"{store.prefix}:*", count=1000):
            store.client.unlink(key)
    finally:
        store.client.close()
