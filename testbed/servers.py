"""A Kafka broker and a Redis server of the harness's own, so faults never touch other tests.

They are the same servers as ``scripts/services`` starts, on other ports and in another state
directory; the script also kills them (SIGKILL) and reports their pids. A run on the three-broker
Kafka cluster (``scripts/services up kafka-cluster``) uses it instead of the single broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import redis

from testbed.services import SERVICES, Services, key_values

# Where scripts/services keeps its servers' data, logs and pids.
STATE_DIR = Path(
    os.environ.get("DELAY_BRIDGE_STATE_DIR", Path.home() / ".local/state/delay-bridge")
)
KAFKA_PORT = int(os.environ.get("DELAY_BRIDGE_CHAOS_KAFKA_PORT", "19192"))  # controller: +1
KAFKA_CLUSTER_PORT = KAFKA_PORT + 100  # brokers 1..3 on +0..+2, the cluster's controller on +10
REDIS_PORT = int(os.environ.get("DELAY_BRIDGE_CHAOS_REDIS_PORT", "16479"))


@dataclass(frozen=True)
class Broker:
    """One broker of the Kafka cluster: its node id, port and pid (0: not running)."""

    id: int
    port: int
    pid: int


def cluster_brokers(info: str) -> dict[int, Broker]:
    """The brokers by id in what ``scripts/services info kafka-cluster`` prints (one
    ``broker=<id> port=<port> pid=<pid>`` line each)."""
    brokers = {}
    for line in info.splitlines():
        if line.startswith("broker="):
            fields = dict(f.split("=", 1) for f in line.split())
            broker = Broker(int(fields["broker"]), int(fields["port"]), int(fields["pid"]))
            brokers[broker.id] = broker
    return brokers


@dataclass
class Servers:
    """Kafka on 127.0.0.1:19192 and Redis on 127.0.0.1:16479 (DELAY_BRIDGE_CHAOS_KAFKA_PORT,
    DELAY_BRIDGE_CHAOS_REDIS_PORT) unless other ports are given, state under ``state_dir``."""

    state_dir: Path
    appendfsync: str = "everysec"  # what a (re)started Redis runs with
    kafka_port: int = KAFKA_PORT  # the controller listens on the next port
    redis_port: int = REDIS_PORT
    kafka_cluster_port: int | None = None  # broker 1's; None: kafka_port + 100
    # While a run is on the three-broker cluster (kafka_cluster_up): its bootstrap servers.
    cluster_bootstrap: str | None = None

    @classmethod
    def local(cls) -> Servers:
        """The servers ``scripts/services`` runs by default (its env overrides apply)."""
        return cls(
            STATE_DIR,
            kafka_port=int(os.environ.get("DELAY_BRIDGE_KAFKA_PORT", "19092")),
            redis_port=int(os.environ.get("DELAY_BRIDGE_REDIS_PORT", "16379")),
            kafka_cluster_port=int(os.environ.get("DELAY_BRIDGE_KAFKA_CLUSTER_BASE_PORT", "19201")),
        )

    @classmethod
    def on(
        cls, services: Services, state_dir: Path, kafka_cluster_port: int | None = None
    ) -> Servers:
        """The test session's Kafka and Redis as the harness's servers (what it starts of its
        own, a Redis Cluster or a Kafka cluster on ``kafka_cluster_port``, under ``state_dir``)."""
        kafka_port = int(services.bootstrap.rsplit(":", 1)[1])
        redis_port = int(services.redis_url.rsplit(":", 1)[1].split("/")[0])
        return cls(
            state_dir,
            kafka_port=kafka_port,
            redis_port=redis_port,
            kafka_cluster_port=kafka_cluster_port,
        )

    @property
    def bootstrap(self) -> str:
        return self.cluster_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def replication(self) -> int:
        """The replication factor of the topics a run makes: 3 on the cluster."""
        return 3 if self.cluster_bootstrap else 1

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _run(self, *args: str, extra: Mapping[str, str] | None = None) -> str:
        env = {
            **os.environ,
            **(extra or {}),
            "PYTHON": sys.executable,
            "DELAY_BRIDGE_STATE_DIR": str(self.state_dir),
            "DELAY_BRIDGE_KAFKA_PORT": str(self.kafka_port),
            "DELAY_BRIDGE_KAFKA_CONTROLLER_PORT": str(self.kafka_port + 1),
            "DELAY_BRIDGE_REDIS_PORT": str(self.redis_port),
            "DELAY_BRIDGE_REDIS_APPENDFSYNC": self.appendfsync,
            "DELAY_BRIDGE_SENTINEL_BASE_PORT": str(self.redis_port + 2),
            "DELAY_BRIDGE_REDIS_CLUSTER_BASE_PORT": str(self.redis_port + 30),
            "DELAY_BRIDGE_KAFKA_CLUSTER_BASE_PORT": str(
                self.kafka_cluster_port or self.kafka_port + 100
            ),
        }
        proc = subprocess.run(
            [str(SERVICES), *args], env=env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"scripts/services {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def up(self, what: str | None = None, env: Mapping[str, str] | None = None) -> None:
        """Start both (or one) and return when they answer; ``env`` is added to a started
        server's environment (a clock shim's, say: testbed/clock)."""
        self._run("up", *([what] if what else []), extra=env)

    def down(self) -> None:
        """Stop both, and the three-broker cluster if a run started it."""
        self._run("down")
        self.kafka_cluster_down()

    def reset(self) -> None:
        """Stop them and wipe their state: the next :meth:`up` starts empty servers (a Redis AOF
        that a run killed mid-write left behind cannot fail the next run's restarts)."""
        self._run("reset")

    def up_set(self, name: str) -> dict[str, str]:
        """Start a ``sentinel`` set or a ``redis-cluster`` of the harness's own (or restart its
        dead nodes); returns their addresses."""
        self._run("up", name)
        return key_values(self._run("info", name))

    def down_set(self, name: str) -> None:
        self._run("down", name)

    def kafka_cluster_up(self) -> dict[int, Broker]:
        """Start the three-broker cluster (or restart its stopped brokers) and point
        :attr:`bootstrap` at it; returns its brokers by id."""
        self._run("up", "kafka-cluster")
        return self.brokers()

    def kafka_cluster_down(self) -> None:
        self._run("down", "kafka-cluster")
        self.cluster_bootstrap = None

    def broker_gc_logs(self) -> list[Path]:
        """The GC logs the cluster's brokers write (their JVMs' pauses, ``scripts/services``)."""
        cluster = self.state_dir / "kafka-cluster"
        return [cluster / f"node-{b}" / "logs" / "gc.log" for b in sorted(self.brokers())]

    def brokers(self) -> dict[int, Broker]:
        """The cluster's brokers as ``scripts/services info kafka-cluster`` lists them."""
        out = self._run("info", "kafka-cluster")
        self.cluster_bootstrap = key_values(out)["bootstrap"]
        return cluster_brokers(out)

    def pid_on(self, port: int) -> int:
        """The pid of the redis-server of a set listening on ``port``."""
        for pidfile in self.state_dir.glob("*/*/redis.pid"):
            pid = int(pidfile.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline")
            if (
                cmdline.exists()
                and f":{port}" in cmdline.read_bytes().replace(b"\0", b" ").decode()
            ):
                return pid
        raise RuntimeError(f"no redis-server of a set on port {port}")

    def kill(self, what: str) -> None:
        """SIGKILL ``redis`` or ``kafka``."""
        self._run("kill", what)

    def pid(self, what: str) -> int:
        return int(self._run("pid", what))

    def signal(self, what: str, sig: signal.Signals) -> None:
        """Send ``sig`` to ``redis`` or ``kafka`` (SIGSTOP: it keeps its connections and answers
        nothing, requests hang rather than being refused)."""
        os.kill(self.pid(what), sig)

    def drop_aof_tail(self, size: int) -> int:
        """Cut the last ``size`` bytes off the AOF of a killed Redis — what a machine crash takes
        with ``appendfsync everysec`` (written, not yet fsynced). Returns the bytes cut."""
        incr = sorted(
            (self.state_dir / "redis" / "appendonlydir").glob("*.incr.aof"),
            key=lambda p: p.stat().st_mtime,
        )
        if not incr:
            return 0
        length = incr[-1].stat().st_size
        cut = min(size, length)
        os.truncate(incr[-1], length - cut)
        return cut

    def set_appendfsync(self, mode: str) -> None:
        """Switch the running Redis and any restarted one to ``everysec`` or ``always``."""
        self.appendfsync = mode
        client = self.redis()
        client.config_set("appendfsync", mode)
        client.close()

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=10)
