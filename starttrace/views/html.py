"""HTML view: the service's pages (run list, startup waterfall, compare), rendered with Jinja2
templates (`views/templates/`, autoescaped: everything taken from span data is escaped) and
the canvas waterfall in `views/static/` (no CDN)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2.filters
from jinja2 import Environment, FileSystemLoader, select_autoescape

from starttrace.analysis.folding import is_not_python

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def phase_color(phase: str) -> str:
    """The phase's colour; for a phase without one, the same hash colour waterfall.js draws."""
    if phase in PHASE_COLORS:
        return PHASE_COLORS[phase]
    hue = 0
    for char in phase:
        hue = (hue * 31 + ord(char)) % 360
    return f"hsl({hue},45%,58%)"


PHASE_COLORS = {
    "interpreter": "#9aa5b1",
    "import": "#4e79a7",
    "forkserver": "#b07aa1",
    "forkserver_preload": "#d4a6c8",
    "launch": "#f28e2b",
    "fork": "#ff9d9a",
    "bootstrap": "#edc948",
    "cuda_init": "#e15759",
    "dist_init": "#76b7b2",
    "model_load": "#59a14f",
    "compile": "#8cd17d",
    "kv_cache": "#b6992d",
    "cuda_graphs": "#499894",
    "ready": "#2ca02c",
    "api_server": "#86bcb6",
    "config": "#d7b5a6",
    "engine_init": "#9c755f",
    "executor_init": "#f1ce63",
    "worker_init": "#a0cbe8",
    "device_init": "#fabfd2",
    "server_startup": "#79706e",
    "tokenizer": "#ffbe7d",
    "first_request": "#d37295",
    "idle": "#e8e8e8",
    "wait": "#c7c7c7",
    "unexplained": "#f0f0f0",
    "other": "#bab0ac",
}


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html", "xml", "j2"], default_for_string=True, default=True),
    )
    env.globals["phase_colors"] = PHASE_COLORS
    env.globals["phase_color"] = phase_color
    env.tests["search_not_python"] = is_not_python  # expected children with no journal: a note, not a warning
    env.filters["utc"] = lambda secs: dt.datetime.fromtimestamp(float(secs), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    env.filters["urlencode"] = path_segment
    return env


_urlencode = jinja2.filters.do_urlencode


def path_segment(value: Any) -> str:
    """The templates' `urlencode`, for run ids in links (`/startup/{{ id | urlencode }}`): a string
    becomes ONE path segment, "/" included (Jinja's own keeps "/", so a run id `a/b` opened
    `/startup/a/b`, a 404); a mapping or pairs are a query string as Jinja makes it."""
    if isinstance(value, str):
        return quote(value, safe="")
    return str(_urlencode(value))


def render_page(env: Environment, name: str, **ctx: Any) -> str:
    return env.get_template(name).render(**ctx)
