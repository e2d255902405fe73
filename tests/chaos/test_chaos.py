"""A short version of every chaos scenario that has one: nothing lost, nothing early, every check holds."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import scenarios
from tests.chaos.scenarios import KAFKA_CLUSTER_SCENARIOS, SCENARIOS, assert_kept, run_scenario
from tests.chaos.servers import STATE_DIR, Servers

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# The short versions with exactly-once delivery: a duplicate fails them too (make chaos
# CHAOS_ARGS=--exactly-once runs every scenario's long version so). The zombie's runs only so
# in make test: at-least-once it is the SIGKILL's and the storm's take-over once more.
EXACTLY_ONCE = ("bridge-sigkill", "zombie", "sentinel-failover", "redis-restart-everysec")
EXACTLY_ONCE_ONLY = frozenset({"zombie"})


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The harness's own Kafka and Redis: the faults must not touch the other tests' servers."""
    chaos = Servers(STATE_DIR / "chaos-test")
    chaos.reset()  # from empty servers: what an earlier, killed run left must not count
    chaos.up()
    yield chaos
    chaos.down()


@pytest.mark.parametrize("name", [name for name, (_, quick, _) in SCENARIOS.items()
                                  if quick and name not in KAFKA_CLUSTER_SCENARIOS
                                  and name not in EXACTLY_ONCE_ONLY])  # fmt: skip
def test_scenario(name: str, servers: Servers, tmp_path: Path) -> None:
    """(The three-broker scenarios' short versions run on the cluster test_kafka_cluster starts.)"""
    _, quick, _ = SCENARIOS[name]
    assert quick is not None
    result = run_scenario(servers, tmp_path, name, quick, seed=zlib.crc32(name.encode()))
    assert_kept(result, tmp_path)


@pytest.mark.parametrize("name", EXACTLY_ONCE)
def test_scenario_exactly_once(
    name: str, servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scenarios, "EXACTLY_ONCE", True)
    _, quick, _ = SCENARIOS[name]
    assert quick is not None
    result = run_scenario(servers, tmp_path, name, quick, seed=zlib.crc32(name.encode()))
    assert_kept(result, tmp_path)
    assert result.account.duplicates == 0
