"""Models are kept out of the cyclic GC's way (frozen once built) and still freed when replaced."""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

from synth_runs import make_run, to_protobuf

from starttrace.service.model_cache import ModelCache
from starttrace.sources.otlp import decode
from starttrace.sources.store import Store


def test_replaced_model_is_freed_although_frozen(tmp_path: Path) -> None:
    store = Store(tmp_path / "st.db")
    cache = ModelCache(store, live_ttl_s=1.0, idle_s=None)
    run = make_run(ranks=2, imports_per_rank=40, run_id="mem", seed=3)
    store.ingest_now(decode(to_protobuf(run).SerializeToString()).batch)
    try:
        first = cache.model("mem")
        assert first is not None and any(n.parent_node is not None for n in first.spans)
        assert gc.get_freeze_count() > 0  # the model's objects are out of the collector's generations
        old = weakref.ref(first)
        del first
        # a new version of the run: the model is rebuilt, the old one retired and released
        more = make_run(ranks=3, imports_per_rank=40, run_id="mem", seed=3)
        store.ingest_now(decode(to_protobuf(more).SerializeToString()).batch)
        second = cache.model("mem")
        assert second is not None and len(second.lanes) > 2
        assert old() is None  # freed by reference counting: its parent links were cut
        assert any(n.parent_node is not None for n in second.spans)  # the current model is intact
        assert cache._frozen.pending == 0
    finally:
        gc.unfreeze()
        store.close()


def test_retired_model_kept_while_in_use(tmp_path: Path) -> None:
    store = Store(tmp_path / "st.db")
    cache = ModelCache(store, live_ttl_s=1.0, idle_s=None)
    store.ingest_now(decode(to_protobuf(make_run(ranks=2, imports_per_rank=20, run_id="g")).SerializeToString()).batch)
    try:
        first = cache.model("g")  # a request rendering from it holds it
        assert first is not None
        cache.forget(["g"])
        assert cache._frozen.pending == 1 and cache._frozen.release() == 0
        assert any(n.parent_node is not None for n in first.spans)  # still whole for its reader
        old = weakref.ref(first)
        del first  # the request is done
        assert cache._frozen.release() == 1 and cache._frozen.pending == 0
        assert old() is None
    finally:
        gc.unfreeze()
        store.close()


def test_garbage_frozen_with_a_model_is_collected_when_idle() -> None:
    """A freeze keeps the cyclic garbage of its moment; the idle collection frees it."""
    from starttrace.service.model_memory import IDLE_COLLECT_S, FrozenModels

    class Cycle:
        pass

    frozen = FrozenModels()
    gc.disable()  # as during a build (run.gc_paused)
    try:
        garbage = Cycle()
        garbage.me = garbage  # type: ignore[attr-defined]
        alive = weakref.ref(garbage)
        del garbage
        frozen.built()
    finally:
        gc.enable()
    try:
        gc.collect()
        assert alive() is not None, "frozen: the collector does not see it"
        assert frozen.idle_collect_in() is not None
        assert not frozen.collect_if_idle()  # a build just happened: not yet
        assert frozen.collect_if_idle(now=time.monotonic() + IDLE_COLLECT_S + 1)
        assert alive() is None and frozen.idle_collect_in() is None and frozen.idle_collections == 1
    finally:
        gc.unfreeze()
