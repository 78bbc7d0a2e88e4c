"""Exports of a real traced process tree: OTLP/HTTP (CLI and the SDK exporter) into a real receiver,
OTLP/JSON, and Perfetto trace JSON."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from run_spans import all_spans

from starttrace.sources.journal_reader import Process, Run, Span
from starttrace.views.otlp import export_run, to_otlp_json


def _starttrace(venv_python: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_python, "-m", "starttrace", *args], capture_output=True, text=True, timeout=120, env=env
    )


def _expected(run: Run) -> dict[str, tuple[Process | None, Span, str]]:
    """span id -> (its process, the span, the parent id the export must carry ("" for none))."""
    incoming = run.meta.get("parent_span_id") or ""
    result: dict[str, tuple[Process | None, Span, str]] = {}
    for process, span in all_spans(run):
        assert span.span_id not in result, f"span id {span.span_id} twice in the run"
        parent = span.parent_id or (incoming if process is None else "")
        result[span.span_id] = (process, span, parent)
    return result


def _check_received(run: Run, received: list[Any]) -> None:
    expected = _expected(run)
    counts = Counter(s.span_id for s in received)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    assert not duplicates, f"spans received more than once: {duplicates}"
    assert set(counts) == set(expected), (
        f"missing {set(expected) - set(counts)}, unexpected {set(counts) - set(expected)}"
    )
    root_resource = run.processes[0].resource
    for got in received:
        process, span, parent = expected[got.span_id]
        assert got.trace_id == run.trace_id
        assert got.parent_id == parent, span.name
        assert got.name == span.name
        assert got.start_ns == span.start_ns, span.name
        assert span.end_ns is not None, f"{span.name} still open in a finished run"
        assert got.end_ns == span.end_ns, span.name
        assert got.attributes.get("starttrace.phase") == span.attrs.get("starttrace.phase")
        assert got.status_code == (2 if span.error is not None else 0)
        resource = process.resource if process is not None else root_resource
        assert got.resource["service.instance.id"] == resource["service.instance.id"]
        assert got.resource["process.pid"] == resource["process.pid"]
        assert got.resource["starttrace.run_id"] == run.run_id
        assert got.resource["starttrace.role"] == resource["starttrace.role"]
        if process is not None:
            assert got.resource["service.instance.id"] == process.instance_id
            assert got.resource["process.pid"] == process.pid
        launched_by = span.attrs.get("starttrace.launched_by")
        if launched_by:
            assert (run.trace_id, launched_by) in got.links
    # one resource per process: instance ids are unique per process
    instances = {s.resource["service.instance.id"] for s in received}
    assert instances == {p.instance_id for p in run.processes}


def _check_tree_shape(run: Run) -> None:
    methods = Counter(p.resource["starttrace.start_method"] for p in run.processes)
    assert methods["root"] == 1
    assert methods["spawn"] >= 1 and methods["fork"] >= 1 and methods["forkserver"] >= 2, methods
    assert all(not p.alive for p in run.processes)


def test_cli_otlp_export_delivers_every_span_once(run_tree: Any, otlp_receiver: Any, venv_python: str) -> None:
    run = run_tree("--no-torch")
    _check_tree_shape(run)
    assert run.path is not None
    proc = _starttrace(venv_python, "export", str(run.path), "--format", "otlp", "--endpoint", otlp_receiver.url)
    assert proc.returncode == 0, proc.stderr
    total = len(all_spans(run))
    assert f"sent {total} spans" in proc.stderr
    received = otlp_receiver.wait_for_spans(total, timeout=10)
    _check_received(run, received)


def test_sdk_exporter_through_export_run(run_tree: Any, otlp_receiver: Any) -> None:
    run = run_tree("--no-torch")
    sent = export_run(run, otlp_receiver.traces_url, timeout_s=10)
    assert sent == len(all_spans(run))
    _check_received(run, otlp_receiver.spans())


def test_cli_otlp_export_to_closed_port_fails_cleanly(run_tree: Any, venv_python: str) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = run_tree("--no-torch")
    proc = _starttrace(
        venv_python,
        "export",
        run.run_id,
        "--dir",
        str(run.path.parent),
        "--format",
        "otlp",
        "--endpoint",
        f"http://127.0.0.1:{port}",
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "refused or did not answer" in proc.stderr


_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _hex_to_b64(document: dict[str, Any]) -> dict[str, Any]:
    converted = json.loads(json.dumps(document))
    for resource_spans in converted["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
    return converted


def test_otlp_json(run_tree: Any, venv_python: str, tmp_path: Path) -> None:
    run = run_tree("--no-torch")
    out = tmp_path / "run.otlp.json"
    proc = _starttrace(venv_python, "export", "--dir", str(run.path.parent), "--format", "otlp-json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert document == to_otlp_json(run)  # the CLI writes exactly what the API builds
    assert len(document["resourceSpans"]) == len(run.processes), "one resource per process"
    spans = [s for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == len(all_spans(run))
    int_values = 0
    for span in spans:
        assert _HEX32.match(span["traceId"]) and span["traceId"] == run.trace_id
        assert _HEX16.match(span["spanId"])
        if "parentSpanId" in span:
            assert _HEX16.match(span["parentSpanId"])
        for key in ("startTimeUnixNano", "endTimeUnixNano"):
            assert isinstance(span[key], str) and span[key].isdigit(), (key, span[key])
        assert isinstance(span.get("kind", 1), int), "OTLP/JSON enums are integers"
        assert isinstance(span.get("status", {}).get("code", 0), int)
        for attribute in span.get("attributes", []):
            if "intValue" in attribute["value"]:
                assert isinstance(attribute["value"]["intValue"], str)
                int_values += 1
        for link in span.get("links", []):
            assert _HEX32.match(link["traceId"]) and _HEX16.match(link["spanId"])
    assert int_values > 0, "the tree's spans carry int attributes (child pids)"
    for resource_spans in document["resourceSpans"]:
        attrs = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
        assert isinstance(attrs["process.pid"]["intValue"], str)
        assert attrs["starttrace.run_id"]["stringValue"] == run.run_id
    # Back to protobuf (after turning hex ids into protobuf-JSON's base64): same ids, same times.
    message = json_format.ParseDict(_hex_to_b64(document), ExportTraceServiceRequest())
    parsed = {
        s.span_id.hex(): (s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano, s.trace_id.hex())
        for rs in message.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    for span_id, (_process, span, parent) in _expected(run).items():
        assert parsed[span_id] == (parent, span.start_ns, span.end_ns, run.trace_id)


# --- Perfetto -------------------------------------------------------------------------------------

_TOLERANCE_US = 0.002  # ts and dur are rounded to the nanosecond independently


def _check_nesting(slices: list[dict[str, Any]]) -> None:
    ordered = sorted(slices, key=lambda e: (e["ts"], -e["dur"]))
    stack: list[dict[str, Any]] = []
    for event in ordered:
        start, end = event["ts"], event["ts"] + event["dur"]
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= start + _TOLERANCE_US:
            stack.pop()
        if stack:
            parent = stack[-1]
            parent_end = parent["ts"] + parent["dur"]
            assert end <= parent_end + _TOLERANCE_US, (
                f"{event['name']} [{start}, {end}] overlaps {parent['name']} [{parent['ts']}, {parent_end}]"
            )
        stack.append(event)


def test_perfetto_structure(run_tree: Any, venv_python: str, tmp_path: Path) -> None:
    run = run_tree("--no-torch")
    out = tmp_path / "run.perfetto.json"
    proc = _starttrace(
        venv_python, "export", run.run_id, "--dir", str(run.path.parent), "-f", "perfetto", "-o", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    events = document["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    instants = [e for e in events if e["ph"] == "i"]
    assert len(slices) + len(instants) == len(all_spans(run))
    assert {e["args"]["span_id"] for e in slices + instants} == {s.span_id for _, s in all_spans(run)}
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in slices:
        assert event["ts"] >= 0 and event["dur"] >= 0, event
        by_track.setdefault((event["pid"], event["tid"]), []).append(event)
    for event in instants:
        assert event["ts"] >= 0
    for track in by_track.values():
        _check_nesting(track)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    sort_index = {
        e["pid"]: e["args"]["sort_index"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"
    }
    pids = {e["pid"] for e in slices + instants}
    assert pids <= set(names) and pids <= set(sort_index)
    assert len(set(sort_index.values())) == len(sort_index), "every track has its own place"
    by_pid = {p.pid: p for p in run.processes}
    assert set(by_pid) <= set(names)
    for pid, process in by_pid.items():
        assert names[pid] == process.label()
        match = re.fullmatch(r"(\w+)(?: rank (\d+))? pid (\d+)", names[pid])
        assert match, names[pid]
        assert match.group(1) == process.role and int(match.group(3)) == pid
    # the root process sorts before the helpers it started
    root = next(p for p in run.processes if p.resource["starttrace.start_method"] == "root")
    assert sort_index[root.pid] == min(sort_index[pid] for pid in by_pid)


def test_export_to_stdout_is_json(run_tree: Any, venv_python: str) -> None:
    run = run_tree("--no-torch")
    for fmt, key in (("perfetto", "traceEvents"), ("otlp-json", "resourceSpans")):
        proc = _starttrace(venv_python, "export", "--dir", str(run.path.parent), "-f", fmt)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)[key], fmt
