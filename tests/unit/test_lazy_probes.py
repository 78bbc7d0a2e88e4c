"""Probes for torch, vLLM and uvicorn load when the traced program first imports what they patch.

Activation loads only the import and multiprocessing probes (docs/benchmarks.md: activation
cost); these tests show the others still attach, at the same moment as before (right after the
first module they patch is imported), without a span of starttrace's own in the program's imports.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_reader import Process, Run, read_run
from starttrace.tracer import recorder
from starttrace.tracer.probes import LAZY_PROBES, helpers_of

PROBES_DIR = Path(__file__).resolve().parents[2] / "starttrace" / "tracer" / "probes"


@pytest.mark.parametrize("probe", sorted(LAZY_PROBES))
def test_lazy_triggers_are_the_modules_the_probe_hooks(probe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger list is exactly what the probe's install() registers: a module it patches that
    is missing from the list would be patched only if another trigger came first."""
    hooked: list[str] = []
    monkeypatch.setattr(recorder, "when_imported", lambda module, hook: hooked.append(module))
    monkeypatch.setattr(os, "register_at_fork", lambda **kwargs: None)
    importlib.import_module(probe).install()
    assert sorted(set(hooked)) == sorted(LAZY_PROBES[probe])


@pytest.mark.parametrize("probe", sorted(LAZY_PROBES))
def test_a_lazy_probe_loads_its_helpers_first(probe: str) -> None:
    """Every probe module a lazy probe imports loads before it, past the import probe
    (PROBE_HELPERS): else its import would be recorded as the program's. No more: a probe's
    helper it does not use would load in every process that imports its library."""
    import ast

    tree = ast.parse((PROBES_DIR / (probe.rsplit(".", 1)[-1] + ".py")).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("starttrace.tracer.probes"):
            if node.module == "starttrace.tracer.probes":  # modules of the package, not its functions
                names = [a.name for a in node.names if (PROBES_DIR / f"{a.name}.py").exists()]
                imported.update(f"{node.module}.{name}" for name in names)
            else:
                imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("starttrace.tracer.probes."))
    imported.discard("starttrace.tracer.probes.imports")  # loaded with the recorder, before any probe
    assert imported == set(helpers_of(probe)), imported


def _traced(
    tmp_path: Path, program: str, *argv: str, processes: int = 1, **extra_env: str
) -> tuple[dict[str, Any], Run, Process]:
    """Run `program` traced; its output's last line (JSON), its run, and its root's process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE") and k.lower() != "traceparent"}
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(tmp_path / "runs"), **extra_env)
    proc = subprocess.run([sys.executable, "-c", program, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = read_run(run_dir)
    assert len(run.processes) == processes
    (process,) = [p for p in run.processes if p.record["method"] == "root"]
    return json.loads(proc.stdout.strip().splitlines()[-1]), run, process


PROBED = """
import json, sys
{imports}
print(json.dumps({{"loaded": sorted(m for m in sys.modules if m.startswith("starttrace.tracer.probes.")),
                   "patched": {check}}}))
"""


def test_a_plain_program_loads_no_library_probe(tmp_path: Path) -> None:
    out, _run, process = _traced(tmp_path, PROBED.format(imports="import json", check="None"))
    # with the C core, activation's light case: the C import hook records without the probe's module
    light = process.record["hotpath"] == "c"
    assert out["loaded"] == ([] if light else ["starttrace.tracer.probes.imports"])
    # the multiprocessing probe's hooks wait for its modules as before: named installed all the same
    assert process.resource["starttrace.probes.installed"] == ["imports", "multiprocessing"]


def test_multiprocessing_probe_loads_with_subprocess_and_records_the_launch(tmp_path: Path) -> None:
    program = PROBED.format(
        imports='import subprocess; subprocess.run([sys.executable, "-c", "pass"], check=True)',
        check='getattr(sys.modules["subprocess"].Popen.__init__, "__starttrace__", False)',
    )
    out, run, process = _traced(tmp_path, program, processes=2)
    assert "starttrace.tracer.probes.multiprocessing" in out["loaded"] and out["patched"] is True
    assert process.resource["starttrace.probes.installed"] == ["imports", "multiprocessing"]
    spans = spans_of(run, process)
    assert not any(s.name.startswith("import starttrace") for s in spans)
    (launch,) = [s for s in spans if s.name == "process.launch"]
    (child,) = [p for p in run.processes if p is not process]
    assert child.record["launch_pid"] == process.record["pid"] and child.record["parent"] == launch.span_id
    assert launch.attrs["starttrace.child_pid"] == child.record["pid"]


def test_the_forkserver_part_loads_only_with_the_forkserver_module(tmp_path: Path) -> None:
    """`import multiprocessing` with its resource tracker (torch's) loads the multiprocessing probe,
    which patches the tracker, without its forkserver part; `multiprocessing.forkserver` loads that
    part, which patches it inside the import, and no span is of starttrace's own modules."""
    check = 'getattr(sys.modules["multiprocessing.resource_tracker"].main, "__starttrace__", False)'
    program = PROBED.format(imports="import multiprocessing.resource_tracker", check=check)
    out, _run, _process = _traced(tmp_path / "a", program)
    assert "starttrace.tracer.probes.multiprocessing" in out["loaded"] and out["patched"] is True
    assert "starttrace.tracer.probes.forkserver" not in out["loaded"]
    check = 'getattr(sys.modules["multiprocessing.forkserver"].ForkServer.ensure_running, "__starttrace__", False)'
    out, run, process = _traced(tmp_path / "b", PROBED.format(imports="import multiprocessing.forkserver", check=check))
    assert "starttrace.tracer.probes.forkserver" in out["loaded"] and out["patched"] is True
    names = {s.name for s in spans_of(run, process)}
    assert "import multiprocessing.forkserver" in names
    assert not any(name.startswith("import starttrace") for name in names)


def test_forkserver_preload_setting_loads_the_multiprocessing_probe_at_activation(tmp_path: Path) -> None:
    """It says at activation what every forkserver will preload (docs/probes.md): the probe's
    forkserver part, which reads the setting, loads with it."""
    program = PROBED.format(imports="", check="None")
    out, _run, process = _traced(tmp_path, program, STARTTRACE_FORKSERVER_PRELOAD="json")
    assert out["loaded"] == [  # sorted
        "starttrace.tracer.probes.forkserver",
        "starttrace.tracer.probes.imports",
        "starttrace.tracer.probes.multiprocessing",
    ]
    assert process.resource["starttrace.probes.installed"] == ["imports", "multiprocessing"]
    assert process.resource["starttrace.forkserver_preload_extra"] == ["json"]


def test_uvicorn_probe_loads_on_first_import_and_patches(tmp_path: Path) -> None:
    check = 'getattr(sys.modules["uvicorn.server"].Server.main_loop, "__starttrace__", False)'
    out, run, process = _traced(tmp_path, PROBED.format(imports="import uvicorn.server", check=check))
    assert "starttrace.tracer.probes.servers" in out["loaded"] and out["patched"] is True
    assert process.resource["starttrace.probes.installed"] == ["imports", "multiprocessing", "servers"]
    spans = spans_of(run, process)
    names = {s.name for s in spans}
    assert "import uvicorn.server" in names
    assert not any(name.startswith("import starttrace") for name in names)  # starttrace's own load: not a span
    # the probe loaded and patched inside the span (as the import statement waited for it), and
    # that time is not the module's own: self time leaves it out
    # (`import uvicorn.server` makes two spans: the statement's, and inside its parent `uvicorn`, whose
    # __init__ imports uvicorn.server, the one that loads it: the probe runs at the end of that one)
    loads = named(run, process, "import uvicorn.server")
    (span,) = [s for s in loads if "starttrace.import.probe_ns" in s.attrs]
    probe_ns = span.attrs["starttrace.import.probe_ns"]
    assert isinstance(probe_ns, int) and 0 < probe_ns < span.end_ns - span.start_ns
    children = sum(c.end_ns - c.start_ns for c in spans if c.parent_id == span.span_id and c.end_ns)
    assert span.attrs["starttrace.import.self_us"] == max(0, span.end_ns - span.start_ns - children - probe_ns) // 1000


def test_torch_probe_loads_with_torch_and_patches_distributed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # `init_process_group` and `_lazy_init` wrapped, also where torch's own modules hold a copy
    # (`from . import _lazy_init` in torch.cuda.random)
    check = (
        '[getattr(sys.modules[m].__dict__.get(a), "__starttrace__", False) for m, a in ('
        '("torch.distributed", "init_process_group"), ("torch.cuda", "_lazy_init"),'
        ' ("torch.cuda.random", "_lazy_init"))]'
    )
    imports = "import torch, torch.distributed, torch.cuda.random"
    out, run, process = _traced(tmp_path, PROBED.format(imports=imports, check=check))
    assert "starttrace.tracer.probes.torch" in out["loaded"] and "starttrace.tracer.probes.vllm" not in out["loaded"]
    assert out["patched"] == [True, True, True]
    assert "torch" in process.resource["starttrace.probes.installed"]
    assert not any(s.name.startswith("import starttrace") for s in spans_of(run, process))


def test_vllm_probe_loads_at_activation_when_argv_names_vllm(tmp_path: Path) -> None:
    """The vLLM probe reads the role from the command line, so it cannot wait for an import."""
    out, _run, process = _traced(tmp_path, PROBED.format(imports="", check="None"), "serve", "--model", "x", "vllm")
    assert "starttrace.tracer.probes.vllm" in out["loaded"]
    assert "vllm" in process.resource["starttrace.probes.installed"]
