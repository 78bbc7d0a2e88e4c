"""Issue 38, items 4-7, each with the input that broke it, on the real service: non-finite numbers
(strict JSON, the attribute keeps its text), label sizes (a 1 MiB phase), bad spans (span ids
reused across processes, parent cycles, a span ending before it starts, absurd ends)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from hostile_runs import T0, S, nonfinite_run, reused_ids_run
from st_service_helpers import wait_for
from synth_runs import SProcess, SRun, SSpan, to_protobuf

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


def _doc(c: TestClient, run_id: str) -> dict[str, Any]:
    r = c.get(f"/startup/{run_id}?spans=all", headers=JSON)
    assert r.status_code == 200, r.text[:300]
    return _strict(r.text)


def test_span_ids_reused_across_processes_never_move_ready(client: TestClient) -> None:
    """Item 7: three processes reuse one set of span ids; the workers' copies of id 3 (in progress,
    sent last) used to replace the API server's `ready`: never ready, startup 142,359 s."""
    run = reused_ids_run()
    api, *workers = run.processes
    _post(client, SRun(run.run_id, run.trace_id, [api]))
    for w in workers:
        _post(client, SRun(run.run_id, run.trace_id, [w]))
    doc = _doc(client, "reuse")
    assert doc["status"] == "ready", doc["status"]
    assert doc["ready_s"] == 4.0 and doc["startup_s"] == 4.0, (doc["ready_s"], doc["startup_s"])
    names = sorted(row[2] for lane in doc["lanes"] for row in lane["spans"])
    assert names.count("model.load") == 2 and names.count("ready") == 1 and names.count("process") == 3
    assert sum(len(lane["spans"]) for lane in doc["lanes"]) == 9
    assert any("reused by several processes" in p for p in doc["problems"]), doc["problems"]
    for lane in doc["lanes"]:  # each span's parent in its own process
        rows = lane["spans"]
        assert [r[1] for r in rows if r[2] != "process"] == [0, 0], rows
    rows = {r["run_id"]: r for r in client.get("/runs", headers=JSON).json()["runs"]}
    assert rows["reuse"]["spans"] == 9
    again = reused_ids_run()  # the same batches again: nothing new
    for p in again.processes:
        _post(client, SRun(again.run_id, again.trace_id, [p]))
    assert client.get("/runs", headers=JSON).json()["runs"][0]["spans"] == 9


def test_parent_cycles_get_sane_depths_and_are_named(client: TestClient) -> None:
    res = {"service.name": "svc", "service.instance.id": "cyc", "process.pid": 5, "starttrace.run_id": "cycle"}
    spans = [SSpan("%016x" % 1, None, "process", T0, T0 + 10 * S, {"starttrace.phase": "process"})]
    n = 50  # a ring of 50 imports, each the parent of the next, the last the parent of the first
    for i in range(n):
        parent = "%016x" % (100 + (i - 1) % n)
        spans.append(SSpan("%016x" % (100 + i), parent, f"import m{i}", T0 + (i + 1) * 1000, T0 + S))
    _post(client, SRun("cycle", "ee" * 16, [SProcess(res, spans)]))
    doc = _doc(client, "cycle")
    depths = [row[6] for lane in doc["lanes"] for row in lane["spans"] if row[2].startswith("import ")]
    assert len(depths) == n and sorted(depths) == list(range(n)), depths  # cut once: one chain
    assert any("1 parent cycle cut" in p and "import m0" in p for p in doc["problems"]), doc["problems"]


def test_a_span_ending_before_it_starts_is_named(client: TestClient) -> None:
    res = {"service.name": "svc", "service.instance.id": "back", "process.pid": 5, "starttrace.run_id": "backwards"}
    spans = [
        SSpan("%016x" % 1, None, "process", T0, T0 + 10 * S, {"starttrace.phase": "process"}),
        SSpan("%016x" % 2, "%016x" % 1, "load", T0 + 5 * S, T0 + 2 * S),
        SSpan("%016x" % 3, "%016x" % 1, "absurd", T0 + 6 * S, T0 + 400 * 86400 * S),  # ends in 2028
    ]
    _post(client, SRun("backwards", "ef" * 16, [SProcess(res, spans)]))
    doc = _doc(client, "backwards")
    assert any(
        "1 span ending before it starts" in p and "'load'" in p and "3 s before its start" in p for p in doc["problems"]
    ), doc["problems"]
    assert any("implausible" in p and "'absurd'" in p for p in doc["problems"]), doc["problems"]
    rows = {row[2]: row for lane in doc["lanes"] for row in lane["spans"]}
    assert "absurd" not in rows  # left out: it stretches nothing
    assert rows["load"][7] & 2 and rows["load"][5] == rows["load"][4] == 5_000_000  # an instant at its start


def test_a_1mib_phase_leaves_metrics_small_and_is_counted(client: TestClient) -> None:
    """Item 6: one span with a 1 MiB `starttrace.phase` made /metrics 1-19 MB until a restart."""
    huge = "p" * (1 << 20)
    res = {"service.name": "svc-big", "service.instance.id": "big", "process.pid": 5, "starttrace.run_id": "big"}
    res["starttrace.role"] = "r" * (1 << 20)
    spans = [
        SSpan("%016x" % 1, None, "process", T0, T0 + 10 * S, {"starttrace.phase": "process"}),
        SSpan("%016x" % 2, "%016x" % 1, "work", T0 + S, T0 + 3 * S, {"starttrace.phase": huge, "note": huge}),
        SSpan("%016x" % 4, "%016x" % 1, "n" * (1 << 20), T0 + 3 * S, T0 + 4 * S),
        SSpan("%016x" % 5, "%016x" % 1, "import m", T0 + S, T0 + 2 * S, {"starttrace.import.module": "m" * (1 << 20)}),
        SSpan("%016x" % 3, "%016x" % 1, "ready", T0 + 4 * S, T0 + 4 * S, {"starttrace.phase": "ready"}),
    ]
    _post(client, SRun("big", "aa" * 16, [SProcess(res, spans)]))
    assert _doc(client, "big")["status"] == "ready"
    for path in ("/startup/big", "/startup/big?spans=all", "/startup/big/lanes/0/spans"):
        text = client.get(path, headers=JSON).text  # shown: names, phases and attributes bounded
        assert len(text) < 64 * 1024, (path, len(text))
    doc = _doc(client, "big")
    assert any("1 span phase over 120 characters cut" in p for p in doc["problems"]), doc["problems"]
    assert any("1 span name over 1000 characters cut" in p for p in doc["problems"]), doc["problems"]
    assert any("1 process identity value (role" in p for p in doc["problems"]), doc["problems"]
    (work,) = [row for row in doc["lanes"][0]["spans"] if row[2] == "work"]
    assert work[3] == "p" * 119 + "…" and work[8]["note"].endswith(f"… ({(1 << 20) - 4096} characters cut)")

    def metrics() -> str | None:
        text = client.get("/metrics").text
        return text if 'starttrace_label_values_cut_total{label="module"} 1.0' in text else None

    text = wait_for(metrics, timeout=30, interval=0.3)
    assert len(text) < 64 * 1024, len(text)
    assert "p" * 119 + "…" in text and "p" * 121 not in text and "m" * 119 + "…" in text
    assert len(client.get("/metrics").text) < 64 * 1024  # and stays small
