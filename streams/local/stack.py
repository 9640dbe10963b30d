"""A real Kafka broker and schema registry on this machine, started by the project itself.

The project's machines have no Docker engine, but Maven Central is reachable. So the dev and
test infrastructure is fetched from there once, cached outside the repository, and run as
plain JVM processes on 127.0.0.1:

- Apache Kafka (KRaft, one node acting as broker and controller; or, with ``brokers=3``,
  three such nodes forming one cluster, each a JVM of its own), with a log4j2 binding so every
  broker writes a log file instead of running silently.
- Apicurio Registry, whose Confluent-compatible API (``/apis/ccompat/v7``) is what
  confluent-kafka's ``SchemaRegistryClient`` talks to.

Both are started detached (their own session), so they outlive the command or test session
that started them; ``down()`` stops them. Everything lives in a cache directory
(``$VIGIL_CACHE_DIR`` or ``~/.cache/vigil``) and a state directory
(``$VIGIL_DEV_STATE_DIR`` or ``<cache>/dev``): data, logs and pid files.

When ``KAFKA_BOOTSTRAP_SERVERS`` and ``SCHEMA_REGISTRY_URL`` are both set, that cluster is
used and nothing is started (see ``cluster_from_env``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("vigil.localstack")

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
APICURIO_VERSION = "3.0.9"
# Pinned so the download does not depend on which plugin version the local Maven defaults to.
# 2.8 (Maven 3.8's default), not 3.x: 3.x's ``copy`` insists on reading the artifact's parent
# POM, and io.apicurio:apicurio-registry:3.0.9's POM is not served by the registry here.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:2.8"
MIN_JAVA = 17  # Kafka 4.x brokers and Apicurio 3.0.x / 3.1.x both run on Java 17.

DEFAULT_KAFKA_PORT = 19092
DEFAULT_REGISTRY_PORT = 18081
CCOMPAT_PATH = "/apis/ccompat/v7"

KAFKA_HEAP = "-Xmx1g"
#: each node's heap in a cluster of several: three brokers with a dev stack's load fit well in
#: it, and three 1 GiB JVMs would not on a small machine
CLUSTER_NODE_HEAP = "-Xmx384m"
REGISTRY_MAX_SUBJECTS = 1_000_000
REGISTRY_HEAP = "-Xmx512m"

SERVICES = ("kafka", "registry")
#: brokers ``vigil dev up --brokers`` accepts: one, or a cluster with a controller quorum
#: (an odd number of voters: three tolerates the loss of one, five of two)
BROKER_CHOICES = (1, 3, 5)

_COMPLETE_MARKER = ".complete"
_MAVEN_TIMEOUT_S = 900.0
_STOP_TIMEOUT_S = 30.0


class LocalStackError(RuntimeError):
    """The local infrastructure could not be fetched, started or reached."""


@dataclass(frozen=True)
class Cluster:
    """Where a Kafka cluster and its schema registry answer."""

    bootstrap_servers: str
    schema_registry_url: str


@dataclass(frozen=True)
class Settings:
    """Paths and ports of the local stack, from the environment with sane defaults."""

    cache_dir: Path
    state_dir: Path
    kafka_port: int
    controller_port: int
    registry_port: int
    #: brokers asked for (``vigil dev up --brokers``): a fresh state dir gets a cluster of
    #: that many; one that holds a cluster of another size is refused. None: the size the
    #: state dir holds, one if fresh (``brokers_of``). Node ``i`` (from 1) listens on
    #: ``kafka_port + 2 (i - 1)`` and ``controller_port + 2 (i - 1)``.
    brokers: int | None = None

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``VIGIL_CACHE_DIR``, ``VIGIL_DEV_STATE_DIR`` and the ``VIGIL_DEV_*_PORT``s."""
        cache = Path(os.environ.get("VIGIL_CACHE_DIR") or Path.home() / ".cache" / "vigil")
        state = Path(os.environ.get("VIGIL_DEV_STATE_DIR") or cache / "dev")
        kafka_port = _env_port("VIGIL_DEV_KAFKA_PORT", DEFAULT_KAFKA_PORT)
        return cls(
            cache_dir=cache.expanduser().resolve(),
            state_dir=state.expanduser().resolve(),
            kafka_port=kafka_port,
            controller_port=_env_port("VIGIL_DEV_CONTROLLER_PORT", kafka_port + 1),
            registry_port=_env_port("VIGIL_DEV_REGISTRY_PORT", DEFAULT_REGISTRY_PORT),
        )

    # Layout. Downloads are versioned so an upgrade fetches next to the old copy.
    @property
    def kafka_home(self) -> Path:
        return self.cache_dir / f"kafka-{KAFKA_VERSION}"

    @property
    def registry_home(self) -> Path:
        return self.cache_dir / f"apicurio-registry-{APICURIO_VERSION}"

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def pid_file(self, service: str) -> Path:
        return self.state_dir / f"{service}.pid"

    def log_file(self, service: str) -> Path:
        """The file where the service's stdout and stderr go."""
        return self.logs_dir / f"{service}.out"

    @property
    def kafka_server_log(self) -> Path:
        """The broker's own log4j2 log (stdout only carries JVM-level failures)."""
        return self.server_log("kafka")

    def server_log(self, node: str) -> Path:
        """The log4j2 log of the broker ``node`` ("kafka", "kafka-2", ...)."""
        return self.logs_dir / f"{node}-server.log"

    @property
    def brokers_file(self) -> Path:
        """How many brokers the cluster in the data dir was formatted for."""
        return self.data_dir / "brokers"

    def brokers_of(self) -> int:
        """The size of the cluster in the data dir: written when it was formatted; a data
        dir formatted before the file existed holds one broker; a fresh one takes
        ``brokers`` (one if not given)."""
        try:
            return int(self.brokers_file.read_text().strip())
        except (OSError, ValueError):
            pass
        if (self.data_dir / "kafka" / "meta.properties").exists():
            return 1
        return self.brokers or 1

    def kafka_nodes(self) -> tuple[str, ...]:
        """The broker processes of the cluster: "kafka" (node 1), "kafka-2", ..."""
        return tuple(node_name(i) for i in range(1, self.brokers_of() + 1))

    def kafka_port_of(self, node: str) -> int:
        return self.kafka_port + 2 * (node_index(node) - 1)

    def controller_port_of(self, node: str) -> int:
        return self.controller_port + 2 * (node_index(node) - 1)

    @property
    def cluster(self) -> Cluster:
        return Cluster(
            bootstrap_servers=",".join(
                f"127.0.0.1:{self.kafka_port_of(node)}" for node in self.kafka_nodes()
            ),
            schema_registry_url=f"http://127.0.0.1:{self.registry_port}{CCOMPAT_PATH}",
        )


def node_name(index: int) -> str:
    """The process name of broker node ``index`` (from 1): node 1 is "kafka", as a single
    broker always was, so that a running single-broker stack stays found."""
    return "kafka" if index == 1 else f"kafka-{index}"


def node_index(node: str) -> int:
    return 1 if node == "kafka" else int(node.removeprefix("kafka-"))


def _kind(service: str) -> str:
    """ "kafka" for every broker node, "registry" for the registry."""
    return "kafka" if service.startswith("kafka") else service


def _processes(s: Settings, services: Sequence[str]) -> list[str]:
    """The processes of ``services`` ("kafka" meaning every broker node), in start order."""
    out: list[str] = []
    if "kafka" in services:
        out += s.kafka_nodes()
    if "registry" in services:
        out.append("registry")
    return out


def _env_port(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise LocalStackError(f"{name}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise LocalStackError(f"{name}={raw!r} is not a port number")
    return port


# --------------------------------------------------------------------------- public API


def cluster_from_env() -> Cluster | None:
    """The cluster named by ``KAFKA_BOOTSTRAP_SERVERS`` and ``SCHEMA_REGISTRY_URL``, if set.

    Only one of the two being set is a configuration mistake, not a request for a local
    stack: silently starting one would hide that the other setting was ignored.
    """
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    registry = os.environ.get("SCHEMA_REGISTRY_URL", "").strip()
    if bootstrap and registry:
        return Cluster(bootstrap_servers=bootstrap, schema_registry_url=registry.rstrip("/"))
    if bootstrap or registry:
        missing = "SCHEMA_REGISTRY_URL" if bootstrap else "KAFKA_BOOTSTRAP_SERVERS"
        raise LocalStackError(
            f"{missing} is not set while its partner is; set both to use an existing "
            "cluster, or neither to start the local one"
        )
    return None


def up(
    reset: bool = False,
    timeout: float = 120.0,
    settings: Settings | None = None,
    services: Sequence[str] = SERVICES,
) -> Cluster:
    """Make the local broker(s) and registry run and answer; return where they are.

    Idempotent: services already running and answering are left alone; a pid file whose
    process is gone (a crash, a reboot) is cleaned up and the service started again.
    With ``reset``, both services are stopped and their data deleted first. ``services``
    chooses what to run ("kafka" alone: a cluster whose registry is elsewhere).

    A fresh (or reset) state dir gets a cluster of ``settings.brokers``; one that holds a
    cluster of another size is refused: its controller quorum was formatted for that size.

    Ready means: every service answers, a cluster lists all its brokers, and brokers started
    by this call give an idempotent producer its id and a consumer group its coordinator at
    once (``_warm_up``). ``timeout`` bounds each of these waits (downloads are not counted);
    a broker that keeps logging while it recovers its data is waited for longer
    (``_wait_ready``).
    """
    s = settings or Settings.from_env()
    _check_services(services)
    with _locked(s.state_dir):
        if reset:
            _stop(s, _processes(s, SERVICES))
            _wipe_data(s)
        if s.brokers is not None and s.brokers not in BROKER_CHOICES:
            raise LocalStackError(f"brokers={s.brokers}: must be one of {BROKER_CHOICES}")
        if s.brokers is not None and s.brokers_of() != s.brokers:
            raise LocalStackError(
                f"{s.data_dir} holds a cluster of {s.brokers_of()} broker(s), not "
                f"{s.brokers}; `vigil dev up --reset --brokers {s.brokers}` deletes its data "
                "and starts one of that size"
            )
        processes = _processes(s, services)
        started: list[str] = []
        try:
            # Fetch and start Kafka first, so the brokers boot while the registry downloads.
            to_start = [service for service in processes if _needs_start(s, service)]
            nodes = [service for service in to_start if _kind(service) == "kafka"]
            if nodes:
                _prepare(s, "kafka")
                _format_storage(s, str(find_java()), nodes)
            for service in to_start:
                if _kind(service) != "kafka":
                    _prepare(s, service)
                _start(s, service)
                started.append(service)
            for service in processes:
                _wait_ready(s, service, timeout, announce=service in started)
            if "kafka" in services:
                _wait_for_brokers(s, timeout)
                fresh = [node for node in started if _kind(node) == "kafka"]
                if fresh:
                    _warm_up(s, fresh, timeout)
        except BaseException:
            # Do not leave half-started processes behind on a failed (or interrupted) start.
            _stop(s, started)
            raise
        if started:
            log.info("started %s", ", ".join(started))
    return s.cluster


def _check_services(services: Sequence[str]) -> None:
    unknown = set(services) - set(SERVICES)
    if unknown:
        raise ValueError(f"unknown services: {sorted(unknown)}")


def down(services: Sequence[str] = SERVICES, settings: Settings | None = None) -> None:
    """Stop the local services (SIGTERM to their process group, then SIGKILL; "kafka": every
    broker node). Keeps data."""
    s = settings or Settings.from_env()
    _check_services(services)
    with _locked(s.state_dir):
        _stop(s, _processes(s, services))


def wipe(settings: Settings | None = None) -> None:
    """Stop both services and delete their data (topics, offsets, schemas); keep downloads."""
    s = settings or Settings.from_env()
    with _locked(s.state_dir):
        _stop(s, _processes(s, SERVICES))
        _wipe_data(s)


def status(settings: Settings | None = None) -> dict[str, dict[str, Any]]:
    """For each process (every broker node: "kafka", "kafka-2", ...; "registry"): pid,
    running (our process alive), answering, address, log file."""
    s = settings or Settings.from_env()
    result: dict[str, dict[str, Any]] = {}
    for service in _processes(s, SERVICES):
        pid = _live_pid(s, service)
        result[service] = {
            "pid": pid,
            "running": pid is not None,
            "answering": _answering(s, service),
            "address": _address(s, service),
            "log": str(s.server_log(service) if _kind(service) == "kafka" else s.log_file(service)),
        }
    return result


def is_running(settings: Settings | None = None) -> dict[str, bool]:
    """Which services have a live process of ours ("kafka": every broker node) (cheap: no
    network calls)."""
    s = settings or Settings.from_env()
    return {
        service: all(_live_pid(s, p) is not None for p in _processes(s, [service]))
        for service in SERVICES
    }


def broker_pids(settings: Settings) -> dict[int, int]:
    """The pid of each running broker node by its node id (the broker id Kafka reports), for
    tests that stop one broker of a cluster."""
    out = {}
    for node in settings.kafka_nodes():
        pid = _live_pid(settings, node)
        if pid is not None:
            out[node_index(node)] = pid
    return out


# --------------------------------------------------------------------------- downloads


def _prepare(s: Settings, service: str) -> None:
    """Fetch the service's binaries into the cache unless a complete copy is there.

    The cache may be shared by several state dirs, hence its own lock.
    """
    with _locked(s.cache_dir):
        if service == "kafka":
            _fetch_kafka(s)
        else:
            _fetch_registry(s)


def _fetch_kafka(s: Settings) -> None:
    home = s.kafka_home
    if (home / _COMPLETE_MARKER).exists() and (home / "libs").is_dir():
        return
    log.info("downloading Apache Kafka %s from Maven Central into %s", KAFKA_VERSION, home)
    libs = home / "libs"
    shutil.rmtree(libs, ignore_errors=True)  # a half download is redone from scratch
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(_kafka_pom())
    _maven(
        [
            "-f",
            str(home / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ],
        cwd=home,
    )
    if not any(libs.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        raise LocalStackError(f"Maven finished but {libs} has no kafka_2.13-{KAFKA_VERSION}.jar")
    (home / _COMPLETE_MARKER).write_text(f"{time.time()}\n")


def _kafka_pom() -> str:
    # kafka_2.13 4.1.x depends on slf4j-api 1.7.x, so the binding is log4j-slf4j-impl (the
    # slf4j 1.x one), not log4j-slf4j2-impl: with a mismatched binding the broker logs nothing.
    deps = [
        ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ]
    dep_xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by vigil (streams/local/stack.py) to fetch the broker's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>vigil.localstack</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{dep_xml}
  </dependencies>
</project>
"""


def _fetch_registry(s: Settings) -> None:
    home = s.registry_home
    if (home / _COMPLETE_MARKER).exists() and (home / "app").is_dir():
        return
    log.info("downloading Apicurio Registry %s from Maven Central into %s", APICURIO_VERSION, home)
    shutil.rmtree(home, ignore_errors=True)
    download = home / "download"
    download.mkdir(parents=True)
    _maven(
        [
            f"{DEPENDENCY_PLUGIN}:copy",
            f"-Dartifact=io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all",
            f"-DoutputDirectory={download}",
        ],
        cwd=home,
    )
    tarballs = list(download.glob("*.tar.gz"))
    if len(tarballs) != 1:
        raise LocalStackError(f"expected one Apicurio tarball in {download}, found {tarballs}")
    app = home / "app"
    with tarfile.open(tarballs[0]) as tar:
        tar.extractall(app, filter="data")
    shutil.rmtree(download)  # 100+ MB that the unpacked copy makes useless
    _registry_jar(s)  # fail now, not at start, if the layout is not what we expect
    (home / _COMPLETE_MARKER).write_text(f"{time.time()}\n")


def _registry_jar(s: Settings) -> Path:
    """The runnable jar of the unpacked assembly.

    The 3.0.x ``all`` assembly is a Quarkus legacy-jar (``*-runner.jar`` beside ``lib/``);
    newer ones use the fast-jar layout (``quarkus-run.jar``). Accept both.
    """
    app = s.registry_home / "app"
    candidates = sorted(app.rglob("quarkus-run.jar")) or sorted(app.rglob("*-runner.jar"))
    if not candidates:
        raise LocalStackError(f"no quarkus-run.jar or *-runner.jar under {app}")
    return candidates[0]


def _maven(args: list[str], cwd: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalStackError("Maven (mvn) is not on PATH; it is needed once to fetch the jars")
    cmd = [mvn, "-q", "-B", *args]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_MAVEN_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LocalStackError(
            f"Maven did not finish in {_MAVEN_TIMEOUT_S:.0f}s: {' '.join(cmd)}"
        ) from None
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip().splitlines()[-40:]
        raise LocalStackError(
            f"Maven failed (exit {proc.returncode}): {' '.join(cmd)}\n" + "\n".join(output)
        )
    log.info("maven done in %.1fs", time.monotonic() - started)


# --------------------------------------------------------------------------- java


def find_java() -> Path:
    """A ``java`` of at least version 17.

    Order: ``$VIGIL_JAVA``, ``$JAVA_HOME/bin/java``, ``java`` on PATH, then JDKs under
    /usr/lib/jvm (newest first), so a machine whose default Java is older still works when
    a newer JDK is installed beside it.
    """
    candidates: list[Path] = []
    for raw in (os.environ.get("VIGIL_JAVA"), os.environ.get("JAVA_HOME")):
        if raw:
            p = Path(raw)
            candidates.append(p / "bin" / "java" if p.is_dir() else p)
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path))
    jvm_root = Path("/usr/lib/jvm")
    if jvm_root.is_dir():
        homes = sorted(jvm_root.iterdir(), key=lambda p: _natural_key(p.name), reverse=True)
        candidates.extend(home / "bin" / "java" for home in homes)
    seen: list[str] = []
    for candidate in candidates:
        version = _java_major(candidate)
        if version is not None and version >= MIN_JAVA:
            return candidate
        seen.append(f"{candidate} ({version or 'not runnable'})")
    raise LocalStackError(
        f"no Java {MIN_JAVA}+ found; tried: {', '.join(seen) or 'nothing'}. "
        "Set VIGIL_JAVA or JAVA_HOME."
    )


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _java_major(java: Path) -> int | None:
    if not (java.is_file() and os.access(java, os.X_OK)):
        return None
    try:
        out = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0_x" means 8


# --------------------------------------------------------------------------- configuration


def _kafka_config_dir(s: Settings) -> Path:
    return s.state_dir / "config"


def _config_name(node: str, suffix: str) -> str:
    """Node 1's files keep the single broker's names (server.properties)."""
    return f"{suffix}.properties" if node == "kafka" else f"{suffix}-{node_index(node)}.properties"


def _server_config(s: Settings, node: str) -> Path:
    return _kafka_config_dir(s) / _config_name(node, "server")


def _log4j_config(s: Settings, node: str) -> Path:
    return _kafka_config_dir(s) / _config_name(node, "kafka-log4j2")


def _write_kafka_config(s: Settings, node: str = "kafka") -> Path:
    """Write the node's server.properties and log4j2 config; return the first one's path."""
    config_dir = _kafka_config_dir(s)
    config_dir.mkdir(parents=True, exist_ok=True)
    _log4j_config(s, node).write_text(_kafka_log4j2(s, node))
    server = _server_config(s, node)
    server.write_text(_server_properties(s, node))
    return server


def _server_properties(s: Settings, node: str = "kafka") -> str:
    """A KRaft node acting as broker and controller. Alone, every replication factor and
    min.isr is 1; in a cluster of three or more, the internal topics (consumer offsets,
    transactions) get three replicas and two in sync, as ``streams.kafka.topics.replication``
    gives vigil's own topics, and so do topics created without a factor."""
    index = node_index(node)
    brokers = s.brokers_of()
    port, controller = s.kafka_port_of(node), s.controller_port_of(node)
    replicas = str(min(3, brokers))
    in_sync = "2" if brokers >= 3 else "1"
    voters = ",".join(
        f"{i}@127.0.0.1:{s.controller_port_of(node_name(i))}" for i in range(1, brokers + 1)
    )
    props = {
        "process.roles": "broker,controller",
        "node.id": str(index),
        # Static quorum: no --standalone / --initial-controllers needed when formatting.
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(s.data_dir / node),
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
        # A replica that lost its leader is never made leader with records missing: with
        # acks=all and min.insync.replicas 2, an acknowledged record is on a replica in sync.
        "unclean.leader.election.enable": "false",
        # Tests and dev runs join consumer groups constantly; the default 3 s delay is waste.
        "group.initial.rebalance.delay.ms": "0",
        # Topics are created on purpose (the project declares them), never by a typo.
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
    }
    lines = ["# Generated by vigil (streams/local/stack.py); rewritten on every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def _kafka_log4j2(s: Settings, node: str = "kafka") -> str:
    log_file = s.server_log(node)
    return f"""# Generated by vigil (streams/local/stack.py): the broker logs to a file.
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.filePattern = {log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def _cluster_id(s: Settings) -> str:
    """The KRaft cluster id of this data dir, created once and then reused.

    An existing formatted log dir keeps its own id in meta.properties; reading it back keeps
    ``format --ignore-formatted`` and the id we pass in agreement.
    """
    meta = s.data_dir / "kafka" / "meta.properties"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    id_file = s.data_dir / "cluster.id"
    if id_file.exists():
        kept = id_file.read_text().strip()
        if kept and not kept.startswith("-"):
            return kept
        # an id an earlier version made with a leading "-": format never took it, so nothing
        # was written with it; a new one replaces it
    cluster_id = new_cluster_id()
    id_file.parent.mkdir(parents=True, exist_ok=True)
    id_file.write_text(cluster_id + "\n")
    return cluster_id


def new_cluster_id(random_bytes: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A KRaft cluster id as Kafka's ``Uuid.randomUuid`` makes one: 16 random bytes in URL-safe
    base64, never starting with "-".

    Why the rule: one id in 64 would start with "-", and a command-line parser reads that as
    an option: ``kafka-storage format -t -…`` failed with "expected one argument" (it did once
    in CI). Kafka draws again in that case; so does this."""
    while True:
        cluster_id = base64.urlsafe_b64encode(random_bytes()).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _tag(s: Settings, service: str) -> str:
    """A JVM system property naming the service and state dir.

    It lets a pid from a pid file be checked against the process's command line, so a pid
    reused by an unrelated process after a crash or reboot is never mistaken for ours.
    """
    return f"-Dvigil.localstack={service}@{s.state_dir}"


def _command(s: Settings, service: str) -> list[str]:
    java = str(find_java())
    if _kind(service) == "kafka":
        server = _write_kafka_config(s, service)
        log4j = _log4j_config(s, service)
        alone = s.brokers_of() == 1
        return [
            java,
            KAFKA_HEAP if alone else CLUSTER_NODE_HEAP,
            "-Xms256m" if alone else "-Xms128m",
            # Three JVMs of a cluster on a small machine: the quick compiler only. It starts
            # a node in about half the CPU time and is soon as fast as it gets; a node's peak
            # is lower than with C2, which a dev cluster never reaches (the single broker,
            # which the benchmarks measure against, keeps both compilers).
            *([] if alone else ["-XX:TieredStopAtLevel=1"]),
            "-XX:+UseG1GC",
            "-XX:+ExitOnOutOfMemoryError",  # a dead broker is restarted by up(); a sick one not
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={s.logs_dir}",
            _tag(s, service),
            "-cp",
            str(s.kafka_home / "libs" / "*"),
            "kafka.Kafka",
            str(server),
        ]
    registry_db = s.data_dir / "registry" / "registry"
    return [
        java,
        REGISTRY_HEAP,
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        _tag(s, service),
        "-Dquarkus.http.host=127.0.0.1",
        f"-Dquarkus.http.port={s.registry_port}",
        "-Dapicurio.storage.kind=sql",
        "-Dapicurio.storage.sql.kind=h2",
        # A file-backed H2 (not the default in-memory one): Kafka's data outlives a restart,
        # so must the schema ids its records carry, or an old record would be read with
        # whatever schema the fresh registry hands out under the same id. WRITE_DELAY=0 makes
        # each registration durable at once, even if the registry is killed right after.
        f"-Dapicurio.datasource.url=jdbc:h2:file:{registry_db};WRITE_DELAY=0",
        "-Dapicurio.datasource.jdbc.initial-size=2",
        "-Dapicurio.datasource.jdbc.min-size=2",
        "-Dquarkus.http.access-log.enabled=false",
        # GET /subjects answers at most this many subjects (Apicurio's default is 1000). Every
        # test deployment registers a score of topic-record subjects, so a long-lived dev
        # stack passes 1000 quickly and a subject listing would silently come back cut short.
        f"-Dapicurio.ccompat.max-subjects={REGISTRY_MAX_SUBJECTS}",
        # The packaged format prints dates like "2025-06+00-09"; use a readable one.
        "-Dquarkus.log.console.format=%d{yyyy-MM-dd HH:mm:ss,SSS} %-5p [%c{3.}] (%t) %s%e%n",
        "-jar",
        str(_registry_jar(s)),
    ]


# --------------------------------------------------------------------------- processes


# Popen objects of the processes this Python process started, kept so their exit status is
# reaped: a killed child we never wait for stays a zombie and would look alive.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _needs_start(s: Settings, service: str) -> bool:
    if _live_pid(s, service) is not None:
        return False
    pid_file = s.pid_file(service)
    if pid_file.exists():
        log.warning("%s: stale pid file %s (process gone); starting again", service, pid_file)
        pid_file.unlink()
    for port in _ports(s, service):
        if _port_open(port):
            raise LocalStackError(
                f"{service}: port 127.0.0.1:{port} is taken by a process that is not vigil's "
                f"(state dir {s.state_dir}); stop it or choose other ports with "
                "VIGIL_DEV_KAFKA_PORT / VIGIL_DEV_REGISTRY_PORT"
            )
    return True


def _raise_open_files_limit() -> None:
    """In the child before exec: the soft limit of open files up to the hard one. A broker
    keeps several files open per partition; at the usual soft limit a busy dev log dir stops it
    with "Too many open files"."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _start(s: Settings, service: str) -> None:
    s.logs_dir.mkdir(parents=True, exist_ok=True)
    (s.data_dir / service).mkdir(parents=True, exist_ok=True)
    command = _command(s, service)
    out_path = s.log_file(service)
    with out_path.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {service}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            command,
            cwd=s.state_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: no terminal signals, clean killpg
            preexec_fn=_raise_open_files_limit,
        )
    _children[proc.pid] = proc
    s.pid_file(service).write_text(f"{proc.pid}\n")
    log.info("%s: started pid %d, log %s", service, proc.pid, out_path)


def _format_storage(s: Settings, java: str, nodes: Sequence[str] = ("kafka",)) -> None:
    """Format the KRaft log dir of each node once (a JVM start each, ~2 s, so skipped when
    already done, and the nodes' run side by side), with the cluster id every node of the data
    dir shares; record the cluster's size."""
    todo = [node for node in nodes if not (s.data_dir / node / "meta.properties").exists()]
    if not todo:
        return
    size = s.brokers_of()  # before node 1's meta.properties makes a data dir look old
    cluster_id = _cluster_id(s)
    running = []
    for node in todo:
        (s.data_dir / node).mkdir(parents=True, exist_ok=True)
        server = _write_kafka_config(s, node)
        cmd = [
            java,
            "-Xmx256m",
            # a tool that runs for seconds: the quick compiler only, the simplest collector
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            f"-Dlog4j2.configurationFile={_log4j_config(s, node)}",
            "-cp",
            str(s.kafka_home / "libs" / "*"),
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",  # attached: an id is never read as an option
            "-c",
            str(server),
            "--ignore-formatted",
        ]
        running.append(
            subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    failures = []
    for node, proc in zip(todo, running, strict=True):
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{node} (exit {proc.returncode}):\n{output}".rstrip())
    if failures:
        raise LocalStackError("formatting Kafka storage failed: " + "\n".join(failures))
    s.brokers_file.write_text(f"{size}\n")


def _stop(s: Settings, processes: Sequence[str]) -> None:
    """Stop the registry first, then the brokers, all brokers of a cluster at once: a node
    stopped after the others can no longer reach a controller quorum, and its controlled
    shutdown would wait for one until it is killed."""
    import threading

    for group in (
        [p for p in processes if _kind(p) != "kafka"],
        [p for p in processes if _kind(p) == "kafka"],
    ):
        threads = []
        for service in group:
            pid = _live_pid(s, service)
            if pid is not None:
                log.info("%s: stopping pid %d", service, pid)
                threads.append(threading.Thread(target=_terminate, args=(pid,)))
                threads[-1].start()
        for thread in threads:
            thread.join()
        for service in group:
            s.pid_file(service).unlink(missing_ok=True)


def _terminate(pid: int) -> None:
    """SIGTERM the process group, wait, then SIGKILL what is left."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    # We start every service as a session (and group) leader; never signal our own group.
    target = pgid if pgid == pid and pgid != os.getpgrp() else None

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if target is not None:
                os.killpg(target, sig)
            else:
                os.kill(pid, sig)

    send(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _pid_alive(pid) and not (target and _group_alive(target)):
            return
        time.sleep(0.2)
    log.warning("pid %d did not stop within %.0fs; killing it", pid, _STOP_TIMEOUT_S)
    send(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (reaping it if it is our child)."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        # Field 3, after the parenthesised command name, is the state; Z is a zombie.
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    return True


def _cmdline_args(pid: int) -> list[str]:
    proc = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            return proc.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []
    out = subprocess.run(
        ["ps", "-ww", "-o", "command=", "-p", str(pid)],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.split()


def _find_by_tag(s: Settings, service: str) -> int | None:
    """Our service's process found by its tag, for when the pid file is gone or wrong.

    Without this a broker whose pid file was lost would hold the port as a "foreign"
    process that ``down()`` cannot stop. Linux only (needs /proc).
    """
    proc = Path("/proc")
    if not (proc / "self").exists():
        return None
    tag = _tag(s, service)
    for entry in proc.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if tag in _cmdline_args(pid) and _pid_alive(pid):
                return pid
    return None


def _live_pid(s: Settings, service: str) -> int | None:
    """The pid of our running service: from its pid file if valid, else found by its tag."""
    try:
        pid: int | None = int(s.pid_file(service).read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None:
        if pid in _children:
            # Our own child: right after spawning, /proc still shows the pre-exec command
            # line (this Python), so the tag check below would wrongly call it foreign.
            return pid if _pid_alive(pid) else None
        if _pid_alive(pid) and _tag(s, service) in _cmdline_args(pid):
            return pid
    found = _find_by_tag(s, service)
    if found is not None:
        s.pid_file(service).write_text(f"{found}\n")
    return found


# --------------------------------------------------------------------------- readiness


def _ports(s: Settings, service: str) -> list[int]:
    if _kind(service) == "kafka":
        return [s.kafka_port_of(service), s.controller_port_of(service)]
    return [s.registry_port]


def _address(s: Settings, service: str) -> str:
    if _kind(service) == "kafka":
        return f"127.0.0.1:{s.kafka_port_of(service)}"
    return s.cluster.schema_registry_url


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def kafka_answers(bootstrap_servers: str, timeout: float = 3.0) -> bool:
    """True if an AdminClient can fetch cluster metadata from ``bootstrap_servers``."""
    from confluent_kafka.admin import AdminClient  # heavy import, only when probing

    # log_level 0: no "connection refused" noise on stderr while the broker boots or is down.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
    except Exception:
        return False
    return True


def registry_answers(url: str, timeout: float = 3.0) -> bool:
    """True if ``GET <url>/subjects`` on the Confluent-compatible API returns 200."""
    try:
        response = httpx.get(f"{url.rstrip('/')}/subjects", timeout=timeout)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def _answering(s: Settings, service: str) -> bool:
    if _kind(service) == "kafka":
        address = _address(s, service)
        return _port_open(s.kafka_port_of(service)) and kafka_answers(address)
    return registry_answers(s.cluster.schema_registry_url)


def _wait_for_brokers(s: Settings, timeout: float) -> None:
    """Until the cluster's metadata lists every node: each node answering alone is not yet a
    cluster a topic of three replicas can be created on."""
    from confluent_kafka.admin import AdminClient

    want = s.brokers_of()
    if want == 1:
        return
    admin = AdminClient({"bootstrap.servers": s.cluster.bootstrap_servers, "log_level": 0})
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            seen = len(admin.list_topics(timeout=3).brokers)
            if seen >= want:
                return
        time.sleep(0.5)
    raise LocalStackError(f"the cluster lists {seen} of its {want} brokers after {timeout:.0f}s")


#: the consumer group whose offsets ``_warm_up`` asks for (it commits none: no group is made)
WARM_UP_GROUP = "vigil-dev-up"


def _warm_up(s: Settings, nodes: Sequence[str], timeout: float) -> None:
    """Until the brokers just started serve at once what vigil's clients ask for first, so
    that ready means ready for them:

    - an idempotent producer's id, from each node. A broker fetches a block of producer ids
      from the controller only when first asked, and answers COORDINATOR_LOAD_IN_PROGRESS
      meanwhile ("Failed to acquire idempotence PID ...: retrying"); librdkafka asks again
      500 ms later. Each node is asked by a producer bootstrapped on it alone.
    - a consumer group's coordinator: the first FindCoordinator creates ``__consumer_offsets``
      (or, after a restart, its partitions load), and librdkafka asks again a second later.

    On a fresh single broker (2 cores) this moves 0.5 s from the first idempotent producer
    and 1 to 3 s from the first consumer group into ``up``. Bounded by ``timeout``."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    started = time.monotonic()
    deadline = started + timeout
    states: dict[str, str] = {}

    def producer(node: str) -> Producer:
        def stats(report: str) -> None:
            states[node] = json.loads(report).get("eos", {}).get("idemp_state", "")

        return Producer(
            {
                "bootstrap.servers": _address(s, node),
                "enable.idempotence": True,
                "statistics.interval.ms": 100,
                "stats_cb": stats,
                "log_level": 0,
            }
        )

    producers = [producer(node) for node in nodes]
    consumer = Consumer(
        {
            "bootstrap.servers": s.cluster.bootstrap_servers,
            "group.id": WARM_UP_GROUP,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    coordinator = False
    try:
        while True:
            left = deadline - time.monotonic()
            if not coordinator:
                with contextlib.suppress(KafkaException):
                    # an offset fetch: it waits for the group's coordinator, and commits nothing
                    consumer.committed(
                        [TopicPartition(WARM_UP_GROUP, 0)], timeout=max(0.1, min(5.0, left))
                    )
                    coordinator = True
            for p in producers:
                p.poll(0)  # serves the stats callback
            waiting = [node for node in nodes if states.get(node) != "Assigned"]
            if coordinator and not waiting:
                log.info(
                    "kafka: producer ids and group coordinator served after %.1fs",
                    time.monotonic() - started,
                )
                return
            if time.monotonic() > deadline:
                what = [f"no producer id from {', '.join(waiting)}"] if waiting else []
                what += [] if coordinator else ["no group coordinator"]
                raise LocalStackError(
                    f"the brokers answer but, after {timeout:.0f}s, serve {' and '.join(what)}"
                )
            time.sleep(0.05)
    finally:
        consumer.close()


#: The longest a broker that keeps logging may take to answer (``_wait_ready``).
RECOVERY_LIMIT_S = 1800.0


def _wait_ready(
    s: Settings,
    service: str,
    timeout: float,
    announce: bool = True,
    recovery_limit: float = RECOVERY_LIMIT_S,
) -> None:
    """Wait until ``service`` answers. A broker stopped uncleanly (killed, a crash) first
    recovers every partition of its data dir, which on a dir with thousands of partitions
    takes minutes, logging as it goes; stopping it then would only make the next start
    recover again. So for a broker ``timeout`` bounds a wait in which its log does not grow,
    and ``recovery_limit`` the whole wait."""
    started = time.monotonic()
    deadline = started + timeout
    logs = [s.server_log(service), s.log_file(service)] if _kind(service) == "kafka" else []
    written = _log_sizes(logs)
    while True:
        pid = _live_pid(s, service)
        if pid is None:
            raise LocalStackError(f"{service} exited during startup.\n{_log_tail(s, service)}")
        if _answering(s, service):
            if announce:
                log.info("%s: ready after %.1fs", service, time.monotonic() - started)
            return
        now = time.monotonic()
        if logs:
            sizes = _log_sizes(logs)
            if sizes != written:
                written = sizes
                deadline = min(now + timeout, started + max(timeout, recovery_limit))
        if now > deadline:
            raise LocalStackError(
                f"{service} (pid {pid}) did not answer at {_address(s, service)} after "
                f"{now - started:.0f}s, {timeout:.0f}s of them without a line logged (if it "
                f"hangs: `vigil dev down`, then `vigil dev up`).\n{_log_tail(s, service)}"
            )
        time.sleep(0.5)


def _log_sizes(paths: Sequence[Path]) -> tuple[int, ...]:
    """The sizes of ``paths`` (0 for a missing one): a log that rotates still changes them."""
    sizes = []
    for path in paths:
        try:
            sizes.append(path.stat().st_size)
        except OSError:
            sizes.append(0)
    return tuple(sizes)


def _log_tail(s: Settings, service: str, lines: int = 40) -> str:
    """The last lines of the service's logs, for error messages."""
    paths = [s.log_file(service)]
    if _kind(service) == "kafka":
        paths.append(s.server_log(service))
    parts = []
    for path in paths:
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- last {len(tail)} lines of {path}:\n" + "\n".join(tail))
    return "\n".join(parts) or f"(no log written in {s.logs_dir})"


# --------------------------------------------------------------------------- housekeeping


def _wipe_data(s: Settings) -> None:
    log.info("deleting %s", s.data_dir)
    shutil.rmtree(s.data_dir, ignore_errors=True)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialise work on ``directory`` across processes (two test sessions, a CLI call)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
