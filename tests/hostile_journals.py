"""Hostile run folders made from one real traced run (issue 38 item 8): a segment that is a link to
/dev/zero, a 1 GiB sparse segment, 2M malformed lines, junk past the per-run cap, a folder no one
may list. Each is a copy of the real run under a run id of its own."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_DAC = "dac_override,dac_read_search"  # root without these is refused by file modes, as any user


def real_run(root: Path, env: dict[str, str]) -> Path:
    """One real traced run (`starttrace run -- python -c "import json"`) in `root`: its folder."""
    before = set(root.iterdir()) if root.exists() else set()
    proc = subprocess.run(
        [sys.executable, "-m", "starttrace", "run", "--dir", str(root), "--", sys.executable, "-c", "import json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = set(root.iterdir()) - before
    return run_dir


def clone(run_dir: Path, run_id: str) -> Path:
    """A copy of `run_dir` as run `run_id` (its own trace id)."""
    copy = run_dir.parent / run_id
    shutil.copytree(run_dir, copy, symlinks=True)
    meta = json.loads((copy / "run.json").read_text())
    meta.update(run_id=run_id, trace_id=secrets.token_hex(16))
    (copy / "run.json").write_text(json.dumps(meta))
    return copy


def process_record(run_dir: Path, pid: int, iid: str) -> bytes:
    """The first journal's process record, as process `pid` with instance `iid` (one line)."""
    first = sorted(run_dir.glob("*.0.journal"))[0]
    record = json.loads(first.read_bytes().split(b"\n", 1)[0])
    record.update(pid=pid, iid=iid, span="e" * 16, method="spawn")
    return json.dumps(record).encode() + b"\n"


def zero_link(run_dir: Path) -> str:
    """A segment that is a link to /dev/zero; its name."""
    name = "777-0000aaaa.0.journal"
    os.symlink("/dev/zero", run_dir / name)
    return name


def sparse_segment(run_dir: Path, size: int = 1 << 30) -> str:
    """A `size` sparse segment holding one process record (as a writer leaves a segment); its name."""
    name = "778-0000bbbb.0.journal"
    with open(run_dir / name, "wb") as fh:
        fh.write(process_record(run_dir, 778, "0000bbbb"))
        fh.truncate(size)
    return name


def malformed_lines(run_dir: Path, count: int = 2_000_000) -> str:
    """A journal of a process record and then `count` lines that are not records; its name."""
    name = "779-0000cccc.0.journal"
    with open(run_dir / name, "wb") as fh:
        fh.write(process_record(run_dir, 779, "0000cccc"))
        fh.write(b"{not json\n" * count)
    return name


def junk_segments(run_dir: Path, mib: int) -> str:
    """A journal of `mib` MiB of lines that are not records in 1 MiB segments; its name."""
    stem = "780-0000dddd"
    line = b"x" * 1023 + b"\n"
    for n in range(mib):
        with open(run_dir / f"{stem}.{n}.journal", "wb") as fh:
            if n == 0:
                fh.write(process_record(run_dir, 780, "0000dddd"))
            fh.write(line * (1024 if n else 1000))
    return f"{stem}.0.journal"


def without_dac(cmd: list[str]) -> list[str]:
    """`cmd` run without the capabilities that let root read any file (so a mode 000 folder is
    unreadable to it, as to any user); `cmd` itself when not root."""
    if os.geteuid() != 0:
        return cmd
    caps = ",".join(f"-{c}" for c in NO_DAC.split(","))
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *cmd]


def lock(run_dir: Path) -> None:
    run_dir.chmod(0)


def unlock(run_dir: Path) -> None:
    run_dir.chmod(0o755)
