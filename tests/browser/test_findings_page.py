"""The page's findings list in a real headless Chromium: listed first among the panels, each with
its kind, text and action; a click opens the import tree of the finding's first process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from chromium_page import CHROMIUM, chromium_page
from st_service_helpers import start_server, wait_for
from synth_runs import make_run, to_protobuf

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("findings-page")
    server = start_server(tmp)
    url = server.url
    try:
        run = make_run(ranks=3, imports_per_rank=40, run_id="findings-run", seed=11, common_imports=3, xss=True)
        body = to_protobuf(run).SerializeToString()
        assert (
            httpx.post(url + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}).status_code
            == 200
        )
        wait_for(lambda: httpx.get(url + "/runs").json()["runs"][:1] != [], timeout=30, interval=0.2)
        yield url
    finally:
        server.stop()


def test_findings_list_first_and_clickable(service: str, tmp_path: Path) -> None:
    with chromium_page(tmp_path / "profile") as (page, errors):
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
