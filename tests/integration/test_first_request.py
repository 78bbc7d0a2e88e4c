"""The first served request of a generic ASGI server under uvicorn (probes/servers.py,
probes/first_request.py): a real traced uvicorn process, with a client thread in it that asks
/health, then (or not) a streamed /generate request, timing what it received (epoch ns, as the
run's spans read)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from run_spans import spans_named

from starttrace.analysis.fleet import fleet_answer, run_facts
from starttrace.analysis.lanes import NoFirstToken, build_model
from starttrace.run import Run
from starttrace.sources.journal_reader import read_run
from starttrace.views.json import to_json

pytest.importorskip("uvicorn")

SERVER = r"""
import http.client, json, socket, sys, threading, time
import uvicorn

LAZY_SECONDS = float(sys.argv[2])
served = []

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/generate" and not served:
        served.append(1)
        if LAZY_SECONDS:
            import lazy_module  # imported on the first request only: lazy work after ready
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    if scope["path"] == "/generate":
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await __import__("asyncio").sleep(0.3)
    await send({"type": "http.response.body", "body": b"ok", "more_body": False})

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
config = uvicorn.Config(app, log_level="warning", lifespan="on")
server = uvicorn.Server(config)
times = {}

def client():
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/health")
    times["health"] = conn.getresponse().read().decode()
    if sys.argv[1] == "request":
        for key in ("first", "second"):
            time.sleep(0.2)
            conn.request("GET", "/generate")
            response = conn.getresponse()
            times[key + "_sent"] = time.time_ns()
            body = response.read(5)
            times[key + "_byte"] = time.time_ns()
            body += response.read()
            times[key + "_body"] = body.decode()
    server.should_exit = True

threading.Thread(target=client, daemon=True).start()
server.run(sockets=[sock])
print(json.dumps(times))
"""


def _serve(tmp_path: Path, mode: str, lazy_seconds: float = 0.0) -> tuple[dict[str, Any], Run]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "lazy_module.py").write_text(f"import time\ntime.sleep({lazy_seconds})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE") and k.lower() != "traceparent"}
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(tmp_path / "runs"))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SERVER, mode, str(lazy_seconds)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    return json.loads(proc.stdout.strip().splitlines()[-1]), read_run(run_dir)


def test_first_served_request_is_recorded_up_to_its_first_byte(tmp_path: Path) -> None:
    times, run = _serve(tmp_path, "request")
    assert times["health"] == "ok" and times["first_body"] == times["second_body"] == "firstok"
    (request,) = spans_named(run, "server.first_request")  # /health is no request; the second is not first
    assert request.attrs["url.path"] == "/generate" and request.attrs["starttrace.phase"] == "first_request"
    assert request.attrs["http.response.status_code"] == 200
    (token,) = spans_named(run, "first_token")
    assert token.parent_id == request.span_id
    (ready,) = spans_named(run, "ready")
    # the first body chunk left before the client read it, and the 0.3 s the stream still took came after
    assert ready.start_ns < request.start_ns < token.start_ns
    # the client's clock is the same host's: the byte left before the client had it, and the client
    # (a thread of the same process, so it waits for the GIL on a loaded machine) had it soon after
    assert token.start_ns <= times["first_byte"] + 0.01e9
    assert times["first_byte"] - token.start_ns < 1.5e9  # the tolerance for vLLM
    assert request.end_ns - token.start_ns >= 0.29e9  # asyncio.sleep(0.3) may wake within its clock resolution

    model = build_model(run)
    assert model.time_to_first_token_s == round((token.start_ns - model.t0) / 1e9, 6)
    doc = to_json(model, include_spans=False)
    assert doc["time_to_first_token_s"] == model.time_to_first_token_s and doc["until"] == "ready"
    assert doc["first_request"]["request_s"] == round((token.start_ns - request.start_ns) / 1e9, 6)
    assert model.critical_path[-1].end == model.ready_ns < token.start_ns  # by default the path ends at ready

    until = build_model(run, until="first_token")
    (lane,) = until.lanes
    assert lane.end == token.start_ns  # the window ends at the first token, not at ready
    assert sum(lane.breakdown.values()) == lane.end - lane.start
    assert lane.breakdown.get("first_request", 0) >= token.start_ns - request.start_ns - 0.05e9
    assert lane.breakdown.get("wait", 0) > 0.15e9  # ready to the request: the server waited for it
    path = until.critical_path
    assert path[-1].end == token.start_ns and path[-1].phase == "first_request"

    facts = run_facts(run, model)
    assert facts["time_to_first_token_s"] == model.time_to_first_token_s
    group = fleet_answer([facts], "service")["groups"][0]
    assert group["time_to_first_token_s"]["p50"] == model.time_to_first_token_s


def test_lazy_work_in_the_first_request_is_named(tmp_path: Path) -> None:
    _times, run = _serve(tmp_path, "request", lazy_seconds=0.8)
    model = build_model(run)
    (imported,) = [s for s in spans_named(run, "import lazy_module")]
    assert imported.attrs.get("starttrace.phase", "import") == "import"
    doc = to_json(model, include_spans=False)
    assert doc["first_request"]["lazy"]["import"] >= 0.75
    (found,) = [f for f in model.findings if f["kind"] == "lazy_first_request"]
    assert found["seconds"] >= 0.75 and found["lazy"]["import"] >= 0.75
    assert "import these modules at startup" in found["action"] and "warm-up request" in found["action"]


def test_a_server_that_gets_no_request_is_unchanged(tmp_path: Path) -> None:
    times, run = _serve(tmp_path, "health-only")
    assert times == {"health": "ok"}
    assert not spans_named(run, "server.first_request") and not spans_named(run, "first_token")
    model = build_model(run)
    assert model.first_token_ns is None and model.time_to_first_token_s is None
    assert "first_request" not in {p for lane in model.lanes for p in lane.phases}
    assert not [f for f in model.findings if f["kind"] == "lazy_first_request"]
    doc = to_json(model, include_spans=False)
    assert doc["time_to_first_token_s"] is None and doc["first_request"] is None
    assert run_facts(run, model)["time_to_first_token_s"] is None
    with pytest.raises(NoFirstToken, match="served no request"):
        build_model(run, until="first_token")


def test_api_and_cli_end_at_the_first_token(tmp_path: Path) -> None:
    from st_service_helpers import start_server, wait_for

    _times, served = _serve(tmp_path / "served", "request")
    _times, idle = _serve(tmp_path / "idle", "health-only")
    runs = tmp_path / "served" / "runs"
    (idle_dir,) = (tmp_path / "idle" / "runs").iterdir()
    idle_dir.rename(runs / idle_dir.name)
    server = start_server(tmp_path, "--journal-dir", str(runs))
    try:
        base = f"{server.url}/startup/{served.run_id}?format=json"
        # the service reads the journal folder in the background: both runs are there once it has
        wait_for(lambda: all(httpx.get(f"{server.url}/startup/{r.run_id}?format=json", timeout=60).status_code == 200
                             for r in (served, idle)), timeout=60)  # fmt: skip
        default = httpx.get(base, timeout=60).json()
        until = httpx.get(base + "&until=first_token", timeout=60).json()
        assert default["until"] == "ready" and until["until"] == "first_token"
        assert until["time_to_first_token_s"] == default["time_to_first_token_s"] is not None
        assert sum(until["ready_by_phase"].values()) == pytest.approx(until["time_to_first_token_s"], abs=1e-3)
        assert "first_request" in until["ready_by_phase"] and "first_request" not in default["ready_by_phase"]
        page = httpx.get(f"{server.url}/startup/{served.run_id}?format=html", timeout=60).text
        assert f'id="ttft-s">{default["time_to_first_token_s"]:.3f} s<' in page and "until=first_token" in page
        idle_page = httpx.get(f"{server.url}/startup/{idle.run_id}?format=html", timeout=60).text
        assert 'id="first-token"' not in idle_page
        bad = httpx.get(base + "&until=forever", timeout=60)
        assert bad.status_code == 400 and "until must be" in bad.json()["error"]
        none = httpx.get(f"{server.url}/startup/{idle.run_id}?format=json&until=first_token", timeout=60)
        assert none.status_code == 404 and "served no request" in none.json()["error"]
    finally:
        server.stop()
    cli = [sys.executable, "-m", "starttrace", "report", "--dir", str(runs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE")}
    out = subprocess.run(
        [*cli, served.run_id, "--until", "first-token"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "time to first token" in out.stdout and "end at the first token" in out.stdout
    refused = subprocess.run(
        [*cli, idle.run_id, "--until", "first-token"], env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "served no request" in refused.stdout + refused.stderr
    compare = [sys.executable, "-m", "starttrace", "compare", served.run_id, served.run_id, "--dir", str(runs)]
    compared = subprocess.run(
        [*compare, "--until", "first-token"], env=env, capture_output=True, text=True, timeout=120
    )
    assert compared.returncode == 0, compared.stderr
    assert "time to first token" in compared.stdout and "time to first token by phase" in compared.stdout


def test_demo_prints_the_time_to_first_token(tmp_path: Path) -> None:
    from rich.console import Console

    from starttrace.demo import _report

    _times, run = _serve(tmp_path, "request")
    console = Console(record=True, width=200)
    assert _report(console, next((tmp_path / "runs").iterdir()), 12.5) == 0
    text = console.export_text()
    ttft = build_model(run).time_to_first_token_s
    assert f"time to first token {ttft:.2f} s (the client had its answer 12.50 s after launch)" in text
