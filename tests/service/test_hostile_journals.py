"""The service watching a journal folder that holds hostile runs (issue 38 item 8), on the real
service: a folder it may not list, a segment linked to /dev/zero and 2M malformed lines are
named, and every other run of that journal folder is stored; the /startup answer stays bounded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hostile_journals import clone, lock, malformed_lines, real_run, unlock, without_dac, zero_link
from st_service_helpers import ROOT, Server, free_port, wait_for


def _serve(tmp: Path, journal_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "starttrace.service.server", "--port", str(port), "--db", str(tmp / "st.db")]
    cmd += ["--journal-dir", str(journal_dir)]
    env = {**env, "PYTHONPATH": str(ROOT)}
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(without_dac(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        assert proc.poll() is None, (tmp / "server.log").read_text()
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop root's file access")
def test_the_service_stores_every_readable_run_and_names_the_others(
    tmp_path: Path, journal_root: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    base = real_run(journal_root, clean_env())
    locked = clone(base, "20250101-000000-locked")
    zero = clone(base, "20250101-000000-zero00")
    zero_name = zero_link(zero)
    noisy = clone(base, "20250101-000000-malfor")
    noisy_name = malformed_lines(noisy)
    lock(locked)
    proc, url = _serve(tmp_path, journal_root, clean_env())
    try:
        want = {base.name, zero.name, noisy.name}

        def stored() -> set[str]:
            return {r["run_id"] for r in httpx.get(url + "/runs", timeout=30).json()["runs"]} & want

        assert wait_for(lambda: stored() == want, timeout=120)
        health = wait_for(
            lambda: (h := httpx.get(url + "/healthz", timeout=30).json())["journal_errors"] and h, timeout=30
        )
        assert any(
            locked.name in e and "cannot list its folder (Permission denied)" in e for e in health["journal_errors"]
        ), health
        answer = httpx.get(url + f"/startup/{noisy.name}", timeout=60)
        assert answer.status_code == 200 and len(answer.content) < 2_000_000, len(answer.content)  # was 119 MB
        problems = answer.json()["problems"]
        assert sum(noisy_name in p for p in problems) <= 5 and any("(1999999 in all)" in p for p in problems)
        problems = httpx.get(url + f"/startup/{zero.name}", timeout=60).json()["problems"]
        assert any(zero_name in p and "not a regular file" in p for p in problems), problems
    finally:
        proc.terminate()
        proc.wait(20)
        unlock(locked)


def test_run_links_keep_a_slash_inside_one_path_segment(
    server_factory: Callable[..., Server], journal_root: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """A run id holding "/" or "%2F" (a journal's run.json says so; ClickHouse keeps ids as sent):
    the page links it as one segment, and that link, its lanes and its exports open it."""
    base = real_run(journal_root, clean_env())
    odd = {"team/run-1": clone(base, "20250101-000000-slash0"), "x%2Fy": clone(base, "20250101-000000-percnt")}
    for run_id, folder in odd.items():
        meta = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**meta, "run_id": run_id}))
    srv = server_factory("--journal-dir", str(journal_root))

    def listed() -> set[str]:
        return {r["run_id"] for r in httpx.get(srv.url + "/runs", timeout=30).json()["runs"]} & set(odd)

    wait_for(lambda: listed() == set(odd), timeout=60)
    page = httpx.get(srv.url + "/runs", headers={"Accept": "text/html"}, timeout=30).text
    links = re.findall(r'href="(/startup/[^"]*)"', page)
    assert "/startup/team%2Frun-1" in links and "/startup/x%252Fy" in links, links
    for run_id in odd:
        enc = quote(run_id, safe="")
        doc = httpx.get(f"{srv.url}/startup/{enc}", headers={"Accept": "application/json"}, timeout=60)
        assert doc.status_code == 200 and doc.json()["run_id"] == run_id, (run_id, doc.text[:200])
        html = httpx.get(f"{srv.url}/startup/{enc}", headers={"Accept": "text/html"}, timeout=60)
        assert html.status_code == 200 and f'data-json-url="/startup/{quote(enc, safe="")}' not in html.text
        assert f'href="/runs/{enc}/export?format=perfetto"' in html.text, html.text[:2000]
        assert httpx.get(f"{srv.url}/startup/{enc}/lanes/0/spans", timeout=60).status_code == 200
        assert httpx.get(f"{srv.url}/runs/{enc}/export?format=jaeger", timeout=60).status_code == 200
    assert httpx.get(f"{srv.url}/startup/team/run-1", timeout=30).status_code == 404  # two segments: no such run
