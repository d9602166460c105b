"""A real OTLP trace receiver for tests: the collector's protocol (OTLP/HTTP, protobuf), on loopback.

Point a service at it with `OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint` and read what it
exported from `receiver.spans`: the spans as the collector would have them, decoded from the
`ExportTraceServiceRequest` bodies the OpenTelemetry SDK's own exporter sends. Nothing of ours
is in between, so a test proves what an operator's collector would receive.
"""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from atmosphere.testing.asgi_server import serving_asgi

__all__ = ["OtlpReceiver", "ReceivedSpan"]

_PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, its ids in the W3C hex form."""

    service: str
    """The exporting process's `service.name`."""
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class OtlpReceiver:
    """Receives OTLP/HTTP trace exports while `serving()` is open."""

    def __init__(self) -> None:
        """Nothing received yet."""
        self.spans: list[ReceivedSpan] = []
        self.endpoint = ""
        """`http://127.0.0.1:<port>`: the value of `OTEL_EXPORTER_OTLP_ENDPOINT` (set while serving)."""

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace received so far."""
        return [s for s in self.spans if s.trace_id == trace_id]

    async def _export(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            status_code=span.status.code,
                        )
                    )
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=_PROTOBUF)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[OtlpReceiver]:
        """Listen on a free loopback port (`endpoint`) until the context exits."""
        app = Starlette(routes=[Route("/v1/traces", self._export, methods=["POST"])])
        async with serving_asgi(app) as port:
            self.endpoint = f"http://127.0.0.1:{port}"
            yield self
