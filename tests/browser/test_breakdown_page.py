"""The page's startup window in a real headless Chromium: it opens on the run's start to its
ready (time after ready is one zoom-out away, dimmed), its per-process table is the exclusive
breakdown (each row's parts add up to its total), processes started after ready are one line,
and time to ready by phase adds up to the startup."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromium_page import CHROMIUM, chromium_page
from st_service_helpers import start_server, wait_for
from synth_runs import SProcess, SRun, SSpan, to_protobuf

S = 1_000_000_000
T0 = 1_750_000_000 * S
DASH = "\u2013"  # the page's view range: "0 µs \u2013 6.12 s"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")


def _resource(pid: int, role: str, rank: int | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "service.name": "vllm",
        "service.instance.id": f"{pid:08x}",
        "process.pid": pid,
        "process.parent_pid": 1 if role == "api_server" else 100,
        "starttrace.run_id": "window-run",
        "starttrace.role": role,
        "starttrace.start_method": "root" if role == "api_server" else "spawn",
    }
    if rank is not None:
        res.update({"starttrace.rank": rank, "starttrace.world_size": 1})
    return res


def _run() -> SRun:
    """An API server ready at 6 s; a worker whose busy loop runs on to 40 s; a helper started at 20 s."""
    ids = iter(f"{i:016x}" for i in range(1, 1000))

    def span(p: SProcess, name: str, parent: str | None, a: float, b: float, phase: str) -> str:
        sid = next(ids)
        p.spans.append(SSpan(sid, parent, name, T0 + int(a * S), T0 + int(b * S), {"starttrace.phase": phase}))
        return sid

    api = SProcess(_resource(100, "api_server"))
    root = span(api, "startup", None, 0, 6, "startup")
    proc = span(api, "process", root, 0, 40, "process")
    span(api, "import vllm", proc, 0.1, 2.0, "import")
    span(api, "vllm.async_llm.init", proc, 2.0, 5.5, "engine_init")
    span(api, "ready", proc, 6, 6, "ready")
    worker = SProcess(_resource(110, "worker", rank=0))
    wproc = span(worker, "process", proc, 1.0, 40, "process")
    span(worker, "import torch", wproc, 1.1, 3.0, "import")
    span(worker, "vllm.model_load", wproc, 3.0, 4.0, "model_load")
    loop = span(worker, "vllm.worker.busy_loop", wproc, 4.1, 40, "idle")
    span(worker, "compile.graph", loop, 4.2, 5.4, "compile")
    helper = SProcess(_resource(120, "helper"))
    hproc = span(helper, "process", proc, 20, 21, "process")
    span(helper, "import json", hproc, 20.1, 20.2, "import")
    return SRun("window-run", "%032x" % 77, [api, worker, helper])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_server(tmp_path_factory.mktemp("window-page"))
    try:
        body = to_protobuf(_run()).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(server.url + "/v1/traces", content=body, headers=headers).status_code == 200
        wait_for(lambda: httpx.get(server.url + "/runs").json()["runs"][:1] != [], timeout=30, interval=0.2)
        yield server.url
    finally:
        server.stop()


def _seconds(text: str) -> float:
    value, unit = re.match(r"([\d.]+)\s*(s|ms|µs)", text.strip()).groups()  # type: ignore[union-attr]
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


def _view_end(page: Any) -> float:
    return _seconds(page.locator("#view-range").inner_text().split(DASH)[1])


def test_the_page_opens_on_start_to_ready(service: str, tmp_path: Path) -> None:
    doc = httpx.get(service + "/startup/window-run?format=json").json()
    assert doc["ready_s"] == 6.0
    with chromium_page(tmp_path / "profile") as (page, errors):
        page.goto(service + "/startup/window-run")
        page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
        low, high = page.locator("#view-range").inner_text().split(DASH)
        assert _seconds(low) == 0.0
        assert 6.0 <= _seconds(high) <= 6.2, "opens on 0 -> ready, not on the run's 40 s"
        # the per-process table: each row's breakdown cells add up to its total
        heads = page.eval_on_selector_all("#rank-table thead th", "ths => ths.map(t => t.textContent.trim())")
        rows = page.eval_on_selector_all(
            "#rank-table tbody tr", "trs => trs.map(tr => Array.from(tr.cells).map(c => c.textContent.trim()))"
        )
        total_at = heads.index("total s")
        parts = slice(total_at + 1, heads.index("coverage"))
        assert len(rows) == 2, rows  # the helper started after ready is not a row
        for row in rows:
            cells = [float(c) for c in row[parts] if c]
            assert abs(sum(cells) - float(row[total_at])) < 0.01, (heads, row)
        assert "idle" not in heads and "wait" in heads
        assert "1 more process" in page.locator("#after-ready").inner_text()
        by_phase = page.eval_on_selector_all(
            "#ready-by-phase tbody tr", "trs => trs.map(tr => parseFloat(tr.cells[1].textContent))"
        )
        assert abs(sum(by_phase) - 6.0) < 0.01
        # the range is redrawn on the next animation frame: wait for it, never read it at once
        page.click("#zoom-in")
        wait_for(lambda: _view_end(page) < 6.0, timeout=10)
        page.click("#zoom-reset")
        wait_for(lambda: 6.0 <= _view_end(page) <= 6.2, timeout=10)
        page.click("#zoom-out")
        wait_for(lambda: _view_end(page) > 6.2, timeout=10)
        assert not errors, errors
