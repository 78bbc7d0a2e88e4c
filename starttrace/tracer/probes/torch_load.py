"""torch.load's hook, apart from the weights probe: every `import torch` imports
`torch.serialization`, so this small module replaces its `load` (and `torch.load`) with a wrapper
that loads the weights probe only at the first load of a path and hands such loads to it.
Standard library only.
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
