"""The weights probe on real files: safetensors shards and a torch.save file, written and read back
by a traced program (safe_open iteration as vLLM's loader does it, load_file, torch.load).

Ground truths: os.stat for the size, `findmnt` (else /proc/self/mountinfo read here) for the
filesystem type, the tensors' own nbytes for the bytes read, and the page cache right after
writing (every page resident) and after posix_fadvise(POSIX_FADV_DONTNEED) (pages dropped).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from run_spans import named, spans_named

from starttrace.sources.journal_reader import read_run
from starttrace.tracer.probes.weights import fs_type

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("safetensors") is None,
    reason="torch and safetensors are needed",
)

PROGRAM = r"""
import json, os, sys
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

folder = sys.argv[1]
torch.manual_seed(0)
shards = []
for index in range(2):  # two shards of ~3 MiB each, as a sharded checkpoint
    tensors = {f"layer{index}.w{j}": torch.randn(256, 1024) for j in range(3)}
    path = os.path.join(folder, f"model-0000{index + 1}-of-00002.safetensors")
    save_file(tensors, path)
    shards.append(path)
pt_path = os.path.join(folder, "extra.pt")
torch.save({"head": torch.randn(128, 512), "bias": torch.randn(512)}, pt_path)

read = {}
with safe_open(shards[0], framework="pt") as f:  # vLLM's safetensors_weights_iterator
    total = 0
    for name in f.keys():
        total += f.get_tensor(name).nbytes
read["iter"] = total
read["load_file"] = sum(t.nbytes for t in load_file(shards[1]).values())
state = torch.load(pt_path)
read["torch_load"] = sum(t.nbytes for t in state.values())

# drop shard 0 from the page cache, then read it again
dropped = False
fd = os.open(shards[0], os.O_RDONLY)
try:
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    dropped = True
finally:
    os.close(fd)
with safe_open(shards[0], framework="pt") as f:
    read["again"] = sum(f.get_tensor(name).nbytes for name in f.keys())
print(json.dumps({"shards": shards, "pt": pt_path, "read": read, "dropped": dropped,
                  "safe_open_module": safe_open.__module__}))
"""


def _findmnt(path: Path) -> str:
    if shutil.which("findmnt"):
        done = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip().splitlines()[0]
    found = fs_type(str(path))
    assert found
    return found


def test_one_weights_load_span_per_file_read(tmp_path: Path, clean_env) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    journal_root = tmp_path / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root))
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(folder)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    (process,) = run.processes
    assert not [w for w in process.warnings if "weights" in w]
    spans = sorted(named(run, process, "weights.load"), key=lambda s: s.start_ns)
    shard0, shard1 = out["shards"]
    assert [s.attrs["starttrace.weights.file"] for s in spans] == [shard0, shard1, out["pt"], shard0]
    assert [s.attrs["starttrace.weights.format"] for s in spans] == [
        "safetensors",
        "safetensors",
        "torch",
        "safetensors",
    ]
    expected_fs = _findmnt(folder)
    for span in spans:
        path = span.attrs["starttrace.weights.file"]
        assert span.attrs["starttrace.phase"] == "model_load"
        assert span.attrs["starttrace.weights.file_bytes"] == os.stat(path).st_size
        assert span.attrs["starttrace.weights.fs_type"] == expected_fs
        assert span.end_ns is not None and span.end_ns > span.start_ns and span.error is None
        assert isinstance(span.attrs["starttrace.weights.io_read_bytes"], int)
    # the bytes of the tensors each read handed out
    assert [s.attrs["starttrace.weights.bytes_read"] for s in spans] == [
        out["read"]["iter"],
        out["read"]["load_file"],
        out["read"]["torch_load"],
        out["read"]["again"],
    ]
    assert out["read"]["iter"] == 3 * 256 * 1024 * 4
    assert [s.attrs["starttrace.weights.tensors"] for s in spans] == [3, 3, 2, 3]
    # just written: every page in the page cache
    assert [s.attrs["starttrace.weights.page_cache_fraction"] for s in spans[:3]] == [1.0, 1.0, 1.0]
    assert out["dropped"]
    if expected_fs not in ("tmpfs", "ramfs", "overlay"):  # fadvise cannot drop tmpfs pages
        assert spans[3].attrs["starttrace.weights.page_cache_fraction"] < 0.5
    probes = process.resource["starttrace.probes"]
    assert {"safetensors.safe_open", "torch.serialization.load"} <= set(probes)


def test_fs_type_matches_findmnt_for_the_root_and_proc() -> None:
    for path in (Path("/"), Path("/proc/self")):
        if shutil.which("findmnt") is None:
            pytest.skip("findmnt is not installed")
        assert fs_type(str(path)) == _findmnt(path)


HF_PROGRAM = r"""
import json
from huggingface_hub import hf_hub_download  # the name vLLM's weight_utils and transformers use

print(json.dumps({"path": hf_hub_download("org/tiny", "model.safetensors")}))
"""


@pytest.mark.skipif(importlib.util.find_spec("huggingface_hub") is None, reason="huggingface_hub is not installed")
def test_hf_hub_download_is_a_weights_download_span(tmp_path: Path, clean_env) -> None:
    """A real hf_hub_download answered from a local Hub cache (offline: nothing is fetched)."""
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123" / "model.safetensors").write_bytes(b"\0" * 12345)
    journal_root = tmp_path / "runs"
    env = clean_env(
        STARTTRACE="1", STARTTRACE_DIR=str(journal_root), HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1"
    )
    done = subprocess.run([sys.executable, "-c", HF_PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    path = json.loads(done.stdout.strip().splitlines()[-1])["path"]
    (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    (process,) = run.processes
    (span,) = named(run, process, "weights.download")
    assert span.attrs["starttrace.phase"] == "model_load"
    assert span.attrs["starttrace.weights.repo"] == "org/tiny"
    assert span.attrs["starttrace.weights.repo_file"] == "model.safetensors"
    assert span.attrs["starttrace.weights.file"] == path
    assert span.attrs["starttrace.weights.file_bytes"] == 12345
    assert "huggingface_hub.file_download.hf_hub_download" in process.resource["starttrace.probes"]


LAZY = r"""
import json, sys, tempfile, os
import torch
before = [m for m in ("starttrace.tracer.probes.torch", "starttrace.tracer.probes.weights") if m in sys.modules]
path = os.path.join(tempfile.mkdtemp(), "w.pt")
torch.save({"w": torch.zeros(4)}, path)
torch.load(path)
after = [m for m in ("starttrace.tracer.probes.torch", "starttrace.tracer.probes.weights") if m in sys.modules]
print(json.dumps({"before": before, "after": after}))
"""


def test_import_torch_loads_the_weights_probe_at_the_first_load_only(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    """`import torch` imports torch.serialization: the torch probe replaces torch.load then (every
    traced `import torch` loads it); the weights probe loads at the first torch.load of a path."""
    done = subprocess.run([venv_python, "-c", LAZY], env=traced_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "before": ["starttrace.tracer.probes.torch"],
        "after": ["starttrace.tracer.probes.torch", "starttrace.tracer.probes.weights"],
    }
    run = read_run(only_run_dir(journal_root))
    loads = spans_named(run, "weights.load")
    assert [s.attrs["starttrace.weights.format"] for s in loads] == ["torch"]
    assert not spans_named(run, "import starttrace.tracer.probes.weights")
