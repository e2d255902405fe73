"""What the process says of itself in the log: start, ready, stop.

What it serves when it starts; one line when it is first ready (where its metrics and console
are: what a person running it waits for); its totals when it stops."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from bridge import __version__
from bridge.config import Config

logger = logging.getLogger(__name__)

READY_CHECK_S = 0.1  # how often readiness is looked at until the bridge is first ready


class Served(Protocol):
    """What the ready line reads of the HTTP server: its port, and its console if it has one."""

    @property
    def port(self) -> int: ...

    @property
    def console(self) -> object | None: ...


def starting(config: Config, instance: str) -> None:
    """Say what this process serves."""
    logger.info(
        "delay-bridge %s starting: delay topics %s, group %s%s",
        __version__,
        ",".join(config.topics.delay),
        config.kafka.group_id,
        f" as instance {instance}" if instance else "",
    )


def base_url(host: str, port: int) -> str:
    """The address a person on this host opens: a wildcard bind is reached at localhost."""
    shown = "localhost" if host in ("", "0.0.0.0", "::") else host
    return f"http://{shown}:{port}"


class ReadyLine:
    """Logs once, the first time ``ready()`` names no problem, that the bridge is ready: what it
    delivers from, and where its metrics and (when it serves one) its console are."""

    def __init__(self, ready: Callable[[], list[str]], config: Config, http: Served) -> None:
        self._ready = ready
        self._config = config
        self._http = http
        self.said = False

    def wait_s(self, otherwise_s: float) -> float:
        """How long the caller's loop waits before its next round: short until it is said."""
        return otherwise_s if self.said else READY_CHECK_S

    def check(self) -> None:
        """Say it if the bridge is ready now and it was not said yet."""
        if self.said or self._ready():
            return
        self.said = True
        url = base_url(self._config.http.host, self._http.port)
        console = f", console at {url}/ui" if self._http.console is not None else ""
        logger.info(
            "ready: delivering from %s; metrics at %s/metrics%s",
            ",".join(self._config.topics.delay),
            url,
            console,
        )


def summary(registry: CollectorRegistry, seconds: float) -> None:
    """The run's totals, one line at exit."""

    def total(metric: str) -> int:
        return int(sum(s.value for m in registry.collect() for s in m.samples if s.name == metric))

    logger.info(
        "stopped after %.1fs: %d ingested, %d delivered, %d dead-lettered, %d redelivered",
        seconds,
        total("delay_bridge_ingested_total"),
        total("delay_bridge_delivered_total"),
        total("delay_bridge_dead_lettered_total"),
        total("delay_bridge_redelivered_total"),
    )
