"""A real OTLP/HTTP trace receiver: `POST /v1/traces` with an `ExportTraceServiceRequest`
(protobuf, decoded by `opentelemetry-proto`), spans kept in memory for the test to read.

Used by the tracing tests, the tracing bench and the waterfall rendering (docs/trace.png).
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    service: str
    kind: int = 0
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def is_error(self) -> bool:
        return self.status_code == 2

    def strings(self) -> list[str]:
        """Every text this span carries (attributes, event attributes, status, name)."""
        out = [self.name, self.status_message]

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
            elif node is not None:
                out.append(str(node))

        walk(self.attributes)
        for name, attrs in self.events:
            out.append(name)
            walk(attrs)
        return out


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _take(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            events=[
                                (e.name, {kv.key: _value(kv.value) for kv in e.attributes})
                                for e in span.events
                            ],
                            status_code=span.status.code,
                            status_message=span.status.message,
                            service=str(resource.get("service.name", "")),
                            kind=span.kind,
                            resource=resource,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, predicate, timeout: float = 60) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted(f"{s.name}@{s.service}" for s in spans)
                raise TimeoutError(f"the receiver did not get the spans; it has {names}")
            time.sleep(0.1)


if __name__ == "__main__":  # a receiver of its own: `python -m tests.otlp_receiver [port]`
    import sys

    receiver = OtlpReceiver()
    if len(sys.argv) > 1:
        receiver.server.server_close()
        receiver.server = ThreadingHTTPServer(
            ("127.0.0.1", int(sys.argv[1])), receiver.server.RequestHandlerClass
        )
    receiver.thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    receiver.start()
    print(receiver.endpoint, flush=True)
    while True:
        time.sleep(10)
        print(f"{len(receiver.spans)} spans in {receiver.requests} requests", flush=True)
