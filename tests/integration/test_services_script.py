"""scripts/services against the real Kafka tools it drives."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, SERVICES, Services, key_values
from tests.integration.conftest import free_port

sys.path.insert(0, str(ROOT / "scripts"))
from kafka_cluster_id import cluster_id

pytestmark = pytest.mark.integration


def _kafka_libs() -> str:
    """Where scripts/services keeps the Kafka jars it runs (fetched by the session's services)."""
    out = subprocess.run(
        [str(SERVICES), "info", "kafka"], check=True, capture_output=True, text=True
    ).stdout
    return key_values(out)["libs"]


def _draws(*raw: bytes) -> Iterator[bytes]:
    yield from raw
    raise AssertionError("drew more ids than given")


def test_a_cluster_id_never_reads_as_an_option_to_kafka_storage(
    services: Services, tmp_path: Path
) -> None:
    # 0xf8 encodes to a leading "-": one fresh state directory in 64 failed to format with
    # "argument --cluster-id/-t: expected one argument". Ids with a "-" anywhere are redrawn,
    # as Kafka's own generator does.
    assert base64.urlsafe_b64encode(b"\xf8").startswith(b"-")
    draws = _draws(b"\xf8" + bytes(15), b"\x10" + b"\xfb" * 15, b"\x10" + bytes(15))
    made = cluster_id(lambda: next(draws))
    props = tmp_path / "server.properties"
    props.write_text(
        "process.roles=controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:9\n"
        "controller.listener.names=CONTROLLER\nlisteners=CONTROLLER://127.0.0.1:9\n"
        f"log.dirs={tmp_path / 'data'}\n"
    )
    tool = ["java", "-cp", f"{_kafka_libs()}/*", "kafka.tools.StorageTool"]
    proc = subprocess.run(
        [*tool, "format", "-t", made, "-c", str(props)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"cluster.id={made}" in (tmp_path / "data" / "meta.properties").read_text()
    assert made == "EAAAAAAAAAAAAAAAAAAAAA"  # the third draw: the second has a "-" inside


def test_redis_started_over_a_killed_ones_pid_file_is_waited_for_not_taken_for_exited(
    tmp_path: Path,
) -> None:
    # A killed Redis leaves its pid file. `redis-server --daemonize yes` returns once it has
    # forked, and the child writes its pid file a moment later: on a busy machine, a check in
    # between read the dead predecessor's pid and `up redis` died with "redis-server exited"
    # while the new server was starting (the adversary's Redis restart, seed 121). Here the
    # child is made to write its pid file a second late.
    real = shutil.which("redis-server")
    assert real is not None
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "redis-server").write_text(
        f'#!/usr/bin/env bash\n( sleep 1; exec {real} "$@" ) >/dev/null 2>&1 </dev/null &\n'
    )
    (slow / "redis-server").chmod(0o755)
    gone = subprocess.Popen(["true"])
    gone.wait()
    state = tmp_path / "state"
    (state / "redis").mkdir(parents=True)
    (state / "redis" / "redis.pid").write_text(f"{gone.pid}\n")
    env = {
        **os.environ,
        "PATH": f"{slow}:{os.environ['PATH']}",
        "DELAY_BRIDGE_STATE_DIR": str(state),
        "DELAY_BRIDGE_REDIS_PORT": str(free_port()),
    }
    try:
        up = subprocess.run(
            [str(SERVICES), "up", "redis"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert up.returncode == 0, up.stderr[-2000:]
        pid = int((state / "redis" / "redis.pid").read_text())
        assert pid != gone.pid
        assert "redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    finally:
        subprocess.run(
            [str(SERVICES), "down", "redis"], env=env, capture_output=True, timeout=60, check=True
        )
