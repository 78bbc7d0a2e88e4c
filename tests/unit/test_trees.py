"""analysis/trees.py against plain walks: random forests (some with cycles added), and a chain
deeper than any level-by-level pass would finish in a test's time."""

from __future__ import annotations

import random

import numpy as np

from starttrace.analysis.trees import cut_cycles, depths, nearest_marked


def _walk_depth(parent: np.ndarray) -> list[int]:
    out = []
    for i in range(len(parent)):
        d, j = 0, parent[i]
        while j >= 0:
            d, j = d + 1, parent[j]
        out.append(d)
    return out


def _walk_nearest(parent: np.ndarray, marked: np.ndarray) -> list[int]:
    out = []
    for i in range(len(parent)):
        j, steps = parent[i], 0
        while j >= 0 and not marked[j] and steps <= len(parent):
            j, steps = parent[j], steps + 1
        out.append(int(j) if j >= 0 and marked[j] else -1)
    return out


def _cycles(parent: np.ndarray) -> int:
    """How many distinct cycles the parent array has."""
    seen: set[frozenset[int]] = set()
    for i in range(len(parent)):
        path: list[int] = []
        j = i
        while j >= 0 and j not in path:
            path.append(j)
            j = parent[j]
        if j >= 0:
            seen.add(frozenset(path[path.index(j) :]))
    return len(seen)


def test_against_plain_walks() -> None:
    rng = random.Random(7)
    for t in range(400):
        n = rng.randint(1, 60)
        perm = list(range(n))
        rng.shuffle(perm)
        parent = np.full(n, -1, dtype=np.int64)
        for i in range(1, n):
            p = rng.randrange(-1, i)
            parent[perm[i]] = perm[p] if p >= 0 else -1
        for _ in range(t % 4):  # 0-3 extra edges: cycles, some rings through several rows
            parent[rng.randrange(n)] = rng.randrange(n)
        marked = np.array([rng.random() < 0.3 for _ in range(n)])
        fixed, cut = cut_cycles(parent)
        assert len(cut) == _cycles(parent)  # each cycle cut once
        assert set(np.flatnonzero(fixed != parent)) == set(cut)
        assert _cycles(fixed) == 0
        assert depths(fixed).tolist() == _walk_depth(fixed)
        assert nearest_marked(parent, marked).tolist() == _walk_nearest(parent, marked)


def test_a_200k_deep_chain_and_a_ring() -> None:
    n = 200_000
    chain = np.arange(-1, n - 1, dtype=np.int64)
    fixed, cut = cut_cycles(chain)
    assert len(cut) == 0 and depths(fixed)[-1] == n - 1
    marked = np.zeros(n, dtype=bool)
    marked[0] = True
    assert nearest_marked(chain, marked)[-1] == 0
    ring = chain.copy()
    ring[0] = n - 1  # the whole chain one cycle
    fixed, cut = cut_cycles(ring)
    assert cut.tolist() == [0] and depths(fixed)[-1] == n - 1
    assert nearest_marked(ring, np.zeros(n, dtype=bool)).max() == -1
