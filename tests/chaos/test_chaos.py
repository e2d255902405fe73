"""A short version of every chaos scenario that has one: nothing lost, nothing early, every check holds."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.scenarios import SCENARIOS, run_scenario
from tests.chaos.servers import Servers

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The harness's own Kafka and Redis: the faults must not touch the other tests' servers."""
    base = os.environ.get("DELAY_BRIDGE_STATE_DIR", str(Path.home() / ".local/state/delay-bridge"))
    chaos = Servers(Path(base) / "chaos-test")
    chaos.up()
    yield chaos
    chaos.down()


@pytest.mark.parametrize("name", [name for name, (_, quick, _) in SCENARIOS.items() if quick])
def test_scenario(name: str, servers: Servers, tmp_path: Path) -> None:
    _, quick, _ = SCENARIOS[name]
    assert quick is not None
    result = run_scenario(servers, tmp_path, name, quick, seed=zlib.crc32(name.encode()))
    account = result.account
    print(f"{name}: {result.row()}")
    assert account.lost == [], f"lost: {account.lost[:10]}"
    assert account.early == [], f"early: {account.early[:10]}"
    assert account.misrouted == [], f"misrouted: {account.misrouted[:10]}"
    assert account.duplicate_ids_differ == 0, "a duplicate carried another delay-id"
    assert (account.delivered + account.dead_lettered + account.scheduled + account.replaced
            == account.records)  # fmt: skip
    assert {k: v for k, v in result.checks.items() if not v} == {}, _crashes(tmp_path)


def _crashes(run_dir: Path) -> str:
    """What the bridges' logs say of a crash, for the failure message (CI keeps no files)."""
    found = []
    for log in sorted(run_dir.rglob("bridge-*.log")):
        text = log.read_text(errors="replace")
        at = text.find("Traceback")
        if at >= 0:
            found.append(f"{log.name}:\n{text[max(0, at - 300) : at + 3000]}")
    return "\n".join(found)
