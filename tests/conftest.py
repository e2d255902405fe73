"""Session-scoped real Kafka and Redis, and per-test isolation (unique topics, groups, prefixes):
pytest's fixtures over :mod:`testbed.services`, whose helpers the tests import from here too.
Unit tests request none of these fixtures and need no server.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from testbed.services import (
    ROOT,
    SERVICES,
    Clock,
    Services,
    TopicFactory,
    confirm_from,
    delete_keys,
    holds_within,
    key_values,
    recreate_topic,
    run_services,
    session_services,
    started,
    wait_for,
)

__all__ = [
    "ROOT",
    "SERVICES",
    "Clock",
    "Services",
    "TopicFactory",
    "confirm_from",
    "delete_keys",
    "holds_within",
    "key_values",
    "recreate_topic",
    "run_services",
    "started",
    "wait_for",
]


REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report is kept on its test (``REPORTS`` in its stash), for fixtures that say more
    in their teardown when the test failed (see tests.integration.conftest.bridges)."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report


def failed(item: pytest.Item) -> bool:
    """Whether ``item``'s setup or call failed (in its teardown)."""
    return any(r.failed for r in item.stash.get(REPORTS, {}).values())


@pytest.fixture(scope="session")
def services() -> Services:
    """The real Kafka and Redis: from the environment, else started by scripts/services."""
    try:
        return session_services()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def admin(services: Services) -> AdminClient:
    """A Kafka AdminClient on the session broker."""
    return AdminClient({"bootstrap.servers": services.bootstrap})


@pytest.fixture
def unique() -> str:
    """A short id unique to this test, for topic names, group ids and key prefixes."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def topics(admin: AdminClient, unique: str) -> Iterator[TopicFactory]:
    """Factory for unique topics: ``topics("delay", partitions=3)`` → ``delay-<id>``."""
    factory = TopicFactory(admin, unique)
    yield factory
    if factory.created:
        for future in admin.delete_topics(factory.created).values():
            try:
                future.result(timeout=30)
            except KafkaException as exc:  # deleted by the test (and not created again)
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise


@pytest.fixture
def redis_client(services: Services, unique: str) -> Iterator[redis.Redis]:
    """A Redis client; every key under this test's prefix is deleted afterwards."""
    client = redis.Redis.from_url(services.redis_url)
    yield client
    delete_keys(client, unique)
    client.close()
