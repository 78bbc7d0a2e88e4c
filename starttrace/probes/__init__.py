"""Probes: one per library, each enabled by post-import hooks (see recorder.when_imported).

A probe module imports only the standard library; it patches its library right after the
traced program imported it, and records which probes attached in `starttrace.probes`.
"""

from __future__ import annotations

from starttrace import recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROBES = (
    "starttrace.probes.imports",
    "starttrace.probes.multiprocessing",
    "starttrace.probes.torch",
    "starttrace.probes.vllm",
    "starttrace.probes.servers",
)


def load_all() -> list[Any]:
    """Import the probe modules (before the import hook exists, so they are not recorded)."""
    modules = []
    for name in PROBES:
        try:
            modules.append(__import__(name, fromlist=["install"]))
        except ImportError:
            continue  # a probe that is not part of this build
        except Exception as exc:
            recorder.report(f"probe {name} failed to load: {type(exc).__name__}: {exc}", key=name)
    return modules


def install_all(modules: list[Any]) -> None:
    attached = []
    for module in modules:
        try:
            module.install()
            attached.append(module.__name__.rsplit(".", 1)[-1])
        except Exception as exc:
            recorder.report(
                f"probe {module.__name__} failed to install: {type(exc).__name__}: {exc}", key=module.__name__
            )
    recorder.set_process_attrs({"starttrace.probes.installed": attached})
