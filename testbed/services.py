"""The real servers a test or benchmark runs on, and the waits and clean-ups around them.

The addresses come from DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS / DELAY_BRIDGE_REDIS__URL when set
(CI or a developer pointing at their own servers); otherwise scripts/services starts the local
ones. tests/conftest.py makes pytest fixtures of them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bridge.message import Cancel, Scheduled
from bridge.store import Confirm, Shard

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "scripts" / "services"


@dataclass(frozen=True)
class Services:
    """Where the real Kafka broker and Redis server for this session listen."""

    bootstrap: str
    redis_url: str


class Clock:
    """A monotonic clock the test moves (``clock.now += s``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key_values(text: str) -> dict[str, str]:
    """What ``scripts/services env`` and ``scripts/services info NAME`` print: one ``key=value``
    per line."""
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def _local_env() -> dict[str, str]:
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(
        [str(SERVICES), "env"], check=True, capture_output=True, text=True, env=env
    ).stdout
    return key_values(out)


def run_services(*args: str) -> str:
    """``scripts/services ARGS``; its stdout (a failure fails the test with its stderr)."""
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        [str(SERVICES), *args], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def started(name: str) -> dict[str, str]:
    """``scripts/services up NAME``, then what ``info NAME`` prints."""
    run_services("up", name)
    return key_values(run_services("info", name))


@dataclass
class TopicFactory:
    """Creates uniquely named topics for one test and deletes them afterwards."""

    admin: AdminClient
    suffix: str
    created: list[str] = field(default_factory=list)

    def __call__(self, base: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{base}-{self.suffix}"
        futures = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
        )
        futures[name].result(timeout=30)
        self.created.append(name)
        wait_for(lambda: _has_leaders(self.admin, name, partitions), 30, f"leaders for {name}")
        return name

    def recreate(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        """Delete ``name`` (if it exists) and create it again: a new incarnation (topic id) under
        the same name."""
        recreate_topic(self.admin, name, partitions, config)
        wait_for(lambda: _has_leaders(self.admin, name, partitions), 30, f"leaders for {name}")


def recreate_topic(
    admin: AdminClient, name: str, partitions: int, config: dict[str, str] | None = None
) -> None:
    """Delete topic ``name`` if it exists and create it again under the same name (a new topic
    id), retrying the creation while the deletion finishes in the background."""
    with contextlib.suppress(KafkaException):  # already gone
        admin.delete_topics([name])[name].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            new = NewTopic(
                name, num_partitions=partitions, replication_factor=1, config=config or {}
            )
            admin.create_topics([new])[name].result(timeout=30)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _has_leaders(admin: AdminClient, name: str, partitions: int) -> bool:
    topic = admin.list_topics(name, timeout=5).topics.get(name)
    if topic is None or topic.error is not None or len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())


def delete_keys(client: redis.Redis, marker: str) -> int:
    """Delete (UNLINK, so a big backlog does not block Redis) every key whose name holds
    ``marker``: what a test, chaos run or benchmark wrote under its unique prefix."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"*{marker}*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += cast(int, client.unlink(*batch))
            batch.clear()
    if batch:
        deleted += cast(int, client.unlink(*batch))
    return deleted


def holds_within(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it is true (True) or ``timeout`` s have passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``condition`` until it is true; fail the test naming ``what`` after ``timeout`` s."""
    if not holds_within(condition, timeout, interval):
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def confirm_from(records: Iterable[Scheduled | Cancel]) -> Confirm:
    """A :data:`bridge.store.Confirm` answering from ``records``, the delay topic of a test of
    the store alone (one partition's, or offsets unique across the shards asked)."""
    log = {r.offset: r for r in records if isinstance(r, Scheduled)}

    def confirm(shard: Shard, asked: Sequence[tuple[int, int]]) -> dict[int, tuple[str, int]]:
        return {o: (log[o].delay_id, log[o].timestamp_ms) for o, _ in asked if o in log}

    return confirm


def session_services() -> Services:
    """The real Kafka and Redis: from the environment, else started by scripts/services. Raises
    RuntimeError with scripts/services' error when it could not start them."""
    bootstrap = os.environ.get("DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS")
    redis_url = os.environ.get("DELAY_BRIDGE_REDIS__URL")
    if not (bootstrap and redis_url):
        env = {**os.environ, "PYTHON": sys.executable}
        proc = subprocess.run(
            [str(SERVICES), "up"], check=False, capture_output=True, text=True, env=env
        )
        if proc.returncode != 0:
            raise RuntimeError(f"scripts/services up failed:\n{proc.stderr}")
        local = _local_env()
        bootstrap = bootstrap or local["DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS"]
        redis_url = redis_url or local["DELAY_BRIDGE_REDIS__URL"]
    return Services(bootstrap=bootstrap, redis_url=redis_url)
