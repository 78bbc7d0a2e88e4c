"""OTLP/HTTP receiver rules (REFERENCE "OTLP/HTTP receiver rules") and API error handling."""

from __future__ import annotations

import gzip
import io
import json
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from fastapi.testclient import TestClient
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from st_service_helpers import Server, flush, wait_for
from synth_runs import make_run, to_otlp_json, to_protobuf

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def test_malformed_protobuf_400_with_status(client: TestClient) -> None:
    r = client.post("/v1/traces", content=b"\xff\xff\xff\x0f garbage", headers=PB)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/x-protobuf"
    st = status_pb2.Status.FromString(r.content)
    assert st.code == 3 and "protobuf" in st.message


def test_malformed_json_400_with_status(client: TestClient) -> None:
    for body in (
        b"{not json",
        b"[1, 2]",
        b'{"resourceSpans": "x"}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "abc"}]}]}]}',
    ):
        r = client.post("/v1/traces", content=body, headers=JS)
        assert r.status_code == 400, body
        doc = r.json()
        assert doc["code"] == 3 and doc["message"]


def test_wrong_content_type_415(client: TestClient) -> None:
    r = client.post("/v1/traces", content=b"hello", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = client.post("/v1/traces", content=b"{}", headers={**JS, "Content-Encoding": "br"})
    assert r.status_code == 415


def test_oversized_413(make_client: Callable[..., TestClient]) -> None:
    c = make_client(max_body_bytes=100_000)
    run = make_run(ranks=4, imports_per_rank=300)
    body = to_protobuf(run).SerializeToString()
    assert len(body) > 100_000
    r = c.post("/v1/traces", content=body, headers=PB)
    assert r.status_code == 413
    assert status_pb2.Status.FromString(r.content).message.startswith("request body larger")
    # the same data compressed is small on the wire but still too large once inflated
    small = gzip.compress(body)
    assert len(small) < 100_000
    r = c.post("/v1/traces", content=small, headers={**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 413


def test_gzip_bomb_413_without_inflating(make_client: Callable[..., TestClient]) -> None:
    c = make_client(max_body_bytes=1_000_000)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as gz:
        chunk = b"\0" * (1 << 20)
        for _ in range(1024):  # 1 GiB of zeros
            gz.write(chunk)
    bomb = buf.getvalue()
    assert len(bomb) < 2_000_000
    t = time.perf_counter()
    r = c.post("/v1/traces", content=bomb, headers={**JS, "Content-Encoding": "gzip"})
    elapsed = time.perf_counter() - t
    assert r.status_code == 413
    assert elapsed < 2.0  # inflating 1 GiB would take far longer


def test_truncated_gzip_400(client: TestClient) -> None:
    body = gzip.compress(json.dumps(to_otlp_json(make_run(ranks=1, imports_per_rank=5))).encode())
    r = client.post("/v1/traces", content=body[: len(body) // 2], headers={**JS, "Content-Encoding": "gzip"})
    assert r.status_code == 400


def test_partial_success_bad_ids(client: TestClient) -> None:
    doc = to_otlp_json(make_run(ranks=1, imports_per_rank=5, run_id="partial"))
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["spanId"] = "zz-not-hex"
    spans[1]["traceId"] = "00000000000000000000000000000000"
    total = sum(len(rs["scopeSpans"][0]["spans"]) for rs in doc["resourceSpans"])
    r = client.post("/v1/traces", json=doc)
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == "2"
    flush(client)
    assert client.get("/runs").json()["runs"][0]["spans"] == total - 2
    # protobuf answers with a protobuf ExportTraceServiceResponse
    run = make_run(ranks=1, imports_per_rank=5, run_id="partial-pb", seed=9)
    req = to_protobuf(run)
    req.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01\x02"
    r = client.post("/v1/traces", content=req.SerializeToString(), headers=PB)
    assert r.status_code == 200
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 1


def test_same_span_twice_stored_once(client: TestClient) -> None:
    run = make_run(ranks=2, imports_per_rank=10, run_id="dup")
    body = to_protobuf(run).SerializeToString()
    for _ in range(3):
        assert client.post("/v1/traces", content=body, headers=PB).status_code == 200
    assert client.post("/v1/traces", json=to_otlp_json(run)).status_code == 200
    flush(client)
    assert client.app.state.store.count_spans("dup") == run.span_count  # type: ignore[attr-defined]


def test_in_progress_span_replaced_when_it_ends(client: TestClient) -> None:
    run = make_run(ranks=2, imports_per_rank=10, run_id="grow", in_progress_rank=1)
    assert client.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB).status_code == 200
    flush(client)
    doc = client.get("/startup/grow").json()
    assert doc["status"] == "running" and doc["live"]
    names = [o["name"] for o in doc["in_progress"]]
    assert "vllm.model_load" in names
    open_s = next(o["open_s"] for o in doc["in_progress"] if o["name"] == "vllm.model_load")
    assert open_s > 0
    # the same span arrives ended: it replaces the in-progress copy, and an old copy never wins
    ended = make_run(ranks=2, imports_per_rank=10, run_id="grow")
    for sp in ended.processes[-1].spans:
        if sp.name == "vllm.model_load":
            sp.end = sp.start + 7_000_000
    body = to_protobuf(ended).SerializeToString()
    assert client.post("/v1/traces", content=body, headers=PB).status_code == 200
    assert client.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB).status_code == 200
    flush(client)
    doc = client.get("/startup/grow").json()
    assert doc["status"] == "ready"
    lane = next(ln for ln in doc["lanes"] if ln["rank"] == 1)
    row = next(r for r in lane["spans"] if r[2] == "vllm.model_load")
    assert row[5] - row[4] == 7000 and not (row[7] & 1)


def test_store_saturated_429_retry_after(make_client: Callable[..., TestClient]) -> None:
    c = make_client(queue_max_spans=50)
    store = c.app.state.store  # type: ignore[attr-defined]
    body = to_protobuf(make_run(ranks=1, imports_per_rank=20, run_id="sat")).SerializeToString()
    answers: list[int] = []
    with store.write_lock:  # stall the writer
        # the first request is queued, and answered only once its spans are committed
        first = threading.Thread(
            target=lambda: answers.append(c.post("/v1/traces", content=body, headers=PB).status_code)
        )
        first.start()
        wait_for(lambda: store.queued_spans > 0)
        time.sleep(0.2)
        assert answers == []  # not acknowledged while the writer cannot write
        second = c.post("/v1/traces", content=body, headers=PB)
        assert second.status_code == 429
        assert int(second.headers["Retry-After"]) >= 1
        assert status_pb2.Status.FromString(second.content).message
    first.join(30)
    assert answers == [200]
    flush(c)
    assert c.post("/v1/traces", content=body, headers=PB).status_code == 200
    assert 'starttrace_otlp_requests_total{code="429",encoding="protobuf"} 1.0' in c.get("/metrics").text


def test_unknown_run_404_json(client: TestClient) -> None:
    for path in ("/startup/nope", "/runs/nope/export?format=jaeger", "/compare?a=nope&b=nope"):
        r = client.get(path)
        assert r.status_code == 404
        assert r.json()["error"] == "run not found"
    r = client.get("/startup/nope", headers={"Accept": "text/html"})
    assert r.status_code == 404 and r.json()["run_id"] == "nope"
    assert client.get("/startup").status_code == 404  # no runs at all


def test_xss_span_names_escaped(client: TestClient) -> None:
    run = make_run(ranks=2, imports_per_rank=10, run_id="xss<b>", xss=True)
    assert client.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB).status_code == 200
    flush(client)
    html = client.get("/startup/xss%3Cb%3E", headers={"Accept": "text/html"}).text
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the hotspot row shows it as text
    assert "xss<b>" not in html and "xss&lt;b&gt;" in html
    assert "<img src=x" not in html
    doc = client.get("/startup/xss%3Cb%3E").json()
    names = [r[2] for ln in doc["lanes"] for r in ln["spans"]]
    assert "import <script>alert(1)</script>" in names  # JSON carries the raw text; the page sets it as textContent
    runs_html = client.get("/runs", headers={"Accept": "text/html"}).text
    assert "xss<b>" not in runs_html and "xss&lt;b&gt;" in runs_html


def test_token_enforced(server_factory: Callable[..., Server]) -> None:
    srv = server_factory(env={"STARTTRACE_TOKEN": "s3cret"})
    body = to_protobuf(make_run(ranks=1, imports_per_rank=5, run_id="tok")).SerializeToString()
    assert httpx.get(srv.url + "/healthz").status_code == 200
    for method, path in (
        ("GET", "/runs"),
        ("GET", "/startup"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/static/waterfall.js"),
        ("POST", "/v1/traces"),
    ):
        r = httpx.request(method, srv.url + path, content=body, headers=PB)
        assert r.status_code == 401, path
        r = httpx.request(method, srv.url + path, content=body, headers={**PB, "Authorization": "Bearer wrong"})
        assert r.status_code == 401, path
    auth = {"Authorization": "Bearer s3cret"}
    assert httpx.post(srv.url + "/v1/traces", content=body, headers={**PB, **auth}).status_code == 200
    wait_for(lambda: httpx.get(srv.url + "/startup/tok", headers=auth).status_code == 200)
    # a browser opens the page once with ?token=, then the cookie carries it
    with httpx.Client(base_url=srv.url) as browser:
        r = browser.get("/startup/tok?token=s3cret", headers={"Accept": "text/html"})
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        assert browser.get("/startup/tok?format=json").status_code == 200


def test_concurrent_posts_thread_safe(client: TestClient) -> None:
    runs = [make_run(ranks=2, imports_per_rank=30, run_id=f"c{i}", seed=i) for i in range(6)]
    bodies = [to_protobuf(r).SerializeToString() for r in runs]
    codes: list[int] = []

    def post(b: bytes) -> None:
        codes.append(client.post("/v1/traces", content=b, headers=PB).status_code)

    threads = [threading.Thread(target=post, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 6
    flush(client)
    listed = {r["run_id"]: r["spans"] for r in client.get("/runs").json()["runs"]}
    assert listed == {r.run_id: r.span_count for r in runs}


@pytest.mark.parametrize("fmt", ["perfetto", "jaeger", "otlp-json"])
def test_exports(client: TestClient, fmt: str) -> None:
    run = make_run(ranks=2, imports_per_rank=10, run_id="exp")
    client.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB)
    flush(client)
    r = client.get(f"/runs/exp/export?format={fmt}")
    assert r.status_code == 200
    doc = r.json()
    if fmt == "perfetto":
        xs = [e for e in doc["traceEvents"] if e["ph"] in ("X", "i")]
        assert len(xs) == run.span_count
        assert {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"} >= {
            "worker rank 1 pid 1101"
        }
    elif fmt == "jaeger":
        spans = doc["data"][0]["spans"]
        assert len(spans) == run.span_count
        assert all(ref["refType"] == "CHILD_OF" for s in spans for ref in s["references"])
        assert sum(1 for s in spans if not s["references"]) == 1  # only `startup` is a root
    else:
        # round trip: the export is valid OTLP/JSON our own receiver accepts
        r2 = client.post("/v1/traces", json=doc)
        assert r2.status_code == 200 and r2.json() == {}
    assert client.get("/runs/exp/export?format=bogus").status_code == 422
