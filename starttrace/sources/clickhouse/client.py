"""Where a ClickHouse run source connects: the URL, and one small client over two engines.

`http(s)://user:pass@host:8123/db?table=otel_traces` is a server through `clickhouse-connect`;
`chdb:PATH[?database=otel&table=otel_traces]` the embedded engine over a data directory (docs/fleet.md).
Both answer a query as an Arrow table (`arrow`) or run a statement (`command`), with parameters the
ClickHouse way (`{name:Type}`): no value is ever pasted into SQL text; identifiers go through `ident`.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from starttrace.sources.clickhouse.ddl import DEFAULT_DATABASE, DEFAULT_TABLE

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class ClickHouseError(RuntimeError):
    """A bad URL, a missing client library, or an engine that refused a statement."""


def ident(name: str) -> str:
    """A database or table name, back-quoted (only plain names are accepted)."""
    if not _IDENT.match(name):
        raise ClickHouseError(f"invalid ClickHouse identifier {name!r}: letters, digits and _ only")
    return f"`{name}`"


@dataclass(frozen=True)
class ClickHouseURL:
    kind: str  # "http" | "chdb"
    database: str = DEFAULT_DATABASE
    table: str = DEFAULT_TABLE
    host: str = ""
    port: int = 8123
    user: str = "default"
    password: str = ""
    secure: bool = False
    path: str = ""  # chdb: the data directory

    @property
    def traces(self) -> str:
        """`db`.`table` of otel_traces."""
        return f"{ident(self.database)}.{ident(self.table)}"

    def redacted(self) -> str:
        """The URL without its password (for messages and pages)."""
        if self.kind == "chdb":
            return f"chdb:{self.path}?database={self.database}&table={self.table}"
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{self.user}@{self.host}:{self.port}/{self.database}?table={self.table}"


def parse_url(url: str) -> ClickHouseURL:
    """`http(s)://user:pass@host:port/db?table=T` or `chdb:PATH[?database=D&table=T]`."""
    url = url.strip()
    if url.startswith("chdb:"):
        path, _, query = url.removeprefix("chdb:").partition("?")
        if not path:
            raise ClickHouseError("chdb URL without a path: use chdb:/path/to/dir")
        q = {k: v[-1] for k, v in parse_qs(query).items()}
        unknown = set(q) - {"database", "table"}
        if unknown:
            raise ClickHouseError(f"unknown chdb URL parameter(s): {', '.join(sorted(unknown))}")
        out = ClickHouseURL(
            "chdb", database=q.get("database", DEFAULT_DATABASE), table=q.get("table", DEFAULT_TABLE), path=path
        )
    else:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClickHouseError(f"invalid ClickHouse URL {url!r}: use http(s)://user:pass@host:8123/db or chdb:PATH")
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(q) - {"table"}
        if unknown:
            raise ClickHouseError(f"unknown ClickHouse URL parameter(s): {', '.join(sorted(unknown))}")
        secure = parts.scheme == "https"
        try:
            port = parts.port or (8443 if secure else 8123)
        except ValueError:
            raise ClickHouseError(f"invalid port in ClickHouse URL {url!r}") from None
        database = parts.path.strip("/") or DEFAULT_DATABASE
        out = ClickHouseURL(
            "http",
            database=unquote(database),
            table=q.get("table", DEFAULT_TABLE),
            host=parts.hostname,
            port=port,
            user=unquote(parts.username) if parts.username else "default",
            password=unquote(parts.password) if parts.password else "",
            secure=secure,
        )
    ident(out.database)
    ident(out.table)
    return out


class Client(Protocol):
    url: ClickHouseURL

    def arrow(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        """The query's answer as a pyarrow Table."""

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run a statement (DDL, INSERT ... FORMAT ...)."""

    def close(self) -> None: ...


# chdb allows one engine per process: sessions are shared by data directory (and only one directory
# per process can be open at a time). Queries run one at a time (`_CHDB_QUERY`): two threads querying
# one session at once with parameters lost them ("Substitution `by` is not set", seen under a request
# and the facts deriver together).
_CHDB_LOCK = threading.Lock()
_CHDB_QUERY = threading.Lock()
_CHDB_SESSIONS: dict[str, Any] = {}


class ChdbClient:
    """The embedded engine over a data directory (`chdb.session.Session`)."""

    def __init__(self, url: ClickHouseURL, create: bool = False) -> None:
        """`create`: a missing data directory is made (tests, benchmarks); a reader is refused one."""
        try:
            from chdb import session
        except ImportError:
            raise ClickHouseError("chdb is not installed: pip install 'starttrace[clickhouse]'") from None
        self.url = url
        path = Path(url.path)
        if path.exists() and not path.is_dir():
            raise ClickHouseError(f"chdb:{url.path} is not a directory: chdb:PATH names a chdb data directory")
        if not create and not path.exists():
            raise ClickHouseError(f"no chdb data directory at {url.path}: chdb:PATH reads an existing one")
        with _CHDB_LOCK:
            sess = _CHDB_SESSIONS.get(url.path)
            if sess is None:
                for other in list(_CHDB_SESSIONS):  # one engine per process: the previous one closes
                    _CHDB_SESSIONS.pop(other).close()
                try:
                    sess = session.Session(url.path)
                except Exception as exc:
                    held = f"cannot open the chdb data directory {url.path} (another process holding it?)"
                    raise ClickHouseError(f"{held}: {_first_line(exc)}") from None
                _CHDB_SESSIONS[url.path] = sess
        self._session = sess

    def arrow(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        try:
            with _CHDB_QUERY:
                return self._session.query(sql, "ArrowTable", params=_chdb_params(params))
        except Exception as exc:
            raise ClickHouseError(_first_line(exc)) from None

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        try:
            with _CHDB_QUERY:
                self._session.query(sql, "CSV", params=_chdb_params(params))
        except Exception as exc:
            raise ClickHouseError(_first_line(exc)) from None

    def close(self) -> None:
        """Sessions stay open for the process (chdb: one engine per process); see `close_all`."""


def _first_line(exc: Exception) -> str:
    """The engine's message without the stack trace chdb appends."""
    text = str(exc)
    return text.split(", Stack trace", 1)[0].split("\n0. ", 1)[0].strip()[:2000]


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


# A query parameter's text is read the way TSV reads a field: backslash escapes live, a tab or newline
# ends the value. A string is escaped that way so that it arrives exactly as sent (`fleet-0000\x31`
# stays itself, a trailing `\` or a run id holding a newline is no error).
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n"})


def _chdb_params(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """Parameters as chdb takes them: strings TSV-escaped, arrays as ClickHouse literals (whose
    quoted strings are read as written), other scalars as chdb converts them."""
    if not params:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, (list, tuple)):
            out[key] = "[" + ",".join(map(_literal, value)) + "]"
        elif isinstance(value, str):
            out[key] = value.translate(_TSV_ESCAPES)
        else:
            out[key] = value
    return out


def close_all() -> None:
    """Close the process's embedded engine (tests that open several data directories)."""
    with _CHDB_LOCK:
        for key in list(_CHDB_SESSIONS):
            _CHDB_SESSIONS.pop(key).close()


class HttpClient:
    """A ClickHouse server over HTTP (`clickhouse-connect`)."""

    def __init__(self, url: ClickHouseURL) -> None:
        try:
            import clickhouse_connect
        except ImportError:
            raise ClickHouseError("clickhouse-connect is not installed: pip install 'starttrace[clickhouse]'") from None
        self.url = url
        try:
            self._client = clickhouse_connect.get_client(
                host=url.host,
                port=url.port,
                username=url.user,
                password=url.password,
                secure=url.secure,
                database=url.database,
                autogenerate_session_id=False,  # thread-safe: no server session shared by requests
            )
        except Exception as exc:
            raise ClickHouseError(f"cannot connect to {url.redacted()}: {exc}") from None

    def arrow(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        try:
            return self._client.query_arrow(sql, parameters=params or None, use_strings=True)
        except Exception as exc:
            raise ClickHouseError(str(exc)) from None

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        try:
            self._client.command(sql, parameters=params or None)
        except Exception as exc:
            raise ClickHouseError(str(exc)) from None

    def close(self) -> None:
        self._client.close()


def connect(url: str | ClickHouseURL, create: bool = False) -> Client:
    """A client; `create`: an embedded data directory that is not there yet is made (tests, benchmarks)."""
    parsed = parse_url(url) if isinstance(url, str) else url
    return ChdbClient(parsed, create) if parsed.kind == "chdb" else HttpClient(parsed)


# the columns of otel_traces that starttrace reads (ddl.py): a table without them is not the exporter's
REQUIRED_COLUMNS = {
    "Timestamp": "DateTime64",
    "TraceId": "String",
    "SpanId": "String",
    "ParentSpanId": "String",
    "SpanName": "",
    "ServiceName": "",
    "ResourceAttributes": "Map",
    "SpanAttributes": "Map",
    "Duration": "UInt64",
    "StatusCode": "",
    "StatusMessage": "String",
    "Events.Name": "Array",
    "Links.SpanId": "Array",
    "Links.Attributes": "Array",
}
COLUMNS_SQL = "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {table:String}"


def check_traces_table(client: Client) -> None:
    """Refuse a source whose traces table is missing or is not the exporter's (a clear message, at start)."""
    url = client.url
    rows = client.arrow(COLUMNS_SQL, {"db": url.database, "table": url.table}).to_pylist()
    if not rows:
        raise ClickHouseError(
            f"{url.redacted()}: no table {url.database}.{url.table} (the Collector's clickhouse exporter creates it;"
            " ?table= and the database name another)"
        )
    types = {str(r["name"]): str(r["type"]) for r in rows}
    bad = [
        f"{name} ({types[name]})" if name in types else name
        for name, kind in REQUIRED_COLUMNS.items()
        if name not in types or kind not in types[name]
    ]
    if bad:
        raise ClickHouseError(
            f"{url.redacted()}: {url.database}.{url.table} is not the exporter's otel_traces schema:"
            f" missing or mistyped column(s) {', '.join(bad)}"
        )
