"""When the delay-topic consumer is started again, and why.

librdkafka can leave a partition fetched from no broker for good (bridge.health.FetchWatch): a new
client reads it from its leader. And it fails a consumer for good when Kafka fences its static
membership: after a session lost while the broker answered, its commit of the lost assignment
carries no member id and the instance id's new one fences it; or another consumer runs with its
instance id. Started again, a static member takes its partitions back at once.

A consumer that failed fatally is closed beside its successor (:func:`close_aside`): Kafka fenced
it, so it commits nothing and leaves nothing, and its close can wait out requests to brokers that
do not answer yet (20 s after two of three brokers came back, in ``make chaos
CHAOS_ARGS=isr-shrink``), where the new consumer rejoins at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException

from bridge.errors import KafkaFault

logger = logging.getLogger(__name__)

RESTART_EVERY_S = 60.0  # the consumer is started again for a stuck partition at most this often
FATAL_RESTART_S = 10.0  # and after a fatal error at most this often

_closing = threading.local()


def is_fatal(error: KafkaError) -> bool:
    """Whether librdkafka failed the consumer for good with ``error``."""
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def closed(close: Callable[[], None]) -> bool:
    """Run ``close`` (the consumer leaving and closing before a restart); False when it turns out
    to have failed fatally (fenced since the restart was asked for, before the error was
    polled): the caller closes it aside, as after any fatal error."""
    try:
        close()
    except KafkaException as exc:
        if not is_fatal(exc.args[0]):
            raise
        logger.warning("the delay-topic consumer failed before it could close: %s", exc)
        return False
    return True


def close_aside(consumer: Consumer) -> None:
    """Close a consumer that failed fatally in a thread of its own (see the module's text); what
    its callbacks report meanwhile is its own, not the live consumer's (:func:`closing_aside`)."""

    def close() -> None:
        _closing.active = True
        began = time.monotonic()
        try:
            consumer.close()
        except Exception as exc:  # it failed already: its close may say so again
            logger.debug("closing the failed consumer: %s", exc)
        logger.info("the failed delay-topic consumer closed in %.1fs", time.monotonic() - began)

    threading.Thread(target=close, name="failed-consumer-close", daemon=True).start()


def closing_aside() -> bool:
    """Whether this thread is closing a failed consumer (its statistics describe no live one)."""
    return bool(getattr(_closing, "active", False))


class Restarts:
    """The reason the consumer is to be started again before the next batch ("": none)."""

    def __init__(self, new_consumer: Callable[[], Consumer] | None) -> None:
        # How a consumer is made again (None: never started again; a fatal error stops the
        # ingress).
        self.new_consumer = new_consumer
        self.why = ""
        self.fatal = False  # the reason is a fatal error: the consumer is closed aside
        self.leaving = False  # the consumer leaves the group first (bridge.ingress.unowned)
        self._next = 0.0
        self._next_fatal = 0.0

    def soon(self, why: str) -> None:
        """Start it again for ``why``, unless it was for a stuck partition within a minute."""
        if self.new_consumer is not None and time.monotonic() >= self._next:
            self.why = why

    def failed(self, error: KafkaError) -> None:
        """librdkafka failed the consumer for good (see the module's text); a second replica
        with the same instance id would fence it again: at most every FATAL_RESTART_S."""
        if self.new_consumer is None:
            raise KafkaFault(f"fatal consumer error: {error}")
        if self.why:  # a restart is due anyway: it closes this consumer aside
            self.fatal = True
            return
        if time.monotonic() < self._next_fatal:
            return
        logger.error(
            "the delay-topic consumer failed: %s; starting it again (if another replica runs "
            "with the same kafka.group_instance_id, give each its own)",
            error.str(),
        )
        self._next_fatal = time.monotonic() + FATAL_RESTART_S
        self.why = "it failed fatally"
        self.fatal = True

    def leave(self, why: str) -> None:
        """Leave the group and join it again, for ``why`` (bridge.ingress.unowned): a member
        leaving starts a rebalance, where a static member restarted is handed its last
        assignment. Called from the probes' thread."""
        if not self.why:
            self.leaving = True
            self.why = why

    def take(self) -> str:
        """The reason, now acted on (and said)."""
        what = (
            "leaving the group and joining it"
            if self.leaving
            else "starting the delay-topic consumer"
        )
        logger.warning("%s again: %s", what, self.why)
        why, self.why, self.fatal, self.leaving = self.why, "", False, False
        self._next = time.monotonic() + RESTART_EVERY_S
        return why
