"""The clock measurements made off the traced processes (starttrace/clocksync.py):

- a run known only from journals records the kernel's NTP state too: the root's helper writes it
  into the run folder at the root's `ready` (or exit), and readers put it on the host's processes;
- the exporter's clock exchange with a real `starttrace serve --token` sends the token the OTLP
  export sends (`OTEL_EXPORTER_OTLP_HEADERS`), so the service answers it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from starttrace.clocksync import ntp_state
from starttrace.sources.journal_reader import read_run

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from multinode_hosts import free_port  # noqa: E402

STARTTRACE = str(Path(sys.executable).with_name("starttrace"))
TOKEN = "s3cret-token"
NTP_KEYS = ("starttrace.clock.ntp_synced", "starttrace.clock.esterror_us", "starttrace.clock.maxerror_us")

# the root marks itself ready (as the uvicorn probe does), starts a traced child, then lives on
READY_THEN_WAIT = r"""
import subprocess, sys, time
from starttrace.tracer import lifecycle
lifecycle.mark_ready({"starttrace.ready.source": "test"})
subprocess.run([sys.executable, "-c", "pass"], check=True)
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_journal_only_run_records_the_ntp_state_at_ready(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    expected = ntp_state()
    if not expected:
        pytest.skip("adjtimex cannot be read here")
    proc = subprocess.Popen(
        [venv_python, "-c", READY_THEN_WAIT, "30"], env=traced_env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        run_dir = only_run_dir(journal_root)
        # written while the root still runs (at its ready, not only at its exit)
        clock_files = _wait_for(lambda: list(run_dir.glob("clock-*.json")), 30, "the clock file")
        assert proc.poll() is None
        # the helper was reaped: no zombie child of the program's is left for its os.wait() to find
        _wait_for(lambda: not psutil.Process(proc.pid).children(), 10, "the clock helper to be reaped")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    (clock_file,) = clock_files
    body = json.loads(clock_file.read_text())
    run = read_run(run_dir)
    assert len(run.processes) == 2
    root = next(p for p in run.processes if p.resource["starttrace.start_method"] == "root")
    assert clock_file.name == f"clock-{root.record['root_span']}.json"
    assert body["domain"] == root.resource["starttrace.clock.domain"]
    for process in run.processes:  # both processes of this host carry the host's NTP state
        assert process.resource["starttrace.clock.ntp_synced"] is expected["starttrace.clock.ntp_synced"]
        assert all(isinstance(process.resource[k], (bool, int)) for k in NTP_KEYS)
    # ... and so do the exports (the CLI on the journals)
    export = subprocess.run(
        [STARTTRACE, "export", str(run_dir), "-f", "otlp-json"], capture_output=True, text=True, timeout=120
    )
    assert export.returncode == 0, export.stderr
    spans = json.loads(export.stdout)["resourceSpans"]
    resources = [{kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]} for rs in spans]
    assert resources and all("starttrace.clock.ntp_synced" in res for res in resources)


def test_a_run_without_a_clock_file_has_no_ntp_state(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    """The state comes from the clock file only (the reader invents nothing): removed, it is gone."""
    subprocess.run([venv_python, "-c", "pass"], env=traced_env, check=True, timeout=60)
    run_dir = only_run_dir(journal_root)
    if ntp_state():
        _wait_for(lambda: list(run_dir.glob("clock-*.json")), 30, "the clock file (written at the root's exit)")
    for path in run_dir.glob("clock-*.json"):
        path.unlink()
    (process,) = read_run(run_dir).processes
    assert not any(k in process.resource for k in NTP_KEYS)


@pytest.fixture
def token_service(tmp_path: Path, clean_env: Callable[..., dict[str, str]]) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [STARTTRACE, "serve", "--port", str(port), "--db", str(tmp_path / "st.db"), "--no-journal",
             "--token", TOKEN],
            stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _healthy(url), 30, f"starttrace serve ({log})")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_clock_exchange_sends_the_exporters_token(
    venv_python: str, traced_env: dict[str, str], token_service: str
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(token_service + "/v1/clock", timeout=5).status_code == 401, "the service wants the token"
    env = dict(
        traced_env,
        OTEL_EXPORTER_OTLP_ENDPOINT=token_service,
        OTEL_EXPORTER_OTLP_HEADERS=f"Authorization=Bearer%20{TOKEN}",  # as the OTel SDK reads it
    )
    subprocess.run([venv_python, "-c", "pass"], env=env, check=True, timeout=60)

    def exported() -> list[dict[str, Any]]:
        runs = httpx.get(token_service + "/runs", headers=auth, timeout=5).json()["runs"]
        return runs if runs and runs[0]["spans"] > 0 else []

    (run,) = _wait_for(exported, 60, "the run over OTLP")
    otlp = httpx.get(f"{token_service}/runs/{run['run_id']}/export?format=otlp-json", headers=auth, timeout=30).json()
    (resource,) = [{kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]} for rs in otlp["resourceSpans"]]
    offset = int(resource["starttrace.clock.exchange_offset_ns"]["intValue"])
    rtt = int(resource["starttrace.clock.exchange_rtt_ns"]["intValue"])
    assert 0 < rtt < 2_000_000_000
    assert abs(offset) <= rtt // 2 + 5_000_000, (offset, rtt)  # one host, one clock: no offset beyond the trip
