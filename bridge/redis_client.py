"""The one place a Redis client is made, whichever Redis mode the config names.

Standalone (``redis://``, ``rediss://``, ``unix://``), through Redis Sentinel, or Redis Cluster,
with or without TLS. The rest of the bridge does not
know which (the store splits its script calls per cluster master itself)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from bridge.config import Config, redact_url
from bridge.errors import StoreError


def redis_client(config: Config) -> redis.Redis:
    """A Redis client for the configured Redis (password from config or file if given).

    With ``redis.sentinel.nodes`` the client asks the sentinels for the master, and asks again
    when the master it talks to turns into a replica (a READONLY reply) or goes away: after a
    failover the next call reaches the new master.
    """
    r = config.redis
    timeout = r.socket_timeout / 1000
    # No call is sent again by the client on its own (redis-py retries a timed-out or broken
    # call 3 times by default): a script call that got no answer may have run, and only the
    # bridge knows what that means (a claim's records leased with no reply: the mover ends those
    # leases once Redis answers, bridge.egress.takeover).
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    password = config.redis_password()
    if password:
        kwargs["password"] = password
    url = r.url
    files = (
        ("ssl_ca_certs", r.tls.ca_file),
        ("ssl_certfile", r.tls.cert_file),
        ("ssl_keyfile", r.tls.key_file),
    )
    tls = {key: path for key, path in files if path}
    parts = urlsplit(url)
    if tls and parts.scheme == "redis":
        url = urlunsplit(parts._replace(scheme="rediss"))
    if r.cluster:
        try:
            cluster: redis.Redis = RedisCluster.from_url(url, **kwargs, **tls)  # type: ignore[no-untyped-call]
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            # The cluster client learns the slot map as it is made: no node, no client.
            raise StoreError(
                f"redis cluster at {redact_url(r.url)} gave no slot map at start-up "
                f"(redis.url must name a reachable node): {exc}"
            ) from exc
        return cluster
    if not r.sentinel.nodes:
        return redis.Redis.from_url(url, **kwargs, **tls)
    if parts.username:
        kwargs["username"] = parts.username
    if parts.password and not password:
        kwargs["password"] = parts.password
    if urlsplit(url).scheme == "rediss":
        kwargs.update(ssl=True, **tls)
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        **({"ssl": True, **tls} if "ssl" in kwargs else {}),
    }
    sentinel_password = config.sentinel_password()
    if sentinel_password:
        sentinel_kwargs["password"] = sentinel_password
    nodes = [(host, int(port)) for host, _, port in (n.rpartition(":") for n in r.sentinel.nodes)]
    sentinel = Sentinel(nodes, sentinel_kwargs=sentinel_kwargs, **kwargs)  # type: ignore[no-untyped-call]
    db = int(parts.path.lstrip("/") or 0) if parts.scheme != "unix" else 0
    master: redis.Redis = sentinel.master_for(r.sentinel.master, db=db)  # type: ignore[no-untyped-call]
    return master
