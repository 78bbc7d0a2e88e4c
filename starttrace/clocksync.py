"""Clock measurements made off the traced processes' path (ctypes and HTTP would be a footprint
there): the kernel's NTP state (`adjtimex(2)`) and an NTP-style exchange with the service (`GET
/v1/clock`, with the OTLP exporter's headers so a `--token` service answers it).

The exporter (`follower`) measures once per node and records the results as `starttrace.clock.*`
resource attributes of that node's processes (docs/multinode.md); a run without an exporter gets
the NTP state from a helper its root starts at ready or exit (`record`: a clock file in the run folder).
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from starttrace.run import Run

# = starttrace.sources.journal_files.CLOCK_PREFIX (not imported: the helper below starts lean)
CLOCK_PREFIX = "clock-"

STA_UNSYNC = 0x0040
EXCHANGES = 5
CLOCK_PATH = "/v1/clock"


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex (linux/timex.h), as far as the fields read here; the tail is reserved space."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


def ntp_state() -> dict[str, Any]:
    """The kernel's view of its clock (read-only adjtimex, modes 0); {} where it cannot be read."""
    try:  # the interpreter's own symbols include the C library's (find_library would run ldconfig)
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "adjtimex"):
            from ctypes.util import find_library

            libc = ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return {}
    if state < 0:
        return {}
    return {
        "starttrace.clock.ntp_synced": not (timex.status & STA_UNSYNC),
        "starttrace.clock.esterror_us": int(timex.esterror),
        "starttrace.clock.maxerror_us": int(timex.maxerror),
        "starttrace.clock.ntp_state": int(state),  # TIME_OK 0 ... TIME_ERROR 5
    }


def clock_url(traces_endpoint: str) -> str | None:
    """The service's clock route next to its OTLP traces route (None for another endpoint shape)."""
    base = traces_endpoint.rstrip("/")
    if not base.endswith("/v1/traces"):
        return None
    return base[: -len("/v1/traces")] + CLOCK_PATH


def otlp_headers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers the OTLP/HTTP exporter sends (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else
    `OTEL_EXPORTER_OTLP_HEADERS`, read as the SDK reads them): the exchange sends them too, so a
    service started with `--token` answers it (`OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20T`)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    if not raw.strip():
        return {}
    from opentelemetry.util.re import parse_env_headers

    return dict(parse_env_headers(raw, liberal=True))


def exchange(
    url: str, tries: int = EXCHANGES, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """NTP-style: local send and receive times around the server's time; the try with the
    smallest round trip wins. {} when the service does not answer (e.g. a Collector, or a
    service that refuses the token)."""
    import urllib.request  # here, not at import: the NTP state alone needs no HTTP

    request = urllib.request.Request(url, headers=dict(headers or {}))
    best: tuple[int, int] | None = None
    for _ in range(tries):
        try:
            t0 = time.time_ns()
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                body = response.read(4096)
            t3 = time.time_ns()
            server = int(json.loads(body)["time_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        rtt = t3 - t0
        offset = (t0 + t3) // 2 - server
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    if best is None:
        return {}
    return {"starttrace.clock.exchange_offset_ns": best[0], "starttrace.clock.exchange_rtt_ns": best[1]}


def measure(traces_endpoint: str | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """NTP state, plus the exchange when the endpoint is a starttrace service (with the OTLP
    exporter's headers from `environ`, default os.environ)."""
    attrs = ntp_state()
    url = clock_url(traces_endpoint) if traces_endpoint else None
    if url:
        attrs.update(exchange(url, headers=otlp_headers(environ)))
    return attrs


def this_node(run: Run, root_span: str | None, clock_attrs: dict[str, Any]) -> Run:
    """The part of `run` this node's exporter sends: the processes of its own tree (where the
    nodes of a job share one run folder, each exports its own), with `clock_attrs` on them."""
    if root_span:
        import polars as pl  # here: the clock helper (`main`) starts lean

        own = [p for p in run.processes if p.record.get("root_span") in (root_span, None)]
        if own:
            run.processes = own
            run.spans = run.spans.filter(pl.col("lane").is_in([p.instance_id for p in own]))
            run.root_spans = [s for s in run.root_spans if s.span_id == root_span] or run.root_spans
    for process in run.processes:
        process.resource.update(clock_attrs)
    return run


# ------------------------------------------------------------------------------------------------
# journal-only runs: the NTP state in the run folder (no exporter measures it there)


def record(run_dir: Path, root_span: str, domain: str) -> Path | None:
    """Write this host's NTP state into `run_dir` for the processes of clock domain `domain`
    (what a node's exporter records on them over OTLP; the journal reader adds it to the processes
    of the same kernel). None when adjtimex cannot be read."""
    attrs = ntp_state()
    if not attrs:
        return None
    body = {"v": 1, "root_span": root_span, "domain": domain, "measured_epoch_ns": time.time_ns(), "attrs": attrs}
    path = Path(run_dir) / f"{CLOCK_PREFIX}{root_span}.json"
    temporary = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")  # pids repeat across hosts
    try:
        temporary.write_text(json.dumps(body, separators=(",", ":")) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # a full disk leaves nothing behind
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m starttrace.clocksync RUN_DIR ROOT_SPAN DOMAIN`: started, detached, by a run's root
    process at its ready or exit when no exporter runs (starttrace.tracer.lifecycle.record_clock_later)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(main.__doc__, file=sys.stderr)
        return 2
    try:
        record(Path(args[0]), args[1], args[2])
    except Exception as exc:  # reported once; nothing traced waits for this process
        print(f"starttrace: cannot record the clock state: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
