"""Builds starttrace's optional C core (starttrace/_hotpath.c) when the package is built or installed.

Without a C compiler, or when STARTTRACE_BUILD_PURE=1, the wheel is pure Python and the hot path
runs its Python code: the same records, at a higher cost per event (docs/benchmarks.md). An
editable install (`pip install -e`) compiles into the source tree, where that install imports
from; a wheel's copy is compiled in a temporary folder, so building one leaves the tree as it was.
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("starttrace") / "_hotpath.c"


def compile_hotpath(root: Path, into: Path) -> Path | None:
    """Compile the extension into the folder `into`; its path, or None (reason on stderr)."""
    if os.environ.get("STARTTRACE_BUILD_PURE", "").strip() not in ("", "0"):
        return None
    source = root / SOURCE
    target = into / ("_hotpath" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not compiler or shutil.which(compiler[0]) is None:
        print(f"starttrace: no C compiler ({compiler[:1]}): building the pure-Python hot path", file=sys.stderr)
        return None
    include = sysconfig.get_paths()["include"]
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    command = [
        *compiler,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Werror=implicit-function-declaration",
        f"-I{include}",
        str(source),
        "-o",
        str(partial),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"starttrace: building {SOURCE} failed, pure-Python hot path:\n{done.stderr}", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, target)  # processes running the old file keep their mapping of it
    return target


class CustomBuildHook(BuildHookInterface):
    _scratch: Path | None = None

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        if version == "editable":  # the install imports the file from the source tree
            built = compile_hotpath(root, root / SOURCE.parent)
        else:
            self._scratch = Path(tempfile.mkdtemp(prefix="starttrace-hotpath-"))
            built = compile_hotpath(root, self._scratch)
            if built is not None:
                build_data["force_include"][str(built)] = f"starttrace/{built.name}"
        if built is not None:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
