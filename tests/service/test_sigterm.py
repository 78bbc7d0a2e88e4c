"""Issue 38 item 5: SIGTERM stops a real `serve` process within a few seconds whatever it is doing,
here four exports of a 20k-deep import chain at once (they kept it deaf to SIGTERM for 26+ s)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import httpx
from hostile_runs import deep_run
from st_service_helpers import Server, wait_for
from synth_runs import to_protobuf

STOP_WITHIN_S = 6.0


def test_sigterm_stops_the_service_during_four_exports(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    body = to_protobuf(deep_run("deep", 20_000)).SerializeToString()
    r = httpx.post(
        server.url + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}, timeout=60
    )
    assert r.status_code == 200, r.text
    wait_for(lambda: httpx.get(server.url + "/runs").json()["runs"][:1] != [], timeout=30, interval=0.2)
    started: list[float] = []

    def export(fmt: str) -> None:
        started.append(time.monotonic())
        try:
            httpx.get(f"{server.url}/runs/deep/export?format={fmt}", timeout=120)
        except httpx.HTTPError:
            pass  # cut off by the stop: what this test wants

    threads = [threading.Thread(target=export, args=(f,)) for f in ("otlp-json", "jaeger", "perfetto", "otlp-json")]
    for t in threads:
        t.start()
    wait_for(lambda: len(started) == 4, timeout=10)
    time.sleep(1.0)  # the exports are being made
    assert server.proc.poll() is None
    t0 = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    server.proc.wait(30)
    took = time.monotonic() - t0
    for t in threads:
        t.join(60)
    print(f"SIGTERM to exit: {took:.2f} s")
    assert took < STOP_WITHIN_S, f"SIGTERM took {took:.1f} s"
