"""Models kept out of the cyclic garbage collector's way.

A 96k-span model is ~1M objects, none of them garbage. Built with the collector paused
(`run.gc_paused`), they would all sit in the youngest generation afterwards, and the next
allocations (the first answer, the page, the next request) would pay for walking them through every
generation: measured 0.7-1 s for 96k spans, landing on whichever request came next. So once a model
is built the whole heap is frozen (`gc.freeze`: moved to the permanent generation, never walked).

Frozen objects are still freed by reference counting, but not when they form cycles, and the only
cycles of a model are a span's `parent_node` and its parent's `children`. A model that is replaced or
evicted is retired; once nothing but the retired list refers to it (a request may still be rendering
from it), its parent links are cut and it is freed like any other object.

A freeze also keeps whatever cyclic garbage the process had at that moment (the collector was
paused during the build, for every thread): so once the service has built nothing for
`IDLE_COLLECT_S`, the heap is unfrozen, collected once and frozen again (`collect_if_idle`), and
that garbage is freed at a moment when nobody waits for an answer.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections import deque

from starttrace.analysis.model import RunModel

RETRY_S = 1.0  # how soon to look again at retired models that were still in use
IDLE_COLLECT_S = 60.0  # no build for this long after a freeze: one full collection (module text)
# references to a retired model nobody else holds, once `release` took it off the list: its own
# variable and the argument of sys.getrefcount
_UNREFERENCED = 2


class FrozenModels:
    def __init__(self) -> None:
        self._retired: deque[RunModel] = deque()
        self._lock = threading.Lock()
        self._frozen_at: float | None = None  # the last freeze not yet followed by a full collection
        self.idle_collections = 0

    def built(self) -> None:
        """A model was just built: freeze the heap (see the module text)."""
        gc.freeze()
        self._frozen_at = time.monotonic()

    def idle_collect_in(self, now: float | None = None) -> float | None:
        """Seconds until `collect_if_idle` is due (None: nothing frozen since the last one)."""
        if self._frozen_at is None:
            return None
        now = time.monotonic() if now is None else now
        return max(0.05, IDLE_COLLECT_S - (now - self._frozen_at))

    def collect_if_idle(self, now: float | None = None) -> bool:
        """Free the cyclic garbage the freezes kept, once no model was built for IDLE_COLLECT_S."""
        frozen_at = self._frozen_at
        now = time.monotonic() if now is None else now
        if frozen_at is None or now - frozen_at < IDLE_COLLECT_S:
            return False
        self._frozen_at = None
        gc.unfreeze()
        gc.collect()
        gc.freeze()  # the live models again out of the collector's way
        self.idle_collections += 1
        return True

    def retire(self, model: RunModel) -> None:
        with self._lock:
            self._retired.append(model)

    @property
    def pending(self) -> int:
        return len(self._retired)

    def release(self) -> int:
        """Cut the cycles of the retired models nobody uses any more; how many were released."""
        with self._lock:
            candidates = list(self._retired)
            self._retired.clear()
        done = 0
        keep: list[RunModel] = []
        while candidates:
            model = candidates.pop()
            if sys.getrefcount(model) > _UNREFERENCED:  # a request still renders from it
                keep.append(model)
                continue
            for node in model.spans:
                node.parent_node = None
            done += 1
        with self._lock:
            self._retired.extend(keep)
        return done
