"""deploy/: the OpenTelemetry Collector, Tempo, Prometheus and Grafana provisioning configs,
checked on their own and against docker-compose.yml (host names, ports, mount paths)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from deploy_helpers import (
    COLLECTOR_CONFIG,
    DASHBOARDS_DIR,
    GRAFANA_PROVISIONING,
    PROMETHEUS_CONFIG,
    TEMPO_CONFIG,
    dashboard_files,
    load_yaml,
    provisioned_datasources,
)

DEPRECATED_EXPORTERS = {"otlp", "otlphttp", "logging", "jaeger", "jaeger_thrift"}
KINDS = ("receivers", "processors", "exporters", "connectors")


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


def test_collector_pipelines_use_only_defined_components(collector: dict[str, Any]) -> None:
    pipelines = collector["service"]["pipelines"]
    assert "traces" in pipelines
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
    assert set(collector["service"]["pipelines"]["traces"]["exporters"]) >= {
        "otlp_grpc/jaeger",
        "otlp_grpc/tempo",
        "otlp_http/starttrace",
    }


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


def test_tempo_config_is_tempo3_monolithic_with_otlp(compose_config: dict[str, Any]) -> None:
    tempo = load_yaml(TEMPO_CONFIG)
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
    assert set(by_type) == {"prometheus", "tempo", "jaeger"}
    assert len(sources) == 3, "data source uids must be unique"
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
