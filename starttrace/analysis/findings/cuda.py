"""The CUDA-clean audit, and its issues as `cuda_before_fork` findings.

Audit: processes that initialized CUDA and then forked (a forked child inherits a CUDA context it
cannot use), and forkservers that initialized CUDA at all (e.g. through a preloaded module). Each
issue carries the chain of spans that led to `cuda.init` (import a -> import b -> cuda.init).
"""

from __future__ import annotations

from typing import Any

from starttrace.analysis.findings.common import finding, is_forkserver
from starttrace.analysis.model import Lane, RunModel, SpanNode


def _chain(n: SpanNode, lane_index: int) -> list[str]:
    names: list[str] = []
    p = n.parent_node
    while p is not None and p.lane == lane_index and p.phase not in ("process", "startup") and len(names) < 200:
        names.append(p.name)
        p = p.parent_node
    names.reverse()
    names.append(n.name)
    return names


def _is_fork(n: SpanNode) -> bool:
    if n.phase == "fork" or n.name == "process.fork":
        return True
    if n.phase == "launch" or n.name == "process.launch":
        return n.attrs.get("starttrace.start_method") == "fork"
    return False


def _in_preload(c: SpanNode, lane: Lane) -> str | None:
    p = c.parent_node
    while p is not None and p.lane == lane.index:
        if p.phase == "forkserver_preload":
            return p.name
        p = p.parent_node
    return None


def _issue(model: RunModel, lane: Lane, kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "lane": lane.index,
        "label": lane.label,
        "role": lane.role,
        "rank": lane.rank,
        "pid": lane.pid,
        "cuda_init_s": None,
        "cuda_error": None,
        "chain": [],
        "in_preload": None,
        "forks": [],
        "severity": "error",
    }


def cuda_audit(model: RunModel) -> dict[str, Any]:
    """`{clean, processes_with_cuda_init, issues}`; see the module docstring."""
    issues: list[dict[str, Any]] = []
    cuda_lanes = 0
    by_lane: dict[tuple[str, int], list[SpanNode]] = {}
    for kind, phases, names in (
        ("cuda", ("cuda_init",), ("cuda.init",)),
        ("process", ("process",), ()),
        ("launch", ("fork", "launch"), ("process.fork", "process.launch")),
    ):
        for n in model.select(phases, names):
            by_lane.setdefault((kind, n.lane), []).append(n)
    for lane in model.lanes:
        cudas = by_lane.get(("cuda", lane.index), [])
        flagged = bool(lane.resource.get("starttrace.cuda_before_fork") is True) or any(
            n.attrs.get("starttrace.cuda_before_fork") is True for n in by_lane.get(("process", lane.index), [])
        )
        if cudas:
            cuda_lanes += 1
        is_fs = is_forkserver(model, lane)
        launches = by_lane.get(("launch", lane.index), []) if cudas else []
        for c in cudas:
            forks = [n for n in launches if _is_fork(n) and n.start >= c.start]
            if not forks and not is_fs:
                continue
            issue = _issue(model, lane, "forkserver_cuda" if is_fs else "cuda_before_fork")
            issue.update(
                cuda_init_s=model.seconds(c.start),
                cuda_error=c.error,
                chain=_chain(c, lane.index),
                in_preload=_in_preload(c, lane),
                forks=[
                    {
                        "name": f.name,
                        "child_pid": f.attrs.get("starttrace.child_pid"),
                        "start_s": model.seconds(f.start),
                    }
                    for f in forks[:20]
                ],
                severity="warning" if c.error else "error",
            )
            issues.append(issue)
        if flagged and not any(i["lane"] == lane.index for i in issues):
            issues.append(_issue(model, lane, "cuda_before_fork"))
    return {"clean": not issues, "processes_with_cuda_init": cuda_lanes, "issues": issues}


def cuda_findings(model: RunModel) -> list[dict[str, Any]]:
    """One `cuda_before_fork` finding per audit issue, with the chain that ran `cuda.init`."""
    out = []
    for issue in model.cuda_audit.get("issues", []):
        lane = model.lanes[issue["lane"]]
        chain = " -> ".join(issue["chain"]) or "(the process flagged itself: CUDA was initialised before a fork)"
        forks = issue["forks"]
        children = [f["child_pid"] for f in forks if f.get("child_pid")]
        failed = (
            f" (cuda.init failed here: {issue['cuda_error']}; on a GPU it would succeed)" if issue["cuda_error"] else ""
        )
        if issue["kind"] == "forkserver_cuda":
            where = f" during {issue['in_preload']}" if issue["in_preload"] else ""
            text = f"{lane.label} initialised CUDA{where}{failed}: {chain}"
            if children:
                text += f"; the {len(children)} processes it forked afterwards (pids {', '.join(map(str, children))})"
                text += " inherit a CUDA state they cannot use"
            module = issue["in_preload"][8:] if (issue["in_preload"] or "").startswith("preload ") else None
            action = (
                f"remove {module!r} from the forkserver preload, or make its import CUDA-clean"
                if module
                else "keep torch.cuda calls out of the forkserver (no CUDA init before it forks)"
            )
        else:
            text = f"{lane.label} initialised CUDA and then forked{failed}: {chain}"
            if children:
                text += f"; forked afterwards: pids {', '.join(map(str, children))}"
            action = "initialise CUDA only in the children (after the fork), or start them with spawn/forkserver"
        out.append(
            finding(
                "cuda_before_fork",
                issue["severity"],
                [lane],
                None,
                text,
                action,
                chain=issue["chain"],
                audit_kind=issue["kind"],
                child_pids=children,
            )
        )
    return out
