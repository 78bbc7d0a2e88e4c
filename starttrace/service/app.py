"""The starttrace service: FastAPI app factory `create_app(settings)`.

Endpoints (docs/service.md): POST /v1/traces, GET /startup, GET /startup/{run_id}, GET /runs,
GET /runs/{run_id}/export, GET /compare, GET /fleet, GET /metrics, GET /healthz, /openapi.json, /static.
Runs come from the embedded store (default) or, with `Settings.clickhouse`, from ClickHouse's
`otel_traces` (docs/fleet.md).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import hmac
import ipaddress
import json
import math
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from starttrace.analysis.compare import compare
from starttrace.analysis.detail import DEFAULT_IMPORT_BUDGET
from starttrace.analysis.model import RunModel
from starttrace.service.decoder import Decoder
from starttrace.service.fleet import FactsDeriver, Prefetching, direct_loader, fleet_of, model_loader
from starttrace.service.model_cache import ModelCache
from starttrace.service.otlp_receiver import (
    DEFAULT_ACK_TIMEOUT_S,
    DEFAULT_INFLIGHT_BYTES,
    DEFAULT_MAX_BODY,
    IngestBudget,
    handle_traces,
)
from starttrace.service.responses import StrictJSONResponse as JSONResponse
from starttrace.sources.clickhouse.client import ClickHouseError
from starttrace.sources.facts_store import FactsStore
from starttrace.sources.journal_watcher import JournalWatcher
from starttrace.sources.store import Store
from starttrace.views import html
from starttrace.views import json as json_view
from starttrace.views import prometheus as metrics
from starttrace.views.export import export_document
from starttrace.views.html import PHASE_COLORS


def default_db_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "starttrace" / "starttrace.db"


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_retention(value: str | float | int | None) -> float | None:
    """'7d', '12h', '30m', '90s', '2w' or a number of days -> seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value) * 86400
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"invalid retention {value!r}: use e.g. 7d, 12h, 30m")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2) or "d"]


@dataclass
class Settings:
    db: Path | str | None = None
    journal_dir: Path | str | None = None
    token: str | None = None
    retention_s: float | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    queue_max_spans: int = 400_000
    inflight_max_bytes: int = DEFAULT_INFLIGHT_BYTES  # request bodies held at once; past it 503 + Retry-After
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S  # spans not committed by then: 503 (never a 200)
    body_timeout_s: float = 10.0  # an OTLP body not received whole by then: 408, the connection closed
    poll_s: float = 1.0
    retry_after_s: int = 2
    live_model_ttl_s: float = 1.0
    prebuild_idle_s: float | None = 0.3  # build a run's model this long after its last ingest; None: on request only
    start_background: bool = True
    decode_workers: int = 1  # processes decoding OTLP bodies (service/decoder.py); 0: in the service itself
    host: str = "127.0.0.1"  # the bind address: which Host headers are accepted (HostGuard)
    allowed_hosts: tuple[str, ...] = ()  # more names a client may call the service by (--allow-host)
    clickhouse: str | None = None  # read runs from ClickHouse (http(s)://... or chdb:PATH) instead of the store
    fleet_interval_s: float = 10.0  # how often runs lacking fleet facts are looked for (service/fleet.py)
    fleet_idle_s: float = 5.0  # a run's facts are derived once it has had no new span for this long
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# auth (pure ASGI, so it costs nothing on the ingest path)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
COOKIE = "starttrace_token"


async def _refuse(send: Send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A JSON error answered by the middleware itself (the app never sees the request)."""
    length = (b"content-length", str(len(body)).encode())
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers, length],
        }
    )
    await send({"type": "http.response.body", "body": body})


class TokenAuth:
    """Bearer token on every endpoint but /healthz. Browsers may open `/startup?token=...` once:
    the token is then kept in an HttpOnly, SameSite=Strict cookie for the page's own requests."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _ok(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") == "/healthz":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer ") and self._ok(auth[7:].strip()):
            await self.app(scope, receive, send)
            return
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and self._ok(value):
                await self.app(scope, receive, send)
                return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        q = query.get("token", [None])[0]
        if self._ok(q):

            async def send_with_cookie(message: Message) -> None:
                if message["type"] == "http.response.start":
                    hdrs = list(message.get("headers", []))
                    hdrs.append((b"set-cookie", f"{COOKIE}={q}; HttpOnly; SameSite=Strict; Path=/".encode("latin-1")))
                    message["headers"] = hdrs
                await send(message)

            await self.app(scope, receive, send_with_cookie)
            return
        body = b'{"error":"unauthorized: send Authorization: Bearer <token>"}'
        await _refuse(send, 401, body, ((b"www-authenticate", b'Bearer realm="starttrace"'),))


# ---------------------------------------------------------------------------------------------
# Host header check (DNS rebinding): a web page the user visits can rebind its own name to
# 127.0.0.1 and read the service's runs (argv, cwd, API keys in commands); the browser then sends
# the attacker's name as Host. Only names a client of this service can have are accepted.

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """A loopback name or address (`localhost`, `*.localhost`, 127.0.0.0/8, ::1)."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name of a Host header value: lower case, without port, brackets or a trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HostGuard:
    """Refuse (421) a request whose Host header is not a name of this service. Bound to loopback
    (the default): loopback names, the bind address and `allowed`. Bound beyond loopback, also IP
    literals, single-label names (a container's service name) and this machine's host names: a
    DNS-rebinding attack needs a dotted public name it controls, and none of these is one."""

    def __init__(self, app: ASGIApp, bind: str, allowed: tuple[str, ...] = ()) -> None:
        self.app = app
        self.local_only = is_loopback(bind)
        names = {_host_name(n) for n in allowed if n.strip()}
        if bind not in ("", "0.0.0.0", "::"):
            names.add(_host_name(bind))
        if not self.local_only:
            with contextlib.suppress(OSError):
                names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
        self.names = frozenset(names)

    def allows(self, value: str) -> bool:
        name = _host_name(value)
        if not name or is_loopback(name) or name in self.names:
            return True
        if self.local_only:
            return False
        if "." not in name:
            return True
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"host"), "")
        if self.allows(host):
            await self.app(scope, receive, send)
            return
        error = f"Host {host[:200]!r} is not a name of this service (DNS rebinding guard)"
        body = json.dumps({"error": f"{error}; start it with --allow-host NAME to accept it"}).encode()
        await _refuse(send, 421, body)


SLASH_IN_SEGMENT = "\ue000"  # a "/" sent inside one path segment (%2F), until the handler reads the id


class EncodedSlashes:
    """A run id holding "/" (ClickHouse keeps ids as exporters send them) is one path segment,
    `/startup/a%2Fb`: servers decode %2F into the path, which then routes as two segments (404).
    Such a request is routed on its raw path, a "/" within a segment kept as SLASH_IN_SEGMENT;
    `path_id` turns it back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and b"%2f" in raw.lower():
            segments = raw.split(b"?", 1)[0].split(b"/")
            decoded = (unquote_to_bytes(seg).decode("utf-8", "replace") for seg in segments)
            scope = dict(scope, path="/".join(seg.replace("/", SLASH_IN_SEGMENT) for seg in decoded))
        await self.app(scope, receive, send)


def path_id(value: str) -> str:
    """A run id from the path, as sent (see EncodedSlashes)."""
    return value.replace(SLASH_IN_SEGMENT, "/")


def wants_html(request: Request) -> bool:
    fmt = request.query_params.get("format")
    if fmt in ("html", "json"):
        return fmt == "html"
    accept = request.headers.get("accept", "")
    best_html = best_json = 0.0
    for part in accept.split(","):
        items = [x.strip() for x in part.split(";")]
        mt = items[0].lower()
        q = 1.0
        for p in items[1:]:
            if p.startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        if mt in ("text/html", "application/xhtml+xml"):
            best_html = max(best_html, q)
        elif mt in ("application/json", "application/*"):
            best_json = max(best_json, q)
        elif mt == "*/*":
            best_json = max(best_json, q * 0.999)
    return best_html > best_json


def not_found(run_id: str) -> JSONResponse:
    return JSONResponse({"error": "run not found", "run_id": run_id}, status_code=404)


EXPORTS_KEPT = 16  # rendered exports kept in memory, least recently used out first
EXPORT_BYTES_KEPT = 512 * 1024 * 1024

# times the store can hold (signed 64-bit epoch ns: 1677-09-21 .. 2262-04-11)
_MAX_NS = 2**63 - 1


def _parse_time(value: str | None) -> int | None:
    """Epoch seconds, or ISO 8601, or relative ('2h' = two hours ago) -> epoch ns. ValueError with
    a clear message for anything else, and for a time out of range (e.g. epoch milliseconds)."""
    if value is None or value == "":
        return None
    try:
        secs = float(value)
    except ValueError:
        rel = _DURATION.match(value)
        if rel and rel.group(2):
            secs = time.time() - (parse_retention(value) or 0.0)
        else:
            try:
                when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"invalid time {value!r}: use epoch seconds, ISO 8601 or e.g. 2h") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            secs = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds()
    if not math.isfinite(secs) or abs(secs) * 1e9 >= _MAX_NS:
        hint = " (epoch milliseconds? use seconds)" if math.isfinite(secs) and abs(secs) < 1e16 else ""
        raise ValueError(f"time {value!r} out of range: epoch seconds between 1677 and 2262{hint}")
    return int(secs * 1e9)


def create_app(settings: Settings | None = None) -> FastAPI:
    # Long by design: FastAPI routes are closures over the app's store, cache and settings; each route is short.
    settings = settings or Settings()
    counters = metrics.Counters()
    db = settings.db if settings.db is not None else default_db_path()
    store: Any
    facts: Any
    if settings.clickhouse:  # runs from otel_traces, facts in starttrace_runs beside it
        from starttrace.sources.clickhouse.facts import ClickHouseFacts
        from starttrace.sources.clickhouse.store import ClickHouseStore

        store = ClickHouseStore(settings.clickhouse)
        facts = ClickHouseFacts(store.client)
    else:
        store = Store(db, queue_max_spans=settings.queue_max_spans, on_stored=counters.add_ingested)
        facts = FactsStore(db)
    cache = ModelCache(store, settings.live_model_ttl_s, settings.prebuild_idle_s)
    if settings.clickhouse:
        cache.groups = store.groups  # type: ignore[assignment]

    def expire() -> None:
        """Drop runs past retention, their models and their facts (ClickHouse expires by its own TTL)."""
        expired = store.expire(settings.retention_s)
        cache.forget(expired)
        if expired and hasattr(facts, "forget"):
            facts.forget(expired)

    if settings.clickhouse:  # a hundred runs per load (two queries), not through the model cache
        prefetching = Prefetching(store.runs.load_runs)
        loader = direct_loader(prefetching.load_run, prefetching)
    else:  # the cache's prebuilt models
        loader = model_loader(cache)
    deriver = FactsDeriver(facts, loader, settings.fleet_interval_s, settings.fleet_idle_s, counters.observe_run)
    decoder = Decoder(settings.decode_workers)
    budget = IngestBudget(settings.inflight_max_bytes)
    store.on_runs_written = cache.note_written
    watcher = (
        JournalWatcher(Path(settings.journal_dir), store, settings.poll_s, settings.retention_s)
        if settings.journal_dir and not settings.clickhouse
        else None
    )
    templates = html.environment()
    exports: collections.OrderedDict[tuple[Any, ...], bytes] = collections.OrderedDict()  # see export()
    export_lock = threading.Lock()
    stop_maintenance = threading.Event()

    def maintenance() -> None:
        while not stop_maintenance.wait(60.0):
            if settings.retention_s is not None:
                with contextlib.suppress(Exception):
                    expire()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.start_background:
            decoder.start()
            store.start()
            cache.start()
            if settings.retention_s is not None:
                expire()
            if watcher is not None:
                watcher.start()
            deriver.start()
            threading.Thread(target=maintenance, name="starttrace-maintenance", daemon=True).start()
        try:
            yield
        finally:
            stop_maintenance.set()
            deriver.stop()
            if watcher is not None:
                watcher.stop()
            store.stop()
            cache.stop()
            decoder.stop()

    app = FastAPI(
        title="starttrace",
        version="0.1.0",
        description="Startup waterfalls of multi-process Python servers (OTLP receiver + journal reader).",
        lifespan=lifespan,
    )
    @app.exception_handler(ClickHouseError)
    async def store_unavailable(request: Request, exc: ClickHouseError) -> JSONResponse:
        """Any route whose store (ClickHouse) failed: 503 with the engine's message, never a bare 500."""
        return JSONResponse({"error": f"ClickHouse: {exc}"[:2000]}, status_code=503, headers={"Retry-After": "5"})

    app.state.store = store
    app.state.cache = cache
    app.state.counters = counters
    app.state.watcher = watcher
    app.state.decoder = decoder
    app.state.settings = settings
    app.state.facts = facts
    app.state.deriver = deriver
    app.mount("/static", StaticFiles(directory=str(html.STATIC)), name="static")

    def render(name: str, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(html.render_page(templates, name, **ctx))

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "queued_spans": store.queued_spans,
            "peak_queued_spans": store.peak_queued_spans,
            "inflight_bytes": budget.used,
            "peak_inflight_bytes": budget.peak,
            "store_errors": store.errors[-5:],
            "models_pending": cache.pending,
            "model_errors": cache.errors[-5:],
            "journal_errors": watcher.errors[-5:] if watcher else [],
            "decoder": decoder.state,
            "decoder_errors": decoder.errors[-5:],
            "fleet_errors": deriver.errors[-5:],
            "source": "clickhouse" if settings.clickhouse else "store",
        }

    @app.post(
        "/v1/traces",
        responses={
            200: {"description": "ExportTraceServiceResponse (partial_success when spans were rejected)"},
            400: {"description": "google.rpc.Status: undecodable request"},
            413: {"description": "google.rpc.Status: body too large after decompression"},
            415: {"description": "unsupported content type"},
            429: {"description": "ingest queue full; Retry-After"},
            503: {"description": "too many request bytes in flight, or the spans could not be stored; Retry-After"},
        },
    )
    async def traces(request: Request) -> Response:
        """OTLP/HTTP trace export (application/x-protobuf or application/json, optionally gzip)."""
        if settings.clickhouse:
            return JSONResponse(
                {"error": "this service reads runs from ClickHouse: send OTLP to the Collector, which writes there"},
                status_code=404,
            )
        return await handle_traces(
            request,
            store,
            settings.max_body_bytes,
            counters.add_request,
            settings.retry_after_s,
            decoder,
            budget,
            settings.ack_timeout_s,
            settings.body_timeout_s,
        )

    @app.get("/v1/clock")
    def clock() -> dict[str, int]:
        """The service's wall clock, for the exporters' NTP-style exchange (starttrace/clocksync.py)."""
        return {"time_ns": time.time_ns()}

    @app.get("/runs")
    def runs(
        request: Request,
        service: str | None = Query(None, description="only runs of this service.name"),
        since: str | None = Query(None, description="epoch seconds, ISO 8601, or relative (2h)"),
        until: str | None = Query(None, description="epoch seconds, ISO 8601, or relative (2h)"),
        limit: int = Query(100, ge=1, le=10000),
    ) -> Response:
        try:
            since_ns, until_ns = _parse_time(since), _parse_time(until)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        rows = store.list_runs(service=service, since_ns=since_ns, until_ns=until_ns, limit=limit)
        if wants_html(request):
            return render("runs.html", runs=rows, service=service)
        return JSONResponse({"runs": rows})

    def _startup(request: Request, run_id: str) -> Response:
        with cache.serving():  # requests first: background work waits (service/model_cache.py)
            return _startup_answer(request, run_id)

    def _startup_answer(request: Request, run_id: str) -> Response:
        if wants_html(request):
            data = cache.head(run_id)
            if data is None:
                return not_found(run_id)
            return render("startup.html", run=data, phase_colors=PHASE_COLORS)
        every_span = request.query_params.get("spans") == "all"
        until = request.query_params.get("until")
        if until not in (None, "ready"):
            return _startup_until(run_id, until, every_span)
        body = cache.json_bytes(run_id) if every_span else cache.first_bytes(run_id)
        if body is None:
            return not_found(run_id)
        return Response(body, media_type="application/json")

    def _startup_until(run_id: str, until: str, every_span: bool) -> Response:
        """`?until=first_token`: the model's breakdowns and critical path end at the first token
        (built for this answer, not cached: the default model ends at ready)."""
        from starttrace.analysis.lanes import NoFirstToken, build_model
        from starttrace.views.json import to_json
        from starttrace.views.startup_json import first_payload

        if until != "first_token":
            return JSONResponse({"error": "until must be ready or first_token"}, status_code=400)
        run = cache.run(run_id)
        if run is None:
            return not_found(run_id)
        try:
            model = build_model(run, until=until)
        except NoFirstToken as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        doc = to_json(model) if every_span else first_payload(model)
        return Response(json.dumps(doc, separators=(",", ":"), default=str), media_type="application/json")

    @app.get("/startup")
    def startup_latest(request: Request) -> Response:
        """The newest run (JSON; HTML when the client prefers text/html)."""
        run_id = store.latest_run_id()
        if run_id is None:
            return JSONResponse({"error": "no runs yet"}, status_code=404)
        return _startup(request, run_id)

    @app.get("/startup/{run_id}")
    def startup(request: Request, run_id: str) -> Response:
        """One run's waterfall model (JSON; HTML when the client prefers text/html)."""
        return _startup(request, path_id(run_id))

    @app.get("/startup/{run_id}/lanes/{lane}/spans")
    def lane_spans(
        run_id: str,
        lane: int,
        start_us: int | None = Query(None, description="window start, µs after the run start"),
        end_us: int | None = Query(None, description="window end, µs after the run start"),
        min_us: int = Query(0, ge=0, description="only spans at least this long (instants always)"),
        limit: int = Query(50_000, ge=1, le=1_000_000, description="at most this many spans, longest first"),
    ) -> Response:
        """One lane's spans in a time window, for the page's zoom and opened lanes (docs/service.md)."""
        run_id = path_id(run_id)
        with cache.serving():
            detail = cache.lane(run_id, lane, start_us=start_us, end_us=end_us, min_us=min_us, limit=limit)
        if detail is None:
            return not_found(run_id)
        if detail is False:
            return JSONResponse({"error": "lane not found", "run_id": run_id, "lane": lane}, status_code=404)
        return Response(json_view.dumps(detail), media_type="application/json")

    @app.get("/runs/{run_id}/export")
    def export(
        run_id: str,
        format: str = Query("perfetto", pattern="^(perfetto|jaeger|otlp-json)$"),
        detail: str = Query("full", pattern="^(full|summary)$", description="full, or summary (what Jaeger holds)"),
        summary_imports: int = Query(DEFAULT_IMPORT_BUDGET, ge=0, le=1_000_000, description="imports kept per process"),
    ) -> Response:
        run_id = path_id(run_id)
        with cache.serving():
            model = cache.model(run_id)
            run = cache.run(run_id) if model is not None else None
        if model is None or run is None:
            return not_found(run_id)
        # Spans still open end where the model ends them: now while the run is live, else at the
        # run's last record (a killed run's open spans do not grow with the clock). Cached per run
        # version (and, while live, per model build, at most one a second): an export of a large
        # run costs seconds of CPU, once.
        now_ns = None if model.live else model.t_end
        key = (run_id, run.version, id(run) if model.live else None, format, detail, summary_imports)
        with export_lock:
            body = exports.get(key)
            if body is not None:
                exports.move_to_end(key)
        if body is None:
            data = export_document(run, format, now_ns=now_ns, detail=detail, import_budget=summary_imports)
            body = json_view.dumps(data).encode()
            del data
            with export_lock:
                exports[key] = body
                while len(exports) > 1 and (
                    len(exports) > EXPORTS_KEPT or sum(map(len, exports.values())) > EXPORT_BYTES_KEPT
                ):
                    exports.popitem(last=False)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)
        suffix = "" if detail == "full" else f".{detail}"
        return Response(
            body,
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="{safe}{suffix}.{format}.json"'},
        )

    @app.get("/compare")
    def compare_runs(request: Request, a: str = Query(...), b: str = Query(...)) -> Response:
        """Run A vs run B: per phase, per rank, per module."""
        with cache.serving():
            ma = cache.model(a)
            mb = cache.model(b) if ma is not None else None
        if ma is None:
            return not_found(a)
        if mb is None:
            return not_found(b)
        cmp = compare(ma, mb).to_json()
        if wants_html(request):
            return render("compare.html", cmp=cmp)
        return JSONResponse(cmp)

    @app.get("/fleet")
    def fleet(
        request: Request,
        by: str = Query(
            "service.version",
            max_length=200,
            description="identity key: service.version, vllm.model, tp, pp, dp, host.name, nodes, container.image, ...",
        ),
        since: str | None = Query(None, description="epoch seconds, ISO 8601, or relative (7d)"),
        until: str | None = Query(None, description="epoch seconds, ISO 8601, or relative (1h)"),
        service: str | None = Query(None, description="only runs of this service.name"),
    ) -> Response:
        """Fleet startup per value of `by`: p50/p95 of time to ready and of each phase, the slowest
        runs, and (by service.version) the phases that regressed from one version to the next."""
        try:
            since_ns, until_ns = _parse_time(since), _parse_time(until)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        try:
            answer = fleet_of(facts, by, since_ns=since_ns, until_ns=until_ns, service=service)
        except ClickHouseError as exc:  # the server is down, or refused the query
            return JSONResponse({"error": f"ClickHouse: {exc}"[:2000]}, status_code=503)
        if wants_html(request):
            source = "ClickHouse " + store.client.url.redacted() if settings.clickhouse else "embedded store"
            return render("fleet.html", fleet=answer, since=since, until=until, service=service, source=source)
        return JSONResponse(answer)

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        def models() -> list[RunModel]:  # the newest run of each service: the gauges' "last run"
            return metrics.newest_per_service(store.newest_run_ids(metrics.METRIC_RUNS), cache.model)

        with cache.serving():  # a scrape is a request: it never waits for background work
            text = metrics.render(counters, models)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    if settings.token:
        app.add_middleware(TokenAuth, token=settings.token)  # type: ignore[arg-type]
    # outermost: a foreign Host is refused before anything else looks at the request
    app.add_middleware(HostGuard, bind=settings.host, allowed=settings.allowed_hosts)  # type: ignore[arg-type]
    app.add_middleware(EncodedSlashes)  # type: ignore[arg-type]
    return app
