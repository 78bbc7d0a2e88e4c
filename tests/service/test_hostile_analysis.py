"""Issue 38, items 4-7, each with the input that broke it, on the real service: non-finite numbers
(strict JSON, the attribute keeps its text), label sizes (a 1 MiB phase), bad spans (span ids
reused across processes, parent cycles, a span ending before it starts, absurd ends)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from hostile_runs import nonfinite_run
from synth_runs import SRun, to_protobuf

PB = {"Content-Type": "application/x-protobuf"}
JSON = {"Accept": "application/json"}


def _post(c: TestClient, run: SRun) -> None:
    r = c.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB)
    assert r.status_code == 200, r.text


def _strict(text: str) -> Any:
    """JSON as a browser reads it: bare NaN / Infinity refused."""

    def refuse(word: str) -> Any:
        raise ValueError(f"bare {word} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinity_give_strict_json_and_keep_their_text(client: TestClient) -> None:
    _post(client, nonfinite_run())
    for path in (
        "/startup/nan",
        "/startup/nan?spans=all",
        "/startup/nan/lanes/0/spans",
        "/runs/nan/export?format=jaeger",
        "/runs/nan/export?format=perfetto",
        "/runs/nan/export?format=otlp-json",
        "/compare?a=nan&b=nan",
        "/runs",
    ):
        r = client.get(path, headers=JSON)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        _strict(r.text)  # no bare NaN / Infinity anywhere
    rows = _strict(client.get("/startup/nan/lanes/0/spans").text)["spans"]
    attrs = {row[2]: row[8] for row in rows}
    assert attrs["weights.load"]["starttrace.weights.page_cache_fraction"] == "NaN"
    assert attrs["compile.graph"]["starttrace.compile.graphs"] == "Infinity"
    assert attrs["odd"] == {"neg": "-Infinity", "list": [1.5, "NaN"]}
    jaeger = _strict(client.get("/runs/nan/export?format=jaeger").text)
    tags = {t["key"]: t for s in jaeger["data"][0]["spans"] for t in s["tags"]}
    assert tags["starttrace.weights.page_cache_fraction"] == {
        "key": "starttrace.weights.page_cache_fraction",
        "type": "string",
        "value": "NaN",
    }
