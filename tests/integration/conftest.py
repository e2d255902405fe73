"""Fixtures of the end-to-end tests: per-test topics and bridge processes."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from bridge.store import Store
from testbed import postmortem
from testbed.clock import build_shim
from testbed.harness import Bridge, Setup
from tests.conftest import ROOT, Services, TopicFactory, delete_keys, failed, wait_for


@pytest.fixture(autouse=True)
def clean_redis(services: Services, unique: str) -> Iterator[None]:
    """Every key a test's bridges wrote under its unique prefix is deleted afterwards."""
    yield
    client = redis.Redis.from_url(services.redis_url)
    try:
        delete_keys(client, unique)
    finally:
        client.close()


@pytest.fixture
def store(redis_client: redis.Redis, unique: str) -> Store:
    """A store on the test session's Redis under a key prefix of the test's own."""
    return Store(redis_client, f"test-{unique}")


@pytest.fixture
def setup(services: Services, topics: TopicFactory, unique: str, tmp_path: Path) -> Setup:
    return Setup(
        services,
        topics("delay", 3),
        [topics("out-a", 2), topics("out-b", 1)],
        topics("dlq"),
        unique,
        tmp_path,
        topics("journal", 2),
    )


@pytest.fixture
def one(services: Services, topics: TopicFactory, unique: str, tmp_path: Path) -> Setup:
    """One delay partition, so offsets are predictable."""
    return Setup(
        services,
        topics("delay", 1),
        [topics("out", 1)],
        topics("dlq"),
        unique,
        tmp_path,
        topics("journal"),
    )


@pytest.fixture
def bridges(request: pytest.FixtureRequest) -> Iterator[list[Bridge]]:
    """The test's bridges, killed afterwards; when the test failed, what their logs and the
    broker say of them is printed (testbed.postmortem; pytest shows it in the failure's report,
    "Captured stdout teardown")."""
    running: list[Bridge] = []
    yield running
    for b in running:
        b.kill()
    if failed(request.node) and running:
        print(*postmortem.report(running), sep="\n")


@pytest.fixture
def acl_user(services: Services, unique: str) -> Iterator[Callable[..., str]]:
    """Creates Redis ACL users for this test (``rules`` as ACL SETUSER takes them); returns the
    URL that logs in as one. They are deleted afterwards."""
    admin = redis.Redis.from_url(services.redis_url)
    made: list[str] = []

    def make(name: str, *rules: str, password: str = "pw") -> str:
        user = f"test-{unique}-{name}"
        admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], reset=True)
        admin.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
        made.append(user)
        host = services.redis_url.split("//", 1)[1]
        return f"redis://{user}:{password}@{host}"

    yield make
    for user in made:
        admin.acl_deluser(user)
    admin.close()


def documented_acl_rules(prefix: str) -> list[str]:
    """The least-privileged ACL user's rules as docs/redis.md documents them, for the key
    prefix ``prefix`` (the docs' is ``delay-bridge``) and without the password."""
    text = (ROOT / "docs" / "redis.md").read_text()
    [line] = [x for x in text.splitlines() if x.startswith("ACL SETUSER delay-bridge on ")]
    rules = line.split()[4:]  # after ACL SETUSER <user> on
    assert "~delay-bridge:*" in rules and "-@all" in rules
    return [f"~{prefix}:*" if r == "~delay-bridge:*" else r for r in rules if r != ">PASSWORD"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port where nothing listens, held bound for the test: a port merely freed is in the
    ephemeral range, so a client retrying it can be given it as its own local port and connect
    to itself (a Redis PING then reads its own PING back, and the bridge counts that as up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(directory: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A Redis server of the caller's own, without persistence, running inside the block: its
    URL. ``env`` is added to its environment (a clock shift's, say)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    client = redis.Redis(port=port)
    try:
        wait_for(lambda: _pings(client), 30, "the scratch redis")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def clock_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """testbed/clock/shift.c built with the machine's C compiler (see its comment)."""
    return build_shim(tmp_path_factory.mktemp("clock"))


@dataclass
class ClockShift:
    """A wall clock a test steps: processes started with :meth:`env` read their offset from
    ``file`` (testbed/clock/shift.c)."""

    shim: Path
    file: Path

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.shim), "CLOCK_SHIFT_FILE": str(self.file)}

    def step_to(self, offset_ms: int) -> None:
        """Move the clock to ``offset_ms`` from the true time (taken within 20 ms)."""
        self.file.write_text(str(offset_ms))


@pytest.fixture
def clock_shift(clock_shim: Path, tmp_path: Path) -> Callable[[str], ClockShift]:
    """A fresh clock shift per name, at 0."""

    def make(name: str) -> ClockShift:
        shift = ClockShift(clock_shim, tmp_path / f"{name}.offset")
        shift.step_to(0)
        return shift

    return make


@pytest.fixture
def scratch_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis server of this test's own (made a replica, flushed: faults no other test sees)."""
    with redis_server(tmp_path) as url:
        yield url


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
