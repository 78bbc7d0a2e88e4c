"""The service's Python objects on transparent huge pages (`service.model_memory.use_huge_page_arenas`,
`_modelcore.c`): read back from the kernel's own accounting (/proc/self/smaps_rollup), in a fresh
interpreter each, since the allocator is for the rest of a process's life."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from st_service_helpers import start_server
from synth_runs import make_run, to_protobuf

from starttrace.service.model_memory import THP_SETTING

try:
    from starttrace import _modelcore
except ImportError:  # pragma: no cover - a pure-Python build
    _modelcore = None


def thp_mode() -> str | None:
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")]


needs_thp = pytest.mark.skipif(
    _modelcore is None or thp_mode() not in ("always", "madvise"),
    reason="needs the C core and a kernel with transparent huge pages",
)

# What a model build does to memory, and more: ~1.5M small objects (arenas in many chunks), threads
# started and ended meanwhile (each has a frame stack from the same allocator, in 16 KiB pieces: a
# chunk then ends in a remainder smaller than an arena), everything freed and made again.
CHILD = textwrap.dedent(
    """
    import json, sys, threading
    from starttrace.service.model_memory import use_huge_page_arenas

    def rollup():
        out = {}
        for line in open("/proc/self/smaps_rollup"):
            key, _, rest = line.partition(":")
            if key in ("Rss", "AnonHugePages"):
                out[key] = int(rest.split()[0])
        return out

    installed = use_huge_page_arenas()
    def deep(n):
        return 0 if n == 0 else 1 + deep(n - 1)
    def churn():
        threads = [threading.Thread(target=deep, args=(200,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    base = rollup()
    rounds = []
    for r in range(2):
        made = []
        for i in range(30):
            made.append([(j, str(j)) for j in range(50_000)])
            if i % 5 == 0:
                churn()
        total = sum(len(x) for x in made)
        check = sum(t[0] for x in made for t in x[:3])
        full = rollup()
        del made
        rounds.append({"total": total, "check": check, "full": full, "freed": rollup()})
    print(json.dumps({"installed": installed, "base": base, "rounds": rounds}))
    """
)


def run_child(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "STARTTRACE_HUGE_PAGES"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env={**environ, **env}, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@needs_thp
def test_objects_live_on_huge_pages_and_memory_goes_back() -> None:
    got = run_child()
    assert got["installed"] is True
    for r in got["rounds"]:
        assert r["total"] == 30 * 50_000 and r["check"] == 30 * 3  # every object intact
        grown_kb = r["full"]["Rss"] - got["base"]["Rss"]
        assert grown_kb > 100_000
        # most of what the objects took is on 2 MiB pages (the rest: lists' item arrays, via malloc)
        assert r["full"]["AnonHugePages"] - got["base"]["AnonHugePages"] > grown_kb * 0.5
        # freed arenas are unmapped: the memory goes back to the system
        assert r["freed"]["Rss"] - got["base"]["Rss"] < grown_kb * 0.2


@needs_thp
def test_switched_off_by_the_environment() -> None:
    got = run_child(STARTTRACE_HUGE_PAGES="0")
    assert got["installed"] is False
    if thp_mode() == "madvise":  # nothing else asks for huge pages then
        assert all(r["full"]["AnonHugePages"] == got["base"]["AnonHugePages"] for r in got["rounds"])


def test_not_installed_without_thp(tmp_path: Path) -> None:
    from starttrace.service import model_memory

    before = model_memory.huge_page_arenas
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    assert model_memory.use_huge_page_arenas({}, never) is before
    assert model_memory.use_huge_page_arenas({}, tmp_path / "missing") is before
    assert model_memory.use_huge_page_arenas({"STARTTRACE_HUGE_PAGES": "off"}) is before
    assert model_memory.huge_page_arenas is before  # this test process is left as it was


@needs_thp
def test_service_reports_and_serves_on_huge_pages(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        assert httpx.get(server.url + "/healthz", timeout=10).json()["huge_page_arenas"] is True
        run = make_run(ranks=4, imports_per_rank=2000, run_id="huge", seed=5)
        r = httpx.post(
            server.url + "/v1/traces",
            content=to_protobuf(run).SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=60,
        )
        assert r.status_code == 200
        doc = None
        for _ in range(100):
            resp = httpx.get(server.url + "/startup/huge", timeout=60)
            if resp.status_code == 200 and len(resp.json()["lanes"]) >= 6:
                doc = resp.json()
                break
        assert doc is not None and doc["run_id"] == "huge"
        smaps = Path(f"/proc/{server.proc.pid}/smaps_rollup").read_text()
        huge_kb = int(next(line for line in smaps.splitlines() if line.startswith("AnonHugePages")).split()[1])
        assert huge_kb >= 2048  # the model's objects sit on huge pages
    finally:
        server.stop()
    # and it ends as it always does (uvicorn re-raises the SIGTERM it handled), not by a fault
    assert server.proc.returncode in (0, -signal.SIGTERM), server.log.read_text()[-2000:]
