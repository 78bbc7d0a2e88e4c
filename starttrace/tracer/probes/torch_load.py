"""torch.load's hook, apart from the weights probe.

`import torch` imports `torch.serialization`, so whatever hooks that module is loaded by every
traced `import torch`. This small module is that hook: it replaces `torch.serialization.load` (and
`torch.load`, which torch binds from it) with a wrapper that hands a load of a path to the weights
probe (`starttrace.tracer.probes.weights`: the `weights.load` span and the file's facts), loaded at the
first such call. A program that imports torch and never loads a file pays for this module only.
Imports the standard library only.
"""

import sys

from starttrace.tracer import recorder
from starttrace.tracer.probes._wrap import _mark, note_attached, note_missing, publish_probe_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def install() -> None:
    """Register the post-import hook (probes/__init__.py LAZY_PROBES)."""
    recorder.when_imported("torch.serialization", _patch_torch_serialization)


def _patch_torch_serialization(serialization: "Any") -> None:
    original = getattr(serialization, "load", None)
    if original is None or not callable(original):
        note_missing("torch.serialization.load")
        publish_probe_list()
        return
    if getattr(original, "__starttrace__", False):
        return
    traced: list[Callable[..., Any]] = []  # the weights probe's wrapper, made at the first load of a path

    def load(f: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        if recorder._writer is None or (not isinstance(f, str) and getattr(type(f), "__fspath__", None) is None):
            return original(f, *args, **kwargs)
        if not traced:
            try:
                from starttrace.tracer.probes import import_unrecorded

                traced.append(import_unrecorded("starttrace.tracer.probes.weights")._torch_load_wrapper(original))
            except Exception as exc:
                recorder.report(f"weights probe failed to load: {type(exc).__name__}: {exc}", key="torch_load")
                traced.append(original)
        return traced[0](f, *args, **kwargs)

    wrapper = _mark(load, original)
    serialization.load = wrapper
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "load", None) is original:
        torch.load = wrapper  # the probe came late: torch had bound it already
    note_attached("torch.serialization.load")
    publish_probe_list()
