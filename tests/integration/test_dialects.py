"""The dialects a delay topic may speak (topics.dialect) through the whole pipeline: what an etf1
producer sends, and the examples of Kaspr's guide, on a bridge process and the real servers. Run
beside the other tests (none checks a time)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from bridge.message import parse_time_ms
from testbed.harness import (
    Bridge,
    Collector,
    Received,
    Setup,
    cli_of,
    metric,
    produce_all,
    wait_ready,
)
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

Record = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


def produced_records(setup: Setup, count: int = 4) -> list[Received]:
    """Every record of the delay topic, read from its beginning."""
    reader = Collector(setup.services.bootstrap, [setup.delay], f"read-{setup.unique}")
    try:
        reader.until(lambda rs: len(rs) >= count, 30, "the delay topic's records")
    finally:
        reader.close()
    return reader.records


def test_the_etf1_dialect_takes_what_an_etf1_producer_sends(
    setup: Setup, bridges: list[Bridge]
) -> None:
    config = setup.tmp / "bridge.yaml"  # a mapping, which the environment cannot set
    config.write_text(f"topics:\n  dialect: {{{setup.delay}: etf1}}\n")
    bridge = setup.bridge()
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    bridges.append(bridge.start())
    target = setup.targets[0].encode()
    epoch = str(int(time.time()) + 2).encode()  # unix seconds
    etf1: list[Record] = [
        (
            b"timeout-1",
            b"expire 1",
            [
                ("scheduler-epoch", epoch),
                ("scheduler-target-topic", target),
                ("scheduler-target-key", b"order-1"),
            ],
        ),
        (
            b"timeout-2",
            b"expire 2",
            [
                ("scheduler-epoch", epoch),
                ("scheduler-target-topic", target),
                ("scheduler-target-key", b"order-2"),
            ],
        ),
        (b"timeout-2", None, []),  # a tombstone: timeout-2 is cancelled
        (
            b"timeout-3",
            b"late",
            [("scheduler-epoch", str(int(epoch) + 1).encode()), ("scheduler-target-topic", target)],
        ),
    ]
    produce_all(setup.services.bootstrap, setup.delay, etf1)
    collector = setup.collector()
    try:
        collector.until(
            lambda rs: {r.value for r in rs} >= {b"expire 1", b"late"}, 60, "the etf1 schedules"
        )
    finally:
        collector.close()
    # What etf1 itself delivers: the target key, or a null key when none is given ...
    assert sorted((r.key or b"", r.value, r.delay_id) for r in collector.records) == [
        (b"", b"late", "timeout-3"),
        (b"order-1", b"expire 1", "timeout-1"),
    ]
    [first] = [r for r in collector.records if r.value == b"expire 1"]
    [late] = [r for r in collector.records if r.value == b"late"]
    assert late.key is None
    assert first.due_ms == int(epoch) * 1000 <= first.timestamp_ms
    # ... with the schedule's own headers and the three etf1 adds on delivery.
    produced = {r.key: r for r in produced_records(setup)}
    etf1_headers = {n: v for n, v in first.headers if n.startswith("scheduler-")}
    assert etf1_headers == {
        "scheduler-epoch": epoch,
        "scheduler-target-topic": target,
        "scheduler-target-key": b"order-1",
        "scheduler-key": b"timeout-1",
        "scheduler-topic": setup.delay.encode(),
        "scheduler-timestamp": str(produced[b"timeout-1"].timestamp_ms // 1000).encode(),
    }
    assert [n for n, _ in first.headers if n.startswith("scheduler-")][:3] == [
        "scheduler-epoch",
        "scheduler-target-topic",
        "scheduler-target-key",
    ]
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1


def test_the_kaspr_dialect_takes_the_examples_of_kasprs_guide(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The user guide's ADD (its own past time too), REPLACE and CANCEL, and a request Kaspr
    rejects, as a Kaspr producer sends them; then the command line on the same topic."""
    config = setup.tmp / "bridge.yaml"
    config.write_text(f"topics:\n  dialect: {{{setup.delay}: kaspr}}\n")
    bridge = setup.bridge()
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    bridges.append(bridge.start())
    # Ready before the requests are sent: the first check below must come before the replaced
    # request falls due, whatever the bridge's start-up took (in CI once, it came after).
    assert wait_ready(bridge)
    target = setup.targets[0].encode()

    def at(seconds: float) -> bytes:  # "UTC timestamp in ISO format", as the guide writes it
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds)).encode()

    def request(
        rid: bytes | None, when: bytes | None, action: bytes | None = None, **headers: bytes
    ) -> list[tuple[str, bytes | None]]:
        out: list[tuple[str, bytes | None]] = [("x-scheduler-deliver-to", target)]
        out += [] if when is None else [("x-scheduler-deliver-at", when)]
        out += [] if rid is None else [("x-scheduler-request-id", rid)]
        out += [] if action is None else [("x-scheduler-action", action)]
        return out + [(k.replace("_", "-"), v) for k, v in headers.items()]

    value = b'{"type": "send-reminder"}'
    first_due = at(8)
    kaspr: list[Record] = [
        # ADD, then REPLACE of the same request id with a new time and value.
        (b"order-123", value, request(b"reminder-order-123", first_due, trace=b"t-1")),
        (
            b"order-123",
            b'{"type": "send-reminder", "v": 2}',
            request(b"reminder-order-123", at(12), b"REPLACE"),
        ),
        # ADD, then CANCEL (only the request id).
        (b"order-456", value, request(b"reminder-order-456", at(8))),
        (
            b"order-456",
            None,
            [("x-scheduler-action", b"CANCEL"), ("x-scheduler-request-id", b"reminder-order-456")],
        ),
        # The guide's own example time is in the past: delivered at once.
        (b"order-789", value, request(b"reminder-order-789", b"2026-05-24T12:30:00Z")),
        # Kaspr rejects a REPLACE without a request id; the bridge dead-letters it.
        (b"order-000", value, request(None, at(4), b"REPLACE")),
    ]
    collector = setup.collector()  # joining its group meanwhile
    produce_all(setup.services.bootstrap, setup.delay, kaspr)
    try:
        collector.until(lambda rs: len(rs) >= 2, 30, "the past-due request and the rejection")
        assert [r.delay_id for r in collector.of(setup.targets[0])] == ["reminder-order-789"]
        [dead] = collector.of(setup.dlq)
        assert (dead.key, dead.header("delay-error")) == (b"order-000", b"bad-header")
        assert dead.header("x-scheduler-action") == b"REPLACE"  # the request as it was sent
        detail = dead.header("delay-error-detail") or b""
        assert b"a REPLACE needs x-scheduler-request-id" in detail
        collector.until(lambda rs: len(rs) >= 3, 30, "the replaced request")
        cli = cli_of(bridge)
        made = cli(
            "produce",
            "--target",
            setup.targets[0],
            "--after",
            "3s",
            "--id",
            "cli-1",
            "--key",
            "u1",
            "from the CLI",
        )
        assert made.returncode == 0, made.stderr
        made = cli(
            "produce",
            "--target",
            setup.targets[0],
            "--after",
            "30s",
            "--id",
            "cli-2",
            "--key",
            "u2",
            "cancelled",
        )
        assert made.returncode == 0, made.stderr
        wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") >= 6, 30, "both stored")
        done = cli("cancel", "--id", "cli-2")
        assert done.returncode == 0, done.stderr
        wait_for(
            lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 2,
            10,
            "the CLI's cancel counted",
        )
        collector.until(lambda rs: len(rs) >= 4, 30, "the CLI's record")
    finally:
        collector.close()
    got = {r.delay_id: r for r in collector.of(setup.targets[0])}
    assert sorted(got) == ["cli-1", "reminder-order-123", "reminder-order-789"]
    replaced = got["reminder-order-123"]
    assert (replaced.key, replaced.value) == (b"order-123", b'{"type": "send-reminder", "v": 2}')
    assert replaced.due_ms > parse_time_ms(first_due.decode())  # the REPLACE's time
    assert replaced.due_ms <= replaced.timestamp_ms
    # Kaspr delivers the record's headers without its x-scheduler-* ones.
    assert not [n for n, _ in replaced.headers if n.startswith("x-scheduler-")]
    past = got["reminder-order-789"]
    assert (past.key, past.value, past.header("trace")) == (b"order-789", value, None)
    assert got["cli-1"].value == b"from the CLI"
    assert metric(bridge, "delay_bridge_replaced_total") == 1
    assert metric(bridge, 'delay_bridge_dead_lettered_total{reason="bad-header"}') == 1
    # What the command line wrote is a Kaspr request, as another Kaspr producer would send it.
    by_cli = [r for r in produced_records(setup, 9) if r.key == b"u2"]
    assert [
        (
            r.header("x-scheduler-action"),
            r.header("x-scheduler-request-id"),
            r.header("x-scheduler-deliver-to"),
        )
        for r in by_cli
    ] == [(None, b"cli-2", target), (b"CANCEL", b"cli-2", None)]
