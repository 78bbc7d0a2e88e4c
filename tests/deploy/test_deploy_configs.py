"""deploy/: the OpenTelemetry Collector, Tempo, Prometheus and Grafana provisioning configs,
checked on their own and against docker-compose.yml (host names, ports, mount paths)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from deploy_helpers import (
    COLLECTOR_CONFIG,
    DASHBOARDS_DIR,
    DEPLOY_DOC,
    GRAFANA_PROVISIONING,
    PROMETHEUS_CONFIG,
    TEMPO_CONFIG,
    dashboard_files,
    load_yaml,
    provisioned_datasources,
)

DEPRECATED_EXPORTERS = {"otlp", "otlphttp", "logging", "jaeger", "jaeger_thrift"}
KINDS = ("receivers", "processors", "exporters", "connectors")
MiB = 1024 * 1024

# Routing by detail (deploy/otel-collector.yaml): pipeline -> the one exporter it feeds.
FULL_PIPELINE = "traces/starttrace"
SUMMARY_PIPELINES = {"traces/jaeger": "otlp_grpc/jaeger", "traces/tempo": "otlp_grpc/tempo"}
SUMMARY_ATTRIBUTE = "starttrace.summary"
# The one drop condition: every span whose starttrace.summary is not the bool true. OTTL's
# comparison (pkg/ottl/compare.go) makes `nil != true` and `"true" != true` true (dropped) and
# `true != true` false (kept); the inverted `== true` would drop exactly the summary set.
SUMMARY_DROP_CONDITION = re.compile(r'span\.attributes\["starttrace\.summary"\]\s*!=\s*true')

# The filter processor of collector-contrib 0.159.0, as its source defines it
# (processor/filterprocessor/config.go, config.schema.yaml, internal/condition/config.go):
# `trace_conditions` etc. are the current form (since 0.146, context inferred from the path
# prefix); the per-signal blocks `traces:` / `spans:` / ... are marked Deprecated, and
# Validate() refuses `trace_conditions` together with `traces.*`.
FILTER_KEYS = {"error_mode", "trace_conditions", "metric_conditions", "log_conditions", "profile_conditions"}
FILTER_DEPRECATED_KEYS = {"traces", "spans", "metrics", "logs", "profiles"}
# pkg/ottl/config.go: ErrorMode.UnmarshalText accepts exactly these (lower-cased).
OTTL_ERROR_MODES = {"ignore", "silent", "propagate"}
# internal/condition/config.go: the advanced style, one group per context.
CONTEXT_CONDITIONS_KEYS = {"context", "conditions", "error_mode"}
TRACE_CONTEXTS = {"resource", "scope", "span", "spanevent"}

# Measured sizes (docs/deploy.md, "Tempo limits"): a real vLLM TP=2 CPU start.
TP2_FULL_SPANS = (21_000, 26_000)
TP2_FULL_BYTES = 8_900_000  # OTLP protobuf
TP2_SUMMARY_SPANS = 3_000
TP2_SUMMARY_BYTES = 1_000_000
# Projection: TP=16 has 8x the ranks of TP=2 (per-rank trees dominate a run).
TP16_FULL_BYTES = 8 * TP2_FULL_BYTES  # ~71 MB
TP16_SUMMARY_BYTES = 8 * TP2_SUMMARY_BYTES  # ~8 MB
MARGIN = 2
# Jaeger v2 runs its default OTLP receiver: gRPC's default 4 MiB message limit.
JAEGER_GRPC_MAX_MSG = 4 * MiB


def container_ports(compose_config: dict[str, Any], service: str) -> set[int]:
    """Ports a service listens on inside the compose network (published or not)."""
    svc = compose_config["services"][service]
    ports = {int(p["target"]) for p in svc.get("ports") or []}
    ports |= {int(str(p).split("/")[0]) for p in svc.get("expose") or []}
    return ports


def host_port(endpoint: str) -> tuple[str, int]:
    url = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
    assert url.hostname and url.port, endpoint
    return url.hostname, url.port


# ------------------------------------------------------------------------------------------------
# OpenTelemetry Collector


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    return load_yaml(COLLECTOR_CONFIG)


def processors_of(collector: dict[str, Any], pipeline: str, kind: str) -> list[str]:
    return [p for p in collector["service"]["pipelines"][pipeline].get("processors") or [] if p.split("/")[0] == kind]


def test_collector_pipelines_use_only_defined_components(collector: dict[str, Any]) -> None:
    pipelines = collector["service"]["pipelines"]
    assert all(name.split("/")[0] == "traces" for name in pipelines), sorted(pipelines)
    used: dict[str, set[str]] = {k: set() for k in KINDS}
    for name, pipeline in pipelines.items():
        assert pipeline.get("receivers"), f"pipeline {name} has no receiver"
        assert pipeline.get("exporters"), f"pipeline {name} has no exporter"
        for kind in ("receivers", "processors", "exporters"):
            for comp in pipeline.get(kind) or []:
                defined = (collector.get(kind) or {}) | (collector.get("connectors") or {})
                assert comp in defined, f"pipeline {name} uses {kind[:-1]} {comp!r}, which is not defined"
                used[kind].add(comp)
    for kind in ("receivers", "processors", "exporters"):
        unused = set(collector.get(kind) or {}) - used[kind]
        assert not unused, f"{kind} defined but used by no pipeline: {sorted(unused)}"
    for ext in collector["service"].get("extensions") or []:
        assert ext in (collector.get("extensions") or {}), f"extension {ext!r} is not defined"


def test_collector_uses_current_exporter_names(collector: dict[str, Any]) -> None:
    for name in collector["exporters"]:
        kind = name.split("/")[0]
        assert kind not in DEPRECATED_EXPORTERS, f"exporter {name!r}: use otlp_grpc/<name> or otlp_http/<name>"
    names = set(collector["exporters"])
    assert {"otlp_grpc/jaeger", "otlp_grpc/tempo", "otlp_http/starttrace"} <= names
    exported = {e for p in collector["service"]["pipelines"].values() for e in p["exporters"]}
    assert exported >= {"otlp_grpc/jaeger", "otlp_grpc/tempo", "otlp_http/starttrace"}


def test_collector_routes_full_detail_to_starttrace_and_the_summary_to_jaeger_and_tempo(
    collector: dict[str, Any],
) -> None:
    pipelines = collector["service"]["pipelines"]
    assert set(pipelines) == {FULL_PIPELINE, *SUMMARY_PIPELINES}, sorted(pipelines)
    for name, pipeline in pipelines.items():
        # one receiver fans out to all three: each pipeline sees every span a program sends
        assert pipeline["receivers"] == ["otlp"], name
        # the memory limiter refuses data first, before any processor has spent work on it
        assert (pipeline.get("processors") or [None])[0] == "memory_limiter", name
    full = pipelines[FULL_PIPELINE]
    assert "otlp_http/starttrace" in full["exporters"]
    assert not set(full["exporters"]) & set(SUMMARY_PIPELINES.values()), "Jaeger/Tempo only from their pipelines"
    assert not processors_of(collector, FULL_PIPELINE, "filter"), "the starttrace service gets full detail"
    for name, exporter in SUMMARY_PIPELINES.items():
        pipeline = pipelines[name]
        assert pipeline["exporters"] == [exporter], name
        filters = processors_of(collector, name, "filter")
        assert filters, f"{name} must filter the spans down to the summary set"
        procs = pipeline["processors"]
        for batch in processors_of(collector, name, "batch"):
            assert procs.index(batch) > max(procs.index(f) for f in filters), f"{name}: batch after the filter"
        conditions = [c for f in filters for c in trace_condition_strings(collector["processors"][f])]
        assert any(SUMMARY_ATTRIBUTE in c for c in conditions), f"{name}: no condition on {SUMMARY_ATTRIBUTE}"
    # every exporter is in exactly one pipeline: no backend gets the spans twice
    exported = [e for p in pipelines.values() for e in p["exporters"]]
    assert len(exported) == len(set(exported)), exported


def trace_condition_strings(cfg: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for item in cfg.get("trace_conditions") or []:
        out.extend([item] if isinstance(item, str) else item.get("conditions") or [])
    return out


def summary_filters(collector: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = {f for name in SUMMARY_PIPELINES for f in processors_of(collector, name, "filter")}
    assert names
    return {name: collector["processors"][name] for name in sorted(names)}


def test_summary_filter_uses_keys_the_0_159_filter_processor_accepts(collector: dict[str, Any]) -> None:
    for name, cfg in summary_filters(collector).items():
        assert isinstance(cfg, dict), name
        assert set(cfg) <= FILTER_KEYS | FILTER_DEPRECATED_KEYS, (
            f"{name}: unknown keys {sorted(set(cfg) - FILTER_KEYS)}"
        )
        assert not set(cfg) & FILTER_DEPRECATED_KEYS, (
            f"{name}: deprecated form {sorted(set(cfg) & FILTER_DEPRECATED_KEYS)}"
        )
        # written out, and `ignore`: a failing condition keeps the span instead of failing the
        # request that the receiver shares with the full-detail pipeline
        assert cfg.get("error_mode") in OTTL_ERROR_MODES, f"{name}: error_mode {cfg.get('error_mode')!r}"
        assert cfg["error_mode"] == "ignore", name
        assert set(cfg) - {"error_mode"} == {"trace_conditions"}, f"{name}: traces only"
        items = cfg["trace_conditions"]
        assert isinstance(items, list) and items, f"{name}: trace_conditions must be a non-empty list"
        # the basic style (a list of strings) and the advanced one (groups) cannot be mixed
        styles = {isinstance(item, str) for item in items}
        assert len(styles) == 1, f"{name}: mixes basic and advanced trace_conditions"
        for item in items:
            if isinstance(item, str):
                continue
            assert isinstance(item, dict) and set(item) <= CONTEXT_CONDITIONS_KEYS, item
            assert item.get("context", "span") in TRACE_CONTEXTS, item
            assert item.get("error_mode", "ignore") in OTTL_ERROR_MODES, item
            assert isinstance(item.get("conditions"), list) and item["conditions"], item
        for condition in trace_condition_strings(cfg):
            assert isinstance(condition, str) and condition.strip(), (name, condition)
            if all(isinstance(item, str) for item in items):
                # basic style: the context is inferred from the path prefix
                paths = re.findall(r"\b([a-z]+)\.(?:attributes|name|kind|status)\b", condition)
                assert paths and set(paths) <= TRACE_CONTEXTS, f"{name}: no context prefix in {condition!r}"


def test_summary_filter_drops_exactly_the_spans_not_marked_summary(collector: dict[str, Any]) -> None:
    """A filter condition that is true drops the span: one condition, `!= true` on the attribute.

    OTTL semantics cannot be run without a collector binary; the shape is the check: any second
    drop condition would thin out the summary set, and `== true` would drop it whole.
    """
    for name, cfg in summary_filters(collector).items():
        conditions = trace_condition_strings(cfg)
        assert len(conditions) == 1, f"{name}: {conditions}"
        assert SUMMARY_DROP_CONDITION.fullmatch(conditions[0].strip()), f"{name}: {conditions[0]!r}"
        for item in cfg["trace_conditions"]:
            if isinstance(item, dict):
                assert item.get("context", "span") == "span", item


def test_backend_batches_fit_jaegers_grpc_message_limit(collector: dict[str, Any]) -> None:
    """A TP=16 summary in one request (~8 MB) is split before it reaches Jaeger's 4 MiB gRPC limit."""
    bytes_per_span = TP2_FULL_BYTES / TP2_FULL_SPANS[0]  # the heavier end of the measurement
    for name in SUMMARY_PIPELINES:
        batches = processors_of(collector, name, "batch")
        assert batches, f"{name}: no batch processor splits large requests"
        for batch in batches:
            cfg = collector["processors"][batch]
            assert set(cfg) <= {
                "send_batch_size",
                "send_batch_max_size",
                "timeout",
                "metadata_keys",
                "metadata_cardinality_limit",
            }
            size, max_size = cfg.get("send_batch_size", 8192), cfg.get("send_batch_max_size", 0)
            assert max_size > 0, f"{batch}: without send_batch_max_size nothing is split"
            assert max_size >= size, f"{batch}: send_batch_max_size must be >= send_batch_size"
            # 4x headroom for spans heavier than the average
            assert max_size * bytes_per_span * 4 < JAEGER_GRPC_MAX_MSG, batch
    assert TP16_SUMMARY_BYTES > JAEGER_GRPC_MAX_MSG  # why the split is needed


def test_collector_receivers_take_a_whole_run_in_one_request(collector: dict[str, Any]) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["max_request_body_size"] >= 4 * TP2_FULL_BYTES
    assert protocols["grpc"]["max_recv_msg_size_mib"] * MiB >= 4 * TP2_FULL_BYTES


def test_collector_receives_otlp_on_all_interfaces(collector: dict[str, Any]) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    assert collector["extensions"]["health_check"]["endpoint"] == "0.0.0.0:13133"


def test_collector_exporters_reach_compose_services(collector: dict[str, Any], compose_config: dict[str, Any]) -> None:
    services = compose_config["services"]
    for name, cfg in collector["exporters"].items():
        if not name.startswith(("otlp_grpc/", "otlp_http/")):
            continue
        host, port = host_port(cfg["endpoint"])
        assert host in services, f"{name} sends to {host!r}, which is no compose service"
        assert port in container_ports(compose_config, host) or host in ("jaeger", "tempo"), (name, host, port)
        if name.startswith("otlp_grpc/"):
            assert cfg.get("tls", {}).get("insecure") is True, f"{name}: plain gRPC inside the compose network"
    starttrace = collector["exporters"]["otlp_http/starttrace"]["endpoint"]
    assert host_port(starttrace) == ("starttrace", 4318)
    # Tempo's OTLP/gRPC receiver is the one the collector's exporter targets
    tempo = load_yaml(TEMPO_CONFIG)
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")


def test_collector_telemetry_is_scraped(collector: dict[str, Any]) -> None:
    reader = collector["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert reader["host"] == "0.0.0.0"
    targets = scrape_targets(load_yaml(PROMETHEUS_CONFIG))
    assert f"otel-collector:{reader['port']}" in targets["otel-collector"]


# ------------------------------------------------------------------------------------------------
# Tempo


def test_tempo_config_is_tempo3_monolithic_with_otlp(compose_config: dict[str, Any], tempo: dict[str, Any]) -> None:
    assert isinstance(tempo, dict)
    # Tempo 3 refuses to start with the removed 2.x blocks
    for removed in ("ingester", "compactor", "ingester_client", "metrics_generator_client"):
        assert removed not in tempo, f"Tempo 3 has no `{removed}:` block"
    protocols = tempo["distributor"]["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    assert tempo.get("target", "all") == "all"
    storage = tempo["storage"]["trace"]
    assert storage["backend"] == "local"
    mounts = {v["target"]: v for v in compose_config["services"]["tempo"]["volumes"]}
    assert mounts["/var/tempo"]["type"] == "volume"
    for path in (storage["wal"]["path"], storage["local"]["path"]):
        assert path.startswith("/var/tempo/"), f"{path} is not on the tempo-data volume"
    port = tempo["server"]["http_listen_port"]
    assert port in container_ports(compose_config, "tempo")
    retention = tempo["backend_scheduler"]["provider"]["compaction"]["compaction"]["block_retention"]
    assert retention.endswith("h")
    # the compose command points Tempo at this file
    assert "-config.file=/etc/tempo.yaml" in compose_config["services"]["tempo"]["command"]
    assert mounts["/etc/tempo.yaml"]["source"] == str(TEMPO_CONFIG)


# Tempo 3.0.3's overrides layout (modules/overrides/config.go: Config, Overrides, IngestionOverrides,
# GlobalOverrides). The flat 2.x keys are refused unless `enable_legacy_overrides: true`.
TEMPO_OVERRIDES_KEYS = {
    "defaults",
    "per_tenant_override_config",
    "per_tenant_override_period",
    "user_configurable_overrides",
    "enable_legacy_overrides",
}
TEMPO_DEFAULTS_KEYS = {
    "ingestion",
    "read",
    "compaction",
    "metrics_generator",
    "forwarders",
    "global",
    "storage",
    "cost_attribution",
}
TEMPO_INGESTION_KEYS = {
    "rate_strategy",
    "rate_limit_bytes",
    "burst_size_bytes",
    "max_traces_per_user",
    "max_global_traces_per_user",
    "tenant_shard_size",
    "max_attribute_bytes",
    "artificial_delay",
    "retry_info_enabled",
}
TEMPO_GLOBAL_KEYS = {"max_bytes_per_trace"}


@pytest.fixture(scope="module")
def tempo() -> dict[str, Any]:
    return load_yaml(TEMPO_CONFIG)


def tempo_limits(tempo: dict[str, Any]) -> dict[str, int]:
    defaults = tempo["overrides"]["defaults"]
    protocols = tempo["distributor"]["receivers"]["otlp"]["protocols"]
    return {
        "max_bytes_per_trace": defaults["global"]["max_bytes_per_trace"],
        "rate_limit_bytes": defaults["ingestion"]["rate_limit_bytes"],
        "burst_size_bytes": defaults["ingestion"]["burst_size_bytes"],
        "grpc_server_max_recv_msg_size": tempo["server"]["grpc_server_max_recv_msg_size"],
        "grpc_server_max_send_msg_size": tempo["server"]["grpc_server_max_send_msg_size"],
        "otlp_grpc_max_recv": protocols["grpc"]["max_recv_msg_size_mib"] * MiB,
        "otlp_http_max_body": protocols["http"]["max_request_body_size"],
    }


def test_tempo_overrides_use_the_tempo3_layout(tempo: dict[str, Any]) -> None:
    overrides = tempo["overrides"]
    assert set(overrides) <= TEMPO_OVERRIDES_KEYS, (
        f"unknown (or legacy flat) keys: {sorted(set(overrides) - TEMPO_OVERRIDES_KEYS)}"
    )
    assert not overrides.get("enable_legacy_overrides")
    defaults = overrides["defaults"]
    assert set(defaults) <= TEMPO_DEFAULTS_KEYS, sorted(set(defaults) - TEMPO_DEFAULTS_KEYS)
    assert set(defaults["ingestion"]) <= TEMPO_INGESTION_KEYS, sorted(set(defaults["ingestion"]) - TEMPO_INGESTION_KEYS)
    assert set(defaults["global"]) <= TEMPO_GLOBAL_KEYS, sorted(set(defaults["global"]) - TEMPO_GLOBAL_KEYS)
    assert defaults["ingestion"].get("rate_strategy", "local") == "local"  # one distributor
    limits = tempo_limits(tempo)
    assert all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in limits.values()), limits


def test_tempo_limits_hold_the_projected_traces(tempo: dict[str, Any]) -> None:
    limits = tempo_limits(tempo)
    per_trace = limits["max_bytes_per_trace"]
    # a TP=16 summary (projected ~8 MB) with margin; a whole full-detail TP=2 trace (8.9 MB) too
    assert per_trace >= MARGIN * TP16_SUMMARY_BYTES, limits
    assert per_trace >= MARGIN * TP2_FULL_BYTES, limits
    # a single push larger than the token bucket is always refused: the bucket takes the largest
    # message the receivers accept, and several whole traces arriving together
    assert limits["burst_size_bytes"] >= limits["otlp_grpc_max_recv"], limits
    assert limits["burst_size_bytes"] >= limits["otlp_http_max_body"], limits
    assert limits["burst_size_bytes"] >= 2 * per_trace, limits
    assert limits["rate_limit_bytes"] >= per_trace, "one max-size trace per second at least"
    # one message may carry a whole trace; a trace fetched by id crosses Tempo's own gRPC server
    assert limits["otlp_grpc_max_recv"] >= per_trace and limits["otlp_http_max_body"] >= per_trace, limits
    assert limits["grpc_server_max_recv_msg_size"] >= per_trace, limits
    assert limits["grpc_server_max_send_msg_size"] >= per_trace, limits
    # full detail of large runs is not Tempo's: it is refused there by design (the starttrace
    # service keeps it); the projection itself says why
    assert TP16_FULL_BYTES > per_trace


def test_deploy_doc_explains_the_routing_and_the_limits(tempo: dict[str, Any]) -> None:
    doc = DEPLOY_DOC.read_text(encoding="utf-8")
    for needle in (
        SUMMARY_ATTRIBUTE,
        "otel/opentelemetry-collector-contrib",
        "filter/summary",
        "trace_conditions",
        'span.attributes["starttrace.summary"] != true',
        "jaeger-ui#645",
        "jaeger-ui#562",
        "8.9 MB",
        "71 MB",
        "TP=16",
        "Viewer",
    ):
        assert needle in doc, f"docs/deploy.md does not mention {needle!r}"
    # the limits the page quotes are the ones deploy/tempo.yaml sets
    for key, value in tempo_limits(tempo).items():
        if key.startswith("otlp_"):
            continue
        quoted = re.findall(rf"{key}:\s*(\d+)", doc)
        assert quoted, f"docs/deploy.md does not quote {key}"
        assert {int(q) for q in quoted} == {value}, (key, quoted, value)


# ------------------------------------------------------------------------------------------------
# Prometheus


def scrape_targets(prom: dict[str, Any]) -> dict[str, list[str]]:
    return {
        job["job_name"]: [t for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
        for job in prom["scrape_configs"]
    }


def test_promtool_check_config(promtool: str) -> None:
    proc = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_rejects_a_broken_config(promtool: str, tmp_path: Path) -> None:
    broken = tmp_path / "prometheus.yml"
    broken.write_text(PROMETHEUS_CONFIG.read_text().replace("scrape_interval: 5s", "scrape_interval: soon"))
    proc = subprocess.run([promtool, "check", "config", str(broken)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0


def test_prometheus_scrapes_starttrace_metrics(compose_config: dict[str, Any]) -> None:
    prom = load_yaml(PROMETHEUS_CONFIG)
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    st = jobs["starttrace"]
    assert st.get("metrics_path", "/metrics") == "/metrics"
    assert scrape_targets(prom)["starttrace"] == ["starttrace:4318"]
    for job, targets in scrape_targets(prom).items():
        for target in targets:
            host, _port = host_port(target)
            if host == "localhost":
                continue
            assert host in compose_config["services"], f"job {job} scrapes unknown host {host}"
    assert 4318 in container_ports(compose_config, "starttrace")
    mounts = {v["target"]: v for v in compose_config["services"]["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"]["source"] == str(PROMETHEUS_CONFIG)
    assert "--config.file=/etc/prometheus/prometheus.yml" in compose_config["services"]["prometheus"]["command"]


# ------------------------------------------------------------------------------------------------
# Grafana provisioning


def test_grafana_datasources(compose_config: dict[str, Any]) -> None:
    sources = provisioned_datasources()
    by_type = {ds["type"]: ds for ds in sources.values()}
    assert set(by_type) == {"prometheus", "tempo", "jaeger", "grafana-clickhouse-datasource"}
    assert len(sources) == 4, "data source uids must be unique"
    ch = by_type["grafana-clickhouse-datasource"]  # the official plugin, by its type name
    assert ch["uid"] == "starttrace-clickhouse"
    assert (ch["jsonData"]["host"], ch["jsonData"]["port"], ch["jsonData"]["protocol"]) == ("clickhouse", 8123, "http")
    assert 8123 in container_ports(compose_config, "clickhouse")
    assert ch["secureJsonData"]["password"] == "$__env{CLICKHOUSE_PASSWORD}"
    grafana = compose_config["services"]["grafana"]
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_PLUGINS_PREINSTALL"].split(",")
    assert "CLICKHOUSE_PASSWORD" in grafana["environment"]
    expected = {"prometheus": ("prometheus", 9090), "tempo": ("tempo", 3200), "jaeger": ("jaeger", 16686)}
    for kind, (service, port) in expected.items():
        ds = by_type[kind]
        assert ds["uid"] == f"starttrace-{kind}", "fixed uids: the dashboards refer to them"
        assert host_port(ds["url"]) == (service, port)
        assert ds.get("access", "proxy") == "proxy"
        assert port in container_ports(compose_config, service)
    assert sum(bool(ds.get("isDefault")) for ds in sources.values()) == 1
    tempo_port = load_yaml(TEMPO_CONFIG)["server"]["http_listen_port"]
    assert host_port(by_type["tempo"]["url"])[1] == tempo_port


def test_grafana_mounts_match_provisioning(compose_config: dict[str, Any]) -> None:
    grafana = compose_config["services"]["grafana"]
    mounts = {v["target"]: v for v in grafana["volumes"]}
    prov = mounts["/etc/grafana/provisioning"]
    assert prov["type"] == "bind" and Path(prov["source"]) == GRAFANA_PROVISIONING
    for sub in ("datasources", "dashboards"):
        files = list((GRAFANA_PROVISIONING / sub).glob("*.y*ml"))
        assert files, f"no provisioning file in {GRAFANA_PROVISIONING / sub}"
    providers = [
        p for f in (GRAFANA_PROVISIONING / "dashboards").glob("*.y*ml") for p in load_yaml(f).get("providers") or []
    ]
    assert providers
    for provider in providers:
        assert provider["type"] == "file"
        path = provider["options"]["path"]
        assert path in mounts, f"dashboard provider reads {path}, which compose does not mount"
        source = Path(mounts[path]["source"])
        assert source == DASHBOARDS_DIR
        assert sorted(source.rglob("*.json")) == dashboard_files() and dashboard_files()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    dash_mount = next(t for t in mounts if home.startswith(t + "/"))
    assert (Path(mounts[dash_mount]["source"]) / home[len(dash_mount) + 1 :]).is_file(), home


def test_collector_sends_full_detail_to_clickhouse(collector: dict[str, Any], compose_config: dict[str, Any]) -> None:
    """The clickhouse exporter is in the full-detail pipeline (no filter), writes otel.otel_traces
    (the table starttrace's ClickHouse source reads) and creates it with its own DDL."""
    cfg = collector["exporters"]["clickhouse"]
    assert "clickhouse" in collector["service"]["pipelines"][FULL_PIPELINE]["exporters"]
    assert not processors_of(collector, FULL_PIPELINE, "filter")
    for name in SUMMARY_PIPELINES:
        assert "clickhouse" not in collector["service"]["pipelines"][name]["exporters"]
    url = urlsplit(cfg["endpoint"])
    assert (url.scheme, url.hostname, url.port) == ("tcp", "clickhouse", 9000)
    assert url.port in container_ports(compose_config, "clickhouse")
    assert (cfg["database"], cfg["traces_table_name"], cfg["create_schema"]) == ("otel", "otel_traces", True)
    assert cfg["password"] == "${env:CLICKHOUSE_PASSWORD}"
    assert cfg["retry_on_failure"]["enabled"] is True
