"""Multi-node runs in every view: the service's page (node rows with offset and error, lanes named by
node), the JSON, the exports, `report` and `compare` (per node), from OTLP posted to the service.
The runs are synthetic (tests/synth_multinode.py: 3 nodes whose clocks are off by known amounts)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from fastapi.testclient import TestClient
from rich.console import Console

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from synth_multinode import make_multinode_run  # noqa: E402
from synth_runs import MS, protobuf_batches, to_run  # noqa: E402

from starttrace.analysis.clocks import correct_clocks  # noqa: E402
from starttrace.analysis.compare import compare  # noqa: E402
from starttrace.analysis.lanes import build_model  # noqa: E402
from starttrace.service.app import Settings, create_app  # noqa: E402
from starttrace.views.terminal import render_compare, render_report  # noqa: E402

SKEWS = [0, 45 * MS, -30 * MS]
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _post(client: TestClient, run: object) -> None:
    for body in protobuf_batches(run):  # type: ignore[arg-type]
        assert client.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200


def test_page_json_and_exports_of_a_three_node_run(tmp_path: Path) -> None:
    run = make_multinode_run(nodes=3, ranks_per_node=2, skews_ns=SKEWS, run_id="mn-views")
    with TestClient(
        create_app(Settings(db=tmp_path / "st.db", prebuild_idle_s=None)), base_url="http://localhost"
    ) as client:
        _post(client, run)
        app = client.app
        assert app.state.store.flush(30)  # type: ignore[attr-defined]
        page = client.get("/startup/mn-views").json()
        html = client.get("/startup/mn-views", headers={"Accept": "text/html"}).text
        perfetto = client.get("/runs/mn-views/export?format=perfetto").json()
    rows = page["nodes"]
    assert [r["node"] for r in rows] == ["node0", "node1", "node2"]
    for row, skew in zip(rows, SKEWS, strict=True):
        assert abs(row["offset_ns"] - skew) <= 3 * MS and row["error_ns"] is not None
    assert [ln["node"] for ln in page["lanes"]] == [f"node{n}" for n in range(3) for _ in range(3)]
    # the page: a node table with every node's offset and error, escaped like everything else
    assert 'id="node-table"' in html
    for row in rows:
        assert f'data-node="{row["node"]}"' in html
        assert f"{row['offset_ns'] / 1e6:+.3f}" in html
    # the Perfetto export: every track named with its host, its own track although pids repeat
    names = [e["args"]["name"] for e in perfetto["traceEvents"] if e.get("name") == "process_name"]
    workers = [n for n in names if n.startswith("worker")]
    assert len(workers) == 6 and all(" @ node" in n for n in workers)
    pids = [e["pid"] for e in perfetto["traceEvents"] if e.get("name") == "process_name"]
    assert len(set(pids)) == len(pids)


def test_report_and_compare_group_by_node() -> None:
    a = build_model(correct_clocks(to_run(make_multinode_run(nodes=2, skews_ns=[0, 20 * MS], seed=1))))
    b = build_model(correct_clocks(to_run(make_multinode_run(nodes=2, skews_ns=[0, -10 * MS], seed=2))))
    out = io.StringIO()
    render_report(a, Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "nodes (offset" in text and "node1" in text and "collective" in text
    assert "node0  worker rank 0" in text
    cmp = compare(a, b)
    assert [(n["host_a"], n["host_b"]) for n in cmp.nodes] == [("node0", "node0"), ("node1", "node1")]
    assert cmp.nodes[1]["ranks_a"] == [2, 3] and cmp.nodes[1]["time_to_ready_s"]["delta"] is not None
    keys = {r["key"] for r in cmp.ranks}
    assert {"node0 main #0", "node1 main #0", "worker rank 3"} <= keys, keys
    out = io.StringIO()
    render_compare(cmp, Console(file=out, width=160, color_system=None))
    assert "per node" in out.getvalue()
