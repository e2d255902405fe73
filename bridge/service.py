"""Wiring: build the clients and stages from a config, run them, stop them cleanly on a signal."""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, Producer
from prometheus_client import CollectorRegistry

from bridge import announce
from bridge.catchup import CatchUp
from bridge.config import (
    Config,
    admin_settings,
    consumer_settings,
    member_instance,
    producer_settings,
    read_back_settings,
)
from bridge.egress import Egress, OwnedWatch, shard_transactions
from bridge.errors import ConfigError, KafkaFault
from bridge.health import PROBE_INTERVAL_S, FetchWatch, Probes, Readiness
from bridge.http import HttpServer
from bridge.ingress import (
    DeadLetters,
    Ingress,
    Owner,
    ReplicaView,
    Settled,
    TopicReads,
    Unowned,
    closing_aside,
    replica_id,
)
from bridge.journal import Journal, JournalReader, Reconcile
from bridge.logs import KafkaNoise
from bridge.memory import TRIM_INTERVAL_S, Trimmer
from bridge.metrics import Metrics, set_lag
from bridge.readback import IdReader, ReadBack, Reader
from bridge.redis_client import redis_client
from bridge.sampler import Sampler
from bridge.startup import check_rebuildable, start_up
from bridge.store import Replicas, Shard, Store
from bridge.topics import Topics
from bridge.turns import name_os_thread

if TYPE_CHECKING:
    from bridge.tracing import Spans

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0
# A revoked partition's records in flight get this long to be acknowledged before the consumer
# hands the partition on (its next owner delivers again what is still in flight).
REVOKE_SETTLE_S = 5.0
STALL_S = 60.0  # a main loop silent this long is stuck: /healthz turns 503
REDIS_WAIT_S = (0.5, 1.0, 2.0, 5.0)  # back-off while waiting for Redis before joining the group
# How long a thread may hold the interpreter while another waits for it (Python's default is
# 5 ms). The mover waits for it after every Redis reply and delivery report, while the ingress
# parses batches: at 5 ms those waits added up to tens of ms of lateness.
SWITCH_INTERVAL_S = 0.001
# The records in memory (parsed, claimed ahead, in flight) are container objects that live a
# second or so and form no cycles: the cycle collector runs once 100,000 more are alive (not
# Python's 700), so it stays a net for real cycles without walking the records many times a
# second; what start-up built is frozen out of it (gc.freeze). Measured: docs/bench/history.md,
# "The cycle collector".
GC_THRESHOLDS = (100_000, 10, 10)


# librdkafka's own lines, routed into the log; lowered where they are not the operator's concern.
_KAFKA_NOISE = KafkaNoise()


def _kafka_logger(name: str) -> logging.Logger:
    kafka = logging.getLogger(f"librdkafka.{name}")
    if _KAFKA_NOISE not in kafka.filters:
        kafka.addFilter(_KAFKA_NOISE)
    return kafka


def _count_fetched(metrics: Metrics, records: int, size: int) -> None:
    metrics.read_back_fetched.inc(records)
    metrics.read_back_fetched_bytes.inc(size)


def _journal(
    config: Config, producer: Producer, metrics: Metrics, readiness: Readiness, topics: Topics
) -> Journal | None:
    """The journal, written through ``producer`` (None: topics.journal is "")."""
    topic = config.topics.journal
    return Journal(producer, topic, metrics, readiness, topics.known) if topic else None


def _id_reader(config: Config) -> IdReader:
    """What the ingress reads the records the id index and default ids name with (one consumer)."""
    settings = {**read_back_settings(config), "logger": _kafka_logger("ids")}
    return IdReader(lambda: Reader(Consumer(settings)), config.rules())


def _spans(config: Config) -> Spans | None:
    """The bridge's spans (None: tracing.enabled is off, and OpenTelemetry is not imported)."""
    if not config.tracing.enabled:
        return None
    from bridge.tracing import Spans

    return Spans.start(config)


def _settled(service: Service, catch_up: CatchUp) -> Settled:
    """What a re-read leaves out as the journal says (exactly once, it waits for the journal)."""
    config = service.config
    reader = (lambda: JournalReader(config)) if config.topics.journal else None
    args = service.store, service.topics.known, service.egress.before_rebuild, service.metrics
    return Settled(reader, *args, catch_up.hold, config.egress.exactly_once)


def _starting(config: Config, instance: str) -> None:
    """Say what this process serves, and set the interpreter up for its loops."""
    announce.starting(config, instance)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _watch_ownership(service: Service, session_ms: str) -> ReplicaView:
    """Have the probes watch for partitions no member owns, and for those assigned here that the
    mover does not deliver from (bridge.egress.owned); returns the replicas' view it reads (a
    replica's last word stands for a group session, ``session_ms``, and a probe round)."""
    config, me, clock = service.config, replica_id(), service.store.time_ms
    replicas = Replicas(service.redis, config.redis.key_prefix, clock, config.kafka.group_id)
    alive_ms = int(session_ms) + int(PROBE_INTERVAL_S * 1000)
    ingress, egress, delay = service.ingress, service.egress, set(config.topics.delay)
    view = ReplicaView(replicas, me, lambda: ingress.joined, lambda: egress.owned, alive_ms)
    watch = Unowned(
        view,
        lambda: {t: n for t, n in service.topics.partitions().items() if t in delay},
        lambda member, why: ingress.restarts.leave(why) if member == me else None,
    )
    here = OwnedWatch(lambda: ingress.assigned, egress)
    service.probes.each_round += [watch.check, here.check]
    return view


class Service:
    """One bridge process: ingress and egress threads around a shared store."""

    def __init__(self, config: Config, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        _KAFKA_NOISE.stopping = False
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.metrics.declare_delay_topics(config.topics.delay)
        self.redis = redis_client(config)
        self.store = Store(self.redis, config.redis.key_prefix)
        self.http = HttpServer(  # bound first: its port names the group member (member_instance)
            config.http.host, config.http.port, self.registry, health=self.health, ready=self.ready
        )
        self.instance = member_instance(config, self.http.port)
        producer_conf: dict[str, Any] = {
            **producer_settings(config),
            "logger": _kafka_logger("producer"),
            "error_cb": self._on_producer_error,
        }
        consumer_conf: dict[str, Any] = {
            **consumer_settings(config, instance=self.instance),
            "logger": _kafka_logger("consumer"),
            "stats_cb": self._on_stats,
        }
        self.brokers_up = 0
        self.readiness = Readiness()
        self.fetch_watch = FetchWatch(self.readiness)
        self._admin = {**admin_settings(config), "logger": _kafka_logger("admin")}
        self.topics = Topics(self._admin)
        self.probes = Probes(
            self.store,
            self.readiness,
            config.topics.dead_letter,
            self.topics.absent,
            writable=self.metrics.redis_writable,
            also_describe=config.topics.delay,
            journal=config.topics.journal,
        )
        catch_up = CatchUp()  # the ingress says how far it is read, the mover claims up to it
        producer = Producer(producer_conf)
        journal = _journal(config, producer, self.metrics, self.readiness, self.topics)
        self.spans = spans = _spans(config)
        self.reconcile = reconcile = Reconcile.of(
            config, self.store, self.topics.known, self.metrics
        )
        self.egress = Egress(
            producer,
            self.store,
            self.metrics,
            config.egress,
            dead_letter=config.topics.dead_letter,
            readiness=self.readiness,
            catch_up=catch_up,
            journal=journal,
            reconcile=reconcile,
            transactions=shard_transactions(
                config,
                self.metrics,
                self.readiness,
                journal=journal,
                store=self.store,
                reconcile=reconcile,
                on_fatal=self._on_producer_error,
                log=_kafka_logger("txn"),
            ),
            spans=spans,
        )
        dlq_producer = Producer(producer_conf)
        self.id_reader = _id_reader(config)
        journal = _journal(config, dlq_producer, self.metrics, self.readiness, self.topics)
        self.ingress = Ingress(
            lambda: Consumer(consumer_conf),
            self.store,
            self.metrics,
            config,
            DeadLetters(dlq_producer, config.rules(), self.metrics, journal),
            topics=self.topics,
            owner=Owner(self.egress.add_shards, self._on_revoke, self.egress.notify),
            readiness=self.readiness,
            catch_up=catch_up,
            settled=_settled(self, catch_up),
            reads=TopicReads(self.id_reader, self.id_reader.schedules, self.id_reader.logged),
            spans=spans,
        )
        self.replica_view = _watch_ownership(self, consumer_conf["session.timeout.ms"])
        # Runs with store.references off too: the references stored before it are still read back.
        reader = Reader(
            Consumer({**read_back_settings(config), "logger": _kafka_logger("read-back")}),
            on_fetched=functools.partial(_count_fetched, self.metrics),
        )
        self.read_back = ReadBack(
            self.store,
            reader,
            config.rules(),
            self.metrics,
            owned=lambda: self.egress.owned,
            read_ahead_ms=config.store.read_ahead_ms,
            on_stored=self.egress.notify,
        )
        self.sampler = Sampler(
            self.store,
            self.metrics,
            lambda: self.egress.owned,
            self.ready,
            in_memory=self.egress.readings,
            lost=lambda: self.ingress.lost,
            due_by_ms=config.egress.due_by_ms,
            quota_of=self.ingress.quotas.limit,
        )
        self.stop_event = threading.Event()
        self._errors: list[BaseException] = []
        self._waiting_for_redis = False
        # When the main loops started, after the wait for Redis: their silence counts from then.
        self._loops_started = 0.0

    def _on_stats(self, stats_json: str) -> None:
        if closing_aside():
            return  # a failed consumer's last statistics, while it is closed aside
        stats = json.loads(stats_json)
        marks = self.ingress.marks
        positions = {s: marks[s] + 1 if s in marks else None for s in self.ingress.assigned}
        self.brokers_up = set_lag(self.metrics, positions, stats)
        stuck = self.fetch_watch.update(stats, positions.keys())
        if stuck:
            names = ", ".join(f"{s.topic}[{s.partition}]" for s in stuck)
            self.ingress.restart_soon(f"librdkafka fetches {names} from no broker")
            self.fetch_watch.reset()

    def _on_producer_error(self, error: KafkaError) -> None:
        """A fatal error leaves a producer unusable (the idempotent producer can no longer keep
        its order and no-duplicate guarantees): rather than fail every delivery behind a green
        /healthz, the bridge stops, exit code 1, for its supervisor to start it with new clients;
        records in flight are claimed again. Other errors are librdkafka's to retry and log."""
        if error.fatal():
            logger.critical("the producer failed fatally, stopping: %s", error)
            self._errors.append(KafkaFault(f"fatal producer error: {error}"))
            self.stop_event.set()

    def _on_revoke(self, shards: set[Shard]) -> None:
        self.egress.remove_shards(shards)
        left = self.egress.wait_settled(shards, REVOKE_SETTLE_S)
        if left:
            logger.warning(
                "%d records of revoked partitions still in flight after %.0fs; their next owner %s",
                left,
                REVOKE_SETTLE_S,
                "reconciles them with the journal"
                if self.config.egress.exactly_once
                else "may deliver them again",
            )
        self.metrics.forget_partitions(shards)

    def health(self) -> list[str]:
        """Problems that mean the process should be restarted: a main loop that stopped."""
        now = time.monotonic()
        # Waiting for Redis, no loop runs yet: not stuck (/readyz names the Redis fault).
        since = now if self._waiting_for_redis else self._loops_started
        problems = [
            f"{name} loop silent for {now - last:.0f}s"
            for name, last in self._last_loops().items()
            if now - max(last, since) > STALL_S
        ]
        if self._errors:
            problems.append(f"stopped: {self._errors[0]!r}")
        return problems

    def _last_loops(self) -> dict[str, float]:
        """When each main loop /healthz watches last came round (monotonic s)."""
        return {
            "ingress": self.ingress.last_loop,
            **self.egress.last_loops(),
            "read-back": self.read_back.last_loop,
        }

    def ready(self) -> list[str]:
        """Problems that mean the bridge cannot do its work now."""
        problems = self.readiness.problems()
        # Waiting for Redis before joining, the consumer has not tried Kafka: Redis alone is named.
        if not self.ingress.joined and not self._waiting_for_redis:
            if self.brokers_up == 0:
                problems.append("kafka unreachable")
            problems.append("consumer has not joined its group")
        if self.stop_event.is_set():
            problems.append("stopping")
        return problems

    def _thread(self, name: str, target: Callable[[threading.Event], None]) -> threading.Thread:
        def body() -> None:
            name_os_thread(name)
            try:
                target(self.stop_event)
            except BaseException as exc:
                logger.exception("%s loop crashed", name)
                self._errors.append(exc)
                self.stop_event.set()

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    def run(self) -> int:
        """Run until :attr:`stop_event` is set; returns the process exit code."""
        started = time.monotonic()
        _starting(self.config, self.instance)
        self.readiness.fail("redis", "redis has not answered yet")  # until the first probe does
        self.http.start()
        try:
            warm = self.reconcile.warm if self.reconcile else lambda: None
            redis_ok = start_up(
                self._wait_for_redis, self.config, self._admin, self.probes, warm=warm
            )
        except ConfigError:
            self._stop(started)
            raise
        if not redis_ok:
            return self._stop(started)
        self.sampler.sample_once()
        check_rebuildable(self.store, self.config, self._admin)  # on a thread of its own
        probes_thread = self._thread("probes", self.probes.run)
        self.ingress.subscribe()
        egress_thread = self._thread("egress", self.egress.run)
        sender_thread = self._thread("sender", self.egress.run_sender)
        read_back_thread = self._thread("read-back", self.read_back.run)
        ingress_thread = self._thread("ingress", self.ingress.run)
        sampler_thread = self._thread("sampler", self.sampler.run)
        ready_line, trim = announce.ReadyLine(self.ready, self.config, self.http), Trimmer()
        while not self.stop_event.wait(ready_line.wait_s(TRIM_INTERVAL_S)):
            ready_line.check()
            trim()
        logger.info("stopping")
        _KAFKA_NOISE.stopping = True
        self.egress.wake_up()  # cut its sleep short
        # Reverse order of start: ingress stops consuming and commits; egress finishes its batch.
        for thread in (ingress_thread, egress_thread, sender_thread, read_back_thread):
            thread.join()
        sampler_thread.join()
        probes_thread.join()
        try:
            self.egress.drain(DRAIN_TIMEOUT_S)
        except Exception:
            logger.exception("draining the mover failed; unacknowledged leases will expire")
        stays = bool(self.config.kafka.group_instance_id)  # a named member (see member_instance)
        owned = frozenset(self.egress.owned)
        try:  # a named member stays one: its partitions wait for its return (a StatefulSet's pod)
            self.ingress.close(leave=not stays)
        except Exception:
            logger.exception("closing the consumer failed")
        self.replica_view.last_word(owned if stays else ())
        return self._stop(started)

    def _stop(self, started: float) -> int:
        self.http.stop()
        if self.reconcile is not None:
            self.reconcile.close()
        self.id_reader.close()
        self.redis.close()
        if self.spans is not None:
            self.spans.shutdown()  # the spans not exported yet
        announce.summary(self.registry, time.monotonic() - started)
        return 1 if self._errors else 0

    def _wait_for_redis(self) -> bool:
        """Join the consumer group only once Redis takes writes: a replica that cannot reach
        Redis (or is refused by it) must not hold partitions it cannot serve. Returns False if
        stopped while waiting."""
        attempt = 0
        self._waiting_for_redis = True
        while not self.probes.redis_once():
            backoff = REDIS_WAIT_S[min(attempt, len(REDIS_WAIT_S) - 1)]
            if attempt == 0:
                logger.error(
                    "not joining the consumer group until Redis takes writes: %s",
                    self.readiness.detail("redis"),
                )
            attempt += 1
            if self.stop_event.wait(backoff):
                return False
        self._waiting_for_redis = False
        self._loops_started = time.monotonic()
        if attempt:
            logger.info("redis takes writes after %d attempts; joining the consumer group", attempt)
        return True

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT set the stop event; a second SIGINT exits at once."""

        def request_stop(signum: int, _frame: FrameType | None) -> None:
            if self.stop_event.is_set() and signum == signal.SIGINT:
                os._exit(130)
            logger.info("received %s", signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
