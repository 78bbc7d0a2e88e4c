"""A real multi-host simulation: two "nodes" on this machine, one torchrun job across them.

Each node is a process tree in its own UTS namespace (hostname), PID namespace (its pids repeat the
other node's), time namespace (its own CLOCK_MONOTONIC) and wall clock: node B runs under
libfaketime SKEW_S ahead (node A's wall clock is the real one). On both, a real `torchrun --nnodes 2
--nproc-per-node 2` with the c10d rendezvous runs examples/torchrun_job.py (gloo: barrier, then
all_reduce), traced with the switch only. The spans reach one `starttrace serve` over OTLP (each
node with its own journal folder), or the journals of both nodes land in one shared folder that
the service watches. Either way: one run with ranks 0-3 on both hosts, whose ranks leave the
barrier within ALIGN_S of each other on the page JSON and in every export, although the ranks'
own wall clocks there differ by SKEW_S; the estimated offset is within OFFSET_TOLERANCE_S of the
injected one. Each agent starts on the run its command line derives and moves into the run the
group-rank-0 agent publishes in the rendezvous store (probes/torchelastic.py): launched again with
the identical command line, the job is a second run (and trace), again with ranks 0-3 on both hosts.

Needs root (namespaces), util-linux `unshare` and Debian `faketime` (scripts/setup.sh).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from starttrace.tracer.launchers import from_argv

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from multinode_hosts import Node, free_port, node_command, why_not  # noqa: E402

JOB = REPO / "examples" / "torchrun_job.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
SKEW_S = 0.06  # node B's wall clock ahead of node A's
ALIGN_S = 0.020  # the ranks' barrier exits, aligned
OFFSET_TOLERANCE_S = 0.010
NODE_TIMEOUT_S = 180

_SKIP = why_not() or (None if TORCHRUN.exists() else "needs torch's torchrun in the venv")
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

NODES = (Node("node-a", 0.0, 1000, "127.0.0.2"), Node("node-b", SKEW_S, 7000, "127.0.0.3"))


def _torchrun_args(rdzv_port: int, job_id: str, local_addr: str) -> list[str]:
    return [
        str(TORCHRUN),
        "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--rdzv-id", job_id,
        "--rdzv-conf", "join_timeout=120",
        "--local-addr", local_addr,
        str(JOB),
    ]  # fmt: skip


def _run_job(
    tmp_path: Path,
    clean_env: Callable[..., dict[str, str]],
    journal_dirs: dict[str, Path],
    otlp_url: str | None,
    launch: tuple[int, str] | None = None,
) -> tuple[str, list[dict[str, Any]], tuple[int, str]]:
    """Both nodes of one job (`launch`: the rendezvous port and id of an earlier launch, to relaunch
    the identical command line); returns the run id both nodes traced, the ranks' own lines and the
    launch's (port, id)."""
    rdzv_port, job_id = launch or (free_port(), f"mn{os.getpid()}-{time.monotonic_ns() % 10**6}")
    procs: list[tuple[Node, subprocess.Popen[bytes], Path]] = []
    for node in NODES:
        traced = {"STARTTRACE": "1", "STARTTRACE_DIR": str(journal_dirs[node.name])}
        if otlp_url:
            traced["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_url
        command = node_command(node, _torchrun_args(rdzv_port, job_id, node.local_addr), traced)
        log = tmp_path / f"{node.name}-{time.monotonic_ns()}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True
            )
        procs.append((node, proc, log))
    try:
        for node, proc, log in procs:
            code = proc.wait(NODE_TIMEOUT_S)
            assert code == 0, f"{node.name} exited {code}:\n{log.read_text(errors='replace')[-4000:]}"
    finally:
        for _, proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    ranks = []
    traced_runs = {}
    argv_job = from_argv(["python", *_torchrun_args(rdzv_port, job_id, "x")])
    assert argv_job is not None
    for node, _, log in procs:
        text = log.read_text(errors="replace")
        for line in re.findall(r'\{"rank": [^{}]*"left_barrier_ns"[^{}]*\}', text):
            ranks.append(dict(json.loads(line), node=node.name))  # the ranks' lines may share a line
        # each agent starts on its command line's run, then adopts the launch's (probes/torchelastic.py)
        adopted = re.findall(r"starttrace: tracing run (\S+) -> \S+ \(this launch's; was (\S+)\)", text)
        assert len(adopted) == 1 and adopted[0][1] == argv_job.run_id, text[-3000:]
        traced_runs[node.name] = adopted[0][0]
    assert len(set(traced_runs.values())) == 1, f"the nodes traced different runs: {traced_runs}"
    return traced_runs[NODES[0].name], ranks, (rdzv_port, job_id)


@pytest.fixture
def service(tmp_path: Path, clean_env: Callable[..., dict[str, str]]) -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> str:
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("starttrace")), "serve", "--port", str(port),
                 "--db", str(tmp_path / f"st-{port}.db"), *args],
                stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
            )  # fmt: skip
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"starttrace serve did not start: {log.read_text()}")

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_run(url: str, run_id: str, processes: int, timeout: float = 60) -> dict[str, Any]:
    """The run's page JSON once the service has all its processes and their spans stopped changing."""
    deadline = time.monotonic() + timeout
    last: tuple[int, int] | None = None
    while time.monotonic() < deadline:
        runs = httpx.get(url + "/runs", timeout=10).json()["runs"]
        mine = [r for r in runs if r["run_id"] == run_id]
        if mine and mine[0]["processes"] >= processes:
            now = (mine[0]["processes"], mine[0]["spans"])
            if now == last:
                return dict(httpx.get(f"{url}/startup/{run_id}", timeout=30).json(), all_runs=runs)
            last = now
        time.sleep(1.0)
    raise AssertionError(f"run {run_id} did not arrive with {processes} processes: {runs}")


def _barrier_exits_s(page: dict[str, Any]) -> dict[int, float]:
    """Each rank's end of its `dist.barrier` span, seconds on the page's (aligned) time axis."""
    fields = page["span_fields"]
    name_at, end_at = fields.index("name"), fields.index("end_us")
    exits = {}
    for lane in page["lanes"]:
        if lane["role"] == "worker" and lane["rank"] is not None:
            ends = [row[end_at] for row in lane["spans"] if row[name_at] == "dist.barrier"]
            assert ends and ends[0] is not None, f"rank {lane['rank']} has no ended dist.barrier span"
            exits[lane["rank"]] = ends[0] / 1e6
    return exits


def _check_page(page: dict[str, Any], run_id: str, ranks: list[dict[str, Any]], others: tuple[str, ...] = ()) -> None:
    """`others`: the runs of other launches the service holds too."""
    assert page["run_id"] == run_id
    assert sorted(r["run_id"] for r in page["all_runs"]) == sorted([run_id, *others]), "both nodes in one run"
    assert len(page["trace_id"]) == 32
    # the ranks' own wall clocks: the barrier's exit differs by the injected skew between the nodes
    own = {r["rank"]: r for r in ranks}
    assert sorted(own) == [0, 1, 2, 3]
    by_node = {n.name: [r["left_barrier_ns"] for r in ranks if r["node"] == n.name] for n in NODES}
    raw_gap = (min(by_node["node-b"]) - max(by_node["node-a"])) / 1e9
    assert raw_gap >= SKEW_S - ALIGN_S, f"the wall clocks were not skewed: {raw_gap:.3f} s"
    # one run: ranks 0-3 on both hosts, lanes grouped by node, each rank on the host it ran on
    workers = [ln for ln in page["lanes"] if ln["role"] == "worker"]
    assert sorted(ln["rank"] for ln in workers) == [0, 1, 2, 3]
    assert {ln["rank"]: ln["host"] for ln in workers} == {r: own[r]["node"] for r in own}
    nodes_in_order = list(dict.fromkeys(ln["node"] for ln in page["lanes"]))
    assert sorted(nodes_in_order) == ["node-a", "node-b"]
    assert nodes_in_order[0] == own[0]["node"], "rank 0's node first"
    # aligned: every rank leaves the barrier within ALIGN_S on the page, though its clock did not
    exits = _barrier_exits_s(page)
    assert max(exits.values()) - min(exits.values()) <= ALIGN_S, exits
    # the estimated offset of the other node: within OFFSET_TOLERANCE_S of the injected skew
    rows = {row["node"]: row for row in page["nodes"]}
    reference = own[0]["node"]
    skews = {n.name: n.skew_s for n in NODES}
    other = next(name for name in rows if name != reference)
    assert rows[reference]["method"] == "reference" and rows[reference]["offset_ns"] == 0
    assert rows[other]["method"] == "collective"
    expected = skews[other] - skews[reference]
    assert abs(rows[other]["offset_ns"] / 1e9 - expected) <= OFFSET_TOLERANCE_S, rows[other]
    assert 0 <= rows[other]["error_ns"] <= 0.05e9
    assert sorted(rows[other]["ranks"] + rows[reference]["ranks"]) == [0, 1, 2, 3]


def _exports_aligned(get: Callable[[str], Any], run_id: str) -> dict[str, Any]:
    """Barrier exits of the four ranks in each export format, aligned there as on the page."""
    out: dict[str, Any] = {}
    perfetto = get("perfetto")
    names = {e["pid"]: e["args"]["name"] for e in perfetto["traceEvents"] if e.get("name") == "process_name"}
    ends = {names[e["pid"]]: (e["ts"] + e["dur"]) / 1e6 for e in perfetto["traceEvents"]
            if e.get("ph") == "X" and e.get("name") == "dist.barrier"}  # fmt: skip
    out["perfetto"] = ends
    jaeger = get("jaeger")["data"][0]
    out["jaeger"] = {
        s["spanID"]: (s["startTime"] + s["duration"]) / 1e6
        for s in jaeger["spans"]
        if s["operationName"] == "dist.barrier"
    }
    otlp = get("otlp-json")
    ends_otlp = {}
    offsets = {}
    for rs in otlp["resourceSpans"]:
        res = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        host = res["host.name"]["stringValue"]
        offsets[host] = (res.get("starttrace.clock.offset_ns"), res.get("starttrace.clock.method"))
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                if s["name"] == "dist.barrier":
                    ends_otlp[s["spanId"]] = int(s["endTimeUnixNano"]) / 1e9
    out["otlp-json"] = ends_otlp
    for fmt, ends in out.items():
        assert len(ends) == 4, f"{fmt}: {ends}"
        assert max(ends.values()) - min(ends.values()) <= ALIGN_S, f"{fmt} not aligned: {ends}"
    assert {m["stringValue"] for _, m in offsets.values() if m} <= {"reference", "collective"}
    assert all(o is not None for o, _ in offsets.values()), "every resource records its clock offset"
    return out


def test_torchrun_two_nodes_over_otlp(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]], service: Callable[..., str]
) -> None:
    url = service("--no-journal")
    dirs = {n.name: tmp_path / n.name / "runs" for n in NODES}  # each node's own disk
    run_id, ranks, launch = _run_job(tmp_path, clean_env, dirs, otlp_url=url)
    for node in NODES:  # each node traced its own part under the same run id; the first folder is gone
        assert [p.name for p in dirs[node.name].iterdir()] == [run_id]
    page = _wait_for_run(url, run_id, processes=6)
    _check_page(page, run_id, ranks)
    assert {_trace_of(dirs[n.name] / run_id) for n in NODES} == {page["trace_id"]}, "one trace on every node"
    _exports_aligned(lambda fmt: httpx.get(f"{url}/runs/{run_id}/export?format={fmt}", timeout=30).json(), run_id)
    # each node's exporter measured its clock against the service (NTP-style exchange)
    otlp = httpx.get(f"{url}/runs/{run_id}/export?format=otlp-json", timeout=30).json()
    exchange = {}
    for rs in otlp["resourceSpans"]:
        res = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        if "starttrace.clock.exchange_offset_ns" in res:
            exchange[res["host.name"]["stringValue"]] = int(res["starttrace.clock.exchange_offset_ns"]["intValue"])
    assert set(exchange) == {"node-a", "node-b"}
    assert abs(exchange["node-b"] / 1e9 - SKEW_S) <= OFFSET_TOLERANCE_S, exchange
    assert abs(exchange["node-a"] / 1e9) <= OFFSET_TOLERANCE_S, exchange
    # the identical command line launched again: a run (and trace) of its own, again with both nodes
    again, ranks_again, _ = _run_job(tmp_path, clean_env, dirs, otlp_url=url, launch=launch)
    assert again != run_id
    for node in NODES:
        assert sorted(p.name for p in dirs[node.name].iterdir()) == sorted([run_id, again])
    page_again = _wait_for_run(url, again, processes=6)
    _check_page(page_again, again, ranks_again, others=(run_id,))
    assert page_again["trace_id"] != page["trace_id"]
    assert len(_wait_for_run(url, run_id, processes=6)["lanes"]) == 6, "the first launch's run is unchanged"


def _trace_of(run_dir: Path) -> str:
    return str(json.loads((run_dir / "run.json").read_text())["trace_id"])


def test_torchrun_two_nodes_shared_journal_dir(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]], service: Callable[..., str]
) -> None:
    shared = tmp_path / "shared" / "runs"  # one filesystem that both nodes mount
    run_id, ranks, launch = _run_job(tmp_path, clean_env, {n.name: shared for n in NODES}, otlp_url=None)
    run_dir = shared / run_id
    assert [p.name for p in shared.iterdir()] == [run_id], "both nodes wrote into one run folder"
    # the identical command line launched again: a run folder of its own, again with both nodes
    again, ranks_again, _ = _run_job(tmp_path, clean_env, {n.name: shared for n in NODES}, None, launch=launch)
    assert again != run_id and sorted(p.name for p in shared.iterdir()) == sorted([run_id, again])
    url = service("--journal-dir", str(shared))
    page = _wait_for_run(url, run_id, processes=6)
    _check_page(page, run_id, ranks, others=(again,))
    page_again = _wait_for_run(url, again, processes=6)
    _check_page(page_again, again, ranks_again, others=(run_id,))
    assert page["trace_id"] == _trace_of(run_dir) != page_again["trace_id"] == _trace_of(shared / again)
    # pids repeat across the two hosts (own pid namespaces); each launch still found its node's child
    lanes = page["lanes"]
    pids = [ln["pid"] for ln in lanes]
    assert len(set(pids)) < len(pids), f"the simulated hosts were to reuse pids: {pids}"
    for lane in lanes:
        if lane["role"] == "worker":
            launcher = lanes[lane["launched_by"]["lane"]]
            assert launcher["host"] == lane["host"] and launcher["role"] == "main", (lane, launcher)
    # the CLI reads the shared folder the same way: report --json and the exports are aligned
    starttrace = str(Path(sys.executable).with_name("starttrace"))
    report = subprocess.run(
        [starttrace, "report", str(run_dir), "--json"], capture_output=True, text=True, env=clean_env(), timeout=120
    )
    assert report.returncode == 0, report.stderr
    model = json.loads(report.stdout)
    assert [row["node"] for row in model["nodes"]] == [row["node"] for row in page["nodes"]]

    def cli_export(fmt: str) -> Any:
        proc = subprocess.run(
            [starttrace, "export", str(run_dir), "-f", fmt],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    _exports_aligned(cli_export, run_id)
    text = subprocess.run(
        [starttrace, "report", str(run_dir)], capture_output=True, text=True, env=clean_env(COLUMNS="160"), timeout=120
    )
    assert text.returncode == 0, text.stderr
    assert "nodes (offset" in text.stdout and "collective" in text.stdout
