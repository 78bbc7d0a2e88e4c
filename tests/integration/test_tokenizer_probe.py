"""The tokenizer probe (probes/tokenizer.py): a traced program that loads a Hugging Face tokenizer
(the demo model's, trained offline) records one `tokenizer.load` span, phase `tokenizer`, a part of
its breakdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_spans import spans_named

from starttrace.analysis.lanes import build_model
from starttrace.sources.journal_reader import read_run

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

PROGRAM = r"""
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps({"class": type(tokenizer).__name__, "ids": tokenizer("Hello, my name is")["input_ids"]}))
"""


def test_tokenizer_load_is_a_phase(tmp_path: Path) -> None:
    from starttrace.demo.model import _write_tokenizer

    model_dir = tmp_path / "model"
    _write_tokenizer(model_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE") and k.lower() != "traceparent"}
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(tmp_path / "runs"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(model_dir)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ids"] and out["ids"][0] == 1  # <s>: the tokenizer works as without tracing
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = read_run(run_dir)
    (span,) = spans_named(run, "tokenizer.load")  # AutoTokenizer calls the class's from_pretrained: one span
    assert span.attrs["starttrace.phase"] == "tokenizer"
    assert span.attrs["starttrace.tokenizer.name"] == str(model_dir)
    assert span.attrs["starttrace.tokenizer.class"] == out["class"]
    (lane,) = build_model(run).lanes
    assert lane.breakdown.get("tokenizer", 0) > 0
