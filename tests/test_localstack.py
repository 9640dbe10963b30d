"""The local Kafka + schema registry: it answers, carries data, and comes back after a crash.

The first tests are pure (no processes): configuration and pid-file safety. The rest use the
session's ``cluster`` fixture; the ones that inspect or kill local processes only run when
that cluster is the local stack, not one from the environment or from containers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from streams.local import stack as localstack
from streams.local.stack import Cluster, Settings
from tests.support import own_brokers

# --------------------------------------------------------------------------- pure tests


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _settings(tmp_path: Path) -> Settings:
    """Ports nobody listens on: these tests must not see a real stack that happens to run."""
    return Settings(
        cache_dir=tmp_path / "cache",
        state_dir=tmp_path / "state",
        kafka_port=_free_port(),
        controller_port=_free_port(),
        registry_port=_free_port(),
    )


def test_cluster_from_env_needs_both_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
    assert localstack.cluster_from_env() is None

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    with pytest.raises(localstack.LocalStackError, match="SCHEMA_REGISTRY_URL"):
        localstack.cluster_from_env()

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "http://registry:8080/apis/ccompat/v7/")
    assert localstack.cluster_from_env() == Cluster(
        "broker:9092", "http://registry:8080/apis/ccompat/v7"
    )


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VIGIL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VIGIL_DEV_STATE_DIR", raising=False)
    monkeypatch.setenv("VIGIL_DEV_KAFKA_PORT", "29092")
    monkeypatch.delenv("VIGIL_DEV_CONTROLLER_PORT", raising=False)
    monkeypatch.setenv("VIGIL_DEV_REGISTRY_PORT", "28081")
    s = Settings.from_env()
    assert s.state_dir == tmp_path.resolve() / "dev"
    assert (s.kafka_port, s.controller_port, s.registry_port) == (29092, 29093, 28081)
    assert s.cluster == Cluster("127.0.0.1:29092", "http://127.0.0.1:28081/apis/ccompat/v7")

    monkeypatch.setenv("VIGIL_DEV_KAFKA_PORT", "not-a-port")
    with pytest.raises(localstack.LocalStackError, match="VIGIL_DEV_KAFKA_PORT"):
        Settings.from_env()


def test_server_properties_are_single_node_and_strict(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    props = dict(
        line.split("=", 1)
        for line in localstack._server_properties(s).splitlines()
        if line and not line.startswith("#")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{s.controller_port}"
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{s.kafka_port}"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    for key, value in props.items():
        if key.endswith(("replication.factor", "min.isr", "min.insync.replicas")):
            assert value == "1", key


def _props(s: Settings, node: str) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in localstack._server_properties(s, node).splitlines()
        if line and not line.startswith("#")
    )


def test_server_properties_of_a_three_node_cluster(tmp_path: Path) -> None:
    """Three KRaft nodes, each broker and controller, on ports of their own and data dirs of
    their own, one quorum of three voters; internal topics replicated 3 with 2 in sync."""
    s = replace(_settings(tmp_path), brokers=3)
    nodes = s.kafka_nodes()
    assert nodes == ("kafka", "kafka-2", "kafka-3")
    props = [_props(s, node) for node in nodes]
    voters = {p["controller.quorum.voters"] for p in props}
    assert voters == {
        ",".join(f"{i}@127.0.0.1:{s.controller_port + 2 * (i - 1)}" for i in (1, 2, 3))
    }
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    ports = [s.kafka_port + 2 * i for i in range(3)]
    assert [p["advertised.listeners"] for p in props] == [
        f"PLAINTEXT://127.0.0.1:{port}" for port in ports
    ]
    assert len({p["log.dirs"] for p in props}) == 3
    for p in props:
        assert p["default.replication.factor"] == p["offsets.topic.replication.factor"] == "3"
        assert p["min.insync.replicas"] == p["transaction.state.log.min.isr"] == "2"
        assert p["unclean.leader.election.enable"] == "false"
    assert s.cluster.bootstrap_servers == ",".join(f"127.0.0.1:{port}" for port in ports)


def test_a_state_dir_keeps_the_size_of_its_cluster(tmp_path: Path) -> None:
    """A fresh state dir takes the size asked for (one if none); a formatted one keeps its
    own, and asking for another is refused before anything starts."""
    s = _settings(tmp_path)
    assert s.brokers_of() == 1 and replace(s, brokers=3).brokers_of() == 3
    (s.data_dir / "kafka").mkdir(parents=True)
    (s.data_dir / "kafka" / "meta.properties").write_text("cluster.id=x\n")
    assert replace(s, brokers=3).brokers_of() == 1  # formatted before the size was recorded
    with pytest.raises(localstack.LocalStackError, match="--reset --brokers 3"):
        localstack.up(settings=replace(s, brokers=3))
    s.brokers_file.write_text("3\n")
    assert s.brokers_of() == 3 and s.kafka_nodes()[-1] == "kafka-3"
    with pytest.raises(localstack.LocalStackError, match="must be one of"):
        localstack.up(settings=replace(s, brokers=2))
    assert localstack.status(s).keys() == {"kafka", "kafka-2", "kafka-3", "registry"}


def test_cluster_ids_never_start_with_a_dash() -> None:
    """One random id in 64 starts with "-", which ``kafka-storage format`` took for an option
    (CI failed on it once): drawn again, as Kafka's ``Uuid.randomUuid`` does."""
    dashed = bytes([0xF8]) + bytes(15)
    assert localstack.base64.urlsafe_b64encode(dashed).decode().startswith("-")  # it happens
    draws = iter([dashed, bytes([0xFB]) * 16, bytes(range(16))])
    cluster_id = localstack.new_cluster_id(lambda: next(draws))
    assert not cluster_id.startswith("-")
    assert localstack.base64.urlsafe_b64decode(cluster_id + "==") == bytes(range(16))
    assert all(not localstack.new_cluster_id().startswith("-") for _ in range(2000))


def test_a_stored_cluster_id_with_a_dash_is_replaced(tmp_path: Path) -> None:
    """An id an earlier version stored with a leading "-" never formatted anything: replaced,
    and the replacement kept for the next start."""
    s = _settings(tmp_path)
    (s.data_dir).mkdir(parents=True, exist_ok=True)
    (s.data_dir / "cluster.id").write_text("-Abc123xyzAbc123xyzAbA\n")
    fresh = localstack._cluster_id(s)
    assert not fresh.startswith("-")
    assert localstack._cluster_id(s) == fresh
    (s.data_dir / "cluster.id").write_text("okAbc123xyzAbc123xyzAb\n")
    assert localstack._cluster_id(s) == "okAbc123xyzAbc123xyzAb"


def test_pid_file_of_a_foreign_process_is_not_ours(tmp_path: Path) -> None:
    """A pid reused by another process (here: this test's own) must not count as running."""
    s = _settings(tmp_path)
    s.state_dir.mkdir(parents=True)
    s.pid_file("kafka").write_text(f"{os.getpid()}\n")
    assert localstack.is_running(s) == {"kafka": False, "registry": False}
    report = localstack.status(s)
    assert report["kafka"]["pid"] is None
    assert report["kafka"]["running"] is False
    assert report["registry"]["answering"] is False


def test_service_found_by_exact_tag_without_pid_file(tmp_path: Path) -> None:
    """A lost pid file is recovered from the process tag, and only for the same state dir."""
    ours = Settings(tmp_path / "c", tmp_path / "state2", 39092, 39093, 38081)
    prefix = Settings(tmp_path / "c", tmp_path / "state", 39092, 39093, 38081)
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", localstack._tag(ours, "kafka")]
    )
    try:
        ours.state_dir.mkdir(parents=True)
        deadline = time.monotonic() + 10
        while localstack._live_pid(ours, "kafka") is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd and shows its command line
        assert localstack._live_pid(ours, "kafka") == stand_in.pid
        assert ours.pid_file("kafka").read_text().strip() == str(stand_in.pid)
        assert localstack._live_pid(prefix, "kafka") is None  # "state" is a prefix of "state2"
    finally:
        stand_in.kill()
        stand_in.wait()
    assert localstack._live_pid(ours, "kafka") is None


def test_find_java_is_new_enough() -> None:
    java = localstack.find_java()
    major = localstack._java_major(java)
    assert major is not None
    assert major >= localstack.MIN_JAVA


class _Clock:
    """``time`` for ``_wait_ready``: sleeping moves the clock and runs ``tick``."""

    def __init__(self, tick: Callable[[float], None]) -> None:
        self.now = 0.0
        self.tick = tick

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.tick(self.now)


def _recovering_broker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answers_at: float, logs_until: float
) -> Settings:
    """A broker process that is alive, answers from ``answers_at`` seconds on and writes a
    line to its server log every second until ``logs_until``."""
    s = replace(Settings.from_env(), state_dir=tmp_path)
    s.logs_dir.mkdir(parents=True)
    server_log = s.server_log("kafka")
    server_log.write_text("starting\n")

    def tick(now: float) -> None:
        if now <= logs_until and now == int(now):
            with server_log.open("a") as f:
                f.write(f"[{now}] INFO Recovering unflushed segment\n")

    clock = _Clock(tick)
    monkeypatch.setattr(localstack, "time", clock)
    monkeypatch.setattr(localstack, "_live_pid", lambda s, service: 4242)
    monkeypatch.setattr(localstack, "_answering", lambda s, service: clock.now >= answers_at)
    return s


def test_a_broker_that_keeps_logging_its_recovery_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past ``timeout`` while its log grows: stopping it would make the next start recover
    everything again."""
    s = _recovering_broker(monkeypatch, tmp_path, answers_at=300, logs_until=299)
    localstack._wait_ready(s, "kafka", timeout=20, announce=False)
    assert localstack.time.monotonic() == 300


def test_a_broker_silent_for_the_timeout_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s = _recovering_broker(monkeypatch, tmp_path, answers_at=300, logs_until=100)
    with pytest.raises(localstack.LocalStackError, match="20s of them without a line logged"):
        localstack._wait_ready(s, "kafka", timeout=20, announce=False)
    assert 120 <= localstack.time.monotonic() <= 121  # 20 s after its last line


def test_a_broker_logging_forever_is_given_up_on_at_the_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s = _recovering_broker(monkeypatch, tmp_path, answers_at=10**6, logs_until=10**6)
    with pytest.raises(localstack.LocalStackError, match="did not answer"):
        localstack._wait_ready(s, "kafka", timeout=20, announce=False, recovery_limit=600)
    assert 600 <= localstack.time.monotonic() <= 601


def test_a_registry_gets_the_timeout_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only a broker's log counts: a registry has no recovery to wait out."""
    s = _recovering_broker(monkeypatch, tmp_path, answers_at=300, logs_until=299)
    s.log_file("registry").write_text("")

    def grow(now: float) -> None:
        with s.log_file("registry").open("a") as f:
            f.write("line\n")

    localstack.time.tick = grow  # type: ignore[attr-defined]
    with pytest.raises(localstack.LocalStackError, match="did not answer"):
        localstack._wait_ready(s, "registry", timeout=20, announce=False)
    assert 20 <= localstack.time.monotonic() <= 21


# --------------------------------------------------------------------------- with a cluster


@pytest.fixture
def topic(cluster: Cluster) -> Iterator[str]:
    """A fresh topic (auto-creation is off), deleted afterwards."""
    name = f"vigil-test-{uuid.uuid4().hex[:12]}"
    _create_topic(cluster, name)
    yield name
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for future in admin.delete_topics([name], operation_timeout=30).values():
        future.result(timeout=60)


def _create_topic(cluster: Cluster, name: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions)])
    for future in futures.values():
        future.result(timeout=60)


def _produce(cluster: Cluster, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0, "records left unsent"


def _consume(cluster: Cluster, topic: str, count: int, timeout: float = 60.0) -> list[tuple]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"vigil-test-{uuid.uuid4().hex[:12]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            got.append((message.key(), message.value()))
    finally:
        consumer.close()
    return got


def test_cluster_answers(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    metadata = admin.list_topics(timeout=30)
    assert metadata.brokers, "no broker in the metadata"

    response = httpx.get(f"{cluster.schema_registry_url}/subjects", timeout=30)
    assert response.status_code == 200
    assert isinstance(response.json(), list)


def test_produce_consume_round_trip(cluster: Cluster, topic: str) -> None:
    records = [(f"exec-{i}".encode(), f"payload-{i}".encode()) for i in range(10)]
    _produce(cluster, topic, records)
    assert sorted(_consume(cluster, topic, len(records))) == sorted(records)


def test_registry_speaks_confluent_api(cluster: Cluster) -> None:
    """confluent-kafka's client accepts the registry URL as it is and gets stable ids."""
    client = SchemaRegistryClient({"url": cluster.schema_registry_url})
    subject = f"vigil-test-{uuid.uuid4().hex[:12]}-value"
    schema = Schema(
        '{"type":"record","name":"Probe","namespace":"vigil.test",'
        '"fields":[{"name":"execution_id","type":"string"}]}',
        "AVRO",
    )
    schema_id = client.register_schema(subject, schema)
    assert client.register_schema(subject, schema) == schema_id  # idempotent
    # Ask for the subject itself: GET /subjects is capped by the registry (Apicurio's
    # apicurio.ccompat.max-subjects), so a listing is no proof on a busy registry.
    assert client.get_versions(subject) == [1]
    assert "execution_id" in client.get_schema(schema_id).schema_str
    client.delete_subject(subject, permanent=False)


@pytest.fixture
def local_only(cluster_origin: str) -> None:
    if cluster_origin != "local":
        pytest.skip(f"the cluster came from {cluster_origin}, not from streams.local.stack")


@pytest.mark.usefixtures("local_only")
def test_status_reports_running(cluster: Cluster) -> None:
    report = localstack.status()
    for service in localstack.SERVICES:
        assert report[service]["running"], report
        assert report[service]["answering"], report
        assert isinstance(report[service]["pid"], int)
    assert report["kafka"]["address"] == cluster.bootstrap_servers
    assert report["registry"]["address"] == cluster.schema_registry_url


@pytest.mark.usefixtures("local_only")
def test_up_is_idempotent(cluster: Cluster) -> None:
    before = {name: info["pid"] for name, info in localstack.status().items()}
    assert localstack.up() == cluster
    after = {name: info["pid"] for name, info in localstack.status().items()}
    assert after == before


@pytest.mark.usefixtures("local_only")
def test_lost_pid_file_is_recovered() -> None:
    pid = localstack.status()["kafka"]["pid"]
    settings = Settings.from_env()
    settings.pid_file("kafka").unlink()
    assert localstack.status()["kafka"]["pid"] == pid
    assert settings.pid_file("kafka").read_text().strip() == str(pid)


def test_broker_comes_back_after_sigkill(cluster: Cluster, tmp_path: Path) -> None:
    """A crashed broker leaves a stale pid file; up() notices, restarts it, data survives.

    On a broker of the test's own (``own_brokers``): the session's is shared with the tests
    that other pytest processes run meanwhile."""
    with own_brokers(cluster, tmp_path / "state") as (own, settings):
        topic = f"vigil-test-{uuid.uuid4().hex[:12]}"
        _create_topic(own, topic)
        _produce(own, topic, [(b"k", b"before the crash")])
        old_pid = localstack.status(settings)["kafka"]["pid"]
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while localstack.is_running(settings)["kafka"] and time.monotonic() < deadline:
            time.sleep(0.1)
        report = localstack.status(settings)["kafka"]
        assert not report["running"]
        assert not report["answering"]

        restarted = localstack.up(settings=settings, services=("kafka",))
        assert restarted.bootstrap_servers == own.bootstrap_servers

        report = localstack.status(settings)["kafka"]
        assert report["running"] and report["answering"]
        assert report["pid"] != old_pid
        assert _consume(own, topic, 1) == [(b"k", b"before the crash")]
