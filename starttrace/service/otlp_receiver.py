"""OTLP/HTTP trace receiver (`POST /v1/traces`), per opentelemetry-proto 1.x; the rules are in docs/service.md.

Protobuf or JSON bodies, optionally gzip/deflate, limited after decompression (inflated in bounded
steps, so a gzip bomb is refused with 413 before it inflates). Acknowledged means stored: the 200
(or `partial_success`) is sent only once the store's writer has committed the request's spans;
saturation and failed writes answer 429/503 with `Retry-After`. Decoding is `sources.otlp`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from collections.abc import AsyncIterator, Callable

from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.requests import Request
from starlette.responses import Response

from starttrace.service.decoder import Decoder
from starttrace.sources.otlp import JSON, PROTOBUF, BadRequest
from starttrace.sources.store import Store, StoreSaturated

DEFAULT_MAX_BODY = 64 * 1024 * 1024
DEFAULT_INFLIGHT_BYTES = 256 * 1024 * 1024  # request bodies (inflated) held at once, read to acknowledged
DEFAULT_ACK_TIMEOUT_S = 30.0  # a request whose spans are not committed by then: 503, Retry-After
_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    pass


class Busy(Exception):
    """Too many request bytes in flight: the client should retry later (503)."""


class IngestBudget:
    """The bytes of request bodies (inflated) the receiver holds at once, from the first byte read
    until the answer; past `max_bytes` a request is refused (503 + Retry-After) unless it is alone."""

    def __init__(self, max_bytes: int = DEFAULT_INFLIGHT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.peak = 0
        self.refused = 0
        self._lock = threading.Lock()

    def charge(self, held: int, more: int) -> None:
        """Add `more` bytes to a request that holds `held` already; Busy when over budget (the
        caller releases what the request holds)."""
        with self._lock:
            if self.used - held > 0 and self.used + more > self.max_bytes:
                self.refused += 1
                raise Busy()
            self.used += more
            self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


class _Held:
    """What one request holds of the budget."""

    __slots__ = ("budget", "n")

    def __init__(self, budget: IngestBudget | None) -> None:
        self.budget = budget
        self.n = 0

    def add(self, more: int) -> None:
        if self.budget is not None and more:
            self.budget.charge(self.n, more)
            self.n += more

    def release(self) -> None:
        if self.budget is not None and self.n:
            self.budget.release(self.n)
            self.n = 0


async def read_body(request: Request, max_bytes: int, held: _Held | None = None) -> bytes:
    """Read the request body, inflating gzip/deflate in bounded steps; BodyTooLarge past max_bytes,
    Busy when the receiver's budget of bytes in flight (`held`) is spent."""
    held = held or _Held(None)
    encoding = request.headers.get("content-encoding", "").strip().lower()
    declared = request.headers.get("content-length")
    if declared is not None and encoding in ("", "identity"):
        try:
            if int(declared) > max_bytes:
                raise BodyTooLarge()
        except ValueError:
            raise BadRequest("invalid Content-Length") from None
    stream: AsyncIterator[bytes] = request.stream()
    if encoding in ("", "identity"):
        parts: list[bytes] = []
        size = 0
        async for chunk in stream:
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge()
            held.add(len(chunk))
            parts.append(chunk)
        return b"".join(parts)
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise UnsupportedEncoding(encoding)
    out = bytearray()
    raw = 0
    try:
        async for chunk in stream:
            raw += len(chunk)
            if raw > max_bytes:  # the compressed body alone is past the limit
                raise BodyTooLarge()
            data = chunk
            while data:
                piece = inflater.decompress(data, _CHUNK)
                out += piece
                if len(out) > max_bytes:
                    raise BodyTooLarge()
                held.add(len(piece))
                data = inflater.unconsumed_tail
                if inflater.eof:
                    break
        while not inflater.eof:
            piece = inflater.decompress(b"", _CHUNK)
            if not piece:
                break
            out += piece
            if len(out) > max_bytes:
                raise BodyTooLarge()
            held.add(len(piece))
        if not inflater.eof:
            raise BadRequest("truncated compressed body")
    except zlib.error as exc:
        raise BadRequest(f"cannot decompress body: {exc}") from None
    return bytes(out)


class UnsupportedEncoding(Exception):
    pass


def status_response(code: int, message: str, encoding: str, headers: dict[str, str] | None = None) -> Response:
    """A google.rpc.Status body (protobuf or JSON)."""
    grpc_code = {400: 3, 408: 4, 413: 8, 415: 3, 429: 8, 503: 14, 401: 16}.get(code, 2)
    st = status_pb2.Status(code=grpc_code, message=message)
    if encoding == PROTOBUF:
        return Response(st.SerializeToString(), status_code=code, media_type=PROTOBUF, headers=headers)
    body = json.dumps({"code": grpc_code, "message": message})
    return Response(body, status_code=code, media_type=JSON, headers=headers)


def success_response(rejected: int, errors: list[str], encoding: str) -> Response:
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = "; ".join(errors)[:1000]
    if encoding == PROTOBUF:
        return Response(resp.SerializeToString(), status_code=200, media_type=PROTOBUF)
    partial = {"rejectedSpans": str(rejected), "errorMessage": resp.partial_success.error_message}
    return Response(json.dumps({"partialSuccess": partial}) if rejected else "{}", status_code=200, media_type=JSON)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def handle_traces(
    request: Request,
    store: Store,
    max_body: int,
    count: Callable[[str, int], None],
    retry_after_s: int = 2,
    decoder: Decoder | None = None,
    budget: IngestBudget | None = None,
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
    body_timeout_s: float | None = None,
) -> Response:
    """The `POST /v1/traces` handler. `count(encoding, code)` counts the request for /metrics;
    `decoder` decodes the body in a worker process (service/decoder.py); `budget` bounds the
    request bytes held at once. The answer waits until the spans are committed (or refused)."""
    ctype = media_type(request)
    enc_label = "protobuf" if ctype == PROTOBUF else "json" if ctype == JSON else "other"
    retry = {"Retry-After": str(retry_after_s)}

    def refuse(code: int, message: str, encoding: str = ctype, headers: dict[str, str] | None = None) -> Response:
        count(enc_label, code)
        return status_response(code, message, encoding, headers)

    if ctype not in (PROTOBUF, JSON):
        return refuse(415, f"unsupported content type {ctype!r}; use {PROTOBUF} or {JSON}", JSON)
    held = _Held(budget)
    try:
        try:
            body = await asyncio.wait_for(read_body(request, max_bytes=max_body, held=held), body_timeout_s)
        except TimeoutError:  # half a body, then nothing: the connection is not held open
            resp = refuse(408, f"request body not received within {body_timeout_s:g} s")
            resp.headers["Connection"] = "close"
            return resp
        except BodyTooLarge:
            return refuse(413, f"request body larger than {max_body} bytes (after decompression)")
        except Busy:
            return refuse(503, "too many request bytes in flight, retry later", headers=retry)
        except UnsupportedEncoding as exc:
            return refuse(415, f"unsupported content encoding {str(exc)!r}")
        except BadRequest as exc:
            return refuse(400, str(exc))
        try:
            decoded = await (decoder or Decoder(workers=0)).decode(body, ctype)
        except BadRequest as exc:
            return refuse(400, str(exc))
        except (DecodeError, ValueError, TypeError, RecursionError, UnicodeDecodeError) as exc:
            return refuse(400, f"undecodable request: {exc}")
        del body
        if decoded.batch.processes:
            loop = asyncio.get_running_loop()
            written: asyncio.Future[str | None] = loop.create_future()

            def on_written(error: str | None) -> None:  # the writer thread, after its commit (or rollback)
                loop.call_soon_threadsafe(_settle, written, error)

            decoded.batch.on_written = on_written
            try:
                store.submit(decoded.batch)
            except StoreSaturated:
                return refuse(429, "ingest queue full, retry later", headers=retry)
            try:
                error = await asyncio.wait_for(asyncio.shield(written), ack_timeout_s)
            except TimeoutError:
                error = f"not stored within {ack_timeout_s:g} s"
            if error is not None:  # nothing is acknowledged that is not on disk: the client sends it again
                return refuse(503, f"spans not stored ({error}), retry later", headers=retry)
        count(enc_label, 200)
        return success_response(decoded.rejected, decoded.errors, ctype)
    finally:
        held.release()


def _settle(future: asyncio.Future[str | None], error: str | None) -> None:
    if not future.done():
        future.set_result(error)
