"""The one join of per-node runs (sources/run_groups.py `closure`, used by the service's RunGroups and
the CLI's join_journal_runs), and the headers the clock exchange sends (clocksync.otlp_headers)."""

from __future__ import annotations

from starttrace.clocksync import otlp_headers
from starttrace.sources.run_groups import MAX_GROUP, closure, signatures

JOB = ("job", "head:29400", 2)


def _join(start: str, sigs: dict[str, set[tuple[str, str, int]]], overlaps: dict[str, list[str]]) -> list[str]:
    return closure(start, lambda rid: overlaps.get(rid, []), lambda rid: sigs.get(rid, set()))


def test_runs_join_through_overlap_and_a_shared_rendezvous_transitively() -> None:
    dist = ("dist", "10.0.0.1:29500", 16)
    sigs = {"a": {JOB}, "b": {JOB, dist}, "c": {dist}, "d": {("job", "other:1", 2)}}
    overlaps = {"a": ["b", "d"], "b": ["a", "c"], "c": ["b"], "d": ["a"]}
    assert _join("a", sigs, overlaps) == ["a", "b", "c"]  # c through b; d names another rendezvous
    assert _join("c", sigs, overlaps)[0] == "c" and sorted(_join("c", sigs, overlaps)) == ["a", "b", "c"]
    assert _join("a", sigs, {"a": []}) == ["a"], "the same rendezvous at another time is another job"
    assert _join("x", {"x": set(), "a": {JOB}}, {"x": ["a"]}) == ["x"], "a run that names nothing joins nothing"


def test_a_group_is_bounded() -> None:
    names = [f"r{i}" for i in range(MAX_GROUP * 2)]
    group = _join(names[0], {n: {JOB} for n in names}, {n: names for n in names})
    assert len(group) == MAX_GROUP and len(set(group)) == len(group)
    assert group[0] == names[0]


def test_signatures_need_more_than_one_node_or_rank() -> None:
    assert signatures([{"starttrace.job.rendezvous": "h:1", "starttrace.job.nnodes": 2}]) == {("job", "h:1", 2)}
    assert signatures([{"starttrace.job.rendezvous": "h:1", "starttrace.job.nnodes": 1}]) == set()
    assert signatures([{"starttrace.dist.master": "h:2", "starttrace.world_size": 4}]) == {("dist", "h:2", 4)}


def test_the_exchange_sends_the_otlp_exporters_headers() -> None:
    assert otlp_headers({}) == {}
    assert otlp_headers({"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0k,x-a=1"}) == {
        "authorization": "Bearer t0k",
        "x-a": "1",
    }
    both = {
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20general",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer%20traces",
    }
    assert otlp_headers(both) == {"authorization": "Bearer traces"}, "the traces-specific variable wins, as in the SDK"
