"""The page's findings list in a real headless Chromium: listed first among the panels, each with
its kind, text and action; a click opens the import tree of the finding's first process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from synth_runs import make_run, to_protobuf

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("findings-page")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if k not in ("STARTTRACE", "VLLM_STARTTRACE", "STARTTRACE_TOKEN")}
    env["PYTHONPATH"] = str(ROOT)
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "starttrace.service.server", "--port", str(port), "--db", str(tmp / "f.db")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and proc.poll() is None, (tmp / "server.log").read_text()
            time.sleep(0.1)
        run = make_run(ranks=3, imports_per_rank=40, run_id="findings-run", seed=11, common_imports=3, xss=True)
        body = to_protobuf(run).SerializeToString()
        assert (
            httpx.post(url + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}).status_code
            == 200
        )
        while httpx.get(url + "/runs").json()["runs"][:1] == []:
            assert time.time() < deadline + 30
            time.sleep(0.2)
        yield url
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(15)


def test_findings_list_first_and_clickable(service: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(service + "/startup/findings-run")
            page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
            panels = page.evaluate("Array.from(document.querySelectorAll('#panels > section')).map(s => s.id)")
            assert panels[0] == "findings", panels
            items = page.locator("#findings-list > li")
            assert items.count() >= 1
            preload = page.locator("#findings-list > li[data-kind=preload]").first
            text = preload.inner_text()
            assert "to the preload of forkserver pid 1002" in text and "vllm.common0" in text
            assert "STARTTRACE_FORKSERVER_PRELOAD" in text
            assert "<script>" not in page.locator("#findings").inner_html()
            preload.locator(".finding-text").click()
            page.wait_for_selector("#import-tree:not([hidden])")
            assert "worker rank 0 pid 1100" in page.locator("#tree-title").inner_text()
            assert errors == []
        finally:
            context.close()
