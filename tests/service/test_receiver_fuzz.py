"""Fuzz the OTLP receiver: whatever the body, never a 5xx."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_runs import make_run, to_otlp_json, to_protobuf

from starttrace.service.app import Settings, create_app

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db: Path = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    with TestClient(create_app(Settings(db=db, max_body_bytes=2_000_000)), base_url="http://localhost") as c:
        yield c


VALID_PB = to_protobuf(make_run(ranks=1, imports_per_rank=8, run_id="fuzz-base")).SerializeToString()
VALID_JSON = to_otlp_json(make_run(ranks=1, imports_per_rank=4, run_id="fuzz-json"))

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=40))
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=25,
)
otlp_keys = st.sampled_from(
    [
        "resourceSpans",
        "scopeSpans",
        "spans",
        "traceId",
        "spanId",
        "parentSpanId",
        "name",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "attributes",
        "key",
        "value",
        "stringValue",
        "intValue",
        "arrayValue",
        "values",
        "resource",
        "status",
        "code",
    ]
)
otlp_like = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(otlp_keys, children, max_size=5)),
    max_leaves=30,
)


def _check(r: Any) -> None:
    assert r.status_code < 500, (r.status_code, r.content[:300])
    assert r.status_code in (200, 400, 413, 415, 429)


@FUZZ
@given(body=st.binary(max_size=2000))
def test_random_protobuf_bytes(fuzz_client: TestClient, body: bytes) -> None:
    _check(fuzz_client.post("/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}))


@FUZZ
@given(data=st.data())
def test_mutated_protobuf(fuzz_client: TestClient, data: st.DataObject) -> None:
    body = bytearray(VALID_PB)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    _check(
        fuzz_client.post("/v1/traces", content=bytes(body[:cut]), headers={"Content-Type": "application/x-protobuf"})
    )


@FUZZ
@given(doc=st.one_of(json_values, otlp_like))
def test_random_json(fuzz_client: TestClient, doc: Any) -> None:
    body = json.dumps(doc).encode()
    _check(fuzz_client.post("/v1/traces", content=body, headers={"Content-Type": "application/json"}))
    _check(
        fuzz_client.post(
            "/v1/traces",
            content=gzip.compress(body),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
    )


@FUZZ
@given(data=st.data())
def test_mutated_otlp_json(fuzz_client: TestClient, data: st.DataObject) -> None:
    doc = json.loads(json.dumps(VALID_JSON))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][data.draw(st.integers(0, 3))]
    key = data.draw(st.sampled_from(sorted(span)))
    span[key] = data.draw(st.one_of(json_values, otlp_like))
    body = json.dumps(doc).encode()  # may hold Infinity/NaN, which the receiver must refuse cleanly
    _check(fuzz_client.post("/v1/traces", content=body, headers={"Content-Type": "application/json"}))


@FUZZ
@given(ctype=st.text(max_size=30), encoding=st.text(max_size=10), body=st.binary(max_size=200))
def test_random_headers(fuzz_client: TestClient, ctype: str, encoding: str, body: bytes) -> None:
    headers = {"Content-Type": ctype.encode("ascii", "ignore").decode().strip() or "x/y"}
    enc = encoding.encode("ascii", "ignore").decode().strip()
    if enc:
        headers["Content-Encoding"] = enc
    _check(fuzz_client.post("/v1/traces", content=body, headers=headers))


def test_fuzzed_store_still_serves(fuzz_client: TestClient) -> None:
    """After the fuzzing, every stored run still renders (no poisoned rows)."""
    fuzz_client.app.state.store.flush(30)  # type: ignore[attr-defined]
    for r in fuzz_client.get("/runs?limit=1000").json()["runs"]:
        from urllib.parse import quote

        resp = fuzz_client.get("/startup/" + quote(r["run_id"], safe=""))
        assert resp.status_code == 200, r["run_id"]
        assert (
            fuzz_client.get("/startup/" + quote(r["run_id"], safe=""), headers={"Accept": "text/html"}).status_code
            == 200
        )
    assert fuzz_client.get("/metrics").status_code == 200
