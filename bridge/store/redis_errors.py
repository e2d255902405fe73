"""Redis failures leave the store as a StoreError whose message says what the failure means."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import redis

from bridge.errors import StoreError, WriteRefused

# A command a script calls that the ACL user lacks: Redis's words for it (no NOPERM code).
_SCRIPT_REFUSED = "user executing the script can't run this command"


def describe_redis_error(exc: redis.RedisError) -> str:
    """One line naming what Redis's failure means, so an operator need not decode it: a read-only
    replica, a missing ACL permission or a full memory are not outages."""
    text = " ".join(str(exc).split())
    if isinstance(exc, redis.exceptions.ReadOnlyError) or "READONLY" in text:
        return (
            f"redis is read-only (READONLY): the bridge talks to a replica, not the master "
            f"(after a failover?): {text}"
        )
    if (
        isinstance(exc, redis.exceptions.NoPermissionError)
        or "NOPERM" in text
        or _SCRIPT_REFUSED in text
    ):
        return f"redis refused permission (NOPERM): the ACL user lacks a command or key: {text}"
    if isinstance(exc, redis.exceptions.AuthenticationError) or "WRONGPASS" in text:
        return f"redis refused the credentials (check redis.url and redis.password): {text}"
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM"):
        return f"redis is out of memory (OOM): it refuses writes at maxmemory: {text}"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return f"redis is loading its data set: {text}"
    if isinstance(exc, redis.exceptions.ClusterDownError) or text.startswith("CLUSTERDOWN"):
        return (
            f"redis cluster is down (CLUSTERDOWN): a slot has no reachable master until "
            f"a replica takes over or the master returns: {text}"
        )
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return f"redis unreachable: {text}"
    return f"redis: {text}"


@contextlib.contextmanager
def as_store_error() -> Iterator[None]:
    """Redis failures leave the store as :class:`StoreError`, the one error callers handle."""
    try:
        yield
    except redis.RedisError as exc:
        text = str(exc)
        refused = isinstance(
            exc, redis.exceptions.OutOfMemoryError | redis.exceptions.ReadOnlyError
        )
        if refused or "OOM command not allowed" in text or "READONLY" in text:
            raise WriteRefused(describe_redis_error(exc)) from exc
        raise StoreError(describe_redis_error(exc)) from exc
    except redis.exceptions.RedisClusterException as exc:
        # redis-py's cluster client's own errors (a slot no node serves, no node answers while it
        # learns the slot map) are not RedisError, yet are as passing as a lost connection.
        raise StoreError(f"redis cluster has no master for every slot: {exc}") from exc
    except (OSError, ValueError) as exc:
        # redis-py's cluster client may close a connection another thread is reading while it
        # learns a new slot map after a failover; that call failed, the next one goes through.
        raise StoreError(f"redis connection closed under the call: {exc!r}") from exc
    except AttributeError as exc:
        # The same race inside redis-py's hiredis parser: the closing thread drops the parser's
        # reader, the reading one then reads through None (redis-py #4003). Not ours: re-raised.
        if not _raised_in_redis_client(exc):
            raise
        raise StoreError(f"redis connection closed under the call: {exc!r}") from exc


_REDIS_CLIENT_DIR = os.path.dirname(redis.__file__) + os.sep


def _raised_in_redis_client(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside redis-py's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_REDIS_CLIENT_DIR)
