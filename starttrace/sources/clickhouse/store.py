"""The service's store when it reads runs from ClickHouse (`starttrace serve --clickhouse URL`):
what the app and the model cache ask of `sources.store.Store`, from `otel_traces`. Nothing is
ingested (the Collector writes ClickHouse), first answers are kept in memory only, and each run
stands alone (no per-node join).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from starttrace.run import Run
from starttrace.sources.clickhouse.client import Client, check_traces_table, connect
from starttrace.sources.clickhouse.runs import ClickHouseRuns


class SingleRuns:
    """What the model cache asks of `sources.run_groups.RunGroups`, for runs that stand alone."""

    def __init__(self, runs: ClickHouseRuns) -> None:
        self.version: Callable[[str], int | None] = runs.run_version
        self.load: Callable[[str], Run | None] = runs.load_run


class ClickHouseStore:
    queued_spans = 0
    peak_queued_spans = 0

    def __init__(self, url: str) -> None:
        self.client: Client = connect(url)
        check_traces_table(self.client)  # a missing or foreign table is refused at start, not per request
        self.runs = ClickHouseRuns(self.client)
        self.groups = SingleRuns(self.runs)
        self.errors: list[str] = []
        self.on_runs_written: Callable[[list[str]], None] | None = None
        self._views: dict[tuple[str, str], tuple[int, bytes]] = {}
        # what the app and the model cache call, answered from otel_traces
        self.latest_run_id = self.runs.latest_run_id
        self.newest_run_ids = self.runs.newest_run_ids
        self.list_runs = self.runs.list_runs
        self.run_version = self.runs.run_version
        self.load_run = self.runs.load_run

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 30.0) -> None:
        pass

    @contextlib.contextmanager
    def deferring_checkpoints(self) -> Iterator[None]:
        yield

    def load_view(self, run_id: str, kind: str) -> tuple[int, bytes] | None:
        return self._views.get((run_id, kind))

    def save_view(self, run_id: str, kind: str, version: int, body: bytes) -> bool:
        if len(self._views) > 256:
            self._views.clear()
        self._views[(run_id, kind)] = (version, body)
        return True

    def expire(self, max_age_s: float, now: float | None = None) -> list[str]:
        return []  # ClickHouse's TTL (the exporter's `ttl`) expires runs there
