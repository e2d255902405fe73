"""Helpers for end-to-end tests: the bridge as a real process, and a collecting consumer."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
import yaml
from confluent_kafka import Consumer, KafkaError, Message, Producer

from bridge.kafka import produce
from bridge.message import (
    H_AFTER,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ID,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    Headers,
    format_time_ms,
    wire_headers,
)
from testbed.services import ROOT, Services
from testbed.workload import ReadOnce

# A checkout whose bridge the harness runs instead of this one's (bench.ab: the code before a
# change, measured by the same harness).
CODE_UNDER_TEST = "BRIDGE_CODE_UNDER_TEST"


def code_under_test() -> Path:
    """The directory ``python -m bridge`` runs from: this checkout unless CODE_UNDER_TEST names
    another."""
    return Path(os.environ.get(CODE_UNDER_TEST) or ROOT)


# The fault hooks a test may set in a bridge's environment (its sitecustomize says which).
FAULTS = ROOT / "tests" / "faults" / "python"


def with_faults(env: Mapping[str, str], **faults: str) -> dict[str, str]:
    """``env`` with the fault hooks ``faults`` set, over the code under test."""
    return {**env, **faults, "PYTHONPATH": f"{code_under_test()}{os.pathsep}{FAULTS}"}


def fit_config(path: Path, env: dict[str, str]) -> None:
    """Drop from the config file at ``path`` the keys the code under test does not know (an
    earlier version's: ``check-config`` refuses them one at a time), each said on stderr."""
    for _ in range(50):
        out = subprocess.run(
            [sys.executable, "-m", "bridge", "check-config"],
            cwd=code_under_test(),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        found = re.search(r"unknown key ([\w.]+)", out.stderr)
        if out.returncode == 0 or found is None:
            return
        *parents, leaf = found.group(1).split(".")
        config = yaml.safe_load(path.read_text())
        node = config
        for name in parents:
            node = node[name]
        del node[leaf]
        path.write_text(yaml.safe_dump(config))
        print(f"{code_under_test()} does not know {found.group(1)}: left out", file=sys.stderr)


def _cpu_s(stat: Path) -> float:
    """User and system CPU seconds of a process or thread, from its ``/proc`` ``stat`` file."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Bridge:
    """A ``delay-bridge run`` process with its own topics, group and key prefix."""

    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Bridge:
        if code_under_test() != ROOT and "DELAY_BRIDGE_CONFIG" in self.env:
            fit_config(Path(self.env["DELAY_BRIDGE_CONFIG"]), self.env)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run"],
                cwd=code_under_test(),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit; returns the exit status."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def memory(self, field: str = "VmRSS") -> int:
        """The process's resident memory in bytes, a ``/proc/<pid>/status`` field: ``VmRSS``, or
        ``RssAnon`` (without file-backed pages, such as the shared libraries' code, which the
        kernel may evict and load again as memory runs short)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc/{self.proc.pid}/status")

    def cpu_seconds(self) -> float:
        """The process's CPU time so far, user and system (``/proc/<pid>/stat``)."""
        assert self.proc is not None
        return _cpu_s(Path(f"/proc/{self.proc.pid}/stat"))

    def thread_cpu_seconds(self) -> dict[str, float]:
        """CPU time so far per thread name (``/proc/<pid>/task/*/comm``: the bridge names its
        loops ``db-<loop>``, librdkafka its threads ``rdk:<role>``), threads of one name summed."""
        assert self.proc is not None
        per: dict[str, float] = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                name, spent = (task / "comm").read_text().strip(), _cpu_s(task / "stat")
            except OSError:  # the thread ended meanwhile
                continue
            per[name] = per.get(name, 0.0) + spent
        return per

    def http_port(self, timeout: float = 30) -> int:
        """The port the bridge's HTTP server bound, from its start-up log line."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(r"http listening on [\d.]+:(\d+)", self.output())
            if match:
                return int(match.group(1))
            if time.monotonic() > deadline or (
                self.proc is not None and self.proc.poll() is not None
            ):
                raise AssertionError(f"no http port in the bridge log:\n{self.output()}")
            time.sleep(0.05)

    def head(self, path: str) -> tuple[int, bytes]:
        """HEAD a path on the bridge's HTTP server: (status, body, which must be empty)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port()}{path}", method="HEAD"
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def get(self, path: str, token: str = "") -> tuple[int, str]:
        """GET a path on the bridge's HTTP server (with a bearer ``token``): (status, body)."""
        url = f"http://127.0.0.1:{self.http_port()}{path}"
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=auth), timeout=5
            ) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()


def cli_of(bridge: Bridge, timeout: float = 60) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs ``python -m bridge ARGS`` as the bridge's own environment configures it."""

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bridge", *args],
            env=bridge.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return cli


def wait_ready(bridge: Bridge, timeout: float = 90) -> bool:
    """Whether /readyz answers 200 within ``timeout`` s (False at once if the bridge exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bridge.proc is not None and bridge.proc.poll() is not None:
            return False  # exited: the "no crash" check and its log say why
        with contextlib.suppress(OSError):  # not listening yet
            if bridge.get("/readyz")[0] == 200:
                return True
        time.sleep(0.2)
    return False


def metric(bridge: Bridge, name: str) -> float:
    """The sum of a metric's samples in /metrics; ``name`` may end in labels ({a="b"})."""
    body = bridge.get("/metrics")[1]
    return sum(
        float(line.split()[-1])
        for line in body.splitlines()
        if re.match(rf"{re.escape(name)}(\{{| )", line)
    )


def cycle_collector(bridge: Bridge) -> list[float]:
    """The bridge's cycle collector so far (its /metrics): collections of each generation, young
    to full, then the objects each collected as garbage."""
    return [
        metric(bridge, f'python_gc_{what}_total{{generation="{g}"}}')
        for what in ("collections", "objects_collected")
        for g in range(3)
    ]


def assert_no_garbage_since(bridge: Bridge, before: list[float], what: str) -> None:
    """Since ``before`` (:func:`cycle_collector`), while ``what`` went through the bridge: at
    most one young collection, no older one, and next to nothing collected as garbage — records
    that hold no reference cycle leave the cycle collector nothing to do."""
    young, middle, full, *collected = (
        a - b for a, b in zip(cycle_collector(bridge), before, strict=True)
    )
    assert sum(collected) < 1_000, f"{sum(collected):.0f} objects collected as garbage ({what})"
    assert young <= 1, f"{young:.0f} young collections for {what}"
    assert middle == 0 and full == 0, f"{middle:.0f} middle and {full:.0f} full collections"


def bridge_env(bootstrap: str, redis_url: str, **overrides: str) -> dict[str, str]:
    """Environment for a bridge process; keyword names are config paths with ``__``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAY_BRIDGE_")}
    env.update(
        DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        DELAY_BRIDGE_REDIS__URL=redis_url,
        DELAY_BRIDGE_CONFIG=str(ROOT / "config" / "bridge.yaml"),
        DELAY_BRIDGE_HTTP__HOST="127.0.0.1",
        DELAY_BRIDGE_HTTP__PORT="0",  # an ephemeral port; read back with Bridge.http_port()
    )
    for key, value in overrides.items():
        env[f"DELAY_BRIDGE_{key.upper()}"] = value
    return env


@dataclass
class Received:
    """A record read from a target topic or the DLQ, with when the test saw it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    seen_ms: int

    def header(self, name: str) -> bytes | None:
        values = [v for k, v in self.headers if k == name]
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None

    @property
    def delay_id(self) -> str:
        return (self.header(H_ID) or b"").decode()

    @property
    def due_ms(self) -> int:
        return int(self.header(H_DUE_AT) or b"-1")


@dataclass
class Collector:
    """Reads topics from the beginning and keeps every record, once (see ReadOnce)."""

    bootstrap: str
    topics: list[str]
    group: str
    records: list[Received] = field(default_factory=list)
    consumer: Consumer | None = None
    read: ReadOnce = field(default_factory=ReadOnce)

    def __post_init__(self) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe(self.topics)

    def poll(self, seconds: float = 0.2) -> None:
        assert self.consumer is not None
        for msg in self.consumer.consume(1000, seconds):
            if msg.error() is None and self.read.first(msg):
                self.records.append(_received(msg))

    @property
    def again(self) -> int:
        """How many records were read again at a position read before (see ReadOnce)."""
        return self.read.again

    def until(self, done: Callable[[list[Received]], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; "
                    f"have {len(self.records)} records"
                )
            self.poll()

    def of(self, topic: str) -> list[Received]:
        return [r for r in self.records if r.topic == topic]

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()


def _received(msg: Message) -> Received:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return Received(
        topic,
        partition,
        offset,
        msg.key(),
        msg.value(),
        list(msg.headers() or []),  # type: ignore[arg-type]
        msg.timestamp()[1],
        time.time_ns() // 1_000_000,
    )


def produce_all(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
) -> list[tuple[int, int]]:
    """Produce (key, value, headers) records; returns their (partition, offset) in order."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    coords: list[tuple[int, int] | None] = [None] * len(records)

    def report(i: int) -> Callable[[object, Message], None]:
        def cb(err: object, msg: Message) -> None:
            assert err is None, err
            coords[i] = (msg.partition() or 0, msg.offset() or 0)

        return cb

    for i, (key, value, headers) in enumerate(records):
        produce(
            producer,
            topic,
            value=value,
            key=key,
            headers=wire_headers(list(headers)),
            on_delivery=report(i),
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert all(c is not None for c in coords)
    return [c for c in coords if c is not None]


ToPartition = list[tuple[int, bytes | None, Headers]]


def produce_to(bootstrap: str, topic: str, records: ToPartition, **settings: str) -> None:
    """Produce each (partition, value, headers) with the key ``k``, in order; ``settings`` are the
    producer's librdkafka properties. A record the broker refused fails it (AssertionError): a
    partition its metadata does not have yet, say, right after the topic grew."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **settings})
    refused: list[str] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            refused.append(f"partition {msg.partition()}: {err}")

    for partition, value, headers in records:
        produce(
            producer,
            topic,
            partition=partition,
            key=b"k",
            value=value,
            headers=headers,
            on_delivery=report,
        )
    assert producer.flush(30) == 0
    assert not refused, f"records refused by {topic}: {'; '.join(refused)}"


@dataclass
class Setup:
    services: Services
    delay: str
    targets: list[str]
    dlq: str
    unique: str
    tmp: Path
    journal: str

    def bridge(self, name: str = "bridge", **overrides: str) -> Bridge:
        env = bridge_env(
            self.services.bootstrap,
            self.services.redis_url,
            topics__delay=self.delay,
            topics__dead_letter=self.dlq,
            topics__journal=self.journal,
            kafka__group_id=f"bridge-{self.unique}",
            redis__key_prefix=f"test-{self.unique}",
            **overrides,
        )
        return Bridge(env, self.tmp / f"{name}.log")

    def collector(self) -> Collector:
        return Collector(self.services.bootstrap, [*self.targets, self.dlq], f"check-{self.unique}")

    def due_now_in(self, partitions: Sequence[int], count: int) -> list[bytes]:
        """Produce ``count`` records due now to each of these delay partitions, for the first
        target (values ``p<partition>-<n>``); returns their values, sorted."""
        now: Headers = [(H_TARGET_TOPIC, self.targets[0].encode()), (H_AFTER, b"0ms")]
        values = [(p, f"p{p}-{i}".encode()) for p in partitions for i in range(count)]
        produce_to(self.services.bootstrap, self.delay, [(p, v, now) for p, v in values])
        return sorted(v for _, v in values)

    def await_values(self, count: int, timeout: float, what: str) -> list[bytes]:
        """The values of the records the targets and the dead-letter topic hold, sorted, once
        there are ``count`` of them."""
        records = self._await(lambda rs: len(rs) >= count, timeout, what)
        return sorted(r.value or b"" for r in records)

    def await_value(self, value: bytes | None, timeout: float, what: str) -> list[Received]:
        """Every record the targets and the dead-letter topic hold once one with ``value`` is
        among them."""
        return self._await(lambda rs: any(r.value == value for r in rs), timeout, what)

    def _await(
        self, done: Callable[[list[Received]], bool], timeout: float, what: str
    ) -> list[Received]:
        """Every record the targets and the dead-letter topic hold once ``done`` says so (a
        collector of their own, from the beginning)."""
        collector = self.collector()
        try:
            collector.until(done, timeout, what)
        finally:
            collector.close()
        return collector.records


def wipe(setup: Setup) -> int:
    """Delete every key of the bridge's prefix, as a Redis that lost its data would."""
    client = redis.Redis.from_url(setup.services.redis_url)
    keys = list(client.scan_iter(match=f"*test-{setup.unique}*", count=1000))
    client.delete(*keys)
    client.close()
    return len(keys)


def schedule(setup: Setup, count: int, seed: int, max_delay_ms: int = 3000) -> dict[str, int]:
    """Produce ``count`` valid records with mixed delays and header formats.

    Returns delay-id → the earliest due time the test can assert (ms).
    """
    rng = random.Random(seed)
    now = time.time_ns() // 1_000_000
    records: list[tuple[bytes | None, bytes, Headers]] = []
    expected_due: list[int] = []
    for i in range(count):
        target = setup.targets[i % 2].encode()
        headers: Headers = [(H_TARGET_TOPIC, target), ("trace", f"t{i}".encode())]
        kind = i % 5
        if kind == 0:  # already past
            due = now - rng.randint(1, 60_000)
            headers.append((H_DELIVER_AT, str(due).encode()))
        elif kind == 1:  # sub-second
            delay = rng.randint(0, 999)
            headers.append((H_AFTER, f"{delay}ms".encode()))
            due = now + delay
        elif kind == 2:  # seconds, plain milliseconds
            delay = rng.randint(1000, max_delay_ms)
            headers.append((H_AFTER, str(delay).encode()))
            due = now + delay
        elif kind == 3:  # RFC 3339 with an offset
            due = now + rng.randint(0, max_delay_ms)
            text = format_time_ms(due).replace("Z", "+00:00")
            headers.append((H_DELIVER_AT, text.encode()))
        else:  # caller's id and a target key
            delay = rng.randint(0, max_delay_ms)
            headers += [
                (H_AFTER, f"{delay}ms".encode()),
                (H_ID, f"mine-{seed}-{i}".encode()),
                (H_TARGET_KEY, f"tk-{i}".encode()),
            ]
            due = now + delay
        records.append((f"k{i}".encode(), f"value-{i}".encode(), headers))
        expected_due.append(due)
    coords = produce_all(setup.services.bootstrap, setup.delay, records)
    ids = {}
    for i, ((partition, offset), due) in enumerate(zip(coords, expected_due, strict=True)):
        delay_id = f"mine-{seed}-{i}" if i % 5 == 4 else f"{setup.delay}:{partition}:{offset}"
        # Relative delays count from the record's timestamp, set a little after `now`.
        ids[delay_id] = due
    return ids


def delivered(collector: Collector, setup: Setup) -> list[Received]:
    return [r for r in collector.records if r.topic in setup.targets]


def check_delivery(received: list[Received], expected: dict[str, int]) -> collections.Counter[str]:
    counts = collections.Counter(r.delay_id for r in received)
    assert set(counts) == set(expected), "missing or unexpected delay-ids"
    for r in received:
        assert r.seen_ms >= expected[r.delay_id], f"{r.delay_id} arrived before its due time"
        assert r.timestamp_ms >= r.due_ms >= expected[r.delay_id] - 1
    return counts


def with_session_timeout(
    setup: Setup, bridge: Bridge, session_ms: str, heartbeat_ms: str | None = None
) -> Bridge:
    """``bridge`` with the consumer's session.timeout.ms (and heartbeat.interval.ms) set, through
    a config file: librdkafka properties are a mapping the environment cannot set."""
    consumer = f"session.timeout.ms: '{session_ms}'"
    if heartbeat_ms is not None:
        consumer += f", heartbeat.interval.ms: '{heartbeat_ms}'"
    config = setup.tmp / f"session-{session_ms}.yaml"
    config.write_text(f"kafka:\n  consumer: {{{consumer}}}\n")
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    return bridge


def fast_takeover(setup: Setup, name: str, **overrides: str) -> Bridge:
    """A bridge whose partitions move within seconds of a SIGKILL (a short session timeout),
    started."""
    return with_session_timeout(setup, setup.bridge(name, **overrides), "6000", "1000").start()


def snapshot_keys(setup: Setup) -> dict[bytes, bytes]:
    """Every key of the bridge's prefix, DUMPed."""
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        keys = list(client.scan_iter(match=f"*test-{setup.unique}*", count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.dump(key)
        return dict(zip(keys, pipe.execute(), strict=True))
    finally:
        client.close()


def roll_back(setup: Setup, snapshot: dict[bytes, bytes]) -> None:
    """Put the bridge's keys back as ``snapshot`` has them, in one transaction: what a failover
    to a replica that had not received the writes since does to them."""
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        now = list(client.scan_iter(match=f"*test-{setup.unique}*", count=1000))
        pipe = client.pipeline(transaction=True)
        pipe.delete(*now)
        for key, dumped in snapshot.items():
            pipe.restore(key, 0, dumped, replace=True)
        pipe.execute()
    finally:
        client.close()
