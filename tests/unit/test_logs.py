"""Repeated warnings and errors are held back and counted, never flooding the log."""

from __future__ import annotations

import logging

from bridge.logs import KafkaNoise, RateLimit


def record(message: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("librdkafka.consumer", level, __file__, 1, message, args, None)


def test_repeats_are_held_back_and_counted() -> None:
    now = [0.0]
    limit = RateLimit(interval=30, clock=lambda: now[0])
    assert limit.filter(record("Connect to %s failed (after %dms)", "127.0.0.1:1", 0))
    for ms in range(1, 50):  # the same line with other numbers: held back
        now[0] += 0.5
        assert not limit.filter(record("Connect to %s failed (after %dms)", "127.0.0.1:1", ms))
    assert limit.filter(record("another fault"))  # a different line passes
    now[0] = 31.0
    late = record("Connect to %s failed (after %dms)", "127.0.0.1:1", 7)
    assert limit.filter(late)
    assert late.getMessage() == (
        "Connect to 127.0.0.1:1 failed (after 7ms) (49 more like this in the last 31s)"
    )
    assert limit.filter(record("x", level=logging.INFO)) and limit.filter(
        record("x", level=logging.INFO)
    )


def test_lines_about_different_partitions_are_not_repeats() -> None:
    limit = RateLimit(interval=30, clock=lambda: 0.0)
    assert all(limit.filter(record(f"delay topic orders[{p}] was deleted")) for p in range(3))
    assert not limit.filter(record("delay topic orders[2] was deleted"))


def test_lines_with_one_repeat_key_are_repeats_whatever_their_text() -> None:
    now = [0.0]
    limit = RateLimit(interval=30, clock=lambda: now[0])

    def cancel(delay_id: str) -> logging.LogRecord:
        line = record("cancel of %s found nothing", delay_id, level=logging.WARNING)
        line.repeat_key = "cancel-not-found"
        return line

    assert limit.filter(cancel("a"))
    assert not limit.filter(cancel("b")) and not limit.filter(cancel("c"))
    assert limit.filter(record("cancel of %s found nothing", "d", level=logging.WARNING))
    now[0] = 30.0
    late = cancel("e")
    assert limit.filter(late)
    assert late.getMessage() == "cancel of e found nothing (2 more like this in the last 30s)"


def test_librdkafka_lines_that_are_not_the_operators_concern_are_lowered() -> None:
    noise = KafkaNoise()

    def line(text: str) -> logging.LogRecord:
        return record("%s", text, level=logging.WARNING)

    pid = line(
        "GETPID [rdkafka#producer-1] [thrd:main]: Failed to acquire idempotence PID from "
        "broker 127.0.0.1:19092/1: Broker: Coordinator load in progress: retrying"
    )
    refused = line(
        "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:19092/1]: Connect to "
        "ipv4#127.0.0.1:19092 failed: Connection refused (after 0ms in state CONNECT)"
    )
    assert noise.filter(pid) and pid.levelno == logging.INFO
    assert noise.filter(refused) and refused.levelno == logging.WARNING  # running: it matters
    noise.stopping = True
    late = line(refused.getMessage())
    assert noise.filter(late) and late.levelno == logging.DEBUG
    other = line("FAIL [rdkafka#producer-1]: SASL authentication failed")
    assert noise.filter(other) and other.levelno == logging.WARNING


def test_a_fenced_transactional_producer_is_a_warning_not_a_critical_line() -> None:
    noise = KafkaNoise()
    fenced = record(
        "%s",
        "FATAL [rdkafka#producer-9] [thrd:main]: Fatal error: Local: This "
        "instance has been fenced by a newer instance: ProduceRequest failed",
        level=logging.CRITICAL,
    )
    assert noise.filter(fenced) and fenced.levelno == logging.WARNING
    other = record(
        "%s",
        "FATAL [rdkafka#producer-9]: Fatal error: Broker: Cluster authorization failed",
        level=logging.CRITICAL,
    )
    assert noise.filter(other) and other.levelno == logging.CRITICAL
