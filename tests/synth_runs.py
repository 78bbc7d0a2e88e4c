"""Synthetic multi-rank startup runs (tests, benchmarks, demos of the service).

`make_run()` builds the spans a vLLM-like tree would record: an API server that starts a
forkserver and an EngineCore, ranks forked from the forkserver that import modules (a nested
tree), initialize CUDA and the process group, load the model, and a `ready` at the end. Encoders
produce OTLP protobuf / OTLP JSON requests.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from starttrace.run import Process, Run, spans_table
from starttrace.run import Span as RunSpan

MS = 1_000_000


@dataclass
class SSpan:
    span_id: str
    parent_id: str | None
    name: str
    start: int
    end: int
    attrs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class SProcess:
    resource: dict[str, Any]
    spans: list[SSpan] = field(default_factory=list)


@dataclass
class SRun:
    run_id: str
    trace_id: str
    processes: list[SProcess]

    @property
    def span_count(self) -> int:
        return sum(len(p.spans) for p in self.processes)


def _sid(rng: random.Random) -> str:
    return "%016x" % rng.getrandbits(64)


class _Lane:
    def __init__(self, run: SRun, rng: random.Random, resource: dict[str, Any]) -> None:
        self.proc = SProcess(resource)
        run.processes.append(self.proc)
        self.rng = rng

    def span(self, name: str, parent: str | None, start: int, end: int, **attrs: Any) -> str:
        sid = _sid(self.rng)
        err = attrs.pop("_error", None)
        self.proc.spans.append(SSpan(sid, parent, name, start, end, attrs, err))
        return sid


def _imports(lane: _Lane, parent: str, t: int, n: int, prefix: str, rng: random.Random, depth: int = 0) -> int:
    """Emit about n nested import spans starting at t; returns the end time."""
    made = 0
    i = 0
    while made < n:
        kids = 0 if depth >= 4 or n - made <= 1 else min(n - made - 1, rng.randint(0, 6) if depth else 40)
        mod = f"{prefix}.m{i}" if prefix else f"pkg{i}"
        start = t
        sid = lane.span(
            f"import {mod}",
            parent,
            start,
            start,
            **{
                "starttrace.phase": "import",
                "starttrace.import.module": mod,
                "code.file.path": f"/site-packages/{mod.replace('.', '/')}.py",
            },
        )
        node = lane.proc.spans[-1]
        t += rng.randint(20_000, 200_000)
        made += 1
        if kids:
            t = _imports(lane, sid, t, kids, mod, rng, depth + 1)
            made += kids
        t += rng.randint(10_000, 100_000)
        node.end = t
        i += 1
    return t


def make_run(
    ranks: int = 4,
    imports_per_rank: int = 60,
    run_id: str | None = None,
    seed: int = 1,
    service: str = "vllm",
    xss: bool = False,
    cuda_in_forkserver: bool = False,
    in_progress_rank: int | None = None,
    ready: bool = True,
    start_method: str = "forkserver",
    t0: int | None = None,
    common_imports: int = 3,
) -> SRun:
    rng = random.Random(seed)
    trace_id = "%032x" % rng.getrandbits(128)
    run_id = run_id or f"synth-{seed}-{trace_id[:6]}"
    run = SRun(run_id, trace_id, [])
    t0 = t0 if t0 is not None else 1_700_000_000_000_000_000 + seed * 10**12

    def resource(pid: int, ppid: int, role: str, method: str, rank: int | None = None) -> dict[str, Any]:
        res: dict[str, Any] = {
            "service.name": service,
            "service.instance.id": f"{pid:08x}",
            "process.pid": pid,
            "process.parent_pid": ppid,
            "process.command_args": ["python", "-m", "vllm", role],
            "host.name": "synth-host",
            "starttrace.run_id": run_id,
            "starttrace.role": role,
            "starttrace.start_method": method,
        }
        if rank is not None:
            res.update({"starttrace.rank": rank, "starttrace.local_rank": rank, "starttrace.world_size": ranks})
        return res

    # API server ------------------------------------------------------------------------------
    api = _Lane(run, rng, resource(1000, 1, "api_server", "root"))
    startup = api.span("startup", None, t0, 0, **{"starttrace.phase": "startup"})
    proc = api.span("process", startup, t0, 0, **{"starttrace.phase": "process"})
    api.span("python.init", proc, t0, t0 + 40 * MS, **{"starttrace.phase": "interpreter"})
    t = _imports(api, proc, t0 + 41 * MS, 30, "vllm_api", rng)
    fs_start = api.span(
        "forkserver.start",
        proc,
        t,
        t + 5 * MS,
        **{"starttrace.phase": "forkserver", "starttrace.preload": ["vllm.v1.engine.async_llm"]},
    )
    t += 6 * MS
    engine_wait_start = t
    launch_ec = api.span(
        "process.launch",
        proc,
        t,
        t + 30 * MS,
        **{"starttrace.phase": "launch", "starttrace.child_pid": 1001, "starttrace.start_method": "spawn"},
    )
    # forkserver -------------------------------------------------------------------------------
    fs = _Lane(run, rng, resource(1002, 1000, "forkserver", "exec"))
    fproc = fs.span("process", fs_start, t - 5 * MS, 0, **{"starttrace.phase": "process"})
    ft = t - 4 * MS
    pre = fs.span("forkserver.preload", fproc, ft, 0, **{"starttrace.phase": "forkserver_preload"})
    pre_mod = fs.span("preload vllm.v1.engine.async_llm", pre, ft, 0, **{"starttrace.phase": "forkserver_preload"})
    ft2 = _imports(fs, pre_mod, ft + 1 * MS, 12, "vllm.v1.engine.async_llm", rng)
    if cuda_in_forkserver:
        imp = fs.span(
            "import vllm.platforms.cuda",
            pre_mod,
            ft2,
            ft2 + 300 * MS,
            **{"starttrace.phase": "import", "starttrace.import.module": "vllm.platforms.cuda"},
        )
        fs.span("cuda.init", imp, ft2 + 10 * MS, ft2 + 290 * MS, **{"starttrace.phase": "cuda_init"})
        ft2 += 300 * MS
    for sp in fs.proc.spans:
        if sp.span_id in (pre, pre_mod):
            sp.end = ft2
    # EngineCore -------------------------------------------------------------------------------
    ec = _Lane(run, rng, resource(1001, 1000, "engine_core", "spawn"))
    et = t + 25 * MS
    eproc = ec.span("process", launch_ec, et, 0, **{"starttrace.phase": "process"})
    ec.span("python.init", eproc, et, et + 45 * MS, **{"starttrace.phase": "interpreter"})
    ec.span("process.bootstrap", eproc, et + 45 * MS, et + 50 * MS, **{"starttrace.phase": "bootstrap"})
    et = _imports(ec, eproc, et + 50 * MS, 40, "vllm_engine", rng)
    overall = ec.span("Overall Loading", eproc, et, 0)  # vLLM's own span: no starttrace attributes
    # ranks forked by the forkserver
    fork_t = max(et + 1 * MS, ft2 + 1 * MS)
    rank_ends = []
    for r in range(ranks):
        req = ec.span(
            "process.launch",
            overall,
            fork_t + r * 2 * MS,
            fork_t + r * 2 * MS + 3 * MS,
            **{"starttrace.phase": "launch", "starttrace.child_pid": 1100 + r, "starttrace.start_method": start_method},
        )
        del req
        fk = fs.span(
            "process.fork",
            fproc,
            fork_t + r * 2 * MS + 1 * MS,
            fork_t + r * 2 * MS + 2 * MS,
            **{"starttrace.phase": "fork", "starttrace.child_pid": 1100 + r},
        )
        name = "<script>alert(1)</script>" if xss and r == 0 else None
        w = _Lane(run, rng, resource(1100 + r, 1002, "worker", start_method, rank=r))
        wt = fork_t + r * 2 * MS + 2 * MS
        wproc = w.span("process", fk, wt, 0, **{"starttrace.phase": "process"})
        w.span("process.bootstrap", wproc, wt, wt + 3 * MS, **{"starttrace.phase": "bootstrap"})
        wt += 3 * MS
        # modules every rank imports after its fork (preload advice material)
        for c in range(common_imports):
            mod = f"vllm.common{c}"
            w.span(
                f"import {mod}",
                wproc,
                wt,
                wt + (20 + c * 10) * MS,
                **{"starttrace.phase": "import", "starttrace.import.module": mod},
            )
            wt += (20 + c * 10) * MS + MS
        n_imp = max(0, imports_per_rank - common_imports - 8)
        wt = _imports(w, wproc, wt, n_imp, f"worker{r}", rng) if n_imp else wt
        if name:
            w.span(
                f"import {name}",
                wproc,
                wt,
                wt + 5 * MS,
                **{
                    "starttrace.phase": "import",
                    "starttrace.import.module": name,
                    "note": "<img src=x onerror=alert(2)>",
                },
            )
            wt += 6 * MS
        imp = w.span(
            "import vllm.platforms.cuda",
            wproc,
            wt,
            wt + 200 * MS,
            **{"starttrace.phase": "import", "starttrace.import.module": "vllm.platforms.cuda"},
        )
        w.span("cuda.init", imp, wt + 20 * MS, wt + 190 * MS, **{"starttrace.phase": "cuda_init"})
        wt += 201 * MS
        w.span("dist.init", wproc, wt, wt + (100 + 10 * r) * MS, **{"starttrace.phase": "dist_init"})
        wt += (100 + 10 * r) * MS + MS
        if in_progress_rank == r:
            w.span(
                "vllm.model_load",
                wproc,
                wt,
                wt + 1,
                **{"starttrace.phase": "model_load", "starttrace.in_progress": True},
            )
            wt += 1
        else:
            w.span("vllm.model_load", wproc, wt, wt + 400 * MS, **{"starttrace.phase": "model_load"})
            wt += 400 * MS
            w.span("vllm.kv_cache", wproc, wt, wt + 80 * MS, **{"starttrace.phase": "kv_cache"})
            wt += 80 * MS
        rank_ends.append(wt)
        for sp in w.proc.spans:
            if sp.span_id == wproc:
                sp.end = wt
    end_all = max(rank_ends) + 5 * MS
    for sp in ec.proc.spans:
        if sp.span_id == overall:
            sp.end = end_all
    ec_end = end_all + 2 * MS
    api.span("vllm.engine_init", proc, engine_wait_start + 31 * MS, ec_end + 3 * MS, **{"starttrace.phase": "other"})
    ready_t = ec_end + 10 * MS
    for sp in ec.proc.spans:
        if sp.span_id == eproc:
            sp.end = ec_end
    for sp in fs.proc.spans:
        if sp.span_id == fproc:
            sp.end = ready_t
    if ready and in_progress_rank is None:
        api.span("ready", proc, ready_t, ready_t, **{"starttrace.phase": "ready"})
        final = ready_t
    else:
        final = ready_t
        for sp in api.proc.spans:
            if sp.span_id in (startup, proc):
                sp.attrs["starttrace.in_progress"] = True
    for sp in api.proc.spans:
        if sp.span_id in (startup, proc):
            sp.end = final
    return run


# ---------------------------------------------------------------------------------------------
# encoders


def _any(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        out = AnyValue()
        out.array_value.values.extend(_any(x) for x in v)
        return out
    return AnyValue(string_value=str(v))


def _kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any(v)) for k, v in attrs.items()]


def to_protobuf(
    run: SRun, processes: list[SProcess] | None = None, spans_slice: slice | None = None
) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    tid = bytes.fromhex(run.trace_id)
    for p in processes if processes is not None else run.processes:
        rs: ResourceSpans = req.resource_spans.add()
        rs.resource.attributes.extend(_kvs(p.resource))
        ss = rs.scope_spans.add()
        ss.scope.name = "starttrace"
        for s in p.spans[spans_slice] if spans_slice else p.spans:
            sp: Span = ss.spans.add()
            sp.trace_id = tid
            sp.span_id = bytes.fromhex(s.span_id)
            if s.parent_id:
                sp.parent_span_id = bytes.fromhex(s.parent_id)
            sp.name = s.name
            sp.kind = Span.SPAN_KIND_INTERNAL
            sp.start_time_unix_nano = s.start
            sp.end_time_unix_nano = s.end
            sp.attributes.extend(_kvs(s.attrs))
            if s.error:
                sp.status.code = Status.STATUS_CODE_ERROR
                sp.status.message = s.error
    return req


def _json_any(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_json_any(x) for x in v]}}
    return {"stringValue": str(v)}


def to_otlp_json(run: SRun) -> dict[str, Any]:
    out = []
    for p in run.processes:
        spans = []
        for s in p.spans:
            d: dict[str, Any] = {
                "traceId": run.trace_id,
                "spanId": s.span_id,
                "name": s.name,
                "kind": 1,
                "startTimeUnixNano": str(s.start),
                "endTimeUnixNano": str(s.end),
                "attributes": [{"key": k, "value": _json_any(v)} for k, v in s.attrs.items()],
            }
            if s.parent_id:
                d["parentSpanId"] = s.parent_id
            if s.error:
                d["status"] = {"code": 2, "message": s.error}
            spans.append(d)
        out.append(
            {
                "resource": {"attributes": [{"key": k, "value": _json_any(v)} for k, v in p.resource.items()]},
                "scopeSpans": [{"scope": {"name": "starttrace"}, "spans": spans}],
            }
        )
    return {"resourceSpans": out}


def protobuf_batches(run: SRun, batch_spans: int = 512) -> list[bytes]:
    """The run as serialized protobuf requests of at most `batch_spans` spans (one process each)."""
    out = []
    for p in run.processes:
        for i in range(0, len(p.spans), batch_spans):
            out.append(to_protobuf(run, [p], slice(i, i + batch_spans)).SerializeToString())
    return out


def to_run(run: SRun, service: str = "vllm") -> Run:
    """The synthetic run as the run type, as a source would hand it to the analysis (all spans on
    their process's lane of the span table, in-progress spans marked by `starttrace.in_progress`)."""
    processes = []
    rows: list[tuple[str, RunSpan]] = []
    for p in run.processes:
        res = p.resource
        lane = res["service.instance.id"]
        own = ""
        for s in p.spans:
            prog = s.attrs.get("starttrace.in_progress") is True
            span = RunSpan(
                s.span_id,
                s.parent_id,
                s.name,
                s.start,
                None if prog else s.end,
                s.attrs,
                s.error,
                instant=s.start == s.end,
                in_progress=prog,
            )
            rows.append((lane, span))
            if not own and s.name == "process":
                own = s.span_id
        processes.append(
            Process(
                lane,
                res["process.pid"],
                res["process.parent_pid"],
                None,
                res,
                own,
                exited=None,
                source="otlp",
            )
        )
    return Run(run.run_id, run.trace_id, "", {}, processes, [], [], spans_table(rows), service=service, source="otlp")


def random_hex(n: int) -> str:
    return os.urandom(n).hex()
