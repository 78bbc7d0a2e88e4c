"""Builds starttrace's optional C core when the package is built or installed: the hot path's
(starttrace/tracer/_hotpath.c: C only where the traced program pays).

Without a C compiler, or when STARTTRACE_BUILD_PURE=1, the wheel is pure Python and the hot path
runs its Python code: the same records, at a higher cost (docs/benchmarks.md). An
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

SOURCES = (Path("starttrace") / "tracer" / "_hotpath.c",)


def compile_extensions(root: Path, into: Path) -> list[Path]:
    """Compile each of SOURCES into its package's folder under `into` (`into`/starttrace/tracer/
    for starttrace/tracer/_hotpath.c); the paths built (a reason on stderr for each one that is
    not)."""
    if os.environ.get("STARTTRACE_BUILD_PURE", "").strip() not in ("", "0"):
        return []
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not compiler or shutil.which(compiler[0]) is None:
        print(f"starttrace: no C compiler ({compiler[:1]}): building pure Python", file=sys.stderr)
        return []
    built = []
    for source in SOURCES:
        folder = into / source.parent
        folder.mkdir(parents=True, exist_ok=True)
        built.append(compile_extension(compiler, root / source, folder))
    return [path for path in built if path is not None]


def compile_extension(compiler: list[str], source: Path, into: Path) -> Path | None:
    """Compile one extension into `into`; its path, or None (reason on stderr)."""
    target = into / (source.stem + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
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
        print(f"starttrace: building {source.name} failed, its Python code runs:\n{done.stderr}", file=sys.stderr)
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
        if version == "editable":  # the install imports the files from the source tree
            built = compile_extensions(root, root)
        else:
            self._scratch = Path(tempfile.mkdtemp(prefix="starttrace-c-"))
            built = compile_extensions(root, self._scratch)
            for path in built:
                build_data["force_include"][str(path)] = path.relative_to(self._scratch).as_posix()
        if built:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
