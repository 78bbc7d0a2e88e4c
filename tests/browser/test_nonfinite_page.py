"""Issue 38 item 4 in a real headless Chromium: a run whose attributes hold NaN and infinities
loads (strict JSON), and its spans show the values' text."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from chromium_page import CHROMIUM, chromium_page
from hostile_runs import nonfinite_run
from st_service_helpers import start_server, wait_for
from synth_runs import to_protobuf

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")


def test_a_run_with_nan_and_infinity_loads_in_the_page(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        body = to_protobuf(nonfinite_run("nan-page")).SerializeToString()
        r = httpx.post(server.url + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == 200, r.text
        wait_for(lambda: httpx.get(server.url + "/runs").json()["runs"][:1] != [], timeout=30, interval=0.2)
        with chromium_page(tmp_path / "profile") as (page, errors):
            page.goto(server.url + "/startup/nan-page")
            page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
            assert "could not load" not in page.inner_text("body")
            assert "not valid JSON" not in page.inner_text("body")
            assert errors == []
    finally:
        server.stop()
