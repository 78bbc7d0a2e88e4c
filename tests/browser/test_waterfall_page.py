"""The waterfall page in a real headless Chromium (Debian's /usr/bin/chromium via Playwright)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from st_service_helpers import start_server
from synth_runs import make_run, protobuf_batches, to_protobuf

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("browser")
    server = start_server(tmp)
    url = server.url
    try:
        pb = {"Content-Type": "application/x-protobuf"}
        run = make_run(ranks=4, imports_per_rank=120, run_id="browser-run", xss=True, seed=7)
        assert (
            httpx.post(url + "/v1/traces", content=to_protobuf(run).SerializeToString(), headers=pb).status_code == 200
        )
        live = make_run(
            ranks=2, imports_per_rank=30, run_id="live-run", seed=8, in_progress_rank=1, t0=time.time_ns() - 3 * 10**9
        )
        assert (
            httpx.post(url + "/v1/traces", content=to_protobuf(live).SerializeToString(), headers=pb).status_code == 200
        )
        big = make_run(ranks=16, imports_per_rank=6000, run_id="big-run", seed=9)
        with httpx.Client(base_url=url, headers=pb, timeout=60) as c:
            for body in protobuf_batches(big, 4096):
                assert c.post("/v1/traces", content=body).status_code == 200
        deadline = time.time() + 60
        while True:
            runs = {r["run_id"]: r["spans"] for r in httpx.get(url + "/runs").json()["runs"]}
            if runs.get("big-run") == big.span_count and runs.get("browser-run") == run.span_count:
                break
            assert time.time() < deadline, runs
            time.sleep(0.2)
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=ARGS, headless=True, viewport={"width": 1400, "height": 1000}
        )
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


def test_page_lanes_tree_xss(service: str, browser: Any) -> None:
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(service + "/startup/browser-run")
    page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
    labels = page.locator(".lane-label")
    assert labels.count() == 7
    texts = [labels.nth(i).inner_text() for i in range(labels.count())]
    assert "api_server" in texts[0] and "pid 1000" in texts[0]
    assert "worker" in texts[3] and "rank 0" in texts[3] and "pid 1100" in texts[3]
    assert "rank 3" in texts[6]
    # legend, summary table, advice and audit panels
    assert page.locator("#legend .legend-item").count() >= 8
    assert page.locator("#rank-table tbody tr").count() == 7
    assert "vllm.common" in page.locator("#preload-advice").inner_text()
    assert "Clean" in page.locator("#cuda-audit").inner_text()
    # zoom changes the visible range
    before = page.locator("#view-range").inner_text()
    page.click("#zoom-in")
    page.wait_for_function("document.getElementById('view-range').textContent !== %r" % before)
    page.click("#zoom-reset")
    # hover over the first worker lane shows a tooltip built from span data
    box = page.locator("#wf-canvas").bounding_box()
    label_box = labels.nth(3).bounding_box()
    y = label_box["y"] + 13
    for frac in (0.5, 0.6, 0.7, 0.8, 0.4, 0.3):
        page.mouse.move(box["x"] + box["width"] * frac, y)
        if page.locator("#tooltip").is_visible():
            break
    assert page.locator("#tooltip").is_visible()
    assert "worker rank 0 pid 1100" in page.locator("#tooltip").inner_text()
    # clicking a lane expands it and shows its import tree; nodes expand lazily
    labels.nth(3).click()
    page.wait_for_selector("#import-tree:not([hidden])")
    assert "worker rank 0 pid 1100" in page.locator("#tree-title").inner_text()
    assert labels.nth(3).get_attribute("class").find("expanded") >= 0
    tree_text = page.locator("#tree-root").inner_text()
    assert "vllm.platforms.cuda" in tree_text
    assert "<script>alert(1)</script>" in tree_text  # the XSS span name renders as text
    node = page.locator("#tree-root > details.tree-node").first
    assert node.locator(".tree-children").count() == 0
    node.locator("summary").click()
    node.locator(".tree-children > *").first.wait_for(timeout=10_000)  # children render on the toggle event
    assert node.locator(".tree-children > *").count() > 0
    # the hotspot table (server-rendered) shows the name as text, too
    assert "<script>alert(1)</script>" in page.locator("#hotspots").inner_text()
    assert page.evaluate("document.scripts.length") == 1
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    page.wait_for_timeout(300)
    assert dialogs == [] and errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "waterfall.png"), full_page=True)
    page.close()


def test_live_run_grows(service: str, browser: Any) -> None:
    page = browser.new_page()
    page.goto(service + "/startup/live-run")
    page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
    assert page.locator("#live-indicator").is_visible()
    assert page.locator("#run-status").inner_text() == "running"
    first = page.locator("#in-progress-table").inner_text()
    assert "vllm.model_load" in first
    # one live refresh (every 2 s; the service may be busy prebuilding the big run's model)
    page.wait_for_function(
        "(first) => { const t = document.getElementById('in-progress-table'); return t && t.innerText !== first; }",
        arg=first,
        timeout=10_000,
    )
    assert page.locator("#in-progress-table").inner_text() != first  # open time went up
    page.close()


def test_big_run_responsive(service: str, browser: Any) -> None:
    """16 ranks x 6000 spans: drawn on a canvas, few DOM nodes, interactive."""
    page = browser.new_page()
    t = time.perf_counter()
    page.goto(service + "/startup/big-run")
    page.wait_for_selector("body[data-loaded=true]", timeout=60_000)
    load_s = time.perf_counter() - t
    assert page.locator(".lane-label").count() == 19
    nodes = page.evaluate("document.getElementsByTagName('*').length")
    assert nodes < 5000, nodes
    # 20 zoom steps (each a full redraw of ~96k spans) stay fast
    ms = page.evaluate(
        """() => { const c = document.getElementById('wf-canvas'); const r = c.getBoundingClientRect();
        const t = performance.now();
        for (let i = 0; i < 20; i++) { c.dispatchEvent(new WheelEvent('wheel', {deltaY: -120,
          clientX: r.left + r.width/2,
          clientY: r.top + 40, bubbles: true, cancelable: true})); }
        return performance.now() - t; }"""
    )
    page.locator(".lane-label").nth(5).click()  # expand a rank with 6000 imports
    page.wait_for_selector("#import-tree:not([hidden])")
    frame_ms = page.evaluate(
        """() => new Promise(res => { const t = performance.now();
        requestAnimationFrame(() => requestAnimationFrame(() => res(performance.now() - t))); })"""
    )
    print(f"big run: load {load_s:.2f}s, 20 wheel events {ms:.0f} ms, 2 frames {frame_ms:.0f} ms, {nodes} DOM nodes")
    assert load_s < 20 and frame_ms < 1000
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "waterfall-16x6000.png"))
    page.close()


def test_big_run_detail_is_fetched_lazily(service: str, browser: Any) -> None:
    """The first answer of the 16 x 6000 run is small and holds part of the spans; opening a lane
    fetches that lane whole (its import tree lists it), zooming in fetches the spans the zoom level
    shows, and they are drawn."""
    first = httpx.get(service + "/startup/big-run", timeout=60)
    doc = first.json()
    assert len(first.content) <= 2_000_000 and not doc["first_answer"]["complete"]
    worker = doc["lanes"][5]
    assert not worker["complete"] and len(worker["spans"]) < worker["span_count"] > 5000
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(service + "/startup/big-run")
    page.wait_for_selector("body[data-loaded=true]", timeout=60_000)
    labels = page.locator(".lane-label")
    assert labels.nth(5).get_attribute("data-complete") == "false"
    assert int(labels.nth(5).get_attribute("data-spans")) == len(worker["spans"])
    # open a lane: one request for the whole lane, then its import tree
    with page.expect_request(lambda r: "/startup/big-run/lanes/5/spans" in r.url) as opened:
        labels.nth(5).click()
    assert "min_us" not in opened.value.url
    page.wait_for_selector(".lane-label[data-lane='5'][data-complete='true']", timeout=30_000)
    assert int(page.locator(".lane-label[data-lane='5']").get_attribute("data-spans")) == worker["span_count"]
    page.locator("#tree-root details.tree-node").first.wait_for(timeout=10_000)
    assert "worker rank 2" in page.locator("#tree-title").inner_text()
    whole = httpx.get(service + "/startup/big-run/lanes/5/spans", timeout=60).json()
    assert whole["complete"] and len(whole["spans"]) == worker["span_count"]
    by_pos = {r[9]: r for r in whole["spans"]}
    roots = [r for r in whole["spans"] if r[3] == "import" and by_pos.get(r[1], [None] * 4)[3] != "import"]
    listed = page.locator("#tree-root > details.tree-node, #tree-root > .tree-leaf").count()
    assert listed == min(200, len(roots)) > 0  # the tree lists the whole lane's top-level imports
    # zoom in on another lane: the spans of that zoom level come in a windowed request
    lane6 = page.locator(".lane-label[data-lane='6']")
    before = int(lane6.get_attribute("data-spans"))
    box = page.locator("#wf-canvas").bounding_box()
    label_box = lane6.bounding_box()
    with page.expect_request(lambda r: "/lanes/6/spans" in r.url and "min_us=" in r.url, timeout=30_000) as zoomed:
        hash_before = page.evaluate(
            """([x, y]) => { const c = document.getElementById('wf-canvas');
            for (let i = 0; i < 16; i++) { c.dispatchEvent(new WheelEvent('wheel', {deltaY: -120,
              clientX: x, clientY: y, bubbles: true, cancelable: true})); }
            return new Promise(res => requestAnimationFrame(() => {
              const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let h = 0;
              for (let i = 0; i < d.length; i += 7) { h = (h * 31 + d[i]) | 0; } res(h); })); }""",
            [box["x"] + box["width"] * 0.55, label_box["y"] + 13],
        )
    assert "start_us=" in zoomed.value.url and "end_us=" in zoomed.value.url
    page.wait_for_function(
        "(n) => Number(document.querySelector(\".lane-label[data-lane='6']\").dataset.spans) > n",
        arg=before,
        timeout=30_000,
    )
    hash_after = page.evaluate(
        """() => new Promise(res => requestAnimationFrame(() => requestAnimationFrame(() => {
        const c = document.getElementById('wf-canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let h = 0;
        for (let i = 0; i < d.length; i += 7) { h = (h * 31 + d[i]) | 0; } res(h); })))"""
    )
    assert hash_after != hash_before, "the fetched spans were drawn"
    assert int(page.get_attribute("body", "data-detail-fetches")) >= 2
    assert errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "waterfall-16x6000-zoomed.png"))
    page.close()
