"""One run per job: the run id and trace id each node derives from its launcher's key
(starttrace/tracer/launchers.py), and what a root process records about its job and clock domain."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from starttrace.sources.journal_reader import read_run
from starttrace.tracer import activation
from starttrace.tracer.launchers import TOOL_MODULES, Job, clean_run_id, command_of, fnv1a_128, from_argv, identify

PY = "/venv/bin/python"
TORCHRUN = [PY, "/venv/bin/torchrun"]


def test_the_hash_is_stable_fnv1a_128() -> None:
    # published FNV-1a 128 test vectors: "" is the offset basis; "a"
    assert fnv1a_128("") == 0x6C62272E07BB014262B821756295C58D
    assert fnv1a_128("a") == 0xD228CB696F1A8CAF78912B704E4A8964
    assert fnv1a_128("torchrun\x00JOB") != fnv1a_128("torchrun\x00JOC")


def test_every_node_of_a_torchrun_job_derives_the_same_run() -> None:
    args = ["--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d"]
    node0 = from_argv([*TORCHRUN, *args, "--rdzv-endpoint", "head:29400", "--rdzv-id", "job7", "train.py"])
    module = [PY, "-m", "torch.distributed.run"]
    node1 = from_argv([*module, *args, "--rdzv_endpoint=head:29400", "--rdzv_id=job7", "x.py"])
    assert node0 is not None and node1 is not None
    assert (node0.run_id, node0.trace_id) == (node1.run_id, node1.trace_id)
    assert node0.run_id.startswith("torchrun-") and len(node0.trace_id) == 32
    assert node0.attrs()["starttrace.job.rendezvous"] == "head:29400"
    assert node0.attrs()["starttrace.job.nnodes"] == 2
    other = from_argv([*TORCHRUN, *args, "--rdzv-endpoint", "head:29400", "--rdzv-id", "job8", "train.py"])
    assert other is not None and other.run_id != node0.run_id


@pytest.mark.parametrize(
    "argv",
    [
        [*TORCHRUN, "--nproc-per-node", "8", "train.py"],  # one node
        [*TORCHRUN, "--standalone", "--nnodes", "2", "train.py"],
        [*TORCHRUN, "--nnodes", "1", "train.py"],
        [PY, "/venv/bin/vllm", "serve", "m", "-tp", "2"],
        [PY, "-m", "sglang.launch_server", "--model-path", "m"],
        [PY, "train.py", "--nnodes", "2"],  # not a launcher we know
        [PY, "-c", "pass"],
    ],
)
def test_single_node_commands_derive_nothing(argv: list[str]) -> None:
    assert from_argv(argv) is None


def test_torchrun_elastic_and_static_forms() -> None:
    elastic = from_argv([*TORCHRUN, "--nnodes=1:4", "--rdzv-endpoint", "h:1", "--rdzv-id", "j", "t.py"])
    assert elastic is not None and elastic.nnodes == 4
    static = from_argv([*TORCHRUN, "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "t.py"])
    assert static is not None and static.rendezvous == "10.0.0.1:29500" and static.node_rank == 1


def test_vllm_head_and_headless_nodes_join() -> None:
    common = ["serve", "meta/llama", "-tp", "8", "-pp", "2", "--nnodes", "2", "--master-addr", "10.1.1.1"]
    head = from_argv([PY, "/venv/bin/vllm", *common, "--node-rank", "0"])
    headless = from_argv([PY, "/venv/bin/vllm", *common, "--node-rank", "1", "--headless"])
    assert head is not None and headless is not None
    assert head.run_id == headless.run_id and head.trace_id == headless.trace_id
    assert head.rendezvous == "10.1.1.1:29501"  # vLLM's default master port
    assert (head.node_rank, headless.node_rank) == (0, 1)
    dp = from_argv([PY, "/venv/bin/vllm", "serve", "m", "-dp", "4", "-dpa", "10.1.1.1", "-dpp", "13345"])
    dp_flags = ["--data-parallel-address=10.1.1.1", "--data-parallel-rpc-port", "13345", "--headless"]
    dp_headless = from_argv([PY, "/venv/bin/vllm", "serve", "m", "-dp", "4", *dp_flags, "-dpr", "2"])
    assert dp is not None and dp_headless is not None and dp.run_id == dp_headless.run_id


def test_sglang_nodes_join_and_disagreeing_nodes_do_not() -> None:
    base = [PY, "-m", "sglang.launch_server", "--model-path", "m", "--tp", "16", "--nnodes", "2"]
    node0 = from_argv([*base, "--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000"])
    node1 = from_argv([*base, "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"])
    wrong = from_argv([*base, "--node-rank", "1", "--dist-init-addr", "10.0.0.2:5000"])
    assert node0 is not None and node1 is not None and wrong is not None
    assert node0.run_id == node1.run_id != wrong.run_id
    assert wrong.attrs()["starttrace.job.rendezvous"] == "10.0.0.2:5000"


def test_environment_keys_in_order_of_preference() -> None:
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "16", "SLURM_NODEID": "1"}
    job = identify(slurm, [PY, "train.py"])
    assert job is not None and job.kind == "slurm" and job.node_rank == 1
    assert identify(dict(slurm, SLURM_STEP_NUM_TASKS="1", SLURM_NNODES="1"), [PY, "t.py"]) is None, "an srun shell"
    assert identify({"SLURM_JOB_ID": "4242"}, [PY, "t.py"]) is None, "the batch script, not a step"
    # explicit wins over everything, and keeps the name the user gave
    explicit = identify(dict(slurm, STARTTRACE_RUN_ID="exp-1"), [PY, "t.py"])
    assert explicit is not None and (explicit.kind, explicit.run_id) == ("explicit", "exp-1")
    ray = identify({"VLLM_STARTTRACE_RUN_ID": "ray-job"}, [PY, "worker.py"])
    assert ray is not None and ray.run_id == "ray-job"
    # an incoming traceparent keeps its trace id, on a run named after it
    traced = identify({}, [PY, "t.py"], incoming_trace="4bf92f3577b34da6a3ce929d0e0e4736")
    assert traced is not None and traced.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert traced.run_id == "trace-4bf92f3577b34da6"
    # a torchrun worker that is its own root (its agent not traced)
    worker = {"TORCHELASTIC_RUN_ID": "j", "MASTER_ADDR": "h", "MASTER_PORT": "4711", "TORCHELASTIC_RESTART_COUNT": "1"}
    got = identify(worker, [PY, "t.py"])
    assert got is not None and got.kind == "torchrun" and got.rendezvous == "h:4711"
    again = identify(dict(worker, TORCHELASTIC_RESTART_COUNT="2"), [PY, "t.py"])
    assert again is not None and again.run_id != got.run_id, "a restart is another run"
    assert identify(dict(worker, TORCHELASTIC_RUN_ID="none"), [PY, "t.py"]) is None


@pytest.mark.parametrize("bad", ["", "   ", "a/b", "..", "x" * 81, "semi;colon", "new\nline"])
def test_unusable_explicit_run_ids_are_ignored(bad: str) -> None:
    assert clean_run_id(bad) == ""
    assert identify({"STARTTRACE_RUN_ID": bad}, [PY, "t.py"]) is None


def test_command_of_reads_interpreter_options() -> None:
    assert command_of([PY, "-X", "importtime", "-m", "torch.distributed.run", "--nnodes", "2"]) == (
        "torchrun",
        ["--nnodes", "2"],
    )
    assert command_of([PY, "-u", "/opt/bin/vllm", "serve", "m"])[0] == "vllm"
    assert command_of([PY])[0] == ""


def test_job_ids_are_folder_names() -> None:
    job = Job("vllm", "10.0.0.1:29501/2")
    assert clean_run_id(job.run_id) == job.run_id and int(job.trace_id, 16) != 0


def test_nodes_started_apart_share_one_run_folder_and_trace(
    venv_python: str, clean_env: Callable[..., dict[str, str]], journal_root: Path
) -> None:
    """Two roots of one job (two "nodes", the same STARTTRACE_DIR): one folder, one trace, two roots
    each with its own `startup` span, their children hung under their own node's root."""
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), STARTTRACE_RUN_ID="job-on-two-nodes")
    for _ in range(2):
        proc = subprocess.run([venv_python, "-c", child], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    (run_dir,) = journal_root.iterdir()
    assert run_dir.name == "job-on-two-nodes"
    meta = json.loads((run_dir / "run.json").read_text())
    run = read_run(run_dir)
    assert run.trace_id == meta["trace_id"] == fnv1a_128("explicit\x00job-on-two-nodes").to_bytes(16, "big").hex()
    assert len(run.root_spans) == 2 and len(run.processes) == 4
    roots = [p for p in run.processes if p.resource["starttrace.start_method"] == "root"]
    assert {p.resource["starttrace.job.kind"] for p in roots} == {"explicit"}
    for root in roots:
        own = run.process_span(root)
        assert own is not None and own.parent_id in {s.span_id for s in run.root_spans}
        assert run.root_owners()[own.parent_id] is root
    children = [p for p in run.processes if p not in roots]
    for child_process in children:
        parent = next(p for p in roots if p.pid == child_process.ppid)
        assert child_process.resource["starttrace.clock.domain"] == parent.resource["starttrace.clock.domain"]
        assert child_process.resource["host.id"] == parent.resource["host.id"]


@pytest.mark.parametrize(
    ("environ", "argv", "trace"),
    [({}, [PY, "-m", module, "--nnodes", "2"], "") for module in sorted(TOOL_MODULES)]
    + [({}, [PY, f"/venv/bin/{tool}", "--nnodes", "2"], "") for tool in ("torchrun", "vllm", "sglang")]
    + [
        ({}, [PY, "-X", "importtime", "/venv/bin/torchrun.py", "--nnodes", "2"], ""),
        ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2"}, [PY, "t.py"], ""),
        ({"TORCHELASTIC_RUN_ID": "r", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, [PY, "t.py"], ""),
        ({"STARTTRACE_RUN_ID": "exp-1"}, [PY, "t.py"], ""),
        ({"VLLM_STARTTRACE_RUN_ID": "ray"}, [PY, "t.py"], ""),
        ({}, [PY, "t.py"], "4bf92f3577b34da6a3ce929d0e0e4736"),
    ],
)
def test_activation_loads_launchers_wherever_they_could_find_a_job(
    environ: dict[str, str], argv: list[str], trace: str
) -> None:
    """activation.may_be_job keeps launchers.py unloaded where identify would find nothing: it must say
    yes for each source of a job identify reads (a launcher's command line, an environment key)."""
    assert activation.may_be_job(environ, argv, trace)


def test_activation_skips_launchers_for_a_plain_command() -> None:
    for argv in ([PY, "-c", "import torch"], [PY, "train.py"], [PY, "-c", "pass", "vllm"]):
        assert not activation.may_be_job({}, argv, "")
        assert identify({}, argv) is None
