"""Python 3.14's forkserver default on Linux, on Python 3.11-3.13: put this folder on PYTHONPATH.

Two changes of 3.14 decide what a program that never names a start method gets:

1. Lib/multiprocessing/context.py ends its POSIX branch with (gh-84559, python/cpython#101556)

       if reduction.HAVE_SEND_HANDLE and sys.platform != 'darwin':
           _default_context = DefaultContext(_concrete_contexts['forkserver'])

   where 3.11-3.13 have `DefaultContext(_concrete_contexts['fork'])`. This file runs that statement
   right after multiprocessing.context's own code, when the program first imports multiprocessing
   (before multiprocessing/__init__.py copies the default context's methods into the package).
   `multiprocessing.get_start_method(allow_none=True)` stays None until something asks for the
   default, then answers "forkserver", as on 3.14.

2. The forkserver's default preload, ['__main__'], really preloads the program's main script:
   `ForkServer.ensure_running` passes `main_path` (from the preparation data's
   `init_main_from_path`) to `forkserver.main` since gh-126631 (python/cpython#135295, in 3.14.0;
   backported to 3.13 by #138609, after 3.13.0). Before, it looked for a key `main_path` the
   preparation data never has, so `__main__` was never preloaded and every child ran the script's
   top level again. This file gives the forkserver module's `spawn` a `get_preparation_data` that
   also answers `main_path`, which the older `ensure_running` passes on.

Both apply in every interpreter that starts with this folder on its path (the program, spawned
children and the forkserver itself, as 3.14 does everywhere). The file imports nothing (only
what the interpreter has already loaded), so the traced program's imports are its own. It does
nothing on 3.14 and later.
"""

import sys

if sys.version_info < (3, 14) and sys.platform == "linux":
    _PathFinder = sys.modules["_frozen_importlib_external"].PathFinder

    class _SpawnWithMainPath:
        """multiprocessing.spawn as multiprocessing.forkserver sees it: `get_preparation_data` also
        answers `main_path`, as 3.14's `ensure_running` reads `init_main_from_path`."""

        def __init__(self, spawn):  # type: ignore[no-untyped-def]
            self._spawn = spawn

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(self._spawn, name)

        def get_preparation_data(self, name):  # type: ignore[no-untyped-def]
            data = self._spawn.get_preparation_data(name)
            if "init_main_from_path" in data:
                data.setdefault("main_path", data["init_main_from_path"])
            return data

    def _after_context(module):  # type: ignore[no-untyped-def]
        if module.reduction.HAVE_SEND_HANDLE:
            module._default_context = module.DefaultContext(module._concrete_contexts["forkserver"])

    def _after_forkserver(module):  # type: ignore[no-untyped-def]
        module.spawn = _SpawnWithMainPath(module.spawn)

    _AFTER = {"multiprocessing.context": _after_context, "multiprocessing.forkserver": _after_forkserver}

    class _Py314Defaults:
        """A meta path finder for the two modules above only: their loader runs 3.14's change
        right after the module's own code."""

        @staticmethod
        def find_spec(name, path=None, target=None):  # type: ignore[no-untyped-def]
            after = _AFTER.get(name)
            if after is None:
                return None
            spec = _PathFinder.find_spec(name, path, target)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_change(module):  # type: ignore[no-untyped-def]
                exec_module(module)
                after(module)

            spec.loader.exec_module = exec_then_change
            return spec

    sys.meta_path.insert(0, _Py314Defaults)
