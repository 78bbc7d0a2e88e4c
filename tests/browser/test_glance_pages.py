"""The demo's real run (a cold vLLM start and the warm start after it, tests/data/vllm_demo) on
the page, in a real headless Chromium at 1366x768: the first screen shows the summary (time to
ready, its phases as one bar), the plan, the four main lanes and the top finding, and nothing
overflows sideways; short helpers are one folded row that opens on a click; the critical-path
toggle; axis labels that fit their scale; the compare and fleet pages fit too.

Screenshots go to the test's folder, and to $STARTTRACE_SCREENSHOTS when set (to look at them)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromium_page import CHROMIUM, chromium_page
from demo_runs import RUN_IDS, demo_run_dir
from st_service_helpers import start_server, wait_for

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")

WIDTH, HEIGHT = 1366, 768
COLD, WARM = RUN_IDS["cold"], RUN_IDS["warm"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("glance")
    root = tmp / "runs"
    demo_run_dir(root, "cold")
    demo_run_dir(root, "warm")
    server = start_server(tmp, "--journal-dir", str(root))
    try:
        wait_for(
            lambda: {COLD, WARM} <= {r["run_id"] for r in httpx.get(server.url + "/runs").json()["runs"]},
            timeout=60,
            interval=0.3,
        )
        yield server.url
    finally:
        server.stop()


def shot(page: Any, path: Path, name: str) -> None:
    target = path / f"{name}.png"
    page.screenshot(path=str(target))
    keep = os.environ.get("STARTTRACE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(keep) / target.name)


def no_sideways_overflow(page: Any) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px window"


def on_first_screen(page: Any, selector: str) -> None:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} not shown"
    assert box["y"] >= 0 and box["y"] + box["height"] <= HEIGHT, f"{selector} below the first screen: {box}"
    assert box["x"] + box["width"] <= WIDTH, f"{selector} wider than the window: {box}"


def test_first_screen_shows_the_summary_plan_main_lanes_and_top_finding(service: str, tmp_path: Path) -> None:
    with chromium_page(tmp_path / "profile", WIDTH, HEIGHT) as (page, errors):
        page.goto(f"{service}/startup/{COLD}")
        page.wait_for_selector("body[data-loaded=true]", timeout=30_000)
        shot(page, tmp_path, "startup-first-screen")
        for selector in ("#summary-ttr", "#phase-bar", "#plan-head", "#plan-list", "#top-finding"):
            on_first_screen(page, selector)
        assert page.locator("#summary-ttr").inner_text() == "65.7 s"
        assert "cold_compile" in page.locator("#top-finding").inner_text()  # the largest saving
        kinds = page.eval_on_selector_all("#plan-list > li", "els => els.map(e => e.dataset.kind)")
        assert kinds[:2] == ["cold_compile", "cold_model_inspection"], kinds
        # the bar: the path's phases, import and compile the largest
        phases = page.eval_on_selector_all("#phase-bar .seg", "els => els.map(e => e.dataset.phase)")
        assert phases[:2] == ["import", "compile"], phases
        for role, rank in (("api_server", ""), ("engine_core", ""), ("worker", "0"), ("worker", "1")):
            on_first_screen(page, f".lane-label[data-role={role}][data-rank='{rank}']")
        no_sideways_overflow(page)
        # the expected children that are not Python: one note, no warnings box for them
        assert page.locator("#problems").count() == 0
        assert "g++ \u00d719" in page.locator("#untraced-note summary").inner_text()
        assert errors == []


def test_helpers_fold_and_open_on_a_click(service: str, tmp_path: Path) -> None:
    doc = httpx.get(f"{service}/startup/{COLD}?format=json").json()
    assert len(doc["lanes"]) == 8  # the JSON keeps every lane
    folded = [i for g in doc["folded"] for i in g["lanes"]]
    assert folded
    with chromium_page(tmp_path / "profile", WIDTH, HEIGHT) as (page, errors):
        page.goto(f"{service}/startup/{COLD}")
        page.wait_for_selector("body[data-loaded=true]", timeout=30_000)
        shown = page.eval_on_selector_all(".lane-label[data-lane]", "els => els.map(e => +e.dataset.lane)")
        assert not set(shown) & set(folded)
        group = page.locator(".lane-label.group", has_text="python -c (Inductor's .so check)").first
        assert "1 x python -c (Inductor's .so check), 0.04 s" in group.inner_text()
        group.click()
        page.wait_for_selector(".lane-label.in-group")
        shown = page.eval_on_selector_all(".lane-label[data-lane]", "els => els.map(e => +e.dataset.lane)")
        assert set(shown) & set(folded)
        shot(page, tmp_path, "startup-group-open")
        assert errors == []


def test_critical_path_toggle_and_axis_labels(service: str, tmp_path: Path) -> None:
    with chromium_page(tmp_path / "profile", WIDTH, HEIGHT) as (page, errors):
        page.goto(f"{service}/startup/{COLD}")
        page.wait_for_selector("body[data-loaded=true]", timeout=30_000)
        axis = page.get_attribute("#wf-canvas", "data-axis").split("|")
        assert axis[:2] == ["0 s", "10 s"], axis  # labels fit the scale: no "10.000 s"
        before = page.evaluate("document.getElementById('wf-canvas').toDataURL()")
        page.click("#toggle-path")
        page.wait_for_selector("body[data-path=on]")
        page.wait_for_timeout(200)
        assert page.evaluate("document.getElementById('wf-canvas').toDataURL()") != before
        shot(page, tmp_path, "startup-critical-path")
        page.click("#zoom-in")
        page.click("#zoom-in")
        page.click("#zoom-in")
        page.wait_for_timeout(200)
        zoomed = page.get_attribute("#wf-canvas", "data-axis").split("|")
        assert all(label.endswith((" s", " ms")) and ".000" not in label for label in zoomed), zoomed
        # the breakdown: a stacked bar per main lane; no table cut at the right edge
        page.locator("#breakdown-bars").scroll_into_view_if_needed()
        assert page.locator("#breakdown-bars .stack").count() >= 4
        shot(page, tmp_path, "startup-breakdown")
        no_sideways_overflow(page)
        assert errors == []


def test_compare_page_sets_the_plan_against_the_warm_start(service: str, tmp_path: Path) -> None:
    with chromium_page(tmp_path / "profile", WIDTH, HEIGHT) as (page, errors):
        page.goto(f"{service}/compare?a={COLD}&b={WARM}")
        page.wait_for_selector("#cmp-plan-table")
        shot(page, tmp_path, "compare")
        rows = page.eval_on_selector_all(
            "#cmp-plan-table tr[data-kind]", "rs => rs.map(r => [r.dataset.kind, r.cells[3].innerText])"
        )
        assert ["cold_compile", "yes"] in rows and ["cold_model_inspection", "yes"] in rows, rows
        on_first_screen(page, "#cmp-plan-table")
        no_sideways_overflow(page)
        assert errors == []


def test_fleet_page_fits(service: str, tmp_path: Path) -> None:
    # the page as a user sees it once both runs' facts are derived (before that it shows progress)
    wait_for(lambda: httpx.get(f"{service}/fleet", headers={"accept": "application/json"}).json()["pending"] == 0, 120)
    with chromium_page(tmp_path / "profile", WIDTH, HEIGHT) as (page, errors):
        page.goto(f"{service}/fleet")
        page.wait_for_load_state("load")
        shot(page, tmp_path, "fleet")
        assert page.locator("#fleet-groups tbody tr").count() == 1  # the demo's two runs, one version
        no_sideways_overflow(page)
        assert errors == []
