"""Parent arrays as trees, in time linear in the rows and logarithmic in the depth.

A parent array holds, per row, the row of its parent (-1: none). Bad input may make it deep (a
20k-deep import chain) or cyclic (a span whose ancestor names it as its parent). A walk per level
costs depth x rows; these functions jump pointers instead (each round doubles how far every row
has looked up), so a chain of any depth takes about log2(rows) vectorised rounds, and a cycle is
found when a row still has an ancestor after more steps than there are rows."""

from __future__ import annotations

import numpy as np


def _rounds(n: int) -> int:
    return max(1, int(n).bit_length()) + 1  # 2**rounds > n: more steps than any chain has


def cut_cycles(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`parent` with every cycle broken (a row of each cycle loses its parent), and the rows
    cut (sorted; empty: no cycle). The array passed in is not changed."""
    anc = parent.astype(np.int64, copy=True)
    for _ in range(_rounds(len(anc))):
        live = np.flatnonzero(anc >= 0)
        if not len(live):
            return parent, np.empty(0, dtype=np.int64)
        anc[live] = anc[anc[live]]
    # after 2**rounds > n steps a row with an ancestor is on a cycle or below one, and that
    # ancestor is on the cycle; each cycle is cut once, at its lowest row (found by jumping along
    # the cycle: each round doubles the stretch whose lowest row every member knows)
    on_cycle = np.unique(anc[anc >= 0])
    low = np.arange(len(anc), dtype=np.int64)
    step = parent.astype(np.int64, copy=True)
    for _ in range(_rounds(len(anc))):
        low[on_cycle] = np.minimum(low[on_cycle], low[step[on_cycle]])
        step[on_cycle] = step[step[on_cycle]]
    cut = np.unique(low[on_cycle])
    fixed = parent.astype(np.int64, copy=True)
    fixed[cut] = -1
    return fixed, cut


def depths(parent: np.ndarray) -> np.ndarray:
    """Per row, how many ancestors it has (0: a root). `parent` must have no cycle (`cut_cycles`)."""
    anc = parent.astype(np.int64, copy=True)
    depth = (anc >= 0).astype(np.int64)  # invariant: the distance from a row to `anc` (or to its root)
    for _ in range(_rounds(len(anc)) + 1):
        live = np.flatnonzero(anc >= 0)
        if not len(live):
            break
        up = anc[live]
        depth[live] += depth[up]
        anc[live] = anc[up]
    return depth


def nearest_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Per row, its nearest proper ancestor that is `marked` (-1: none; also for a row whose
    ancestors loop through unmarked rows only)."""
    n = len(parent)
    rows = np.arange(n, dtype=np.int64)
    # `to`: the row itself where marked, else its parent; jumped until each row reaches a marked one
    to = np.where(marked, rows, parent.astype(np.int64))
    for _ in range(_rounds(n)):
        live = np.flatnonzero((to >= 0) & ~marked[np.maximum(to, 0)])
        if not len(live):
            break
        to[live] = to[to[live]]
    got = np.where((to >= 0) & marked[np.maximum(to, 0)], to, -1)
    up = parent.astype(np.int64)
    return np.where(up >= 0, got[np.maximum(up, 0)], -1)
