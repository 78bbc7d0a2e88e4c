"""The plan's replay (analysis/plan.py): time cut by two findings counts once (the larger share),
not twice; the folding of helpers by kind (analysis/folding.py)."""

from __future__ import annotations

import pytest
from demo_runs import demo_run_dir

from starttrace.analysis.folding import command_kind
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.analysis.plan import _merged, _removed, finding_cuts, replay
from starttrace.sources.journal_reader import read_run


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> RunModel:
    return build_model(read_run(demo_run_dir(tmp_path_factory.mktemp("demo"), "cold")))


def test_overlapping_cuts_count_once_with_the_larger_share() -> None:
    assert _removed([(0, 10, 0.5), (5, 20, 1.0)], 0, 20) == pytest.approx(5 * 0.5 + 15 * 1.0)
    assert _removed([(0, 10, 1.0), (0, 10, 1.0)], 0, 10) == pytest.approx(10)  # not 20
    assert _removed([(0, 10, 1.0)], 4, 6) == pytest.approx(2)  # only inside the step
    assert _removed([], 0, 10) == 0


def test_two_findings_on_the_same_stretch_save_once(cold: RunModel) -> None:
    (compile_finding,) = [f for f in cold.findings if f["kind"] == "cold_compile"]
    cuts = finding_cuts(cold, compile_finding)
    assert cuts
    alone = cold.startup_s - replay(cold, cuts)
    twice = cold.startup_s - replay(cold, _merged([cuts, cuts]))
    assert alone == pytest.approx(compile_finding["saving_s"], abs=1e-6)
    assert twice == pytest.approx(alone)  # the sum would say 2x


def test_helpers_by_kind() -> None:
    so_check = "/venv/bin/python -c \"import ctypes; ctypes.cdll.LoadLibrary('/tmp/x.so')\""
    assert command_kind(so_check) == "python -c (Inductor's .so check)"
    assert command_kind("/venv/bin/python -m vllm.model_executor.models.registry") == (
        "python -m vllm.model_executor.models.registry (vLLM's model inspection)"
    )
    assert command_kind("/usr/bin/python3 tool.py --x") == "python tool.py"
    assert command_kind(None) == "process"
    assert command_kind('python -c "unbalanced') == "python -c"
