"""OTLP/HTTP trace receiver (`POST /v1/traces`), per opentelemetry-proto 1.x.

- `application/x-protobuf` and `application/json` bodies, optionally `Content-Encoding: gzip`.
- The body limit applies after decompression; gzip is inflated in bounded steps, so a gzip bomb
  is refused (413) as soon as it inflates past the limit, never fully inflated.
- Undecodable data: 400 with a `google.rpc.Status` body in the request's encoding.
- Other content types: 415. Store saturated (bounded ingest queue): 429 with `Retry-After`.
- Spans with bad ids are rejected one by one: 200 with `partial_success`.
- Decoding lives in `starttrace.sources.otlp` (run in a worker process by `service.decoder`);
  this module is the HTTP side.
"""

from __future__ import annotations

import json
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
_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the request body, inflating gzip/deflate in bounded steps; BodyTooLarge past max_bytes."""
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
        if not inflater.eof:
            raise BadRequest("truncated compressed body")
    except zlib.error as exc:
        raise BadRequest(f"cannot decompress body: {exc}") from None
    return bytes(out)


class UnsupportedEncoding(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# responses


def status_response(code: int, message: str, encoding: str, headers: dict[str, str] | None = None) -> Response:
    """A google.rpc.Status body (protobuf or JSON)."""
    grpc_code = {400: 3, 413: 8, 415: 3, 429: 8, 503: 14, 401: 16}.get(code, 2)
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
    if rejected:
        body = json.dumps(
            {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": resp.partial_success.error_message}}
        )
    else:
        body = "{}"
    return Response(body, status_code=200, media_type=JSON)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def handle_traces(
    request: Request,
    store: Store,
    max_body: int,
    count: Callable[[str, int], None],
    retry_after_s: int = 2,
    decoder: Decoder | None = None,
) -> Response:
    """The `POST /v1/traces` handler. `count(encoding, code)` counts the request for /metrics;
    `decoder` decodes the body in a worker process (service/decoder.py)."""
    ctype = media_type(request)
    enc_label = "protobuf" if ctype == PROTOBUF else "json" if ctype == JSON else "other"
    if ctype not in (PROTOBUF, JSON):
        count(enc_label, 415)
        return status_response(415, f"unsupported content type {ctype!r}; use {PROTOBUF} or {JSON}", JSON)
    try:
        body = await read_body(request, max_bytes=max_body)
    except BodyTooLarge:
        count(enc_label, 413)
        return status_response(413, f"request body larger than {max_body} bytes (after decompression)", ctype)
    except UnsupportedEncoding as exc:
        count(enc_label, 415)
        return status_response(415, f"unsupported content encoding {str(exc)!r}", ctype)
    except BadRequest as exc:
        count(enc_label, 400)
        return status_response(400, str(exc), ctype)
    try:
        decoded = await (decoder or Decoder(workers=0)).decode(body, ctype)
    except BadRequest as exc:
        count(enc_label, 400)
        return status_response(400, str(exc), ctype)
    except (DecodeError, ValueError, TypeError, RecursionError, UnicodeDecodeError) as exc:
        count(enc_label, 400)
        return status_response(400, f"undecodable request: {exc}", ctype)
    if decoded.batch.processes:
        try:
            store.submit(decoded.batch)
        except StoreSaturated:
            count(enc_label, 429)
            return status_response(
                429, "ingest queue full, retry later", ctype, headers={"Retry-After": str(retry_after_s)}
            )
    count(enc_label, 200)
    return success_response(decoded.rejected, decoded.errors, ctype)
