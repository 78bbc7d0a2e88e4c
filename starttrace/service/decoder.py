"""OTLP bodies decoded in a worker process, so the service's own interpreter keeps its GIL for
HTTP, the store's writer and the models.

Decoding a span (`sources.otlp.decode`: parse, validate, one row tuple) and storing it (the
store's writer, SQLite) each run at 80k-240k spans/s alone, but in one interpreter they share one
GIL and ingest reached 36-46k spans/s (docs/benchmarks.md, "Ingest's two halves alone"). Here the
body goes to a worker process (a spawned interpreter that imports only `sources.otlp`) and the
decoded batch comes back pickled, which costs about a fifth of decoding it.

Small bodies are decoded inline (a round trip to the worker would cost more than they do). If the
worker dies, the body is decoded inline and a new worker started; the failure is reported once in
`errors` (`/healthz`).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from starttrace.sources.otlp import Decoded, parse_and_decode

INLINE_MAX_BYTES = 16 * 1024  # bodies up to this size are decoded in the service itself


def _warm() -> None:
    """Runs in the worker at its start: the decoder imported before the first body arrives."""
    import starttrace.sources.otlp  # noqa: F401


class Decoder:
    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.errors: list[str] = []
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        if self.workers > 0 and self._pool is None:
            # spawn: the service has threads (writer, prebuild), which a fork would copy mid-lock
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_warm
            )
            self._pool.submit(_warm)  # start the worker now, not on the first request

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    async def decode(self, body: bytes, content_type: str) -> Decoded:
        """`parse_and_decode(body, content_type)`, in the worker when the body is worth sending
        there. Raises what it raises (BadRequest, ...)."""
        pool = self._pool
        if pool is None or len(body) <= INLINE_MAX_BYTES:
            return parse_and_decode(body, content_type)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, parse_and_decode, body, content_type)
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
