"""Shared fixtures: a real Kafka broker and schema registry, only for tests that ask for one.

The ``cluster`` fixture is session-scoped and lazy: a test gets a cluster by naming the
fixture (or by carrying ``@pytest.mark.kafka``), and a run with no such test starts nothing.
Tests that use the cluster are marked ``kafka`` automatically; the page's tests over a view
built without Kafka are marked ``browser`` (they drive chromium), so
``pytest -m "not kafka and not browser"`` runs the pure tests alone.

Where the cluster comes from, first match wins:

1. ``KAFKA_BOOTSTRAP_SERVERS`` + ``SCHEMA_REGISTRY_URL`` in the environment (nothing started);
2. testcontainers, when a Docker engine answers (Kafka in KRaft mode + Apicurio Registry);
3. the project's own local stack (``streams.local.stack``: JVM processes, no Docker), shared
   by every pytest process of the run (pytest-xdist's workers). It is stopped at the end only
   if this run started it, once every process is done with it; a cluster a developer started
   with ``vigil dev up`` keeps running.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import pytest
from hypothesis import settings as hypothesis_settings

from streams.local import stack as localstack
from streams.local.stack import CCOMPAT_PATH, REGISTRY_MAX_SUBJECTS, Cluster

Origin = Literal["env", "docker", "local"]

# Speed is measured by the benchmarks, never asserted: no per-example deadline. On a loaded
# machine, or in the other Pythons' run at the lowest CPU priority, one example can take
# longer than hypothesis's default 200 ms, which says nothing about the code.
hypothesis_settings.register_profile("vigil", deadline=None)
hypothesis_settings.load_profile("vigil")

# A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment (no terminal
# behind it). The CLI's consoles are made at import and keep a width found in the environment
# then, so whichever test imported them first would fix every later test's output at 80
# columns: the tests give the width they need to each invocation instead, as in one process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
REGISTRY_IMAGE = f"apicurio/apicurio-registry:{localstack.APICURIO_VERSION}"
STARTUP_TIMEOUT_S = 180


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the cluster as ``kafka`` (before ``-m`` selection runs); then
    put the files that hold real-broker or browser tests first, each file's tests in their own
    order. Those are the long ones (seconds to minutes each, against milliseconds): started
    first, they do not leave one pytest-xdist process running the last of them alone while
    the other has nothing left to do, and the short ones fill the end."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
    long_files = {
        item.path
        for item in items
        if item.get_closest_marker("kafka") or item.get_closest_marker("browser")
    }
    items.sort(key=lambda item: item.path not in long_files)


@pytest.fixture(autouse=True)
def _cluster_for_kafka_marked_tests(request: pytest.FixtureRequest) -> None:
    """Give ``@pytest.mark.kafka`` tests the cluster even if they do not name the fixture.

    Resolved per test with ``getfixturevalue``, so unmarked tests never start Kafka.
    """
    if request.node.get_closest_marker("kafka") is not None:
        request.getfixturevalue("cluster")


@pytest.fixture(autouse=True)
def _delete_test_topics() -> Iterator[None]:
    """After each test, the topics of the deployments it made (``tests.support.deployment``).
    Those of module- and session-scoped fixtures, made before it starts, stay until the end
    of the session."""
    from tests.support import delete_made_topics, made

    before = len(made)
    yield
    delete_made_topics(since=before)


def _delete_every_made_topic() -> None:
    from tests.support import delete_made_topics, made, made_in_background

    made.extend(made_in_background)
    made_in_background.clear()
    delete_made_topics(since=0)


@pytest.fixture(scope="session", autouse=True)
def _delete_shared_test_topics() -> Iterator[None]:
    """At the end of the session, the topics of session- and module-scoped deployments left
    (the cluster fixture deletes them first when it stops a stack it started)."""
    yield
    _delete_every_made_topic()


@pytest.fixture(scope="session")
def _cluster_and_origin() -> Iterator[tuple[Cluster, Origin]]:
    from_env = localstack.cluster_from_env()
    if from_env is not None:
        yield from_env, "env"
    elif _docker_answers():
        with _containers() as cluster:
            yield cluster, "docker"
    else:
        with _shared_local_stack() as cluster:
            yield cluster, "local"


@contextmanager
def _shared_local_stack() -> Iterator[Cluster]:
    """The local stack, shared by every pytest process of the run (pytest-xdist's workers,
    ``scripts/test.sh``): the first process to need it starts it, and the one that started it
    stops it once no other process uses it.

    ``localstack.up`` is idempotent and locked, but it cannot say whether this process started
    the stack: that is decided under a lock of the tests' own (``tests-start.lock``). Every
    process holds ``tests-users.lock`` shared while it uses the stack; the one that started it
    takes it exclusive before stopping it, which waits for the others to finish."""
    s = localstack.Settings.from_env()
    s.state_dir.mkdir(parents=True, exist_ok=True)
    users = open(s.state_dir / "tests-users.lock", "a")  # noqa: SIM115 (held for the session)
    try:
        with open(s.state_dir / "tests-start.lock", "a") as start:
            fcntl.flock(start, fcntl.LOCK_EX)
            running_before = localstack.is_running()
            cluster = localstack.up(timeout=STARTUP_TIMEOUT_S)
            fcntl.flock(users, fcntl.LOCK_SH)
        started_here = [name for name, running in running_before.items() if not running]
        try:
            yield cluster
        finally:
            # Before the stack can stop (and before ``_delete_shared_test_topics``, set up
            # first): with the broker stopped, the session's topics would stay in the local
            # stack's data dir, run after run, and a broker restarted after a crash recovers
            # them all.
            _delete_every_made_topic()
            if started_here:
                fcntl.flock(users, fcntl.LOCK_EX)
                localstack.down(started_here)
    finally:
        users.close()


@pytest.fixture(scope="session")
def cluster(_cluster_and_origin: tuple[Cluster, Origin]) -> Cluster:
    """A Kafka cluster with a Confluent-compatible schema registry, shared by the session."""
    return _cluster_and_origin[0]


@pytest.fixture(scope="session")
def cluster_origin(_cluster_and_origin: tuple[Cluster, Origin]) -> Origin:
    """Where ``cluster`` came from: tests that kill or inspect local processes need "local"."""
    return _cluster_and_origin[1]


def _docker_answers() -> bool:
    """True if a Docker engine answers a ping (any failure means: no Docker here)."""
    try:
        import docker

        client = docker.from_env(timeout=5)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


class _containers:
    """Kafka (KRaft) and Apicurio Registry in containers, removed again on exit.

    A context manager class rather than ``@contextmanager`` so a failure starting the
    registry (or a broker that never became ready) still removes both containers.
    """

    def __enter__(self) -> Cluster:
        from testcontainers.community.kafka import KafkaContainer
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.wait_strategies import HttpWaitStrategy

        # Same broker settings as the local stack: topics are never auto-created, group
        # joins are not delayed, transactions work on one node.
        self.kafka = (
            KafkaContainer(KAFKA_IMAGE)
            .with_kraft()
            .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        )
        # The image's default storage is in-memory, which is what a test session wants.
        self.registry = (
            DockerContainer(REGISTRY_IMAGE)
            .with_exposed_ports(8080)
            .with_env("APICURIO_CCOMPAT_MAX_SUBJECTS", str(REGISTRY_MAX_SUBJECTS))
            .waiting_for(
                HttpWaitStrategy(8080, f"{CCOMPAT_PATH}/subjects")
                .for_status_code(200)
                .with_startup_timeout(STARTUP_TIMEOUT_S)
            )
        )
        try:
            self.kafka.start(timeout=STARTUP_TIMEOUT_S)
            self.registry.start()
        except BaseException:
            self._stop()
            raise
        host = self.registry.get_container_host_ip()
        port = self.registry.get_exposed_port(8080)
        return Cluster(
            bootstrap_servers=self.kafka.get_bootstrap_server(),
            schema_registry_url=f"http://{host}:{port}{CCOMPAT_PATH}",
        )

    def __exit__(self, *exc_info: object) -> None:
        self._stop()

    def _stop(self) -> None:
        # stop() removes the container if one was created and is a no-op otherwise.
        self.registry.stop()
        self.kafka.stop()
