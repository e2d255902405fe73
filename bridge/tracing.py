"""OpenTelemetry spans of the bridge's own hop: one per record stored, one per delivery.

On with ``tracing.enabled`` (the OpenTelemetry SDK and its OTLP/HTTP exporter are the optional extra
``delay-bridge[otel]``; the image has them), exported as the standard ``OTEL_*`` environment
variables say: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``), ``OTEL_SERVICE_NAME``
(default ``delay-bridge``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_SDK_DISABLED``. Only the ``http/protobuf`` protocol is served (gRPC would need grpcio).

- A **store** span (kind CONSUMER) per record the ingress stores, a child of the producer's span
  (the record's W3C ``traceparent``), from the batch's handling to Redis having it.
- A **send** span (kind PRODUCER) per delivery, from the produce to Kafka's delivery report (a
  retry ends it failed and starts another). The delivered record's ``traceparent`` is this
  span's, so its consumer's spans follow it. Its parent is the producer's span (``tracing.mode:
  continue``), or it starts a new trace with a link to that span (``link``: a delay of days
  makes a trace nobody reads as one).

Both carry OpenTelemetry's messaging attributes (``messaging.system`` kafka, the destination and
its partition, the Kafka offset, the delay-id as ``messaging.message.id``) and the bridge's own:
``delay_bridge.due_time_ms``, ``delay_bridge.lateness_ms`` (as ``delay_bridge_lateness_seconds``
counts it), ``delay_bridge.delay_topic``, ``delay_bridge.dead_letter_reason`` for a DLQ copy.

Off, nothing of this module is imported and ``traceparent``/``tracestate`` pass through as they
came.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import bridge
from bridge.config import Config
from bridge.errors import ConfigError
from bridge.message import Cancel, Headers, Scheduled, origin

if TYPE_CHECKING:
    from bridge.store import Shard

TRACE_HEADERS = ("traceparent", "tracestate")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_PROPAGATOR = TraceContextTextMapPropagator()


def producer_context(headers: Headers) -> otel_context.Context:
    """The context the record's own ``traceparent``/``tracestate`` name (empty: none, or not
    one W3C Trace Context reads)."""
    carrier = {k: v.decode("latin-1") for k, v in headers if k in TRACE_HEADERS and v is not None}
    return _PROPAGATOR.extract(carrier) if carrier else otel_context.Context()


class Spans:
    """The bridge's spans, on a tracer provider of its own (the process's global one is left to
    whoever embeds the bridge)."""

    def __init__(self, provider: TracerProvider, *, mode: str, group: str) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("delay-bridge", bridge.__version__)
        self.link = mode == "link"
        self.group = group

    @classmethod
    def start(cls, config: Config) -> Spans:
        """Spans exported over OTLP/HTTP as the OTEL_* environment says. Raises ConfigError for a
        protocol other than http/protobuf."""
        for name in PROTOCOLS:
            protocol = os.environ.get(name, "").strip()
            if protocol and protocol != "http/protobuf":
                raise ConfigError(
                    f"{name}: {protocol!r} is not served; the bridge exports spans over "
                    "http/protobuf (OTLP/HTTP)"
                )
        service = os.environ.get("OTEL_SERVICE_NAME") or "delay-bridge"
        resource = Resource.create({"service.name": service, "service.version": bridge.__version__})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider, mode=config.tracing.mode, group=config.kafka.group_id)

    def stored(
        self, stored: Mapping[Shard, tuple[int, list[Scheduled | Cancel]]], start_ns: int
    ) -> None:
        """A store span for each record of ``stored`` (per shard: its records), begun at
        ``start_ns`` (epoch ns) and ended now."""
        end_ns = time.time_ns()
        for shard, (_, records) in stored.items():
            for record in records:
                if isinstance(record, Scheduled):
                    self._store_span(shard, record, start_ns).end(end_time=end_ns)

    def _store_span(self, shard: Shard, record: Scheduled, start_ns: int) -> Span:
        return self.tracer.start_span(
            f"store {shard.topic}",
            context=producer_context(record.headers),
            kind=SpanKind.CONSUMER,
            start_time=start_ns,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.operation.name": "store",
                "messaging.destination.name": shard.topic,
                "messaging.destination.partition.id": str(shard.partition),
                "messaging.consumer.group.name": self.group,
                "messaging.kafka.offset": record.offset,
                "messaging.message.id": record.delay_id,
                "delay_bridge.due_time_ms": record.due_ms,
                "delay_bridge.target": record.target,
                "delay_bridge.priority": record.priority.label,
            },
        )

    def sending(
        self,
        record: Scheduled,
        shard: Shard,
        topic: str,
        headers: Headers,
        *,
        previous: Span | None = None,
        dead_letter: str = "",
    ) -> tuple[Span, Headers]:
        """Begin the send span of a delivery of ``record`` (of ``shard``) to ``topic`` — for a
        DLQ copy, ``dead_letter`` is its reason — ending the ``previous`` attempt's as failed.
        Returns the span and ``headers`` with its ``traceparent`` (unchanged when the span has
        no context: the SDK disabled)."""
        self.failed(previous, "produced again")
        parent = producer_context(record.headers)
        links: list[Link] = []
        if self.link:
            linked = trace.get_current_span(parent).get_span_context()
            links = [Link(linked)] if linked.is_valid else []
            parent = otel_context.Context()
        attributes: dict[str, str | int] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": topic,
            "messaging.message.id": record.delay_id,
            "delay_bridge.due_time_ms": record.due_ms,
            "delay_bridge.delay_topic": shard.topic,
            "delay_bridge.origin": origin(shard.topic, shard.partition, record.offset),
        }
        if dead_letter:
            attributes["delay_bridge.dead_letter_reason"] = dead_letter
        span = self.tracer.start_span(
            f"send {topic}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=links,
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        if not carrier:
            return span, headers
        kept = [(k, v) for k, v in headers if k not in TRACE_HEADERS]
        return span, kept + [(k, v.encode()) for k, v in carrier.items()]

    def delivered(
        self, span: Span | None, record: Scheduled, placed: tuple[int, int], at_ms: int
    ) -> None:
        """Kafka has ``record`` at ``placed`` (partition, offset), reported at ``at_ms``: its
        send ``span`` ends (None: none was begun)."""
        if span is None:
            return
        partition, offset = placed
        span.set_attributes(
            {
                "messaging.destination.partition.id": str(partition),
                "messaging.kafka.offset": offset,
                "delay_bridge.lateness_ms": max(0, at_ms - record.late_from_ms()),
            }
        )
        span.set_status(Status(StatusCode.OK))
        span.end()

    def failed(self, span: Span | None, error: str) -> None:
        """The delivery failed with Kafka's ``error``: its send ``span`` ends with it (None: none
        was begun)."""
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, error))
            span.end()

    def shutdown(self) -> None:
        """Export what is left (at shutdown)."""
        self.provider.shutdown()
