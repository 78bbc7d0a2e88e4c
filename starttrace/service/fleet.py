"""Deriving the fleet facts of runs, once each (`analysis.fleet.run_facts`), into a facts store
(`sources.facts_store.FactsStore` or `sources.clickhouse.facts.ClickHouseFacts`): in the service's
background thread, and for `starttrace fleet`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from starttrace.analysis.fleet import FACTS_VERSION, SLOWEST, fleet_answer, run_facts
from starttrace.analysis.model import RunModel
from starttrace.run import Run

# the run and its model, or None (no such run)
ModelLoader = Callable[[str], "tuple[Run, RunModel] | None"]
PREFETCH = 100  # runs loaded at once by a prefetching loader


class FactsSink(Protocol):
    def missing(self, limit: int = ..., idle_s: float = ..., facts_version: int = ...) -> list[str]: ...

    def write(self, facts: list[dict[str, Any]]) -> None: ...


def derive(
    run_ids: list[str], load: ModelLoader, sink: FactsSink, on_facts: Callable[[dict[str, Any]], None] | None = None
) -> list[str]:
    """Derive and write the facts of these runs; the ids of those that failed come back. A loader
    with a `prefetch(ids)` (`Prefetching`) is handed each chunk of ids first."""
    failed = []
    batch: list[dict[str, Any]] = []
    prefetch = getattr(load, "prefetch", None)
    for i, rid in enumerate(run_ids):
        if prefetch is not None and i % PREFETCH == 0:
            prefetch(run_ids[i : i + PREFETCH])
        try:
            got = load(rid)
            if got is None:
                continue
            facts = run_facts(*got)
        except Exception:
            failed.append(rid)
            continue
        if facts["status"] == "running":
            continue  # a live run: its facts once it has ended
        batch.append(facts)
        if on_facts is not None:
            on_facts(facts)
        if len(batch) >= 200:
            sink.write(batch)
            batch = []
    sink.write(batch)
    return failed


def fleet_of(
    facts: Any,
    by: str,
    since_ns: int | None = None,
    until_ns: int | None = None,
    service: str | None = None,
    slowest: int = SLOWEST,
) -> dict[str, Any]:
    """The fleet answer from a facts store (`FactsStore`, or `ClickHouseFacts`: facts from the runs'
    `starttrace.run` spans, else derived): its facts rows through `analysis.fleet.fleet_answer`, and
    `pending`, the runs in range whose facts are not derived yet (runs + pending = all runs in range)."""
    rows = facts.rows(since_ns, until_ns, service, facts_version=FACTS_VERSION)
    answer = fleet_answer(rows, by, slowest)
    answer["pending"] = facts.pending(since_ns, until_ns, service, facts_version=FACTS_VERSION)
    return answer


class FactsDeriver:
    """A background thread deriving missing facts every `interval_s` (the service)."""

    def __init__(
        self,
        sink: FactsSink,
        load: ModelLoader,
        interval_s: float = 10.0,
        idle_s: float = 5.0,
        on_facts: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.sink, self.load = sink, load
        self.interval_s, self.idle_s = interval_s, idle_s
        self.on_facts = on_facts
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one derivation at a time (the thread, or a request)
        self._thread: threading.Thread | None = None

    def run_once(self, limit: int = 1000) -> int:
        """Derive the facts of up to `limit` runs that lack them; how many were looked at."""
        with self._lock:
            try:
                ids = self.sink.missing(limit=limit, idle_s=self.idle_s, facts_version=FACTS_VERSION)
                failed = derive(ids, self.load, self.sink, self.on_facts)
                error = f"{len(failed)} run(s) failed, e.g. {failed[0]}" if failed else None
            except Exception as exc:  # /healthz reports it; the next turn tries again
                ids, error = [], f"{type(exc).__name__}: {exc}"
            if error is not None:
                self.errors.append(f"deriving fleet facts: {error}")
                del self.errors[:-20]
            return len(ids)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="starttrace-fleet-facts", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval_s)


def model_loader(cache: Any) -> ModelLoader:
    """Runs and models through the service's model cache (`service.model_cache.ModelCache`): a run
    the cache has prebuilt is not built again."""

    def load(run_id: str) -> tuple[Run, RunModel] | None:
        model = cache.model(run_id)
        run = cache.run(run_id) if model is not None else None
        return None if model is None or run is None else (run, model)

    return load


class Prefetching:
    """Runs loaded a chunk at a time (`ClickHouseRuns.load_runs`), handed out one by one."""

    def __init__(self, load_runs: Callable[[list[str]], dict[str, Run]]) -> None:
        self.load_runs = load_runs
        self._runs: dict[str, Run] = {}

    def prefetch(self, run_ids: list[str]) -> None:
        self._runs = self.load_runs(run_ids)

    def load_run(self, run_id: str) -> Run | None:
        return self._runs.pop(run_id, None)


def direct_loader(load_run: Callable[[str], Run | None], prefetching: Prefetching | None = None) -> ModelLoader:
    """Runs loaded by `load_run`, their hosts on one clock, and analysed (no cache: the CLI)."""
    from starttrace.analysis.clocks import correct_clocks
    from starttrace.analysis.lanes import build_model

    def load(run_id: str) -> tuple[Run, RunModel] | None:
        run = load_run(run_id)
        if run is None:
            return None
        run = correct_clocks(run, owned=True)
        return run, build_model(run)

    if prefetching is not None:
        load.prefetch = prefetching.prefetch  # type: ignore[attr-defined]
    return load


def cli_answer(
    by: str,
    since_ns: int | None,
    until_ns: int | None,
    service: str | None,
    clickhouse: str | None,
    db: Path | None,
    derive_first: bool = True,
) -> dict[str, Any]:
    """`starttrace fleet`: the answer from ClickHouse (`clickhouse`) or the embedded store (`db`),
    the facts of runs that lack them derived first (`derive_first`)."""
    if clickhouse:
        from starttrace.sources.clickhouse.client import check_traces_table, connect
        from starttrace.sources.clickhouse.facts import ClickHouseFacts
        from starttrace.sources.clickhouse.runs import ClickHouseRuns

        client = connect(clickhouse)
        check_traces_table(client)
        facts: Any = ClickHouseFacts(client)
        if derive_first:
            pre = Prefetching(ClickHouseRuns(client).load_runs)
            derive_all(facts, direct_loader(pre.load_run, pre))
        return dict(fleet_of(facts, by, since_ns, until_ns, service), source=client.url.redacted())
    from starttrace.sources.facts_store import FactsStore
    from starttrace.sources.store import Store

    if db is None or not Path(db).exists():
        raise ValueError(f"no store at {db}: pass --db or --clickhouse")
    store = Store(db)
    try:
        facts = FactsStore(db)
        if derive_first:
            derive_all(facts, direct_loader(store.load_run))
        return dict(fleet_of(facts, by, since_ns, until_ns, service), source=str(db))
    finally:
        store.close()


def derive_all(sink: FactsSink, load: ModelLoader, idle_s: float = 0.0, batch: int = 1000) -> int:
    """Derive every missing run's facts (batches of `batch`), until none is left that can be."""
    done = 0
    seen: set[str] = set()
    while True:
        ids = [r for r in sink.missing(limit=batch, idle_s=idle_s, facts_version=FACTS_VERSION) if r not in seen]
        if not ids:
            return done
        seen.update(ids)
        derive(ids, load, sink)
        done += len(ids)
