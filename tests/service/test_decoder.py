"""OTLP bodies are decoded in a worker process (service/decoder.py): stored the same, bad bodies
refused the same, and a worker that dies costs nothing but a report and a restart."""

from __future__ import annotations

import os
import signal

import httpx
import psutil
from st_service_helpers import Server, wait_for
from synth_runs import make_run, protobuf_batches

from starttrace.service.decoder import INLINE_MAX_BYTES

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _workers(server: Server) -> list[psutil.Process]:
    """The decoder's worker processes (the spawn resource tracker is a child too)."""
    children = psutil.Process(server.proc.pid).children()
    return [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]


def _stored(server: Server) -> int:
    runs = httpx.get(server.url + "/runs", timeout=30).json()["runs"]
    return sum(r["spans"] for r in runs)


def test_large_bodies_go_to_a_worker_and_are_stored(server: Server) -> None:
    run = make_run(ranks=2, imports_per_rank=600, run_id="decoded", seed=3)
    bodies = protobuf_batches(run, 512)
    assert sum(len(b) > INLINE_MAX_BYTES for b in bodies) >= 2, "some bodies must be large enough for the worker"
    wait_for(lambda: len(_workers(server)) == 1, timeout=30)
    wait_for(lambda: httpx.get(server.url + "/healthz").json()["decoder"] == "ready", timeout=60)
    for body in bodies:
        assert httpx.post(server.url + "/v1/traces", content=body, headers=PROTOBUF, timeout=30).status_code == 200
    wait_for(lambda: _stored(server) == run.span_count, timeout=30)
    assert httpx.get(server.url + "/healthz").json()["decoder_errors"] == []


def test_a_bad_body_decoded_in_the_worker_is_a_400_with_the_reason(server: Server) -> None:
    body = b"\x0a\xff\xff\xff\xff\x0f" + os.urandom(INLINE_MAX_BYTES * 2)
    r = httpx.post(server.url + "/v1/traces", content=body, headers=PROTOBUF, timeout=30)
    assert r.status_code == 400
    assert _workers(server), "the worker survives a bad body"
    assert httpx.get(server.url + "/healthz").json()["decoder_errors"] == []


def test_a_killed_worker_loses_no_span_and_is_replaced(server: Server) -> None:
    run = make_run(ranks=1, imports_per_rank=1500, run_id="killed", seed=4)
    first, *rest = sorted(protobuf_batches(run, 512), key=len, reverse=True)
    assert len(first) > INLINE_MAX_BYTES
    wait_for(lambda: len(_workers(server)) == 1, timeout=30)
    (worker,) = _workers(server)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    r = httpx.post(server.url + "/v1/traces", content=first, headers=PROTOBUF, timeout=30)
    assert r.status_code == 200  # decoded in the service itself this once
    errors = httpx.get(server.url + "/healthz").json()["decoder_errors"]
    assert len(errors) == 1 and "decoder process failed" in errors[0]
    wait_for(lambda: [w.pid for w in _workers(server)] not in ([], [worker.pid]), timeout=30)
    for body in rest:
        assert httpx.post(server.url + "/v1/traces", content=body, headers=PROTOBUF, timeout=30).status_code == 200
    wait_for(lambda: _stored(server) == run.span_count, timeout=30)
    assert len(httpx.get(server.url + "/healthz").json()["decoder_errors"]) == 1, "reported once"


def test_the_worker_exits_with_a_killed_service(server: Server) -> None:
    wait_for(lambda: len(_workers(server)) == 1, timeout=30)
    (worker,) = _workers(server)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    worker.wait(10)  # psutil.TimeoutExpired if the worker outlives its service
    assert not worker.is_running()


def test_packed_by_the_worker_is_stored_as_decoded_in_the_service(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the worker hands back (each process's spans packed) is stored exactly as the same body
    decoded in the service; and a span that comes again in the other form is still one span."""
    from starttrace.service.decoder import decode_packed
    from starttrace.sources.otlp import PROTOBUF as CTYPE
    from starttrace.sources.otlp import parse_and_decode
    from starttrace.sources.store import Store

    run = make_run(ranks=2, imports_per_rank=300, run_id="packed", seed=5)
    bodies = protobuf_batches(run, 128)
    packed, inline = Store(tmp_path / "p.db"), Store(tmp_path / "i.db")
    for body in bodies:
        batch = decode_packed(body, CTYPE).batch
        assert all(p.packed and not p.spans for p in batch.processes)
        packed.ingest_now(batch)
        inline.ingest_now(parse_and_decode(body, CTYPE).batch)
    rows = packed.load_rows("packed")
    assert rows is not None and rows.spans.equals(inline.load_rows("packed").spans)  # type: ignore[union-attr]
    assert packed.count_spans("packed") == run.span_count
    for body in bodies[:3]:  # again, now as tuples: nothing new
        packed.ingest_now(parse_and_decode(body, CTYPE).batch)
    assert packed.count_spans("packed") == run.span_count
    assert packed.load_rows("packed").spans.equals(rows.spans)  # type: ignore[union-attr]
    packed.close()
    inline.close()


def test_without_a_worker_bodies_are_decoded_in_the_service(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory("--decode-workers", "0")
    assert httpx.get(server.url + "/healthz").json()["decoder"] == "off"
    run = make_run(ranks=1, imports_per_rank=600, run_id="inline", seed=4)
    bodies = protobuf_batches(run, 512)
    assert any(len(b) > INLINE_MAX_BYTES for b in bodies)
    for body in bodies:
        assert httpx.post(server.url + "/v1/traces", content=body, headers=PROTOBUF, timeout=30).status_code == 200
    wait_for(lambda: _stored(server) == run.span_count, timeout=30)
    assert _workers(server) == []


def test_every_worker_is_started_with_the_service(server_factory) -> None:  # type: ignore[no-untyped-def]
    """With two workers, both are running once the service says its decoder is ready: the second
    does not start (importing the decoder) in the middle of the first burst of requests."""
    server = server_factory("--decode-workers", "2")
    wait_for(lambda: httpx.get(server.url + "/healthz").json()["decoder"] == "ready", timeout=60)
    assert len(_workers(server)) == 2
