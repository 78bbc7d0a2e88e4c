"""Lanes are processes: a program that forks after creating its TracerProvider (gunicorn or Celery
prefork workers) sends, through the real OpenTelemetry SDK and OTLP/HTTP exporter, spans whose
resources share one `service.instance.id` (the resource is made once, before the fork) but carry
each process's own `process.pid`. The service
keys lanes by (instance id, host, pid), so each process is its own lane."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
from st_service_helpers import Server, wait_for

PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, ProcessResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # gunicorn's documented pattern: the resource is made once at import (in the master: one
    # instance id, drawn by the SDK), each worker makes its TracerProvider in post_fork with it
    resource = Resource.create({"service.name": "prefork", "starttrace.run_id": sys.argv[2]})
    iid = resource.attributes.get(SERVICE_INSTANCE_ID)
    if not iid:  # an SDK without the instance id detector: the same, set by the program
        iid = "prefork-" + str(os.getpid())
        resource = resource.merge(Resource({SERVICE_INSTANCE_ID: iid}))

    def provider():
        made = TracerProvider(resource=resource.merge(ProcessResourceDetector().detect()))
        made.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
        return made

    master = provider()
    with master.get_tracer("prefork").start_as_current_span("master.start"):
        pass
    master.force_flush()
    kids = []
    for i in range(4):
        pid = os.fork()
        if pid == 0:  # post_fork
            worker = provider()
            with worker.get_tracer("prefork").start_as_current_span(f"worker.boot {i}"):
                time.sleep(0.01)
            worker.shutdown()
            os._exit(0)
        kids.append(pid)
    for kid in kids:
        os.waitpid(kid, 0)
    master.shutdown()
    print(iid, " ".join(str(p) for p in [os.getpid(), *kids]))
    """
)


def test_fork_children_of_one_sdk_instance_are_separate_lanes(server: Server, tmp_path: Path) -> None:
    prog = tmp_path / "prefork.py"
    prog.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, str(prog), server.url + "/v1/traces", "prefork-run"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    iid, *pid_text = done.stdout.split()
    pids = [int(p) for p in pid_text]
    assert len(set(pids)) == 5

    def lanes() -> list[dict] | None:
        r = httpx.get(f"{server.url}/startup/prefork-run", timeout=10)
        if r.status_code != 200:
            return None
        found = r.json()["lanes"]
        return found if sum(len(lane["spans"]) for lane in found) == 5 else None

    found = wait_for(lanes, timeout=20)
    by_pid = {lane["pid"]: lane for lane in found}
    assert sorted(by_pid) == sorted(pids), "one lane per process"
    assert len(found) == 5
    names = {pid: [s[2] for s in lane["spans"]] for pid, lane in by_pid.items()}
    assert names[pids[0]] == ["master.start"]
    assert sorted(n for pid in pids[1:] for n in names[pid]) == [f"worker.boot {i}" for i in range(4)]
    # the instance id they share is kept: the first process seen owns it, the others get host/pid
    ids = sorted(lane["id"] for lane in found)
    assert sum(1 for i in ids if i == iid) == 1
    for lane in found:
        assert lane["id"] == iid or (lane["id"].startswith(iid + "/") and lane["id"].endswith(f"/{lane['pid']}"))
