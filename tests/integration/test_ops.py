"""The operator commands on the real services: ``status`` and ``list`` read what Redis holds and
where Kafka's offsets stand, for records in every state on two partitions; ``dlq replay`` sends
dead letters back once their cause is fixed, and never twice."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
import yaml

from bridge.client import delay_headers, partition_for
from bridge.message import (
    H_AFTER,
    H_DELIVER_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_ID,
    H_ORIGIN,
    H_TARGET_TOPIC,
    Headers,
    Priority,
    Scheduled,
)
from bridge.ops import AHEAD, STALL_S
from bridge.store import Shard, Store
from testbed.harness import Bridge, Collector, Setup, cli_of, metric, produce_all
from tests.conftest import ROOT, TopicFactory, wait_for
from tests.integration.test_cancel_pipeline import Record as Scheduling
from tests.integration.test_cancel_pipeline import check, settle

Record = tuple[bytes, bytes, Headers]

pytestmark = pytest.mark.integration

HOUR = 3_600_000


def cli(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    env = setup.bridge().env
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def held(setup: Setup, redis_client: redis.Redis) -> dict[str, Any]:
    """Partition 0: three records due in an hour (one with a delay-id) and two overdue;
    partition 1: one in flight, one due in two hours, and one due in three hours kept as a
    reference."""
    store = Store(redis_client, f"test-{setup.unique}")
    now = store.time_ms()
    p0, p1 = Shard(setup.delay, 0), Shard(setup.delay, 1)
    target = setup.targets[0]

    def rec(
        offset: int,
        due: int,
        delay_id: str | None = None,
        value: bytes = b"v",
        priority: Priority = Priority.NORMAL,
    ) -> Scheduled:
        return Scheduled(
            offset,
            due,
            target,
            b"key-%d" % offset,
            value,
            [],
            delay_id or f"{setup.delay}:0:{offset}",
            priority=priority,
        )

    # Of the three due in an hour, one high and one low: each lane is listed, in due order.
    store.add(
        {
            p0: (
                4,
                [
                    rec(0, now - 10_000),
                    rec(1, now - 5_000),
                    rec(2, now + HOUR, "expire-7", priority=Priority.HIGH),
                    rec(3, now + HOUR + 1, priority=Priority.LOW),
                    rec(4, now + HOUR + 2, value=b"x" * 300),
                ],
            )
        }
    )
    store.add(
        {
            p1: (
                1,
                [
                    Scheduled(0, now - 1000, target, None, b"v", [], f"{setup.delay}:1:0"),
                    Scheduled(1, now + 2 * HOUR, target, None, b"v", [], f"{setup.delay}:1:1"),
                ],
            )
        }
    )
    far = Scheduled(2, now + 3 * HOUR, target, None, b"v", [], f"{setup.delay}:1:2")
    store.add({p1: (2, [far])}, refer_after_ms=now + 2 * HOUR)
    assert len(store.claim([p1], 10, 60_000)) == 1
    return {"now": now}


def test_status_shows_every_state_per_partition(setup: Setup, held: dict[str, Any]) -> None:
    proc = cli(setup, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["partition"]: r for r in doc["partitions"]}
    assert sorted(rows) == [0, 1, 2]
    p0, p1, p2 = rows[0], rows[1], rows[2]
    assert (p0["waiting"], p0["overdue"], p0["in_flight"], p0["watermark"]) == (5, 2, 0, 4)
    assert p0["next_due_ms"] == held["now"] - 10_000
    assert 10 <= p0["oldest_overdue_s"] < 70
    assert (p1["waiting"], p1["overdue"], p1["in_flight"], p1["watermark"]) == (1, 0, 1, 2)
    assert (p0["references"], p1["references"], p2["references"]) == (0, 1, 0)
    assert p1["next_due_ms"] == held["now"] + 2 * HOUR and p1["oldest_overdue_s"] == 0
    assert (p2["waiting"], p2["watermark"], p2["next_due_ms"]) == (0, -1, -1)
    for row in rows.values():  # nothing produced to the topic, nothing committed
        assert (row["committed"], row["log_end"], row["lag"]) == (-1, 0, 0)
    assert doc["totals"]["waiting"] == 6 and doc["totals"]["in_flight"] == 1
    assert doc["totals"]["references"] == 1
    assert doc["totals"]["next_due_ms"] == held["now"] - 10_000
    text = cli(setup, "status")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["topic", "partition", "waiting", "references"]
    assert lines[-2].split()[:3] == ["total", "6", "1"]


def test_list_shows_waiting_records_in_due_order(setup: Setup, held: dict[str, Any]) -> None:
    proc = cli(setup, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    # The reference (1, 2) is listed too; its offset holds no record in the topic (the fixture
    # wrote Redis alone), so it shows as bound for the DLQ, as the read-back would store it.
    assert [(r["partition"], r["offset"]) for r in records] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, 1),
        (1, 2),
    ]
    assert records[6]["target"] == "" and records[6]["due_ms"] == held["now"] + 3 * HOUR
    third = records[2]
    assert (third["delay_id"], third["target"], third["key"], third["value_bytes"]) == (
        "expire-7",
        setup.targets[0],
        "key-2",
        1,
    )
    assert records[4]["value_bytes"] == 300
    assert [r["priority"] for r in records] == [
        "normal",
        "normal",
        "high",
        "low",
        "normal",
        "normal",
        "normal",
    ]
    page = json.loads(cli(setup, "list", "--json", "--limit", "2", "--partition", "0").stdout)
    assert [r["offset"] for r in page] == [0, 1]
    due_before = str(held["now"])
    overdue = json.loads(cli(setup, "list", "--json", "--due-before", due_before).stdout)
    assert [r["offset"] for r in overdue] == [0, 1]
    by_id = json.loads(cli(setup, "list", "--json", "--id", "expire-7").stdout)
    assert [r["offset"] for r in by_id] == [2]
    by_origin = json.loads(cli(setup, "list", "--json", "--id", f"{setup.delay}:0:3").stdout)
    assert [r["offset"] for r in by_origin] == [3]
    text = cli(setup, "list", "--limit", "3")
    assert text.returncode == 0 and "key-0" in text.stdout
    assert text.stdout.splitlines()[0].split()[3] == "priority"
    assert text.stdout.splitlines()[3].split()[3] == "high"


def test_list_says_how_many_it_left_out_and_takes_times_from_now(
    setup: Setup, held: dict[str, Any]
) -> None:
    def listed(*args: str) -> tuple[list[int], str]:
        proc = cli(setup, "list", "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return [r["offset"] for r in json.loads(proc.stdout)], proc.stderr.strip()

    # Seven wait (six whole, one a reference; the one in flight does not count).
    assert listed("--limit", "2") == ([0, 1], "2 of 7 shown; --limit to see more")
    assert listed("--limit", "7") == ([0, 1, 2, 3, 4, 1, 2], "")
    # Due within 90 minutes from now: the five of partition 0; within 4 hours: the reference too.
    assert listed("--due-before", "90m", "--limit", "1") == (
        [0],
        "1 of 5 shown; --limit to see more",
    )
    assert listed("--due-before", "4h", "--limit", "6")[1] == "6 of 7 shown; --limit to see more"
    assert listed("--due-before=-1m") == ([], "")  # a minute ago: none was due so early
    assert listed("--due-before", "+90m", "--partition", "0") == ([0, 1, 2, 3, 4], "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--topic", "nope"], "--topic nope: not one of topics.delay"),
        (["list", "--limit", "0"], "--limit 0: 1 to 1,000"),
        (["list", "--limit", "1001"], "--limit 1001: 1 to 1,000"),
        (["list", "--limit", "\u0663"], "a whole number"),
        (["list", "--due-before", "soon"], "--due-before: not a time"),
        (["list", "--partition", "9"], "--partition 9: no such partition"),
    ],
)
def test_bad_input_is_one_line(setup: Setup, args: list[str], message: str) -> None:
    proc = cli(setup, *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dlq_replay_schedules_again_once_the_cause_is_fixed(
    setup: Setup, topics: TopicFactory, bridges: list[Bridge]
) -> None:
    missing = f"missing-{topics.suffix}"  # a target that does not exist yet
    narrow = setup.tmp / "narrow.yaml"
    narrow.write_text(
        yaml.safe_dump({"topics": {"allowed_targets": [re.escape(setup.targets[0]), "missing-.*"]}})
    )
    first = setup.bridge("bridge-1", egress__max_attempts="1")
    first.env["DELAY_BRIDGE_CONFIG"] = str(narrow)
    bridges.append(first.start())
    records: list[tuple[bytes, bytes, Headers]] = [
        (b"k1", b"failed-1", [(H_TARGET_TOPIC, missing.encode()), (H_AFTER, b"0ms")]),
        (b"k2", b"failed-2", [(H_TARGET_TOPIC, missing.encode()), (H_AFTER, b"0ms")]),
        (b"k3", b"refused-1", [(H_TARGET_TOPIC, setup.targets[1].encode()), (H_AFTER, b"0ms")]),
        (b"k4", b"refused-2", [(H_TARGET_TOPIC, setup.targets[1].encode()), (H_AFTER, b"0ms")]),
    ]
    produce_all(setup.services.bootstrap, setup.delay, records)
    # A dead letter from some other bridge: its origin is not one of our delay topics.
    produce_all(
        setup.services.bootstrap,
        setup.dlq,
        [(b"k5", b"foreign", [(H_ERROR, b"bad-header"), (H_ORIGIN, b"other:0:7")])],
    )
    dead = setup.collector()
    try:
        dead.until(lambda rs: len(dead.of(setup.dlq)) >= 5, 90, "four dead letters")
    finally:
        dead.close()
    reasons = sorted((r.header(H_ERROR) or b"").decode() for r in dead.of(setup.dlq))
    assert reasons == ["bad-header", *["delivery-failed"] * 2, *["target-not-allowed"] * 2]

    def replay(*args: str) -> str:
        proc = cli(setup, "dlq", "replay", *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert replay("--dry-run") == (
        "would replay 4 (2 delivery-failed, 2 target-not-allowed); 0 "
        "left out by the filters; 1 skipped: their origin is not a "
        "configured delay topic"
    )
    assert replay("--dry-run", "--reason", "delivery-failed").startswith(
        "would replay 2 (2 delivery-failed); 3 left out by the filters"
    )
    # Fixed: the target exists, the allow-list is widened; the bridge restarted with it.
    topics("missing")
    assert first.stop() == 0  # leaves the group: the next one takes over at once
    second = setup.bridge("bridge-2")
    bridges.append(second.start())
    assert replay().startswith("replayed 4 (2 delivery-failed, 2 target-not-allowed)")
    arrived = Collector(setup.services.bootstrap, [missing, setup.targets[1]], f"c-{setup.unique}")
    try:
        arrived.until(lambda rs: len(rs) >= 4, 60, "the replayed records delivered")
    finally:
        arrived.close()
    assert sorted((r.topic, r.key, r.value) for r in arrived.records) == [
        (missing, b"k1", b"failed-1"),
        (missing, b"k2", b"failed-2"),
        (setup.targets[1], b"k3", b"refused-1"),
        (setup.targets[1], b"k4", b"refused-2"),
    ]
    assert all(r.header(H_ERROR) is None and r.header(H_ORIGIN) is None for r in arrived.records)
    assert replay().startswith("replayed 0; 0 left out")  # nothing twice


def test_dlq_replay_refuses_bad_input_in_one_line(setup: Setup) -> None:
    for args, message in (
        (["--reason", "oops"], "--reason oops: not a delay-error"),
        (["--since", "yesterday"], "--since: not a time"),
        (["--limit", "0"], "--limit 0: at least 1"),
    ):
        proc = cli(setup, "dlq", "replay", *args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_output_into_a_closed_pipe_is_no_traceback(setup: Setup, held: dict[str, Any]) -> None:
    """``status | head`` and ``list | head``: the reader is gone before the table is written."""
    env = setup.bridge().env
    for command in ("status", "list --limit 100"):
        proc = subprocess.run(
            f"{sys.executable} -m bridge {command} | true",
            shell=True,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_produce_warns_of_a_target_that_does_not_exist(setup: Setup) -> None:
    missing = f"nowhere-{setup.unique}"
    proc = cli(setup, "produce", "--target", missing, "--after", "1h", "--key", "k", "v")
    assert proc.returncode == 0, proc.stderr  # it may be created before the record is due
    assert f"warning: target topic {missing} does not exist" in proc.stderr
    assert proc.stdout.startswith("scheduled")
    there = cli(setup, "produce", "--target", setup.targets[0], "--after", "1h", "v")
    assert there.returncode == 0 and "warning" not in there.stderr, there.stderr


def test_a_filtered_dlq_replay_says_what_it_passed_over_and_how_to_get_it_back(
    setup: Setup,
) -> None:
    origin = f"{setup.delay}:0:7".encode()
    dead: list[tuple[bytes, bytes, Headers]] = [
        (
            f"k{i}".encode(),
            f"v{i}".encode(),
            [
                (H_ERROR, reason),
                (H_ORIGIN, origin),
                (H_TARGET_TOPIC, setup.targets[0].encode()),
                (H_AFTER, b"1h"),
            ],
        )
        for i, reason in enumerate([b"delivery-failed", b"target-not-allowed"] * 2)
    ]
    produce_all(setup.services.bootstrap, setup.dlq, dead)

    def replay(*args: str) -> list[str]:
        proc = cli(setup, "dlq", "replay", *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()

    first = replay("--reason", "delivery-failed")
    assert first[0].startswith("replayed 2 (2 delivery-failed); 2 left out by the filters")
    assert first[1] == (
        f"2 left out are passed over for good in the group "
        f"bridge-{setup.unique}.dlq-replay: replay them with --from-beginning "
        "and filters that select them (e.g. --reason)"
    )
    assert replay()[0].startswith("replayed 0; 0 left out")  # passed over, as it said
    back = replay("--from-beginning", "--reason", "target-not-allowed")
    assert back[0].startswith("replayed 2 (2 target-not-allowed); 2 left out")
    assert replay()[0].startswith("replayed 0; 0 left out")  # and the group is past them again
    got = Collector(setup.services.bootstrap, [setup.delay], f"c-{setup.unique}")
    try:
        got.until(lambda rs: len(rs) >= 4, 30, "the four replayed records")
    finally:
        got.close()
    assert sorted(r.value or b"" for r in got.records) == [b"v0", b"v1", b"v2", b"v3"]


def test_dlq_list_shows_dead_letters_with_their_reasons_and_details(setup: Setup) -> None:
    dead: list[tuple[bytes, bytes, Headers]] = [
        (
            f"k{i}".encode(),
            b"v" * i,
            [
                (H_ERROR, reason),
                (H_ERROR_DETAIL, b"why %d" % i),
                (H_ORIGIN, f"{setup.delay}:0:{i}".encode()),
                (H_TARGET_TOPIC, b"orders"),
            ],
        )
        for i, reason in enumerate([b"expired", b"delivery-failed", b"expired"])
    ]
    produce_all(setup.services.bootstrap, setup.dlq, dead)

    def listed(*args: str) -> tuple[list[dict[str, Any]], str]:
        proc = cli(setup, "dlq", "list", "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), proc.stderr.strip()

    every, summary = listed()
    assert [
        (d["reason"], d["detail"], d["origin"], d["key"], d["value_bytes"], d["target"])
        for d in every
    ] == [
        ("expired", "why 0", f"{setup.delay}:0:0", "k0", 0, "orders"),
        ("delivery-failed", "why 1", f"{setup.delay}:0:1", "k1", 1, "orders"),
        ("expired", "why 2", f"{setup.delay}:0:2", "k2", 2, "orders"),
    ]
    assert summary == "3 match: 1 delivery-failed, 2 expired"
    first, summary = listed("--reason", "expired", "--limit", "1")
    assert [d["key"] for d in first] == ["k0"]
    assert summary == "1 of 2 shown; --limit to see more; 2 match: 2 expired"
    assert listed("--until", "1h") == ([], "0 match")  # dead-lettered an hour ago or earlier
    assert len(listed("--since", "1h")[0]) == 3
    text = cli(setup, "dlq", "list")
    assert text.returncode == 0 and text.stdout.splitlines()[0].split()[:3] == [
        "dead-lettered",
        "reason",
        "origin",
    ]
    assert "why 1" in text.stdout and text.stdout.splitlines()[-1].startswith("3 match")
    # The listing commits nothing: a replay still finds all three.
    assert cli(setup, "dlq", "replay", "--dry-run").stdout.startswith("would replay 3")


def test_a_bulk_cancel_counts_then_cancels_what_its_filters_match(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Records of two customers for two targets, due soon, in an hour (one with a delay-id of
    its own) and in three hours (kept as a reference): a filter on the target, a key prefix and
    a due time counts the matches per partition, then cancels them through cancel records the
    running bridge applies — a reference's key read in the delay topic. Run again: nothing
    matches, exit 1."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    t0, t1 = (t.encode() for t in setup.targets[:2])

    def later(key: bytes, target: bytes, after: bytes, *more: tuple[str, bytes]) -> Record:
        return key, b"v", [(H_TARGET_TOPIC, target), (H_AFTER, after), *more]

    placed = produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            later(b"cust-1-a", t0, b"1h"),
            later(b"cust-1-b", t0, b"1h", (H_ID, b"order-b")),
            later(b"cust-2-c", t0, b"1h"),
            later(b"cust-1-d", t1, b"1h"),
            later(b"cust-1-e", t0, b"3h"),
            later(b"cust-1-f", t0, b"2m"),
        ],
    )

    def keys() -> list[str]:
        proc = cli(setup, "list", "--json", "--limit", "100")
        return sorted(r["key"] for r in json.loads(proc.stdout))

    wait_for(lambda: len(keys()) == 6, 60, "all six stored")
    chosen = ["--target", setup.targets[0], "--key-prefix", "cust-1-", "--due-after", "10m"]
    counted = cli(setup, "cancel", *chosen, "--dry-run")
    assert counted.returncode == 0, counted.stderr
    per_partition = collections.Counter(p for p, _ in (placed[0], placed[1], placed[4]))
    table = ", ".join(f"{setup.delay}:{p} {n}" for p, n in sorted(per_partition.items()))
    assert counted.stdout.strip() == f"would cancel 3 waiting records: {table}"
    assert len(keys()) == 6  # a dry run changes nothing
    done = cli(setup, "cancel", *chosen, "--yes")
    assert done.returncode == 0 and done.stdout.startswith("cancelled 3 waiting records"), done
    wait_for(lambda: keys() == ["cust-1-d", "cust-1-f", "cust-2-c"], 60, "the three cancelled")
    again = cli(setup, "cancel", *chosen, "--yes")
    assert again.returncode == 1 and "no waiting record matches" in again.stderr
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 3


def test_a_key_prefix_alone_is_matched_by_the_keys_of_references(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A key prefix with no other filter: a reference's key alone decides (its record is not
    parsed). References of two customers, one without a key, and a whole record: exactly the
    customer's are counted and cancelled."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()

    def later(key: bytes | None, after: bytes) -> tuple[bytes | None, bytes, Headers]:
        return key, b"v", [(H_TARGET_TOPIC, target), (H_AFTER, after)]

    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            later(b"a-1", b"3h"),
            later(b"b-1", b"3h"),
            later(None, b"3h"),
            later(b"a-2", b"3h"),
            later(b"ab", b"3h"),
            later(b"a-3", b"1h"),
        ],
    )

    def keys() -> list[str | None]:
        proc = cli(setup, "list", "--json", "--limit", "100")
        return sorted((r["key"] for r in json.loads(proc.stdout)), key=str)

    wait_for(lambda: len(keys()) == 6, 60, "all six stored")
    counted = cli(setup, "cancel", "--key-prefix", "a-", "--dry-run")
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.startswith("would cancel 3 waiting records"), counted.stdout
    done = cli(setup, "cancel", "--key-prefix", "a-", "--yes")
    assert done.returncode == 0 and done.stdout.startswith("cancelled 3 waiting records"), done
    wait_for(lambda: keys() == [None, "ab", "b-1"], 60, "the three cancelled")


def test_a_bulk_cancel_with_no_bridge_applying_stops_waiting_for_it(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """More cancels than a command keeps ahead of the bridge (``AHEAD``), and no bridge running:
    the command waits ``STALL_S`` for the bridge, says it stopped waiting, produces the rest and
    exits 0; a bridge started then applies every cancel."""
    count = AHEAD + 500
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    records = [
        (b"s-%d" % i, b"v", [(H_TARGET_TOPIC, target), (H_AFTER, b"3h")]) for i in range(count)
    ]
    produce_all(setup.services.bootstrap, setup.delay, records)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") >= count, 60, "all stored")
    assert bridge.stop() == 0
    done = cli(setup, "cancel", "--key-prefix", "s-", "--yes")
    assert done.returncode == 0 and done.stdout.startswith(f"cancelled {count:,} waiting"), done
    assert f"applied none of {setup.delay}'s records for {STALL_S:.0f} s" in done.stderr
    again = setup.bridge("bridge-2").start()
    bridges.append(again)
    wait_for(lambda: again.get("/readyz")[0] == 200, 60, "ready again")
    applied = 'delay_bridge_cancelled_total{result="cancelled"}'
    wait_for(lambda: metric(again, applied) == count, 60, "every cancel applied")


def test_fire_and_reschedule_replace_what_they_match_and_nothing_is_delivered_twice(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Three records of one customer (one with a delay-id of its own, one far off: a reference)
    fired in bulk: each delivered now, once, with the delay-id it would have had, its original
    withdrawn. Another customer's record rescheduled by its default id: an hour later."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    t0 = setup.targets[0].encode()

    def later(key: bytes, after: bytes, *more: tuple[str, bytes]) -> Record:
        return key, b"value-" + key, [(H_TARGET_TOPIC, t0), (H_AFTER, after), ("h", b"1"), *more]

    placed = produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            later(b"f-a", b"1h"),
            later(b"f-b", b"1h", (H_ID, b"order-b")),
            later(b"f-c", b"3h"),
            later(b"g-d", b"1h"),
        ],
    )
    origins = [f"{setup.delay}:{p}:{o}" for p, o in placed]

    def waiting() -> dict[str, int]:
        proc = cli(setup, "list", "--json", "--limit", "100")
        return {r["key"]: r["due_ms"] for r in json.loads(proc.stdout)}

    wait_for(lambda: len(waiting()) == 4, 60, "all four stored")
    due_d = waiting()["g-d"]
    assert cli(setup, "fire", "--key-prefix", "f-", "--dry-run").stdout.startswith(
        "would fire 3 waiting records"
    )
    fired = cli(setup, "fire", "--key-prefix", "f-", "--yes")
    assert fired.returncode == 0 and fired.stdout.startswith("fired 3 waiting records"), fired
    got = Collector(setup.services.bootstrap, [setup.targets[0]], f"c-{setup.unique}")
    try:
        got.until(lambda rs: len(rs) >= 3, 60, "the three fired")
    finally:
        got.close()
    assert sorted((r.key, r.value, r.header(H_ID), r.header("h")) for r in got.records) == [
        (b"f-a", b"value-f-a", origins[0].encode(), b"1"),
        (b"f-b", b"value-f-b", b"order-b", b"1"),
        (b"f-c", b"value-f-c", origins[2].encode(), b"1"),
    ]
    wait_for(lambda: list(waiting()) == ["g-d"], 30, "the originals withdrawn")
    moved = cli(setup, "reschedule", "--id", origins[3], "--shift", "1h")
    assert moved.returncode == 0 and moved.stdout.startswith("reschedule "), moved
    wait_for(lambda: waiting() == {"g-d": due_d + 3_600_000}, 30, "g-d an hour later")
    assert metric(bridge, "delay_bridge_replaced_total") == 4
    again = cli(setup, "fire", "--key-prefix", "f-", "--yes")
    assert again.returncode == 1 and "no waiting record matches" in again.stderr


def _waiting_dues(setup: Setup, redis_client: redis.Redis) -> collections.Counter[int]:
    """The due time of every record waiting in the delay topic's shards, whole or a reference."""
    store = Store(redis_client, f"test-{setup.unique}")
    dues: collections.Counter[int] = collections.Counter()
    for partition in range(3):
        seen: set[bytes] = set()
        for page in store.inventory.scan(Shard(setup.delay, partition), None, None):
            for due, member in page:
                if member[:8] not in seen:  # the scan may give one twice
                    seen.add(member[:8])
                    dues[due] += 1
    return dues


def test_a_bulk_reschedule_over_thousands_moves_each_record_once(
    setup: Setup, bridges: list[Bridge], redis_client: redis.Redis
) -> None:
    """``reschedule --due-after 10m --shift 1h --yes`` over 5,000 waiting records, half of them
    kept as references, moved 235 by 2 h: the match scan ran while the replacements landed (ZSCAN
    gives members added meanwhile, reference chunks were read after replacements were appended).
    The matches are the records the bridge had stored when the command started: each moves once.
    Run again, the command changes nothing: its replacements carry its operation id."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    t0 = setup.targets[0].encode()
    base = time.time_ns() // 1_000_000 + 20 * 60_000
    dues = [base + i if i % 2 else base + 3 * 3_600_000 + i for i in range(5000)]
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            (b"k%d" % (i % 7), b"v%d" % i, [(H_TARGET_TOPIC, t0), (H_DELIVER_AT, b"%d" % due)])
            for i, due in enumerate(dues)
        ],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 5000, 90, "all stored")
    assert _waiting_dues(setup, redis_client) == collections.Counter(dues)
    moved = collections.Counter(d + 3_600_000 for d in dues)
    command = ("reschedule", "--due-after", "10m", "--shift", "1h", "--yes")
    done = cli(setup, *command)
    assert done.returncode == 0, done.stderr
    # It reports what the bridge applied: nothing of it is left to apply.
    assert re.match(
        r"rescheduled 5,000 waiting records \(operation \w+\), applied 5,000", done.stdout
    ), done.stdout
    assert _waiting_dues(setup, redis_client) == moved
    again = cli(setup, *command)
    assert again.returncode == 0, again.stderr
    assert "5,000 matching records were rescheduled by this operation already" in again.stdout
    assert _waiting_dues(setup, redis_client) == moved
    assert metric(bridge, "delay_bridge_replaced_total") == 5000


def test_the_cancel_command(setup: Setup, bridges: list[Bridge]) -> None:
    bridge = setup.bridge().start()
    bridges.append(bridge)
    cli = cli_of(bridge)

    target = setup.targets[0]
    # Due in 10 min: no command-line run races its due time (3 s did, once in CI: the cancel
    # found it claimed already). The cancelled count says it was found waiting.
    made = cli(
        "produce",
        "--target",
        target,
        "--after",
        "10m",
        "--id",
        "reminder-9",
        "--key",
        "u9",
        "remind",
    )
    assert made.returncode == 0, made.stderr
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    # No --key: the cancel goes where Redis says the id waits, with the record's own key.
    done = cli("cancel", "--id", "reminder-9")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cancel of reminder-9 {setup.delay}:")
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1,
        10,
        "the cancel counted",
    )
    gone = cli("cancel", "--id", "reminder-9")
    assert gone.returncode == 1 and "reminder-9 waits in no partition" in gone.stderr
    assert "--force" in gone.stderr and not gone.stdout
    blind = cli("cancel", "--id", "reminder-9", "--force")
    assert blind.returncode == 2 and "--force needs --key" in blind.stderr
    forced = cli("cancel", "--id", "reminder-9", "--force", "--key", "u9")
    assert forced.returncode == 0 and forced.stdout.startswith("cancel of reminder-9")
    assert all("Traceback" not in p.stderr for p in (gone, blind, forced))
    after = cli("produce", "--target", target, "--after", "4s", "--key", "u9", "after")
    assert after.returncode == 0, after.stderr
    records = setup.await_value(b"after", 60, "the later record")
    assert [r.value for r in records] == [b"after"]
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}') == 1,
        10,
        "the forced cancel counted",
    )
    partition, offset = forced.stdout.split()[-1].split(":")[1:]
    assert (
        f"cancel of reminder-9 at {setup.delay}[{partition}] offset {offset} found no "
        "waiting record"
    ) in bridge.output()
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1
    assert json.loads(cli("list", "--json").stdout) == []  # reminder-9 waits no more


def test_cli_cancels_and_replaces_what_a_librdkafka_producer_scheduled(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Records produced with librdkafka's default partitioner (CRC32, not Java's murmur2) are
    cancelled and replaced from the command line in the partition where they wait."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    target = setup.targets[0]
    ids = {n: f"expire-order-{n}" for n in range(40, 48)}
    # Due in 10 min, so no command-line run races the originals' own due time (20 s did, once
    # in CI: six runs one after the other outlasted it, and 44 and 45 arrived twice); 46 and 47
    # are fired at the end.
    originals: list[Scheduling] = [
        (f"order-{n}".encode(), b"original", delay_headers(target, after="10m", delay_id=ids[n]))
        for n in ids
    ]
    coords = produce_all(setup.services.bootstrap, setup.delay, originals)
    wait_for(
        lambda: metric(bridge, "delay_bridge_ingested_total") >= len(ids),
        30,
        "the originals stored",
    )
    cli = cli_of(bridge)

    cancelled = {ids[n] for n in range(40, 44)}
    moved = 0
    for n, (partition, _) in zip(ids, coords, strict=True):
        if n >= 44:
            break
        done = cli("cancel", "--id", ids[n], "--key", f"order-{n}")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"cancel of {ids[n]} {setup.delay}:{partition}:")
        if partition_for(f"order-{n}", 3) != partition:  # CRC32 put it elsewhere than murmur2
            moved += 1
            assert f"waits in {setup.delay} partition {partition}" in done.stderr
    assert moved, "no key of the test maps differently under the two partitioners"
    for n in (44, 45):
        done = cli(
            "produce",
            "--target",
            target,
            "--after",
            "1s",
            "--id",
            ids[n],
            "--key",
            f"order-{n}",
            "replaced",
        )
        assert done.returncode == 0, done.stderr
    for n in (46, 47):
        done = cli("fire", "--id", ids[n])
        assert done.returncode == 0, done.stderr
    expected = {ids[n]: b"replaced" if n in (44, 45) else b"original" for n in range(44, 48)}
    collector = setup.collector()
    try:
        got = settle(setup, collector, expected, 1)
    finally:
        collector.close()
    check(got, expected, cancelled)
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 4
    assert metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}') == 0
    assert metric(bridge, "delay_bridge_replaced_total") == 4  # two replacements, two fires
    listed = cli("list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], "a cancelled record waits"


def test_a_bulk_fire_during_a_rate_limited_drain_delivers_each_record_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``fire --target slow --yes`` while 3,000 overdue records drain at the target's rate
    (egress.max_rate_per_target 200/s): a record claimed between the command's snapshot and its
    replacement's arrival was delivered, and the replacement, finding nothing to replace, was
    scheduled and delivered again. What an operator's replacement finds claimed or delivered is
    not delivered twice: each record once."""
    slow = setup.targets[0]
    config = setup.tmp / "bridge.yaml"  # a mapping, which the environment cannot set
    config.write_text(f"egress:\n  max_rate_per_target: {{{slow}: 200}}\n")
    bridge = setup.bridge()
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    now = time.time_ns() // 1_000_000
    count = 3000
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            (
                b"k%d" % (i % 11),
                b"v%d" % i,
                [(H_TARGET_TOPIC, slow.encode()), (H_DELIVER_AT, b"%d" % (now - 2000))],
            )
            for i in range(count)
        ],
    )
    collector = Collector(setup.services.bootstrap, [slow, setup.dlq], f"check-{setup.unique}")
    try:
        collector.until(lambda rs: len(rs) >= 200, 60, "the drain under way")
        fired = cli(setup, "fire", "--target", slow, "--yes")
        assert fired.returncode == 0, fired.stderr
        collector.until(lambda rs: len({r.value for r in rs}) == count, 120, "every record")
        wait_for(lambda: metric(bridge, "delay_bridge_scheduled_messages") == 0, 30, "none waits")
        collector.poll()
    finally:
        collector.close()
    values = collections.Counter(r.value for r in collector.records)
    assert [v for v, n in values.items() if n > 1] == [], "delivered twice"
    assert sum(values.values()) == count
    # Each replacement replaced its record, or came after it left and was not scheduled.
    said = re.search(r"fired ([\d,]+) waiting", fired.stdout)
    assert said is not None, fired.stdout
    fired_count = int(said[1].replace(",", ""))
    late = metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}')
    assert metric(bridge, "delay_bridge_replaced_total") + late == fired_count, fired.stdout
