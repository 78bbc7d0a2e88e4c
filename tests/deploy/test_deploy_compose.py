"""docker-compose.yml and .env, checked with the real Docker Compose v2 parser and the compose spec."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import (
    COMPOSE_FILE,
    DOCKERFILE,
    ENV_FILE,
    REPO,
    read_env_file,
    run_compose,
    venv_tool,
)

# images whose containers have no shell and no HTTP client: Docker cannot probe them from inside
DISTROLESS = {"otel-collector", "tempo"}
# service -> container path that must be a named volume (state that survives `docker compose down`)
STATEFUL = {
    "starttrace": "/data",
    "tempo": "/var/tempo",
    "prometheus": "/prometheus",
    "grafana": "/var/lib/grafana",
    "clickhouse": "/var/lib/clickhouse",
    "starttrace-fleet": "/data",
}
EXPECTED_IMAGES = {
    # contrib: the core image has no business here (the filter processor routes by detail)
    "otel-collector": ("otel/opentelemetry-collector-contrib", "OTELCOL_VERSION"),
    "jaeger": ("jaegertracing/jaeger", "JAEGER_VERSION"),
    "tempo": ("grafana/tempo", "TEMPO_VERSION"),
    "prometheus": ("prom/prometheus", "PROMETHEUS_VERSION"),
    "grafana": ("grafana/grafana", "GRAFANA_VERSION"),
    "clickhouse": ("clickhouse/clickhouse-server", "CLICKHOUSE_VERSION"),
}


def test_compose_binary_is_the_real_parser(compose_bin: Path) -> None:
    proc = subprocess.run([str(compose_bin), "version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Docker Compose version v2." in proc.stdout


def test_compose_config_parses(compose_bin: Path) -> None:
    proc = run_compose(compose_bin, COMPOSE_FILE, "config", "-q")
    assert proc.returncode == 0, f"docker compose config -q failed:\n{proc.stderr}"


BROKEN = {
    # a dependency on a service that does not exist
    "undefined-dependency": lambda s: s.replace(
        "      jaeger:\n        condition: service_healthy\n      tempo:",
        "      jaegerr:\n        condition: service_healthy\n      tempo:",
        1,
    ),
    # a key the compose spec does not have
    "unknown-key": lambda s: s.replace(
        "    restart: unless-stopped\n", "    restart: unless-stopped\n    portz: [1]\n", 1
    ),
    # invalid YAML
    "yaml-syntax": lambda s: s.replace("services:\n", "services:\n  broken: [\n", 1),
    # a port that is not a port
    "bad-port": lambda s: s.replace(":${STARTTRACE_UI_PORT:-8318}:4318", ":${STARTTRACE_UI_PORT:-8318}:notaport", 1),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_compose_config_rejects_a_broken_copy(compose_bin: Path, tmp_path: Path, kind: str) -> None:
    """The check has teeth: the same command fails on a deliberately broken copy."""
    original = COMPOSE_FILE.read_text(encoding="utf-8")
    broken = BROKEN[kind](original)
    assert broken != original, f"the {kind} mutation did not apply: update the test"
    path = tmp_path / "docker-compose.yml"
    path.write_text(broken, encoding="utf-8")
    proc = run_compose(compose_bin, path, "config", "-q")
    assert proc.returncode != 0, f"compose accepted a broken file ({kind})"


def test_compose_needs_the_pinned_versions_of_env(compose_bin: Path, tmp_path: Path) -> None:
    """Without .env the image versions are missing: compose refuses instead of pulling `latest`."""
    empty = tmp_path / "empty.env"
    empty.write_text("", encoding="utf-8")
    proc = run_compose(compose_bin, COMPOSE_FILE, "config", "-q", env_file=empty)
    assert proc.returncode != 0
    assert "set" in proc.stderr and "in .env" in proc.stderr, proc.stderr


def test_compose_spec_schema() -> None:
    tool = venv_tool("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    proc = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_spec_schema_rejects_a_broken_copy(tmp_path: Path) -> None:
    tool = venv_tool("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    path = tmp_path / "docker-compose.yml"
    path.write_text(BROKEN["unknown-key"](COMPOSE_FILE.read_text(encoding="utf-8")), encoding="utf-8")
    proc = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0


def test_every_host_port_is_loopback_only(compose_config: dict[str, Any]) -> None:
    published = []
    for name, svc in compose_config["services"].items():
        for port in svc.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published.append((name, int(port["published"]), int(port["target"])))
    hosts = [p for _, p, _ in published]
    assert len(hosts) == len(set(hosts)), f"two services publish the same host port: {published}"
    by_service = {(n, t): p for n, p, t in published}
    env = read_env_file()
    # traced programs point OTEL_EXPORTER_OTLP_ENDPOINT at the collector on the host's 4317/4318
    assert by_service[("otel-collector", 4318)] == int(env["OTLP_HTTP_PORT"]) == 4318
    assert by_service[("otel-collector", 4317)] == int(env["OTLP_GRPC_PORT"]) == 4317
    # the starttrace UI is on a different host port (4318 belongs to the collector)
    assert by_service[("starttrace", 4318)] == int(env["STARTTRACE_UI_PORT"]) == 8318
    assert ("grafana", 3000) in by_service
    assert ("jaeger", 16686) in by_service
    assert ("prometheus", 9090) in by_service


def test_images_are_pinned_from_env(compose_config: dict[str, Any]) -> None:
    env = read_env_file()
    raw = COMPOSE_FILE.read_text(encoding="utf-8")
    for name, (repo, var) in EXPECTED_IMAGES.items():
        image = compose_config["services"][name]["image"]
        assert image == f"{repo}:{env[var]}", f"{name}: {image}"
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", env[var]), f"{var}={env[var]} is not an exact version"
        assert f"${{{var}:?" in raw, f"{name} must fail loudly when {var} is not set"
    assert env["JAEGER_VERSION"] == "2.20.0"  # later releases drop the API Grafana's Jaeger source uses
    assert env["OTELCOL_VERSION"] == "0.159.0"
    assert env["TEMPO_VERSION"].split(".")[0] == "3"
    assert env["GRAFANA_VERSION"].split(".")[0] == "13"
    for svc in compose_config["services"].values():
        assert not svc.get("image", "").endswith(":latest")


def test_healthchecks(compose_config: dict[str, Any]) -> None:
    services = compose_config["services"]
    for name, svc in services.items():
        if name in DISTROLESS:
            # no probe can run inside; their health endpoints are published for an outside probe
            assert "healthcheck" not in svc or svc["healthcheck"].get("disable")
            continue
        hc = svc.get("healthcheck")
        assert hc and hc.get("test"), f"{name} has no healthcheck"
        assert hc["test"][0] in ("CMD", "CMD-SHELL")
        assert "127.0.0.1" in " ".join(hc["test"]), f"{name}: probe the container's own loopback"
    # the collector's health_check extension and Tempo's /ready are reachable from the host
    targets = {(n, int(p["target"])) for n, s in services.items() for p in s.get("ports") or []}
    assert ("otel-collector", 13133) in targets
    assert ("tempo", 3200) in targets
    # the starttrace probe is the image's: python stdlib urllib on /healthz
    st = services["starttrace"]["healthcheck"]["test"]
    assert st[:3] == ["CMD", "python", "-c"] and "urllib.request" in st[3] and "/healthz" in st[3]


def test_dependencies_wait_for_health(compose_config: dict[str, Any]) -> None:
    services = compose_config["services"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            want = "service_started" if dep in DISTROLESS else "service_healthy"
            assert cond["condition"] == want, f"{name} -> {dep}: {cond}"
    assert "starttrace" in services["otel-collector"]["depends_on"]
    assert "starttrace" in services["prometheus"]["depends_on"]


def test_named_volumes_for_state(compose_config: dict[str, Any]) -> None:
    declared = set(compose_config.get("volumes") or {})
    for name, target in STATEFUL.items():
        mounts = {v["target"]: v for v in compose_config["services"][name].get("volumes") or []}
        assert target in mounts, f"{name} keeps no state at {target}"
        assert mounts[target]["type"] == "volume", f"{name}:{target} must be a named volume"
        assert mounts[target]["source"] in declared


def test_bind_mounts_exist_and_are_read_only(compose_config: dict[str, Any]) -> None:
    seen = 0
    for name, svc in compose_config["services"].items():
        for v in svc.get("volumes") or []:
            if v["type"] != "bind":
                continue
            seen += 1
            source = Path(v["source"])
            assert source.exists(), f"{name}: bind source {source} does not exist"
            assert REPO in source.parents, f"{name}: {source} is outside the repository"
            assert v.get("read_only") is True, f"{name}: mount {source} read-only"
    assert seen >= 5


def test_starttrace_service_is_built_and_binds_all_interfaces_inside(compose_config: dict[str, Any]) -> None:
    st = compose_config["services"]["starttrace"]
    assert Path(st["build"]["context"]) == REPO
    assert st["build"]["dockerfile"] == "Dockerfile"
    assert not st.get("entrypoint"), "keep the image's entrypoint (starttrace serve --host 0.0.0.0 ...)"
    text = DOCKERFILE.read_text(encoding="utf-8")
    entry = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
    assert entry, "Dockerfile has no exec-form ENTRYPOINT"
    argv = __import__("json").loads(entry.group(1)) + list(st.get("command") or [])
    assert argv[:2] == ["starttrace", "serve"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "4318"
    assert "--db" in argv and "--journal-dir" in argv
    for flag in ("--db", "--journal-dir"):
        assert argv[argv.index(flag) + 1].startswith("/data/"), f"{flag} must live on the /data volume"


def test_env_file_documents_every_variable_compose_uses() -> None:
    raw = COMPOSE_FILE.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", raw))
    env = read_env_file(ENV_FILE)
    assert used <= set(env), f"set in .env: {sorted(used - set(env))}"


def test_deploy_doc_names_the_pinned_versions() -> None:
    doc = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    env = read_env_file(ENV_FILE)
    for var in ("OTELCOL_VERSION", "JAEGER_VERSION", "TEMPO_VERSION", "PROMETHEUS_VERSION", "GRAFANA_VERSION"):
        assert env[var] in doc, f"docs/deploy.md does not mention {var}={env[var]}"
    assert "VLLM_STARTTRACE=1 OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318" in doc


def test_collector_is_the_pinned_contrib_distribution(compose_config: dict[str, Any]) -> None:
    env = read_env_file()
    collector = compose_config["services"]["otel-collector"]
    assert collector["image"] == f"otel/opentelemetry-collector-contrib:{env['OTELCOL_VERSION']}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", env["OTELCOL_VERSION"])
    # the config file compose mounts is the one the command names (the contrib image's own
    # default is /etc/otelcol-contrib/config.yaml; the command makes it explicit)
    configs = [a.split("=", 1)[1] for a in collector["command"] if a.startswith("--config=")]
    assert len(configs) == 1, collector["command"]
    mounts = {v["target"]: v for v in collector["volumes"]}
    assert configs[0] in mounts, (configs, sorted(mounts))
    assert Path(mounts[configs[0]]["source"]) == REPO / "deploy" / "otel-collector.yaml"


def test_grafana_anonymous_visitors_are_viewers(compose_config: dict[str, Any]) -> None:
    grafana = compose_config["services"]["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer", "anonymous access must never be Admin or Editor"
    assert read_env_file()["GRAFANA_ANONYMOUS_ROLE"] == "Viewer"
    raw = COMPOSE_FILE.read_text(encoding="utf-8")
    fallback = re.search(r"GF_AUTH_ANONYMOUS_ORG_ROLE:\s*\$\{GRAFANA_ANONYMOUS_ROLE:-(\w+)\}", raw)
    assert fallback and fallback.group(1) == "Viewer", "without .env, anonymous must still be Viewer"


def test_grafana_admin_password_comes_from_env(
    compose_bin: Path, compose_config: dict[str, Any], tmp_path: Path
) -> None:
    grafana = compose_config["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == read_env_file()["GRAFANA_ADMIN_PASSWORD"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] not in ("", "admin"), "not Grafana's well-known default"
    raw = COMPOSE_FILE.read_text(encoding="utf-8")
    assert "${GRAFANA_ADMIN_PASSWORD:?" in raw, "no fallback password in docker-compose.yml"
    # without it in .env, compose refuses to start the stack (and says what to set)
    env = tmp_path / "no-password.env"
    lines = ENV_FILE.read_text(encoding="utf-8").splitlines()
    env.write_text("\n".join(ln for ln in lines if not ln.startswith("GRAFANA_ADMIN_PASSWORD=")) + "\n")
    proc = run_compose(compose_bin, COMPOSE_FILE, "config", "-q", env_file=env)
    assert proc.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in proc.stderr, proc.stderr


def test_clickhouse_and_the_fleet_service(compose_config: dict[str, Any]) -> None:
    """ClickHouse holds full detail (the Collector's clickhouse exporter); starttrace-fleet is the
    starttrace image reading runs from it (docs/fleet.md)."""
    services = compose_config["services"]
    env = read_env_file()
    ch = services["clickhouse"]
    assert ch["environment"]["CLICKHOUSE_DB"] == "otel"
    assert ch["environment"]["CLICKHOUSE_PASSWORD"] == env["CLICKHOUSE_PASSWORD"]
    raw = COMPOSE_FILE.read_text(encoding="utf-8")
    assert "${CLICKHOUSE_PASSWORD:?" in raw, "no fallback password in docker-compose.yml"
    # the exporter's password reaches the collector from .env, never from the config file
    assert services["otel-collector"]["environment"]["CLICKHOUSE_PASSWORD"] == env["CLICKHOUSE_PASSWORD"]
    assert services["otel-collector"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    fleet = services["starttrace-fleet"]
    assert fleet["image"] == services["starttrace"]["image"], "the same image as the starttrace service"
    assert not fleet.get("entrypoint") and fleet["command"] == ["--no-journal"]
    url = fleet["environment"]["STARTTRACE_CLICKHOUSE"]
    assert url == f"http://starttrace:{env['CLICKHOUSE_PASSWORD']}@clickhouse:8123/otel"
    from starttrace.sources.clickhouse.client import parse_url

    parsed = parse_url(url)
    assert (parsed.host, parsed.port, parsed.database, parsed.table) == ("clickhouse", 8123, "otel", "otel_traces")
    published = {int(p["target"]): int(p["published"]) for p in fleet["ports"]}
    assert published == {4318: int(env["STARTTRACE_FLEET_PORT"])}
