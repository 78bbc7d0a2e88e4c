"""The demo's real vLLM runs kept as test data (tests/data/vllm_demo/README.md): a cold start and
the warm start after it, their journals unpacked on demand."""

from __future__ import annotations

import tarfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "vllm_demo"
RUN_IDS = {"cold": "20261205-040500-a3a4f1", "warm": "20261205-040703-467e89"}


def demo_run_dir(root: Path, which: str = "cold") -> Path:
    """The run folder of the `which` ("cold" or "warm") demo run, unpacked under `root`."""
    target = root / RUN_IDS[which]
    if not target.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(DATA / f"{which}.tar.xz") as archive:
            archive.extractall(root, filter="data")
    return target
