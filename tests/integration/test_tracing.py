"""Tracing (``tracing.enabled``) end to end: a producer's trace through the bridge to the consumer.

The bridge exports to a real OTLP/HTTP receiver on the loopback — an HTTP server that decodes the
protobuf requests the OpenTelemetry exporter sends (``ExportTraceServiceRequest``) — and a
consumer reads the delivered record's ``traceparent``: the spans are checked as they arrived over
the wire, not in an in-memory exporter."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from confluent_kafka import Producer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from bridge.kafka import produce
from bridge.message import H_AFTER, H_ID, H_TARGET_TOPIC, origin
from testbed.harness import Bridge, Received, Setup
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01".encode()
SPAN_KIND_PRODUCER, SPAN_KIND_CONSUMER = 4, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
STATUS_OK = 1


@dataclass
class Exported:
    """A span as the receiver decoded it."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    status: int
    service: str


def value_of(kv: KeyValue) -> Any:
    which = kv.value.WhichOneof("value")
    return getattr(kv.value, which) if which else None


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span of every request it answered."""

    spans: list[Exported] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            self.requests += 1
            for resource_spans in request.resource_spans:
                resource = {kv.key: value_of(kv) for kv in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            Exported(
                                span.name,
                                span.kind,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                {kv.key: value_of(kv) for kv in span.attributes},
                                [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                span.status.code,
                                resource.get("service.name", ""),
                            )
                        )

    def named(self, prefix: str) -> list[Exported]:
        with self.lock:
            return [s for s in self.spans if s.name.startswith(prefix)]

    def send_span(self, span_id: str) -> Exported:
        """The one send span with this id, once it has been exported."""
        wait_for(lambda: any(s.span_id == span_id for s in self.named("send ")), 30, "the span")
        [send] = [s for s in self.named("send ") if s.span_id == span_id]
        return send


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    found = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/traces", self.path
            assert self.headers["Content-Type"] == "application/x-protobuf"
            found.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def traced_bridge(
    one: Setup, bridges: list[Bridge], endpoint: str, mode: str, **overrides: str
) -> Bridge:
    bridge = one.bridge(tracing__enabled="true", tracing__mode=mode, **overrides)
    bridge.env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_SERVICE_NAME="orders-delay",
        OTEL_BSP_SCHEDULE_DELAY="100",  # export within 0.1 s, not the default 5 s
    )
    bridges.append(bridge.start())
    return bridge


def send_two(one: Setup) -> None:
    """One record in the producer's trace (with a tracestate), one without a trace."""
    producer = Producer({"bootstrap.servers": one.services.bootstrap})
    target = one.targets[0].encode()
    produce(
        producer,
        one.delay,
        value=b"traced",
        headers=[
            (H_TARGET_TOPIC, target),
            (H_AFTER, b"1s"),
            (H_ID, b"order-42"),
            ("traceparent", TRACEPARENT),
            ("tracestate", b"vendor=abc"),
        ],
    )
    produce(
        producer, one.delay, value=b"untraced", headers=[(H_TARGET_TOPIC, target), (H_AFTER, b"0s")]
    )
    assert producer.flush(10) == 0


def delivered(one: Setup) -> dict[bytes, Received]:
    records = one.await_value(b"traced", 60, "the traced record delivered")
    got = {r.value: r for r in records if r.value is not None}
    if b"untraced" not in got:
        got.update({r.value: r for r in one.await_value(b"untraced", 60, "the other") if r.value})
    return got


def traceparent_of(record: Received) -> tuple[str, str]:
    header = record.header("traceparent")
    assert header is not None
    version, trace_id, span_id, flags = header.decode().split("-")
    assert version == "00" and int(flags, 16) & 1, header  # sampled (0x02: a random trace id)
    return trace_id, span_id


def test_a_trace_goes_from_the_producer_through_the_bridge_to_the_consumer(
    one: Setup, bridges: list[Bridge], receiver: tuple[Receiver, str]
) -> None:
    found, endpoint = receiver
    traced_bridge(one, bridges, endpoint, "continue")
    send_two(one)
    records = delivered(one)
    wait_for(lambda: len(found.named("send ")) >= 2, 30, "both send spans exported")
    wait_for(lambda: len(found.named("store ")) >= 2, 30, "both store spans exported")

    # The stored span: a child of the producer's span, in its trace.
    [store] = [s for s in found.named("store ") if s.trace_id == PRODUCER_TRACE]
    assert (store.name, store.kind, store.parent) == (
        f"store {one.delay}",
        SPAN_KIND_CONSUMER,
        PRODUCER_SPAN,
    )
    assert store.service == "orders-delay"
    assert store.attributes["messaging.system"] == "kafka"
    assert store.attributes["messaging.destination.name"] == one.delay
    assert store.attributes["messaging.destination.partition.id"] == "0"
    assert store.attributes["messaging.kafka.offset"] == 0
    assert store.attributes["messaging.message.id"] == "order-42"
    assert store.attributes["delay_bridge.target"] == one.targets[0]
    traced = records[b"traced"]
    due_ms = int(traced.header("delay-due-at") or b"0")
    assert store.attributes["delay_bridge.due_time_ms"] == due_ms

    # The delivery's span: in the producer's trace, its parent the producer's span; the
    # delivered record carries its context, so a consumer's span is its child.
    trace_id, span_id = traceparent_of(traced)
    assert trace_id == PRODUCER_TRACE and span_id != PRODUCER_SPAN
    assert traced.header("tracestate") == b"vendor=abc"
    send = found.send_span(span_id)
    assert (send.name, send.kind, send.trace_id, send.parent) == (
        f"send {one.targets[0]}",
        SPAN_KIND_PRODUCER,
        PRODUCER_TRACE,
        PRODUCER_SPAN,
    )
    assert send.status == STATUS_OK and send.links == []
    assert send.attributes["messaging.destination.name"] == one.targets[0]
    assert send.attributes["messaging.destination.partition.id"] == str(traced.partition)
    assert send.attributes["messaging.kafka.offset"] == traced.offset
    assert send.attributes["messaging.message.id"] == "order-42"
    assert send.attributes["delay_bridge.due_time_ms"] == due_ms
    assert send.attributes["delay_bridge.delay_topic"] == one.delay
    assert 0 <= send.attributes["delay_bridge.lateness_ms"] < 30_000

    # A record without a trace: spans of their own (roots), and the delivered record names its
    # send span, so its consumer's trace starts at the bridge.
    untraced = records[b"untraced"]
    trace_id, span_id = traceparent_of(untraced)
    send = found.send_span(span_id)
    assert send.parent == "" and send.trace_id == trace_id != PRODUCER_TRACE
    assert send.attributes["messaging.message.id"] == origin(one.delay, 0, 1)
    [store] = [s for s in found.named("store ") if s.attributes["messaging.kafka.offset"] == 1]
    assert store.parent == "" and store.trace_id != PRODUCER_TRACE


def test_link_mode_starts_a_new_trace_linked_to_the_producers(
    one: Setup, bridges: list[Bridge], receiver: tuple[Receiver, str]
) -> None:
    found, endpoint = receiver
    traced_bridge(one, bridges, endpoint, "link")
    send_two(one)
    traced = delivered(one)[b"traced"]
    trace_id, span_id = traceparent_of(traced)
    assert trace_id != PRODUCER_TRACE
    send = found.send_span(span_id)
    assert send.trace_id == trace_id and send.parent == ""
    assert send.links == [(PRODUCER_TRACE, PRODUCER_SPAN)]
    # The producer's tracestate belongs to its trace, not to the new one.
    assert traced.header("tracestate") is None
    # Storing is part of the producer's trace in either mode: it happens as the record is sent.
    wait_for(lambda: len(found.named("store ")) >= 2, 30, "the store spans exported")
    [store] = [s for s in found.named("store ") if s.trace_id == PRODUCER_TRACE]
    assert store.parent == PRODUCER_SPAN


def test_exactly_once_deliveries_carry_their_send_spans_through_the_transaction(
    one: Setup, bridges: list[Bridge], receiver: tuple[Receiver, str]
) -> None:
    """With egress.exactly_once the records leave through each shard's transactions: the send
    span's context rides in the transaction's record, and the span ends at its report."""
    found, endpoint = receiver
    traced_bridge(one, bridges, endpoint, "continue", egress__exactly_once="true")
    send_two(one)
    traced = delivered(one)[b"traced"]  # read_committed: the transaction committed
    trace_id, span_id = traceparent_of(traced)
    assert trace_id == PRODUCER_TRACE
    send = found.send_span(span_id)
    assert send.parent == PRODUCER_SPAN and send.status == STATUS_OK
    assert send.attributes["messaging.kafka.offset"] == traced.offset


def test_without_tracing_the_trace_headers_pass_through_unchanged(
    one: Setup, bridges: list[Bridge]
) -> None:
    bridges.append(one.bridge().start())
    send_two(one)
    records = delivered(one)
    assert records[b"traced"].header("traceparent") == TRACEPARENT
    assert records[b"traced"].header("tracestate") == b"vendor=abc"
    assert records[b"untraced"].header("traceparent") is None
