"""Probes: one per library, each patching its library right after the traced program imported it
(post-import hooks: recorder.when_imported); standard library only.

Only the import probe loads at activation; the others when the program first imports a module
they patch (`LAZY_PROBES`), and the vLLM probe also at activation when the command line names vLLM
(it reads the process role from argv). The multiprocessing probe patches nothing at activation
either (its install() only hooks multiprocessing's and subprocess's modules), so it loads with the
first of them too, unless STARTTRACE_FORKSERVER_PRELOAD asks it to speak at activation; it counts
as installed from activation all the same: its hooks are in place.

This module is what every traced process loads once a probe is needed (the light activation's
hand-over); what only the Python activation uses (the probes it loads at activation) is boot.py's.
"""

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

_installed: "list[str]" = []  # the probes installed, short names (`starttrace.probes.installed`)
_lazy_done: "set[str]" = set()


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
    lifecycle.loaded_probes[short_name(imports.__name__)] = imports
    imports.adopt(light["original"], light["hook"])
    return recorder, imports


def installed(name: str) -> None:
    """Name a probe installed (once), in `starttrace.probes.installed`'s order."""
    if name not in _installed:
        _installed.append(name)


def installed_names() -> "list[str]":
    """The probes installed so far, short names (`starttrace.probes.installed`)."""
    return list(_installed)


def install_probe(module: "Any") -> bool:
    try:
        module.install()
    except Exception as exc:
        recorder.report(f"probe {module.__name__} failed to install: {type(exc).__name__}: {exc}", key=module.__name__)
        return False
    installed(short_name(module.__name__))
    return True


def short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def lazy_loader(name: str) -> "Any":
    def load(_target: "Any") -> None:
        if name in _lazy_done:
            return
        _lazy_done.add(name)
        try:
            module = import_probe(name)
        except Exception as exc:
            recorder.report(f"probe {name} failed to load: {type(exc).__name__}: {exc}", key=name)
            return
        lifecycle.loaded_probes[short_name(name)] = module
        if install_probe(module):  # its hooks on modules already imported (the target) run at once
            recorder.set_process_attrs({"starttrace.probes.installed": installed_names()})

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


def import_probe(name: str) -> "Any":
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
