"""`report`, `compare` and `advise` in an 80-column console: no line wider, no header cut, module
names abbreviated only from the left at a component boundary (and whole in the findings list);
`wide=True` abbreviates nothing."""

from __future__ import annotations

import io
import re

import pytest
from finding_runs import forkserver_run, spawn_run
from rich.console import Console

from starttrace.analysis.compare import compare
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.run import Run, span_of, spans_table
from starttrace.views.terminal import abbreviate, render_advise, render_compare, render_report

PREFIX = "vllm.model_executor.layers.quantization.compressed_tensors.schemes."
HEADERS = {
    "report": [
        "process",
        "start",
        "ready s",
        "import s",
        "cover",
        "top import (s)",
        "cumulative s",
        "self s",
        "seconds",
    ],
    "compare": ["phase", "A s", "B s", "delta s", "ready A s", "ready B s", "import A s", "import B s", "ranks A"],
    "advise": ["module", "ranks", "s per rank"],
}


def long_names(run: Run) -> tuple[Run, set[str]]:
    """The run with every imported module renamed to a long dotted name."""
    names = set()
    rows = []
    for row in run.spans.iter_rows(named=True):
        span = span_of(row)
        mod = span.attrs.get("starttrace.import.module")
        if isinstance(mod, str):
            long = PREFIX + mod.replace("<", "").replace(">", "").replace(" ", "_").replace("=", "_")
            span.attrs["starttrace.import.module"] = long
            span.name = f"import {long}"
            names.add(long)
        rows.append((row["lane"], span))
    run.spans = spans_table(rows)
    return run, names


def rendered(width: int, draw: object, *args: object, wide: bool = False, **kw: bool) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    draw(*args, console, wide=wide, **kw)  # type: ignore[operator]
    return out.getvalue().splitlines()


def check_fits(lines: list[str], width: int, names: set[str], headers: list[str]) -> None:
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    for header in headers:
        assert re.search(rf"(^|\s){re.escape(header)}(\s|$)", text, re.M), f"header {header!r} cut or missing"
    for line in lines:
        for before, after in re.findall(r"(\S*)…(\S*)", line):
            assert before == "", f"an ellipsis inside a name: {line!r}"
            assert any(name == after or name.endswith("." + after) for name in names), (
                f"{after!r} is not the end of a module name at a component boundary: {line!r}"
            )


@pytest.fixture(scope="module")
def models() -> tuple[RunModel, RunModel, set[str]]:
    a, names = long_names(forkserver_run())
    b, more = long_names(spawn_run())
    return build_model(a), build_model(b), names | more


def test_abbreviate_keeps_last_components() -> None:
    assert abbreviate("vllm.entrypoints.openai.api_server", 40) == "vllm.entrypoints.openai.api_server"
    assert abbreviate("vllm.entrypoints.openai.api_server", 20) == "…openai.api_server"
    assert abbreviate("vllm.entrypoints.openai.api_server", 12) == "…api_server"
    assert abbreviate("averyveryverylongsinglename", 10) == "…" + "averyveryverylongsinglename"[-9:]
    assert len(abbreviate("a.b.c.d.e.f.g", 5)) <= 5


@pytest.mark.parametrize("width", [80, 100])
def test_report_fits(models: tuple[RunModel, RunModel, set[str]], width: int) -> None:
    a, _, names = models
    lines = rendered(width, render_report, a, full=True)
    check_fits(lines, width, names, HEADERS["report"])
    titles = [line.strip() for line in lines]
    assert titles.index("findings") < titles.index("processes")  # findings first
    # the findings list names modules whole (wrapped at spaces)
    flat = " ".join(line.strip() for line in lines)
    assert PREFIX + "slowmod" in flat
    # by default: the same fit, without the hotspots (--full), findings cut to two lines each
    lines = rendered(width, render_report, a)
    check_fits(lines, width, names, [h for h in HEADERS["report"] if h not in ("cumulative s", "self s")])
    assert "import hotspots" not in "\n".join(lines)


def test_compare_and_advise_fit(models: tuple[RunModel, RunModel, set[str]]) -> None:
    a, b, names = models
    check_fits(rendered(80, render_compare, compare(a, b)), 80, names, HEADERS["compare"])
    lines = rendered(80, render_advise, a)
    check_fits(lines, 80, names, HEADERS["advise"])
    assert any("…" in line for line in lines)  # the preload table did abbreviate


def test_wide_abbreviates_nothing(models: tuple[RunModel, RunModel, set[str]]) -> None:
    a, b, _ = models
    for lines in (rendered(80, render_report, a, wide=True), rendered(80, render_compare, compare(a, b), wide=True)):
        text = "\n".join(lines)
        assert "…" not in text
        assert PREFIX + "slowmod" in text and max(len(line) for line in lines) > 80
