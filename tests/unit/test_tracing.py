"""Tracing's config and the delivered record's trace headers (bridge.tracing), in memory; the
spans over the wire to a real OTLP receiver are tests/integration/test_tracing.py's."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge.config import from_mapping
from bridge.config import loader as config_loader
from bridge.errors import ConfigError
from bridge.message import Headers, Scheduled
from bridge.store import Shard
from bridge.tracing import Spans, producer_context

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_mode_outside_the_two_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^tracing.mode: 'follow' is none of continue, link$"):
        from_mapping({"tracing": {"mode": "follow"}}, env={})
    assert from_mapping({"tracing": {"mode": "link"}}, env={}).tracing.mode == "link"
    assert from_mapping({}, env={}).tracing.enabled is False


def test_tracing_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_loader, "_has_otel", lambda: False)
    with pytest.raises(ConfigError, match=r"^tracing.enabled: .*delay-bridge\[otel\]"):
        from_mapping({"tracing": {"enabled": True}}, env={})
    from_mapping({"tracing": {"enabled": False}}, env={})  # off: nothing is needed


def test_only_otlp_over_http_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    config = from_mapping({"tracing": {"enabled": True}}, env={})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ConfigError, match=r"^OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' is not served"):
        Spans.start(config)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    Spans.start(config).shutdown()


def scheduled(headers: Headers) -> Scheduled:
    return Scheduled(7, 1_000, "out", b"k", b"v", headers, "order-7")


def spans(mode: str, provider: TracerProvider | None = None) -> tuple[Spans, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = provider or TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Spans(provider, mode=mode, group="g"), exporter


def test_the_delivered_record_names_its_send_span_and_a_retry_ends_the_first() -> None:
    made, exporter = spans("continue")
    record = scheduled([("traceparent", TRACEPARENT), ("tracestate", b"v=1"), ("x", b"y")])
    shard = Shard("delay", 2)
    first, headers = made.sending(record, shard, "out", [("x", b"y"), ("traceparent", b"old")])
    names = [k for k, _ in headers]
    assert names.count("traceparent") == 1 and ("x", b"y") in headers
    context = first.get_span_context()
    assert dict(headers)["traceparent"].decode().split("-")[1:3] == [  # type: ignore[union-attr]
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    ]
    assert f"{context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert dict(headers)["tracestate"] == b"v=1"
    # Produced again: the first attempt's span ends, failed.
    second, _ = made.sending(record, shard, "dlq", [], previous=first, dead_letter="expired")
    [ended] = exporter.get_finished_spans()
    assert ended.status.description == "produced again"
    made.delivered(second, record, (1, 99), at_ms=1_250)
    last = exporter.get_finished_spans()[-1]
    assert last.attributes is not None
    assert last.attributes["messaging.kafka.offset"] == 99
    assert last.attributes["delay_bridge.lateness_ms"] == 250
    assert last.attributes["delay_bridge.dead_letter_reason"] == "expired"
    made.delivered(None, record, (0, 0), 0)  # no span begun: nothing to end
    made.failed(None, "x")
    assert len(exporter.get_finished_spans()) == 2


def test_with_the_sdk_disabled_the_trace_headers_pass_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    made, exporter = spans("continue", TracerProvider())
    headers: Headers = [("traceparent", TRACEPARENT), ("tracestate", b"v=1")]
    _, sent = made.sending(scheduled(headers), Shard("delay", 0), "out", headers)
    assert sent == headers
    assert exporter.get_finished_spans() == ()


def test_a_header_that_is_no_trace_context_starts_none() -> None:
    assert producer_context([("traceparent", b"not one")]) == producer_context([])
    made, _ = spans("link")
    span, _ = made.sending(scheduled([("traceparent", b"00-zz-zz-01")]), Shard("d", 0), "o", [])
    assert list(span.links) == []  # type: ignore[attr-defined]
