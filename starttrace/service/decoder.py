"""OTLP bodies decoded in a worker process, so the service's own interpreter keeps its GIL for
HTTP, the store's writer and the models.

With the store writing packed batches (one row per process and trace), decoding is most of what
ingest costs the service: several µs of Python per span (`sources.otlp.decode`: fields read,
validated, the column attributes read, one tuple), against ~3 µs for the writer. Here the body goes
to a worker process (spawned once, at the service's start; like any spawned child it imports the
service's main module), which decodes it and packs each process's spans as columns
(`sources.batches.pack_by_trace`: an Arrow IPC stream per trace), so what comes back pickled is a
few blobs and id lists, and the writer stores a blob as it came: no Python loop per span is left
in the service (docs/benchmarks.md, "The service on the columnar run model").

Small bodies are decoded inline (a round trip to the worker would cost more than they do), and
large ones in a thread when there is no worker, so that the event loop stays free. If the worker
dies, the body is decoded inline and a new worker started; the failure is reported once in
`errors` (`/healthz`). The worker exits when the service does, even when it is killed: it
watches its parent (its own copy of the task queue's pipe would keep it waiting forever).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import anyio.to_thread

from starttrace.sources.batches import pack_by_trace
from starttrace.sources.otlp import Decoded, parse_and_decode

INLINE_MAX_BYTES = 16 * 1024  # bodies up to this size are decoded in the service itself
THREAD_MIN_BYTES = 1_000_000  # without a worker, bodies from this size are decoded in a thread
PARENT_POLL_S = 0.5


def _worker_start(parent: int) -> None:
    """The worker's initializer: exit as soon as the service is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="starttrace-decoder-parent", daemon=True).start()


def decode_packed(body: bytes, content_type: str) -> Decoded:
    """`parse_and_decode`, each process's spans packed for the store (what the worker runs)."""
    decoded = parse_and_decode(body, content_type)
    for proc in decoded.batch.processes:
        proc.packed, proc.spans = pack_by_trace(proc.spans), []
    return decoded


def _warm() -> None:
    """A task that does nothing: sent at start, it makes the worker start and import this module
    (and with it the decoder) before the first body arrives."""


class Decoder:
    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.errors: list[str] = []
        self._pool: ProcessPoolExecutor | None = None
        self._warmed: list[Future[None]] = []

    @property
    def state(self) -> str:
        """`off` (no worker), `starting` (spawned, still importing), `ready`."""
        if self._pool is None or not self._warmed:
            return "off"
        return "ready" if all(f.done() for f in self._warmed) else "starting"

    def start(self) -> None:
        if self.workers > 0 and self._pool is None:
            # spawn: the service has threads (writer, prebuild), which a fork would copy mid-lock
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_start,
                initargs=(os.getpid(),),
            )
            # every worker started now: not on the first request, nor the second one during a burst
            self._warmed = [self._pool.submit(_warm) for _ in range(self.workers)]

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    async def decode(self, body: bytes, content_type: str) -> Decoded:
        """`parse_and_decode(body, content_type)`, in the worker when the body is worth sending
        there. Raises what it raises (BadRequest, ...)."""
        pool = self._pool
        if pool is None and len(body) >= THREAD_MIN_BYTES:
            return await anyio.to_thread.run_sync(parse_and_decode, body, content_type)
        if pool is None or len(body) <= INLINE_MAX_BYTES:
            return parse_and_decode(body, content_type)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, decode_packed, body, content_type)
        except BrokenProcessPool as exc:
            self._restart(f"OTLP decoder process failed ({exc or 'it exited'}): decoded in the service, restarted")
            return parse_and_decode(body, content_type)

    def _restart(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)
            del self.errors[:-20]
        broken, self._pool = self._pool, None
        if broken is not None:
            broken.shutdown(wait=False, cancel_futures=True)
        self.start()
