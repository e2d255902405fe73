"""A record keeps its identity, (delay topic, delay-id), through every tool: a default id like any
other id (after a fire or a reschedule, from another partition, for a far-future record), the
journal naming a record by its own id, and ``trace`` telling apart the records that held one id.
On the real servers, beside the other tests (none checks a time)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from bridge.message import H_AFTER, H_CANCEL, H_ID, H_TARGET_TOPIC, Headers
from testbed.harness import (
    Bridge,
    Setup,
    cli_of,
    metric,
    produce_all,
    produce_to,
)
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration


def trace(setup: Setup, *args: str) -> tuple[int, dict[str, Any], str]:
    """``delay-bridge trace ARGS --json``: exit code, the JSON, stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "trace", *args, "--json"],
        cwd=ROOT,
        env=setup.bridge().env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {}, proc.stderr


def test_a_default_delay_id_cancels_like_any_other(setup: Setup, bridges: list[Bridge]) -> None:
    """``cancel --id <topic>:<partition>:<offset>`` (the id `list` shows for a record produced
    without one) printed a success line and exited 0, while the bridge found nothing (the id index
    holds caller-given ids only) and delivered the record."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    cli = cli_of(bridge)
    target = setup.targets[0]
    # Due in 10 min: no command-line run races its due time (4 s did, once in CI). The cancelled
    # count says it was found waiting.
    made = cli("produce", "--target", target, "--after", "10m", "--key", "u1", "plain")
    assert made.returncode == 0, made.stderr
    default_id = made.stdout.split()[-1]  # <topic>:<partition>:<offset>
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    listed = cli("list", "--id", default_id)
    assert listed.returncode == 0 and default_id in listed.stdout, listed.stdout
    done = cli("cancel", "--id", default_id)
    assert done.returncode == 0, done.stderr
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1,
        10,
        "the cancel counted",
    )
    after = cli("produce", "--target", target, "--after", "1s", "--key", "u1", "after")
    assert after.returncode == 0, after.stderr
    records = setup.await_value(b"after", 60, "the later record")
    assert [r.value for r in records] == [b"after"]
    assert json.loads(cli("list", "--json").stdout) == []  # nothing of u1 waits


def test_far_future_records_show_in_the_tools_as_any_other(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A record due past store.payload_horizon is kept as a reference: list --id said "(no
    waiting records)", cancel --id said it waits in no partition (and exited 1), status showed no
    next due time, list --due-before left it out. Its tier is an internal matter."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    cli = cli_of(bridge)
    made = cli(
        "produce",
        "--target",
        setup.targets[0],
        "--after",
        "2h",
        "--id",
        "far-id",
        "--key",
        "k-far",
        "far away",
    )
    assert made.returncode == 0, made.stderr
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    partition = int(made.stdout.split()[-1].split(":")[1])
    listed = cli("list", "--id", "far-id", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["delay_id"], row["target"], row["key"], row["value_bytes"]) == (
        "far-id",
        setup.targets[0],
        "k-far",
        len(b"far away"),
    )
    in_3h = str(time.time_ns() // 1_000_000 + 3 * 3_600_000)
    before = cli("list", "--due-before", in_3h, "--json")
    assert [r["delay_id"] for r in json.loads(before.stdout)] == ["far-id"], before.stdout
    status = json.loads(cli("status", "--json").stdout)
    [mine] = [p for p in status["partitions"] if p["partition"] == partition]
    assert mine["references"] == 1 and mine["next_due_ms"] == row["due_ms"], mine
    done = cli("cancel", "--id", "far-id")
    assert done.returncode == 0, done.stderr
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1,
        10,
        "the cancel counted",
    )
    assert json.loads(cli("list", "--id", "far-id", "--json").stdout) == []


def test_a_far_future_record_is_found_by_its_default_id(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A record produced without a delay-id, due in 3 h (kept as a reference): ``list``,
    ``trace`` and ``cancel --id <topic>:<p>:<offset>`` did not find it (a default id was looked
    up by a pass over the records held whole, which a reference is not). The record at that
    offset is read in the delay topic for its due time, and Redis asked for it there."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    cli = cli_of(bridge)
    made = cli("produce", "--target", setup.targets[0], "--after", "3h", "far, no id")
    assert made.returncode == 0, made.stderr
    default_id = made.stdout.split()[-1]
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    listed = cli("list", "--id", default_id, "--json")
    assert [r["delay_id"] for r in json.loads(listed.stdout)] == [default_id], listed.stderr
    traced = cli("trace", "--id", default_id, "--json")
    assert json.loads(traced.stdout)["fate"] == "waiting", traced.stdout + traced.stderr
    done = cli("cancel", "--id", default_id)
    assert done.returncode == 0, done.stderr
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1,
        10,
        "the cancel counted",
    )
    assert json.loads(cli("list", "--id", default_id, "--json").stdout) == []


def test_a_default_id_answers_for_its_replacement_and_from_any_partition(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A record without a delay-id, rescheduled by its default id: the replacement carries that
    id, yet ``list``, ``trace`` and ``cancel --id`` with it found nothing (a default id was looked
    for at its offset alone). And a cancel of a default id produced to another partition than
    the one it names found nothing (the id index holds caller-given ids only): the contract's
    default id is an id like any other, whatever partitioner the producer used."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    cli = cli_of(bridge)
    target = setup.targets[0].encode()
    later: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"10m")]
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"moved", later), (0, b"gone", later)])
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 2, 30, "both stored")
    moved, gone = f"{setup.delay}:0:0", f"{setup.delay}:0:1"
    done = cli("reschedule", "--id", moved, "--shift", "1h")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: metric(bridge, "delay_bridge_replaced_total") == 1, 30, "the replacement")
    listed = json.loads(cli("list", "--id", moved, "--json").stdout)
    assert [(r["delay_id"], r["value_bytes"]) for r in listed] == [(moved, 5)], listed
    assert json.loads(cli("trace", "--id", moved, "--json").stdout)["fate"] == "waiting"
    assert cli("cancel", "--id", moved).returncode == 0
    produce_to(setup.services.bootstrap, setup.delay, [(1, None, [(H_CANCEL, gone.encode())])])
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 2,
        30,
        "both cancelled",
    )
    assert json.loads(cli("list", "--json").stdout) == []


def test_a_record_cancelled_in_bulk_is_traced_by_its_own_delay_id(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``cancel --key-prefix customer-17: --yes`` names each record by its origin; the journal
    entry took that name for the record's, so ``trace --id c17-o6`` said "unknown" (exit 1).
    The entry names the record's own delay-id, in its partition and from another, for a record
    held whole and one kept as a reference (due in 3 h: its own id is read in the delay topic)."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    cli = cli_of(bridge)
    target = setup.targets[0].encode()
    later: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"10m")]
    far: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"3h")]
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"o6", [*later, (H_ID, b"c17-o6")]),
            (1, b"o7", [*later, (H_ID, b"c17-o7")]),
            (1, b"o9", [*far, (H_ID, b"c17-o9")]),
        ],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 3, 30, "all stored")
    done = cli("cancel", "--due-after", "5m", "--yes")
    assert done.returncode == 0, done.stderr
    # And two by their origin from another partition than their own.
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (2, b"o8", [*later, (H_ID, b"c17-o8")]),
            (2, b"o10", [*far, (H_ID, b"c17-o10")]),
        ],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 5, 30, "the others stored")
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, None, [(H_CANCEL, f"{setup.delay}:2:0".encode())]),
            (0, None, [(H_CANCEL, f"{setup.delay}:2:1".encode())]),
        ],
    )
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 5,
        30,
        "all five cancelled",
    )
    for delay_id in ("c17-o6", "c17-o7", "c17-o8", "c17-o9", "c17-o10"):
        traced = cli("trace", "--id", delay_id, "--json")
        assert traced.returncode == 0, traced.stderr
        assert json.loads(traced.stdout)["fate"] == "cancelled", traced.stdout


def test_trace_tells_the_records_that_held_one_id_apart(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Three attempts of one retry, each replacing the one before by its delay-id, the last
    delivered: ``trace --id`` showed the first attempt's record (the oldest journal entry's
    origin) beside the last one's fate; and one id scheduled twice, each delivered, merged into
    one history with two ``delivered`` rows. Each record that held the id is its own use now:
    the delivered or waiting one first, with its own record as produced."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()

    def attempt(delay_id: bytes, value: bytes, after: bytes) -> tuple[bytes, bytes, Headers]:
        return (b"k", value, [(H_TARGET_TOPIC, target), (H_AFTER, after), (H_ID, delay_id)])

    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            attempt(b"retry", b"attempt-5s", b"10m"),
            attempt(b"retry", b"attempt-10s", b"10m"),
            attempt(b"retry", b"attempt-20s", b"0ms"),
            attempt(b"twice", b"first", b"0ms"),
        ],
    )
    setup.await_value(b"first", 60, "the first use of twice")
    produce_all(setup.services.bootstrap, setup.delay, [attempt(b"twice", b"second", b"0ms")])
    setup.await_value(b"second", 60, "the second use of twice")
    wait_for(
        lambda: trace(setup, "--id", "retry")[1].get("fate") == "delivered",
        30,
        "retry's delivery journaled",
    )
    wait_for(
        lambda: len(trace(setup, "--id", "twice")[1].get("uses", [])) == 1,
        30,
        "both uses of twice journaled",
    )
    code, retry, _ = trace(setup, "--id", "retry")
    assert code == 0 and retry["fate"] == "delivered", retry
    assert retry["record"]["value"] == "attempt-20s"
    assert [u["fate"] for u in retry["uses"]] == ["replaced", "replaced"]
    assert sorted(u["record"]["value"] for u in retry["uses"]) == ["attempt-10s", "attempt-5s"]
    twice = trace(setup, "--id", "twice")[1]
    assert (twice["fate"], twice["record"]["value"]) == ("delivered", "second")
    assert [e["event"] for e in twice["events"]].count("delivered") == 1
    [earlier] = twice["uses"]
    assert (earlier["fate"], earlier["record"]["value"]) == ("delivered", "first")
