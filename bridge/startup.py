"""Start-up checks of settings that could lose a record or keep a lost Redis from being rebuilt.

A delay topic's retention can delete a record before it is due; Redis eviction can drop scheduled
records unnoticed. ``admin`` is the admin client's settings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaException

from bridge.config import Config
from bridge.dialects import ETF1
from bridge.errors import ConfigError, StoreError
from bridge.health import Probes
from bridge.store import Store
from bridge.topics import check_retention, read_retention

logger = logging.getLogger(__name__)


def _retention_args(
    config: Config, admin: Mapping[str, Any]
) -> tuple[Mapping[str, Any], tuple[str, ...], int]:
    return admin, config.topics.delay, config.limits.max_delay


def _key_is_id(config: Config) -> set[str]:
    return {t for t, d in config.topics.dialect.items() if d == ETF1}


def check_references_retention(config: Config, admin: Mapping[str, Any]) -> None:
    """With store.references on, a far-future record lives only in its delay topic until it is
    read back: a retention that can delete it first stops start-up (raises ConfigError)."""
    if not config.store.references:
        return
    try:
        problems = read_retention(*_retention_args(config, admin), key_is_id=_key_is_id(config))
    except (KafkaException, TimeoutError) as exc:
        logger.warning(
            "could not read the delay topics' retention (%s); with "
            "store.references on it must cover limits.max_delay",
            exc,
        )
        return
    if problems:
        raise ConfigError(
            f"store.references is on, so the delay topics must keep every record until it is "
            f"due (or set store.references: false): {problems[0]}"
        )


def check_rebuildable(store: Store, config: Config, admin: Mapping[str, Any]) -> None:
    """Warn loudly about settings that would keep a lost Redis from being rebuilt, on a thread
    of its own: these only warn, so start-up does not wait for them."""
    threading.Thread(
        target=_rebuildable, args=(store, config, admin), name="checks", daemon=True
    ).start()


def _rebuildable(store: Store, config: Config, admin: Mapping[str, Any]) -> None:
    try:
        policy = store.eviction_policy()
    except StoreError as exc:
        logger.warning(
            "could not check that Redis does not evict (%s): make sure its "
            "maxmemory-policy is noeviction",
            exc,
        )
        policy = None
    if policy is not None and policy != "noeviction":
        logger.warning(
            "REDIS MAY EVICT SCHEDULED RECORDS: maxmemory-policy is %s; set noeviction "
            "(an evicted record set cannot be noticed or rebuilt)",
            policy,
        )
    if not config.store.references:  # else checked before joining (check_references_retention)
        check_retention(*_retention_args(config, admin), key_is_id=_key_is_id(config))


def start_up(
    wait_for_redis: Callable[[], bool],
    config: Config,
    admin: Mapping[str, Any],
    probes: Probes,
    *,
    warm: Callable[[], None] = lambda: None,
) -> bool:
    """What start-up asks Kafka before the consumer joins — the delay topics' retention and the
    first description of the topics (each up to 10 s when Kafka does not answer), and ``warm``
    (the journal reader connecting) — beside the wait for Redis; returns what that wait returned
    (False: stopped while waiting). Raises ConfigError for a retention that can delete waiting
    records."""
    with ThreadPoolExecutor(3, thread_name_prefix="start-up") as pool:
        asked = [
            pool.submit(check_references_retention, config, admin),
            pool.submit(probes.topics_once),
            pool.submit(warm),
        ]
        if not wait_for_redis():
            return False
        for question in asked:
            question.result()
    return True
