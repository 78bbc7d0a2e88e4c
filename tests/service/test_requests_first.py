"""Requests first (issue 34, the first answer at the moment a user sees it): while a request is
answered, the service's background work for a run that just ended waits, and a request and the
prebuild thread asking for the same first answer share one rendering. On the real app (ASGI,
its background threads running)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from st_service_helpers import flush, wait_for
from synth_runs import make_run, to_protobuf

import starttrace.service.model_cache as model_cache

PB = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(autouse=True)
def collected() -> Iterator[None]:
    """After the app is closed: its threads' SQLite connections, garbage now, are closed here, not
    in the middle of a later test that counts open descriptors (tests/unit/test_journal.py)."""
    yield
    gc.collect()


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first answers rendered (run ids), in order."""
    done: list[str] = []
    real = model_cache.first_payload

    def counted(model: Any) -> Any:
        done.append(model.run_id)
        return real(model)

    monkeypatch.setattr(model_cache, "first_payload", counted)
    return done


def test_background_work_waits_while_a_request_is_answered(
    make_client: Callable[..., TestClient], renders: list[str]
) -> None:
    client = make_client(prebuild_idle_s=0.05, decode_workers=0)
    cache = client.app.state.cache  # type: ignore[attr-defined]
    body = to_protobuf(make_run(ranks=2, imports_per_rank=50, run_id="later", seed=3)).SerializeToString()
    with cache.serving():  # a request for another run being answered
        assert client.post("/v1/traces", content=body, headers=PB).status_code == 200
        flush(client)
        cache.note_written(["later"], build_now=True)
        blocked = threading.Event()
        threading.Timer(1.0, blocked.set).start()
        blocked.wait()
        assert cache.prebuilt == 0 and renders == [], "the prebuild waited for the request"
        assert cache._building == "later" or "later" in cache._dirty
    wait_for(lambda: cache.prebuilt >= 1 and not cache.pending)
    assert renders == ["later"]


def test_a_request_and_the_prebuild_render_the_first_answer_once(
    make_client: Callable[..., TestClient], renders: list[str]
) -> None:
    client = make_client(prebuild_idle_s=0.0, decode_workers=0)
    cache = client.app.state.cache  # type: ignore[attr-defined]
    for seed, run_id in enumerate(["one", "two", "three"]):
        body = to_protobuf(make_run(ranks=4, imports_per_rank=400, run_id=run_id, seed=seed)).SerializeToString()
        assert client.post("/v1/traces", content=body, headers=PB).status_code == 200
        flush(client)
        # asked at once: the prebuild thread wants the same answer now (idle 0 s)
        assert client.get(f"/startup/{run_id}").json()["run_id"] == run_id
        wait_for(lambda: not cache.pending)
    assert sorted(renders) == ["one", "three", "two"], renders  # each once, whoever came first
