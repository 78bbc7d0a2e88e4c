"""Probes: one per library, each patching its library right after the traced program imported it
(post-import hooks: recorder.when_imported); standard library only.

Only the import probe loads at activation; the others when the program first imports a module
they patch (`LAZY_PROBES`), and the vLLM probe also at activation when the command line names vLLM
(it reads the process role from argv). The multiprocessing probe patches nothing at activation
either (its install() only hooks multiprocessing's and subprocess's modules), so it loads with the
first of them too, unless STARTTRACE_FORKSERVER_PRELOAD asks it to speak at activation; it counts
as installed from activation all the same (`HOOKED_AT_ACTIVATION`): its hooks are in place.
"""

import os
import sys

from starttrace.tracer import journal, lifecycle, recorder
from starttrace.tracer.activation import (
    EAGER_WHEN_ARGV,
    EAGER_WHEN_ENV,
    INSTALLED_AT_ACTIVATION,
    LAZY_PROBES,
    load_own,
)

__all__ = ["EAGER_WHEN_ARGV", "EAGER_WHEN_ENV", "LAZY_PROBES"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROBES = ("starttrace.tracer.probes.imports",)
# lazy probes named installed from activation on (`starttrace.probes.installed`), as when they
# loaded at activation: their install() only hooks modules, which their lazy loader hooks alike
HOOKED_AT_ACTIVATION = ("starttrace.tracer.probes.multiprocessing",)
_installed: "list[str]" = []
_lazy_done: "set[str]" = set()


# Loaded only in a torchrun agent whose run its command line named (`lifecycle.state.job`, set in
# roots only): every other process pays nothing for it.
TORCHRUN_AGENT_PROBE = "starttrace.tracer.probes.torchelastic"


def load_all() -> "list[Any]":
    """Import the probe modules loaded at activation (before the import hook exists, so they are
    not recorded)."""
    job = lifecycle.state.job
    agent = job is not None and job.kind == "torchrun" and job.from_argv
    names = list(PROBES)
    environ = os.environ
    for name, variables in EAGER_WHEN_ENV.items():
        if any((environ.get(variable) or "").strip() for variable in variables):
            names.append(name)
    if agent:
        names.append(TORCHRUN_AGENT_PROBE)
    joined = " ".join(getattr(sys, "orig_argv", None) or sys.argv)
    for name, words in EAGER_WHEN_ARGV.items():
        if any(word in joined for word in words):
            names.append(name)
    modules = []
    for name in names:
        try:
            module = load_own(name) if name in PROBES else _import_unrecorded(name)
        except ImportError:
            continue  # a probe that is not part of this build
        except Exception as exc:
            recorder.report(f"probe {name} failed to load: {type(exc).__name__}: {exc}", key=name)
        else:
            modules.append(module)
            lifecycle.loaded_probes[_short_name(name)] = module
    return modules


def take_over(
    light: "dict[str, Any]",
    segment: "Any",
    process_span: str,
    main_ident: int,
    stacks: "dict[int, list[str]]",
    held: "dict[str, tuple[str, int]]",
    post_import_hooks: "dict[str, list[Any]]",
    attrs: "dict[str, Any]",
) -> "tuple[Any, Any]":
    """(recorder, import probe): they take this process over from activation.py's light case,
    with its journal segment, the stacks and hooks its C import hook holds, and the process
    attributes written so far (activation._adopt; the probes it hooked load as ever)."""
    from starttrace.tracer.probes import imports

    journal.hotpath = light["hotpath"]
    writer = journal.JournalWriter.adopt(light["base"], light["number"], light["size"], segment.write)
    recorder.adopt(writer, process_span, main_ident, stacks, held, post_import_hooks, attrs)
    _installed[:] = INSTALLED_AT_ACTIVATION
    lifecycle.loaded_probes[_short_name(imports.__name__)] = imports
    imports.adopt(light["original"], light["hook"])
    return recorder, imports


def install_all(modules: "list[Any]") -> None:
    """Install the probes loaded at activation; hook the others onto the modules they patch."""
    loaded = {module.__name__ for module in modules}
    for module in modules:
        _install(module)
        if module.__name__ == PROBES[-1]:  # listed where they stood when they loaded at activation
            _installed.extend(_short_name(name) for name in HOOKED_AT_ACTIVATION if name not in loaded)
    for name, targets in LAZY_PROBES.items():
        if name not in loaded:
            load = _lazy_loader(name)
            for target in targets:
                recorder.when_imported(target, load)
    recorder.set_process_attrs({"starttrace.probes.installed": list(_installed)})


def _install(module: "Any") -> bool:
    try:
        module.install()
    except Exception as exc:
        recorder.report(f"probe {module.__name__} failed to install: {type(exc).__name__}: {exc}", key=module.__name__)
        return False
    short = _short_name(module.__name__)
    if short not in _installed:
        _installed.append(short)
    return True


def _short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _lazy_loader(name: str) -> "Any":
    def load(_target: "Any") -> None:
        if name in _lazy_done:
            return
        _lazy_done.add(name)
        try:
            module = _import_unrecorded(name)
        except Exception as exc:
            recorder.report(f"probe {name} failed to load: {type(exc).__name__}: {exc}", key=name)
            return
        lifecycle.loaded_probes[_short_name(name)] = module
        if _install(module):  # its hooks on modules already imported (the target) run at once
            recorder.set_process_attrs({"starttrace.probes.installed": list(_installed)})

    return load


# The probe modules a probe imports, loaded before it in this order (tests/unit/test_lazy_probes.py
# keeps this equal to the probes' imports): _wrap for every probe not named here.
WRAP = "starttrace.tracer.probes._wrap"
PROBE_HELPERS: "dict[str, tuple[str, ...]]" = {
    "starttrace.tracer.probes.multiprocessing": (),
    "starttrace.tracer.probes.vllm": (WRAP, "starttrace.tracer.probes.first_request"),
    "starttrace.tracer.probes.servers": (WRAP, "starttrace.tracer.probes.first_request"),
}


def helpers_of(probe: str) -> "tuple[str, ...]":
    return PROBE_HELPERS.get(probe, (WRAP,))


def _import_unrecorded(name: str) -> "Any":
    """Import probe `name` (and the helpers it imports) past the import probe: starttrace's own
    modules are not the program's imports, whose spans this runs inside."""
    for module in (*helpers_of(name), name):
        import_unrecorded(module)
    return sys.modules[name]


def import_unrecorded(name: str) -> "Any":
    """Import module `name` past the import probe (no span): for what starttrace itself needs
    (a probe, or a library a probe uses, such as ctypes for the weights probe's mincore)."""
    if name not in sys.modules:
        load_own(name, _import_past_probe)
    return sys.modules[name]


def _import_past_probe(name: str) -> None:
    from starttrace.tracer.probes import imports

    find_and_load = imports._original or (lambda module, _import: __import__(module, fromlist=["install"]))
    find_and_load(name, __import__)
