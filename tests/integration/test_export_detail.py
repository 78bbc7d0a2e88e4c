"""Export detail levels on a real traced process tree, through every exporter: the OTLP exporter
(official SDK exporter into a real OTLP/HTTP receiver), `starttrace export --detail` for OTLP/JSON,
Perfetto and Jaeger, the automatic exporter (`STARTTRACE_OTLP_DETAIL`), and the service's
`GET /runs/{id}/export?detail=summary`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from run_spans import all_spans, spans_of

from starttrace.analysis.detail import DROPPED_COUNT_ATTR, SUMMARY_ATTR, apply_detail, is_import, summary_selection
from starttrace.run import Run
from starttrace.sources.journal_reader import read_run
from starttrace.views.jaeger import to_jaeger
from starttrace.views.otlp import export_run, to_otlp_protobuf
from starttrace.views.perfetto import to_perfetto

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "service"))

from st_service_helpers import start_server, wait_final, wait_for  # noqa: E402

BUDGET = 4


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory, venv_python: str, clean_env: Callable[..., dict[str, str]]) -> Any:
    """examples/tree.py --no-torch, traced and finished (spawn, fork, forkserver, subprocess)."""
    root = tmp_path_factory.mktemp("detail") / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root))
    proc = subprocess.run(
        [venv_python, str(REPO / "examples" / "tree.py"), "--no-torch"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    wait_final(run_dir)
    return run_dir


def _ids(run: Run) -> set[str]:
    return {s.span_id for _, s in all_spans(run)}


def test_real_tree_summary(tree: Path) -> None:
    run = read_run(tree)
    selection = summary_selection(run, BUDGET)
    spans = {s.span_id: s for _, s in all_spans(run)}
    assert len(selection.kept) < run.span_count(), "the tree has more imports than the budget keeps"
    for process in run.processes:
        assert process.process_span_id in selection.kept, process.label()
        forced = set()  # imports kept whatever the budget: open ones, ancestors of non-imports
        for span in spans_of(run, process):
            if is_import(span) and not span.open:
                continue
            node = spans.get(span.parent_id or "")
            while node is not None:
                if is_import(node):
                    forced.add(node.span_id)
                node = spans.get(node.parent_id or "")
        imports = [s for s in spans_of(run, process) if is_import(s)]
        kept = [s for s in imports if s.span_id in selection.kept]
        assert len(kept) == min(len(imports), max(BUDGET, len(forced))), process.label()
    for span_id in selection.kept:
        parent = spans[span_id].parent_id
        assert parent is None or parent not in spans or parent in selection.kept, spans[span_id].name
    dropped = sum(e[DROPPED_COUNT_ATTR] for e in selection.extra.values())
    assert dropped == selection.dropped == run.span_count() - len(selection.kept)


def test_every_exporter_offers_both_levels(tree: Path, otlp_receiver: Any) -> None:
    run = read_run(tree)
    kept = summary_selection(run, BUDGET).kept
    # OTLP: the official exporter, into a real receiver
    sent = export_run(run, otlp_receiver.traces_url, detail="summary", import_budget=BUDGET)
    received = otlp_receiver.wait_for_spans(sent, timeout=15)
    assert sent == len(kept) and {s.span_id for s in received} == kept
    assert all(s.attributes[SUMMARY_ATTR] is True for s in received)
    assert len(to_otlp_protobuf(run, detail="summary", import_budget=BUDGET)) < len(to_otlp_protobuf(run))
    # Perfetto and Jaeger
    perfetto = to_perfetto(run, detail="summary", import_budget=BUDGET)
    slices = {e["args"]["span_id"] for e in perfetto["traceEvents"] if e["ph"] in ("X", "i")}
    assert slices == kept
    jaeger = to_jaeger(run, detail="summary", import_budget=BUDGET)
    assert {s["spanID"] for s in jaeger["data"][0]["spans"]} == kept
    full = to_jaeger(run, import_budget=BUDGET)
    marked = {
        s["spanID"]
        for s in full["data"][0]["spans"]
        if {"key": SUMMARY_ATTR, "type": "bool", "value": True} in s["tags"]
    }
    assert len(full["data"][0]["spans"]) == run.span_count() and marked == kept


def test_cli_export_detail(tree: Path, venv_python: str, clean_env: Callable[..., dict[str, str]]) -> None:
    run = read_run(tree)
    kept = summary_selection(run, BUDGET).kept
    base = [venv_python, "-m", "starttrace", "export", tree.name, "--dir", str(tree.parent)]
    env = clean_env(STARTTRACE_SUMMARY_IMPORTS=str(BUDGET))
    out = subprocess.run(
        [*base, "-f", "otlp-json", "--detail", "summary"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert {s["spanId"] for s in spans} == kept
    out = subprocess.run(
        [*base, "-f", "perfetto", "--detail", "summary", "--summary-imports", "0"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    events = json.loads(out.stdout)["traceEvents"]
    assert {e["args"]["span_id"] for e in events if e["ph"] in ("X", "i")} == summary_selection(run, 0).kept
    for bad, message in (
        (["--detail", "half"], "half"),
        (["--summary-imports", "lots"], "--summary-imports='lots'"),
    ):
        out = subprocess.run([*base, "-f", "jaeger", *bad], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_automatic_export_in_summary_detail(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, otlp_receiver: Any,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    env = dict(
        traced_env,
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.url,
        STARTTRACE_OTLP_DETAIL="summary",
        STARTTRACE_SUMMARY_IMPORTS="3",
    )
    code = "import json, decimal, email.parser, http.client, zipfile, csv"
    proc = subprocess.run([venv_python, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(journal_root)
    run = read_run(run_dir)
    expected = _ids(apply_detail(run, "summary", 3))
    assert 3 < len(expected) < run.span_count()
    received = otlp_receiver.wait_for_spans(len(expected), timeout=20)
    time.sleep(1.5)  # nothing else arrives
    received = otlp_receiver.spans()
    assert {s.span_id for s in received} == expected
    assert all(s.attributes.get(SUMMARY_ATTR) is True for s in received)


def test_service_export_detail(tree: Path, tmp_path: Path) -> None:
    run = read_run(tree)
    kept = summary_selection(run, 2).kept
    server = start_server(tmp_path, "--journal-dir", str(tree.parent))
    try:
        url = f"{server.url}/runs/{tree.name}/export"
        wait_for(lambda: httpx.get(url, params={"format": "jaeger"}).status_code == 200)

        def summary_ids() -> set[str] | None:
            r = httpx.get(url, params={"format": "jaeger", "detail": "summary", "summary_imports": 2})
            ids = {s["spanID"] for s in r.json()["data"][0]["spans"]}
            return ids if ids == kept else None

        assert wait_for(summary_ids, timeout=20) == kept
        r = httpx.get(url, params={"format": "perfetto", "detail": "summary", "summary_imports": 2})
        assert r.status_code == 200 and ".summary.perfetto.json" in r.headers["content-disposition"]
        assert httpx.get(url, params={"format": "jaeger", "detail": "some"}).status_code == 422
    finally:
        server.stop()
