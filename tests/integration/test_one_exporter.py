"""One exporter per format: `starttrace export` (journals read directly) and the service's
`GET /runs/{id}/export` (the same journals ingested into its store, then loaded back as the run
type) write the same document for the same run, in every format."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from st_service_helpers import start_server, wait_final, wait_for

REPO = Path(__file__).resolve().parents[2]

FORMATS = ("perfetto", "jaeger", "otlp-json")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, venv_python: str) -> dict[str, Any]:
    """A finished traced tree (spawn, fork, forkserver, subprocess), exported both ways."""
    import os

    work = tmp_path_factory.mktemp("one-exporter")
    root = work / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(root))
    env.pop("traceparent", None)
    tree = subprocess.run(
        [venv_python, str(REPO / "examples" / "tree.py"), "--no-torch"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert tree.returncode == 0, tree.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    wait_final(run_dir)  # the CLI and the service must read the same, final run
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    cli: dict[str, Any] = {}
    for fmt in FORMATS:
        out = work / f"cli.{fmt}.json"
        proc = subprocess.run(
            [venv_python, "-m", "starttrace", "export", run_dir.name, "--dir", str(root), "-f", fmt, "-o", str(out)],
            capture_output=True, text=True, timeout=120, env=clean,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        cli[fmt] = json.loads(out.read_text())
    server = start_server(work, "--journal-dir", str(root))
    try:
        wait_for(lambda: httpx.get(f"{server.url}/runs/{run_dir.name}/export?format=perfetto").status_code == 200)
        n_spans = sum(1 for e in cli["perfetto"]["traceEvents"] if e["ph"] in ("X", "i"))

        def complete() -> bool:
            doc = httpx.get(f"{server.url}/runs/{run_dir.name}/export?format=perfetto").json()
            return sum(1 for e in doc["traceEvents"] if e["ph"] in ("X", "i")) == n_spans

        wait_for(complete, timeout=20)
        service = {fmt: httpx.get(f"{server.url}/runs/{run_dir.name}/export?format={fmt}").json() for fmt in FORMATS}
    finally:
        server.stop()
    return {"cli": cli, "service": service, "run_id": run_dir.name}


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_and_service_export_the_same_document(exported: dict[str, Any], fmt: str) -> None:
    cli, service = exported["cli"][fmt], exported["service"][fmt]
    assert cli, "the CLI wrote a document"
    assert service == cli


def test_the_documents_hold_the_whole_run(exported: dict[str, Any]) -> None:
    perfetto = exported["cli"]["perfetto"]
    jaeger = exported["cli"]["jaeger"]
    otlp = exported["cli"]["otlp-json"]
    perfetto_ids = {e["args"]["span_id"] for e in perfetto["traceEvents"] if e["ph"] in ("X", "i")}
    jaeger_ids = {s["spanID"] for s in jaeger["data"][0]["spans"]}
    otlp_ids = {s["spanId"] for rs in otlp["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert len(perfetto_ids) > 50
    assert perfetto_ids == jaeger_ids == otlp_ids
    roots = [s for s in jaeger["data"][0]["spans"] if not any(r["refType"] == "CHILD_OF" for r in s["references"])]
    assert [s["operationName"] for s in roots] == ["startup"]
