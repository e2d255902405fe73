"""Values no producer or operator should send, sent anyway, on the real servers: each decides one
record's fate (or one command's answer) and stops nothing else."""

from __future__ import annotations

import json
import signal
import socket
import urllib.parse
from pathlib import Path
from typing import cast

import pytest
import redis

from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_DUE_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_ID,
    H_ORIGIN,
    H_TARGET_TOPIC,
    Headers,
)
from testbed.harness import (
    Bridge,
    Setup,
    ToPartition,
    cli_of,
    metric,
    produce_to,
    wait_ready,
    with_faults,
)
from tests.conftest import Services, TopicFactory, wait_for
from tests.integration.conftest import redis_server

pytestmark = pytest.mark.integration


def test_a_default_id_with_a_unicode_digit_or_a_huge_hint_stalls_nothing(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``delay-cancel: <topic>:0:²`` (``str.isdigit`` says yes, ``int`` refuses) rewound the
    ingress's batch for ever, and every partition behind it waited; a replacement of a default id
    whose ``delay-due-at`` has 5,000 digits (past Python's int limit) did the same. Neither is a
    default id or a due time: the cancel finds nothing, the replacement looks its record up."""
    target = setup.targets[0].encode()
    bridge = setup.bridge().start()
    bridges.append(bridge)

    def after(delay: bytes) -> Headers:
        return [(H_TARGET_TOPIC, target), (H_AFTER, delay)]

    # Partition 0's first record is the one the replacement names (its default id).
    hostile: ToPartition = [
        (0, b"replaced", after(b"10m")),
        (0, None, [(H_CANCEL, f"{setup.delay}:0:\u00b2".encode())]),
        (0, None, [(H_CANCEL, f"{setup.delay}:0:\u0663".encode())]),  # an Arabic-Indic 3
        (
            0,
            b"replacement",
            [*after(b"0ms"), (H_ID, f"{setup.delay}:0:0".encode()), (H_DUE_AT, b"9" * 5000)],
        ),
    ]
    later: ToPartition = [(i % 3, f"later-{i}".encode(), after(b"0ms")) for i in range(12)]
    produce_to(setup.services.bootstrap, setup.delay, hostile + later)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 13, 60, "the replacement and the 12 later records")
        collector.poll(1.0)  # the replaced record, were it delivered, would not be due yet anyway
    finally:
        collector.close()
    values = sorted(r.value or b"" for r in collector.records)
    assert values == sorted([b"replacement", *(f"later-{i}".encode() for i in range(12))])
    assert metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}') == 2
    assert metric(bridge, "delay_bridge_replaced_total") == 1
    assert bridge.get("/readyz")[0] == 200


def test_a_record_the_bridge_fails_on_is_dead_lettered_and_stops_nothing(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A bug that raises on one record (injected: the store's call for a batch holding it fails)
    rewound the ingress's batch for ever: that record's partition, and every partition read in
    the same batches, waited (/readyz "ingress cannot store records"). The batch is handled again
    an offset at a time; the offset that fails twice goes to the DLQ as bad-header with the error,
    and the records before and after it, on its partition and others, are delivered."""
    target = setup.targets[0].encode()
    bridge = setup.bridge()
    # This checkout first: the sitecustomize imports the bridge before ``-m`` adds the cwd.
    bridge.env = with_faults(bridge.env, STORE_FAULT_VALUE="poison")
    bridges.append(bridge.start())
    now: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms")]
    records: ToPartition = [(0, b"before", now), (0, b"poison", now), (0, b"after", now)]
    records += [(1, f"other-{i}".encode(), now) for i in range(5)]
    produce_to(setup.services.bootstrap, setup.delay, records)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 8, 60, "seven records and the dead letter")
    finally:
        collector.close()
    delivered = sorted(r.value or b"" for r in collector.records if r.topic != setup.dlq)
    assert delivered == sorted([b"before", b"after", *(f"other-{i}".encode() for i in range(5))])
    (dead,) = [r for r in collector.records if r.topic == setup.dlq]
    assert (dead.value, dead.header(H_ERROR)) == (b"poison", b"bad-header")
    assert dead.header(H_ORIGIN) == f"{setup.delay}:0:1".encode()
    detail = (dead.header(H_ERROR_DETAIL) or b"").decode()
    assert "a bug" in detail and "ValueError" in detail, detail
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "/readyz 200 again")


def test_a_batch_redis_refuses_for_a_while_dead_letters_its_bad_record_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A batch Redis refuses (loading its data set: injected, for 3 s from the assignment) is
    read again until Redis takes it, and its bad record went to the DLQ at every try: three
    copies in 3 s, one more each second of an outage, each journaled. It goes once."""
    target = setup.targets[0].encode()
    bad: ToPartition = [(0, b"no-due-time", [(H_TARGET_TOPIC, target)])]
    produce_to(setup.services.bootstrap, setup.delay, bad)
    bridge = setup.bridge()
    bridge.env = with_faults(bridge.env, REDIS_LOADING_AT_ASSIGNMENT_S="3")
    bridges.append(bridge.start())
    # Redis answers: the batch refused is stored, or (the loading over while the partition was
    # assigned: CI's machine once took the whole 3 s) the claims held at the assignment go on.
    said = ("ingress stores batches again", "records are claimed again")
    wait_for(lambda: any(s in bridge.output() for s in said), 60, "redis answering")
    now: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms")]
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"after", now)])
    collector = setup.collector()
    try:
        collector.until(lambda rs: any(r.value == b"after" for r in rs), 60, "the next record")
        collector.poll(1.0)  # and any copy after it
    finally:
        collector.close()
    dead = [r.value for r in collector.records if r.topic == setup.dlq]
    assert dead == [b"no-due-time"], dead
    assert bridge.output().count("dead-lettering") == 1


def test_a_cross_partition_cancel_outlives_a_fault_after_its_batch_was_stored(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A cancel produced to another partition than its record's: add.lua stores its batch (the
    watermark passes it), then the look in the record's partition fails (injected: Kafka does
    not answer). The batch was handled again, add.lua skipped what its watermark covered, and
    the cancel never withdrew its record: it was delivered. The withdrawals a batch leaves to
    do are kept with it in Redis, and done again until they are done."""
    target = setup.targets[0].encode()
    bridge = setup.bridge()
    bridge.env = with_faults(bridge.env, ACROSS_FAULTS="1")
    bridges.append(bridge.start())
    later: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"10m")]
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"ordered", [*later, (H_ID, b"x1")])])
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    produce_to(setup.services.bootstrap, setup.delay, [(1, None, [(H_CANCEL, b"x1")])])
    wait_for(
        lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1,
        30,
        "the cancel applied",
    )
    assert "injected by the test" in bridge.output()
    assert metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}') == 0


def test_a_cross_partition_cancel_left_to_do_by_a_killed_bridge_is_done_by_the_next(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The look in the record's partition fails for good on one bridge (injected), which is then
    SIGKILLed: the offset it committed stays at the cancel (the lowest thing Redis has left to
    do), so the next bridge reads it again, and add.lua, which applied it, hands it back."""
    target = setup.targets[0].encode()
    first = setup.bridge()
    first.env = with_faults(first.env, ACROSS_FAULTS="1000000")
    bridges.append(first.start())
    later: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"10m")]
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"ordered", [*later, (H_ID, b"x2")])])
    wait_for(lambda: metric(first, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    produce_to(setup.services.bootstrap, setup.delay, [(1, None, [(H_CANCEL, b"x2")])])
    wait_for(lambda: "injected by the test" in first.output(), 30, "the look failed")
    first.signal(signal.SIGKILL)
    first.wait(30)
    second = setup.bridge("second").start()
    bridges.append(second)
    wait_for(
        lambda: metric(second, 'delay_bridge_cancelled_total{result="cancelled"}') == 1,
        60,
        "the cancel applied by the next bridge",
    )
    # Read again from below its watermark on purpose, not as a log that went back (retired and
    # read from its beginning, every record of it stored again).
    assert "went back" not in second.output()
    assert metric(second, "delay_bridge_rebuilds_total") == 0


def test_a_default_id_named_without_its_due_time_is_read_not_scanned_for(
    setup: Setup, bridges: list[Bridge], tmp_path: Path
) -> None:
    """``delay-cancel: <topic>:0:<offset>`` without ``delay-due-at`` (as an application sends it),
    and a replacement by a default id without one, each made the ingress pass over every record
    the shard holds whole, payloads and all (a ZSCAN of the due index per batch): the bridge's
    work per cancel grew with its backlog. The record named is read at its offset in the delay
    topic for its due time, and Redis is asked there (its own Redis: ZSCANs are counted)."""
    target = setup.targets[0].encode()
    with redis_server(tmp_path) as url:
        bridge = setup.bridge(redis__url=url).start()
        bridges.append(bridge)
        later: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"10m")]
        backlog: ToPartition = [(0, b"x" * 1000, later) for _ in range(500)]
        backlog.append((0, b"far", [(H_TARGET_TOPIC, target), (H_AFTER, b"3h")]))  # a reference
        produce_to(setup.services.bootstrap, setup.delay, backlog)
        wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 501, 60, "the backlog")
        client = redis.Redis.from_url(url)
        before = _zscans(client)
        nine = f"{setup.delay}:0:9".encode()
        named: ToPartition = [
            (0, None, [(H_CANCEL, f"{setup.delay}:0:7".encode())]),
            (0, None, [(H_CANCEL, f"{setup.delay}:0:500".encode())]),
            (0, b"fired", [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms"), (H_ID, nine)]),
        ]
        produce_to(setup.services.bootstrap, setup.delay, named)
        setup.await_value(b"fired", 60, "the replacement")
        wait_for(
            lambda: metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 2,
            30,
            "both cancels applied",
        )
        assert metric(bridge, "delay_bridge_replaced_total") == 1
        assert _zscans(client) == before
        client.close()


def _zscans(client: redis.Redis) -> int:
    stats = cast(dict[str, dict[str, int]], client.info("commandstats"))
    return stats.get("cmdstat_zscan", {}).get("calls", 0)


@pytest.mark.parametrize("verb", ["list", "trace", "cancel", "fire"])
def test_the_tools_answer_an_id_with_a_unicode_digit_in_one_line(
    setup: Setup, bridges: list[Bridge], verb: str
) -> None:
    """``list|trace|cancel --id 'T:P:²'`` printed a traceback (the id looked like a default id)."""
    bridge = setup.bridge()  # not started: the tools need its environment only
    cli = cli_of(bridge)
    for delay_id in (f"{setup.delay}:0:\u00b2", f"{setup.delay}:0:{'9' * 5000}"):
        done = cli(verb, "--id", delay_id)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode in (0, 1, 2), (done.returncode, done.stderr)
        assert len(done.stderr.strip().splitlines()) <= 1, done.stderr


def test_a_record_whose_headers_fill_the_delay_topic_has_a_stub_in_the_dlq(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A bad due time and a 1,048,440-byte header (the record just fits the delay topic's default
    1,048,588 bytes): its DLQ copy without its value kept the header and was refused too, and its
    partition waited for good behind it. A stub goes now (reason, detail, origin), the record
    stays in the delay topic, and the record behind it is delivered."""
    target = setup.targets[0].encode()
    big: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"soon"), ("blob", b"b" * 1_048_440)]
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [(0, b"v", big), (0, b"behind", [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms")])],
        **{"message.max.bytes": "2000000"},
    )
    bridges.append(setup.bridge().start())
    records = setup.await_value(b"behind", 60, "the record behind the large one")
    (dead,) = [r for r in records if r.topic == setup.dlq]
    assert dead.header(H_ERROR) == b"bad-due-time"
    assert dead.header(H_ORIGIN) == f"{setup.delay}:0:0".encode()
    assert dead.key is None and dead.value is None and dead.header("blob") is None
    detail = (dead.header(H_ERROR_DETAIL) or b"").decode()
    assert "a stub" in detail and f"it stays at {setup.delay}:0:0" in detail, detail


def test_reads_are_bounded_whatever_the_query(setup: Setup, bridges: list[Bridge]) -> None:
    """``GET /api/records?limit=1000000000`` answered every waiting record (their payloads, and a
    read-back of every far-future one) from inside the delivering process. A page is 1 to 1,000
    records, it starts at most 10,000 in, and a number is ASCII digits."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    assert wait_ready(bridge), bridge.output()
    records = "/api/records?limit="
    for query in ("1000000000", "1001", "0", "-1", "\u00b2", "1&skip=10001", "9" * 5000):
        status, body = bridge.get(records + urllib.parse.quote(query, safe="&="))
        assert status == 400, (query[:40], status, body[:200])
        assert "Traceback" not in body
    assert bridge.get(records + "1000")[0] == 200
    assert bridge.get(records + "20&skip=10000")[0] == 200
    status, body = bridge.get("/api/trace?id=x&since=" + urllib.parse.quote("3000d"))
    assert status == 400 and "limits.max_delay" in body, body


def test_a_trace_of_an_origin_no_record_can_hold_answers_what_the_topic_holds(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``trace --origin T:9:9`` of a topic of 3 partitions waited 10 s for the partition, then
    read the journal from the epoch; one past a partition's end did the same. Each is answered
    from the topic's partitions and ends: no such record can be."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    assert wait_ready(bridge), bridge.output()
    status, body = bridge.get(f"/api/trace?origin={setup.delay}:9:9")
    assert status == 400 and "has 3 partitions" in body, (status, body[:300])
    status, body = bridge.get(f"/api/trace?origin={setup.delay}:0:1000")
    assert status == 400 and "partition 0 ends at offset 0" in body, (status, body[:300])
    done = cli_of(bridge)("trace", "--origin", f"{setup.delay}:9:9")
    assert done.returncode == 2 and "has 3 partitions" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_flood_of_idle_connections_costs_a_bounded_pool(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The HTTP server started a thread per connection: 300 idle connections, 300 threads. A
    bounded pool serves them now (connections past it are told 503 at once), an idle one is
    closed after 2 s, and the probes answer again as soon as the flood is gone. Each connects at
    once: a listen backlog of 5 overflowed, and a connection past it (a probe among them) waited
    for its SYN to be sent again, a second later and more (the flood took 44 s to connect)."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    assert wait_ready(bridge), bridge.output()
    assert bridge.proc is not None
    tasks = Path(f"/proc/{bridge.proc.pid}/task")
    before = len(list(tasks.iterdir()))
    port = bridge.http_port()
    flood: list[socket.socket] = []
    try:
        for _ in range(300):  # a SYN sent again would come after 1 s
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
        wait_for(lambda: bridge_threads(tasks) >= before, 5, "the pool started")
        peak = max(bridge_threads(tasks) for _ in range(20))
        assert peak <= before + 10, (before, peak)
        flood[-1].settimeout(10)
        assert flood[-1].recv(64).startswith(b"HTTP/1.0 503")  # past the pool: told at once
    finally:
        for conn in flood:
            conn.close()
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "/readyz once the flood is gone")
    assert bridge_threads(tasks) <= before + 10


def bridge_threads(tasks: Path) -> int:
    return len(list(tasks.iterdir()))


def test_one_long_field_is_cut_in_tables_pages_and_log_lines(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A 5,000-character target name widened every row of ``dlq list``, the console's dead-letter
    page and the log line. Each cuts it with an ellipsis now; ``--json`` and the API have it
    whole."""
    target = "t" * 5000
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [(0, b"long", [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"0ms")])],
    )
    bridge = setup.bridge().start()
    bridges.append(bridge)
    records = setup.await_value(b"long", 60, "the dead letter")
    assert [r.header(H_ERROR) for r in records] == [b"target-not-allowed"]
    cli = cli_of(bridge)
    table = cli("dlq", "list")
    assert table.returncode == 0, table.stderr
    assert "\u2026" in table.stdout and max(map(len, table.stdout.splitlines())) < 600
    listed = cli("dlq", "list", "--json")
    assert [d["target"] for d in json.loads(listed.stdout)] == [target]
    status, page = bridge.get("/ui/dlq")
    assert status == 200 and "t" * 300 not in page and "\u2026" in page
    logged = [line for line in bridge.output().splitlines() if "dead-lettering" in line]
    assert logged and max(map(len, logged)) < 600


def test_reads_show_payloads_only_to_a_token_and_can_need_one(
    setup: Setup, bridges: list[Bridge], tmp_path: Path
) -> None:
    """Reads were open and showed every payload and header ("no way to require the token for
    reads or hide payloads"). Without a token a record's page and trace keep its key and sizes,
    its value and non-contract headers out; with http.console.read_token_file every read needs a
    token (the read one or the write one)."""
    (tmp_path / "write").write_text("w-token\n")
    (tmp_path / "read").write_text("r-token\n")
    headers: Headers = [
        (H_TARGET_TOPIC, setup.targets[0].encode()),
        (H_AFTER, b"10m"),
        ("secret-header", b"s3cr3t"),
    ]
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"the-payload", headers)])
    bridge = setup.bridge(http__console__token_file=str(tmp_path / "write")).start()
    bridges.append(bridge)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 60, "the record stored")
    trace = f"/api/trace?origin={setup.delay}:0:0"
    status, body = bridge.get(trace)
    assert status == 200, body
    record = json.loads(body)["result"]["record"]
    assert record["value"] is None and record["value_bytes"] == len(b"the-payload")
    assert "s3cr3t" not in body and "the-payload" not in body and record["key"] == "k"
    assert [h for h, _ in record["headers"]] == ["delay-target-topic", "delay-after"]
    page = bridge.get(f"/ui/record?origin={setup.delay}:0:0")[1]
    assert "s3cr3t" not in page and "the-payload" not in page
    shown = bridge.get(trace, token="w-token")[1]
    assert "s3cr3t" in shown and "the-payload" in shown
    assert bridge.stop() == 0  # leaves the group: the next one is assigned at once
    guarded = setup.bridge(
        "guarded",
        http__console__token_file=str(tmp_path / "write"),
        http__console__read_token_file=str(tmp_path / "read"),
    ).start()
    bridges.append(guarded)
    assert wait_ready(guarded), guarded.output()
    for path in ("/api/status", "/ui", trace):
        assert guarded.get(path)[0] == 401, path
        assert guarded.get(path, token="nope")[0] == 401, path
    assert guarded.get(trace, token="r-token")[0] == 200
    assert "the-payload" in guarded.get(trace, token="w-token")[1]
    assert guarded.get("/readyz")[0] == 200 and guarded.get("/metrics")[0] == 200


def test_a_delivery_failed_copy_too_large_without_its_value_goes_as_a_stub(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, bridges: list[Bridge]
) -> None:
    """A record its target refuses, whose headers alone are more than the DLQ takes: its copy
    without its value was refused too, and it was claimed again for good. A stub goes now."""
    small = {"max.message.bytes": "1000"}
    setup = Setup(
        services,
        topics("delay"),
        [topics("out", config=small)],
        topics("dlq", config=small),
        unique,
        tmp_path,
        topics("journal"),
    )
    bridges.append(setup.bridge(egress__max_attempts="2").start())
    headers: Headers = [
        (H_TARGET_TOPIC, setup.targets[0].encode()),
        (H_AFTER, b"0ms"),
        ("blob", b"b" * 3000),
    ]
    produce_to(services.bootstrap, setup.delay, [(0, b"x" * 5000, headers)])
    dead = setup.await_value(None, 60, "the stub")
    assert [r.topic for r in dead] == [setup.dlq]
    assert dead[0].header(H_ERROR) == b"delivery-failed" and dead[0].key is None
    assert (
        dead[0].header("blob") is None and dead[0].header(H_ORIGIN) == f"{setup.delay}:0:0".encode()
    )
    detail = (dead[0].header(H_ERROR_DETAIL) or b"").decode()
    assert "failed 2 times" in detail and "a stub" in detail, detail
