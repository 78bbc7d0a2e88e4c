"""A full disk says so (issue 38 item 9), on the real service with its store on a real, small
file system (a 3 MiB tmpfs in a mount namespace of its own): 503 whose message says "disk full",
/healthz says the same, and every span answered 200 is still served."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from google.rpc import status_pb2
from st_service_helpers import ROOT, free_port
from synth_runs import make_run, to_protobuf

PB = {"Content-Type": "application/x-protobuf"}


def _mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _mount_works(), reason="needs `unshare` to mount a small tmpfs (user namespaces)")
def test_a_full_disk_is_503_disk_full_and_loses_no_acknowledged_span(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    port = free_port()
    serve = f"{sys.executable} -m starttrace.service.server --port {port} --db {disk}/st.db --decode-workers 0"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
             f"mount -t tmpfs -o size=3m tmpfs {disk} && exec {serve}"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        acked: dict[str, int] = {}
        refused = None
        for i in range(100):  # ~140 KB of spans each: the 3 MiB fill up within a few dozen
            run = make_run(ranks=2, imports_per_rank=300, run_id=f"fill-{i}", seed=i)
            r = httpx.post(url + "/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB, timeout=60)
            if r.status_code != 200:
                refused = r
                break
            acked[run.run_id] = run.span_count
        assert refused is not None and acked, "the disk never filled up"
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        message = status_pb2.Status.FromString(refused.content).message
        assert "disk full" in message and "no transaction is active" not in message, message
        errors = httpx.get(url + "/healthz", timeout=30).json()["store_errors"]
        assert errors and all("disk full" in e for e in errors), errors
        stored = {r["run_id"]: r for r in httpx.get(url + "/runs", params={"limit": 1000}, timeout=30).json()["runs"]}
        for run_id, spans in acked.items():  # nothing acknowledged was lost
            assert stored[run_id]["spans"] == spans, (run_id, stored.get(run_id))
    finally:
        proc.terminate()
        proc.wait(20)
