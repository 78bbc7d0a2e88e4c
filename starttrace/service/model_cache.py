"""Waterfall models per run, and the page's first answer, ready before anyone asks.

- A model is built from the store's run (`build_model`) and kept while the run's version is the
  same (rebuilt at most once per `live_ttl_s` while a run is live, for its growing in-progress
  spans). Models are evicted oldest first past `MAX_MODELS` runs or `MAX_MODEL_SPANS` spans.
- The first answer to `GET /startup/{run}` (`views.startup_json.first_payload`, at most ~2 MB) is
  rendered once per model and, for a run that is not live, saved in the store with the run's
  version: after a restart it is answered from there, without building anything.
- Prebuilding: the store reports every run it wrote; once a run has had no ingest for
  `idle_s` (and the ingest queue is empty), a background thread builds its model and first
  answer, so the first request finds them done. A run whose last model was live waits
  `LIVE_IDLE_S` instead: nothing is rebuilt every second next to a startup that is being traced.
- While a model is built, the store's idle WAL checkpoint waits (`Store.deferring_checkpoints`):
  right after ingest it copied the whole ingest's pages next to the first request.
- Requests first (`serving`): while a request is answered, background work waits before its next
  step: prebuilding and saving answers, the fleet facts' model loads (service/fleet.py loads
  through `model`), the store's idle checkpoint. One first answer is rendered once per model: a
  request and the prebuild thread asking for it at once share one rendering. Without this, the
  first request right after an ingest ran next to the prebuild of the same run (two renderings of
  one answer), its save and a checkpoint (docs/benchmarks.md, "The first answer at the moment a
  user sees it").
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from starttrace.analysis.clocks import correct_clocks
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.run import Run
from starttrace.sources.run_groups import RunGroups
from starttrace.sources.store import Store, write_error_text
from starttrace.views.json import dumps, to_json
from starttrace.views.startup_json import first_payload, lane_detail

MAX_MODELS = 64
MAX_MODEL_SPANS = 2_000_000
LIVE_IDLE_S = 5.0
YIELD_MAX_S = 30.0  # background work waits for requests at most this long per step (never starved)
FIRST_VIEW = "first"  # the store's name for the saved first answer


@dataclass
class _First:
    version: int
    model_id: int  # id() of the model it was rendered from; 0: loaded from the store
    live: bool
    body: bytes
    head: dict[str, Any] | None = None  # the payload without span rows (the HTML page), on demand


class ModelCache:
    def __init__(self, store: Store, live_ttl_s: float, idle_s: float | None = 0.3) -> None:
        self.store = store
        self.groups = RunGroups(store)  # per-node runs of one job, joined (sources/run_groups.py)
        self.live_ttl_s = live_ttl_s
        self.idle_s = idle_s  # None: no prebuilding
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}
        self._models: dict[str, tuple[int, float, RunModel]] = {}
        self._json: dict[str, tuple[int, int, bytes]] = {}
        self._runs: dict[str, Run] = {}
        self._first: dict[str, _First] = {}
        self._dirty: dict[str, float] = {}  # run id -> when the store last wrote it
        self._saves: dict[str, tuple[int, bytes]] = {}  # first answers to save (by the prebuild thread)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.prebuilt = 0
        self._building: str | None = None
        self._serving = 0  # requests being answered now (`serving`)
        self._served = threading.Condition()
        self._local = threading.local()  # .request: this thread answers a request

    @property
    def pending(self) -> int:
        """Runs waiting for their model to be prebuilt (or being built now)."""
        return len(self._dirty) + len(self._saves) + (1 if self._building is not None else 0)

    # requests first -------------------------------------------------------------------------
    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """A request is answered on this thread: background work waits (`_yield_to_requests`), and so
        does the store's idle WAL checkpoint."""
        with self._served:
            self._serving += 1
        self._local.request = True
        try:
            with self.store.deferring_checkpoints():
                yield
        finally:
            self._local.request = False
            with self._served:
                self._serving -= 1
                if not self._serving:
                    self._served.notify_all()

    def _yield_to_requests(self) -> None:
        """On a background thread: wait while requests are answered (at most YIELD_MAX_S)."""
        if getattr(self._local, "request", False):
            return
        deadline = time.monotonic() + YIELD_MAX_S
        with self._served:
            while self._serving and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._served.wait(min(left, 0.5))

    # models --------------------------------------------------------------------------------
    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            lock = self._run_locks.get(run_id)
            if lock is None:
                lock = self._run_locks[run_id] = threading.Lock()
            return lock

    def _fresh(self, entry: tuple[int, float, Any] | None, version: int, live: bool) -> bool:
        if entry is None or entry[0] != version:
            return False
        return not live or time.monotonic() - entry[1] < self.live_ttl_s

    def _current(self, run_id: str, version: int) -> RunModel | None:
        entry = self._models.get(run_id)
        if entry is not None and self._fresh(entry, version, entry[2].live):
            return entry[2]
        return None

    def model(self, run_id: str) -> RunModel | None:
        version = self.groups.version(run_id)
        if version is None:
            return None
        model = self._current(run_id, version)
        if model is not None:
            return model
        self._yield_to_requests()
        with self._run_lock(run_id), self.store.deferring_checkpoints():
            model = self._current(run_id, version)
            if model is not None:
                return model
            run = self.groups.load(run_id)
            if run is None:
                return None
            run = correct_clocks(run, owned=True)  # hosts on one clock (docs/multinode.md); run is ours
            model = build_model(run)
            with self._lock:
                self._models[run_id] = (run.version, time.monotonic(), model)
                self._runs[run_id] = run
                self._evict()
            return model

    def _evict(self) -> None:
        """Oldest models first, past MAX_MODELS runs or MAX_MODEL_SPANS spans (the newest stays)."""
        by_age = sorted(self._models.items(), key=lambda kv: kv[1][1])
        spans = sum(len(entry[2].spans) for _, entry in by_age)
        while len(by_age) > 1 and (len(by_age) > MAX_MODELS or spans > MAX_MODEL_SPANS):
            key, entry = by_age.pop(0)
            spans -= len(entry[2].spans)
            self._models.pop(key, None)
            self._json.pop(key, None)
            self._runs.pop(key, None)

    def run(self, run_id: str) -> Run | None:
        """The run behind the current model (what exports render)."""
        if self.model(run_id) is None:
            return None
        return self._runs.get(run_id)

    def json_bytes(self, run_id: str) -> bytes | None:
        """The whole model as JSON, every span included (`?spans=all`; `report --json`)."""
        model = self.model(run_id)
        if model is None:
            return None
        entry = self._json.get(run_id)
        if entry is not None and entry[0] == model.version and entry[1] == id(model):
            return entry[2]
        data = dumps(to_json(model)).encode()
        self._json[run_id] = (model.version, id(model), data)
        return data

    # the first answer ------------------------------------------------------------------------
    def _first_entry(self, run_id: str) -> _First | None:
        version = self.groups.version(run_id)
        if version is None:
            return None
        entry = self._first.get(run_id)
        if entry is not None and entry.version == version:
            model = self._current(run_id, version)
            if not entry.live or (model is not None and id(model) == entry.model_id):
                return entry
        if self._current(run_id, version) is None:
            saved = self.store.load_view(run_id, FIRST_VIEW)
            if saved is not None and saved[0] == version:
                entry = _First(version, 0, False, saved[1])
                self._first[run_id] = entry
                self.note_written([run_id], build_now=True)  # someone looks at it: the lanes' detail next
                return entry
        model = self.model(run_id)
        if model is None:
            return None
        return self._render_first(run_id, model)

    def _render_first(self, run_id: str, model: RunModel) -> _First:
        entry = self._usable_first(run_id, model)
        if entry is not None:
            return entry
        self._yield_to_requests()
        with self._run_lock(run_id):  # once per model: a request and the prebuild share one rendering
            entry = self._usable_first(run_id, model)
            return entry if entry is not None else self._render_new_first(run_id, model)

    def _usable_first(self, run_id: str, model: RunModel) -> _First | None:
        entry = self._first.get(run_id)
        if entry is not None and entry.model_id == id(model):
            return entry
        if entry is not None and entry.version == model.version and not entry.live and not model.live:
            entry.model_id = id(model)  # the same data: the answer loaded from the store stands
            return entry
        return None

    def _render_new_first(self, run_id: str, model: RunModel) -> _First:
        doc = first_payload(model)
        body = dumps(doc).encode()
        for lane in doc["lanes"]:
            lane.pop("spans", None)
        entry = _First(model.version, id(model), model.live, body, doc)
        self._first[run_id] = entry
        if not model.live:
            if self._thread is not None and threading.current_thread() is not self._thread:
                self._saves[run_id] = (model.version, body)  # not on a request: the store may be busy writing
                self._wake.set()
            else:
                self._save(run_id, model.version, body)
        return entry

    def _save(self, run_id: str, version: int, body: bytes) -> None:
        try:
            self.store.save_view(run_id, FIRST_VIEW, version, body)
        except Exception as exc:  # the answer went out anyway; /healthz reports it
            self._error(f"saving the first answer of {run_id}: {write_error_text(exc, self.store.path)}")

    def first_bytes(self, run_id: str) -> bytes | None:
        """The page's first answer (JSON bytes): lanes, phases, findings, the spans of the first
        zoom level (`views.startup_json`)."""
        entry = self._first_entry(run_id)
        return None if entry is None else entry.body

    def head(self, run_id: str) -> dict[str, Any] | None:
        """The first answer without its span rows, as a dict (what the HTML page renders)."""
        entry = self._first_entry(run_id)
        if entry is None:
            return None
        if entry.head is None:
            doc = json.loads(entry.body)
            for lane in doc["lanes"]:
                lane.pop("spans", None)
            entry.head = doc
        return entry.head

    def lane(self, run_id: str, lane: int, **window: Any) -> dict[str, Any] | bool | None:
        """One lane's span detail (`views.startup_json.lane_detail`); None: no such run, False: no
        such lane."""
        model = self.model(run_id)
        if model is None:
            return None
        detail = lane_detail(model, lane, **window)
        return False if detail is None else detail

    def forget(self, run_ids: list[str]) -> None:
        with self._lock:
            for rid in run_ids:
                self._models.pop(rid, None)
                self._json.pop(rid, None)
                self._runs.pop(rid, None)
                self._first.pop(rid, None)
                self._dirty.pop(rid, None)

    # prebuilding -----------------------------------------------------------------------------
    def note_written(self, run_ids: list[str], build_now: bool = False) -> None:
        """The store wrote these runs (called on the writer thread: only notes them)."""
        if self.idle_s is None:
            return
        now = time.monotonic() - (3600.0 if build_now else 0.0)
        for rid in run_ids:
            self._dirty[rid] = now
        self._wake.set()

    def start(self) -> None:
        if self.idle_s is not None and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._prebuild_loop, name="starttrace-prebuild", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def _idle_needed(self, run_id: str) -> float:
        entry = self._models.get(run_id)
        return LIVE_IDLE_S if entry is not None and entry[2].live else float(self.idle_s or 0)

    def _prebuild_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=max(0.05, float(self.idle_s or 0)) if self._dirty else None)
            self._wake.clear()
            while self._saves:  # before stopping too: a restart then answers from the store
                if not self._stop.is_set():
                    self._yield_to_requests()
                run_id, (version, body) = self._saves.popitem()
                self._save(run_id, version, body)
            if self._stop.is_set():
                return
            if self.store.queued_spans:
                continue  # ingest is still going on
            now = time.monotonic()
            due = [rid for rid, t in list(self._dirty.items()) if now - t >= self._idle_needed(rid)]
            for rid in due:
                if self._stop.is_set() or self.store.queued_spans:
                    break
                if self._dirty.get(rid, now + 1) > now:
                    continue  # written again meanwhile
                self._building = rid
                self._dirty.pop(rid, None)
                try:
                    model = self.model(rid)
                    if model is not None:
                        self._render_first(rid, model)
                        self.prebuilt += 1
                except Exception as exc:  # keep prebuilding the others; /healthz reports it
                    self._error(f"prebuilding {rid}: {type(exc).__name__}: {exc}")
                finally:
                    self._building = None

    def _error(self, message: str) -> None:
        self.errors.append(message)
        del self.errors[:-20]
