"""Clock measurements made off the traced processes' path: the kernel's NTP state (`adjtimex(2)`,
through ctypes) and an NTP-style exchange with the starttrace service (`GET /v1/clock`).

The exporter (`starttrace.follower`) measures once per node and records the results as resource
attributes of that node's processes:

- `starttrace.clock.ntp_synced` (bool: STA_UNSYNC clear), `starttrace.clock.esterror_us`,
  `starttrace.clock.maxerror_us` (the kernel's estimated and maximum error, microseconds);
- `starttrace.clock.exchange_offset_ns` (this host's clock minus the service's, from the exchange
  with the smallest round trip) and `starttrace.clock.exchange_rtt_ns`.

`analysis.clocks` aligns a domain on the exchange when it has no collective sync point (a node
whose processes join no collective). Nothing here runs inside a traced process: ctypes and HTTP
would be a footprint there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import time
import urllib.request
from typing import Any

from starttrace.run import Run

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
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
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


def exchange(url: str, tries: int = EXCHANGES, timeout_s: float = 2.0) -> dict[str, Any]:
    """NTP-style: local send and receive times around the server's time; the try with the
    smallest round trip wins. {} when the service does not answer (e.g. a Collector)."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        try:
            t0 = time.time_ns()
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
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


def measure(traces_endpoint: str | None) -> dict[str, Any]:
    """NTP state, plus the exchange when the endpoint is a starttrace service."""
    attrs = ntp_state()
    url = clock_url(traces_endpoint) if traces_endpoint else None
    if url:
        attrs.update(exchange(url))
    return attrs


def this_node(run: Run, root_span: str | None, clock_attrs: dict[str, Any]) -> Run:
    """The part of `run` this node's exporter sends: the processes of its own tree (where the
    nodes of a job share one run folder, each exports its own), with `clock_attrs` on them."""
    if root_span:
        own = [p for p in run.processes if p.record.get("root_span") in (root_span, None)]
        if own:
            run.processes = own
            run.root_spans = [s for s in run.root_spans if s.span_id == root_span] or run.root_spans
    for process in run.processes:
        process.resource.update(clock_attrs)
    return run
