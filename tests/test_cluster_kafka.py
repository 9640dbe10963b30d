"""Issue 26, part 7: a cluster, not one broker.

Every other Kafka test runs on the session's single broker. Here the test starts its own
three-broker KRaft cluster (``streams.local.stack`` with ``brokers=3``: three JVMs on ports and
a data dir of its own, the session's schema registry), checks that vigil's topics and the
worker's changelogs get three replicas and ``min.insync.replicas`` 2, and then kills (-9) the
broker leading the input partitions while a real ``vigil worker`` drains a backlog. Nothing may
be lost and nothing invented: the outputs are compared with what the pure Processor computes
for the same input records (``offline``), as ``test_backlog_faults_kafka.py`` does for killed
workers; and the worker must carry on without a restart. The cluster is stopped and its data
deleted at the end.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from streams.contracts.models.base import Record
from streams.kafka.clients import ConsumedRecord
from streams.local import stack as localstack
from streams.local.stack import Cluster
from tests.support import Deployment, deployment, worker
from tests.test_backlog_faults_kafka import SESSION, Backfill, Progress
from tests.test_faults_kafka import (
    assert_same_as_offline,
    final_states,
    steady_stream,
    until_complete,
)
from tests.test_pipeline_kafka import offline

pytestmark = pytest.mark.kafka

#: executions in the backlog: enough that one worker needs several commit intervals (Faust
#: commits about every 3 s) to drain it, so that the broker dies in the middle of the drain
#: (a worker drains 600 in under one interval)
EXECUTIONS = 1200
#: the broker is killed once this share of the execution-status records is acknowledged:
#: the first commit or so
KILL_AT = 0.05
START_TIMEOUT_S = 150


def free_block(size: int) -> int:
    """A first port of ``size`` consecutive free ports on 127.0.0.1 (nodes listen on the
    first and every second one after it, controllers on the ports between), below the
    ephemeral range, where the system's outgoing connections would take them meanwhile."""
    rng = random.Random()
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    for _ in range(200):
        base = rng.randrange(20000, low - size)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no block of free ports")


@pytest.fixture(scope="module")
def three_brokers(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, localstack.Settings]]:
    """A three-broker cluster of this test's own (own ports and data dir, the jars of the
    shared download cache), with the session's schema registry; stopped and wiped after."""
    try:
        localstack.find_java()
    except localstack.LocalStackError as exc:
        pytest.skip(f"the three brokers need a Java to run on: {exc}")
    base = free_block(6)
    settings = localstack.Settings(
        cache_dir=localstack.Settings.from_env().cache_dir,
        state_dir=tmp_path_factory.mktemp("three-brokers"),
        kafka_port=base,
        controller_port=base + 1,
        registry_port=0,  # not started: the session's registry serves
        brokers=3,
    )
    began = time.monotonic()
    try:
        brokers = localstack.up(settings=settings, services=("kafka",), timeout=START_TIMEOUT_S)
        print(f"three brokers up in {time.monotonic() - began:.0f}s")
        yield Cluster(brokers.bootstrap_servers, cluster.schema_registry_url), settings
    finally:
        # kill -9: the data is deleted anyway, and a controlled shutdown of three nodes costs
        # seconds each (one of them already dead)
        for pid in localstack.broker_pids(settings).values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        localstack.wipe(settings)


def replication_of(dep: Deployment, names: list[str]) -> dict[str, tuple[int, str]]:
    """Per topic: the fewest replicas of any partition, and its ``min.insync.replicas``."""
    admin = AdminClient(dep.settings.confluent_conf())
    metadata = admin.list_topics(timeout=30).topics
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    configs = {
        r.name: f.result(30)["min.insync.replicas"].value
        for r, f in admin.describe_configs(resources).items()
    }
    return {
        name: (min(len(p.replicas) for p in metadata[name].partitions.values()), configs[name])
        for name in names
    }


def input_leaders(dep: Deployment) -> Counter[int]:
    """How many input partitions each broker leads."""
    admin = AdminClient(dep.settings.confluent_conf())
    metadata = admin.list_topics(timeout=30).topics
    return Counter(
        p.leader for t in dep.topics.inputs() for p in metadata[t.name].partitions.values()
    )


def led_by(dep: Deployment, broker: int) -> list[str]:
    """The partitions of the deployment's topics (its own and the worker's) ``broker`` leads,
    or that have no leader."""
    admin = AdminClient(dep.settings.confluent_conf())
    prefixes = (f"{dep.settings.topic_prefix}.", f"{dep.settings.app_id}-")
    return [
        f"{name}-{p.id}"
        for name, topic in admin.list_topics(timeout=30).topics.items()
        if name.startswith(prefixes)
        for p in topic.partitions.values()
        if p.leader in (broker, -1)
    ]


def moved_away_from(dep: Deployment, broker: int, timeout: float = 60) -> float:
    """Wait until ``broker`` leads nothing of the deployment: the controller fences a broker
    that stopped heartbeating after ``broker.session.timeout.ms`` (9 s) and elects the other
    replicas in sync. Returns the seconds it took."""
    began = time.monotonic()
    while still := led_by(dep, broker):
        assert time.monotonic() - began < timeout, f"still led by {broker} or nobody: {still}"
        time.sleep(0.5)
    return time.monotonic() - began


def until_complete_through_elections(
    dep: Deployment, expected: dict[str, Record], timeout: float = 240
) -> list[ConsumedRecord]:
    """``until_complete``, asked again when a read of the outputs meets a partition whose new
    leader does not answer for its offsets yet (OFFSET_NOT_AVAILABLE: its high watermark is
    not caught up; or a timeout): a reader's transient error, not the worker's."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return until_complete(dep, expected, quiet=40, timeout=timeout)
        except KafkaException as exc:
            assert time.monotonic() < deadline, f"outputs unreadable: {exc}"
            print(f"reading the outputs again: {exc}")
            time.sleep(1)


def changelogs(dep: Deployment) -> list[str]:
    admin = AdminClient(dep.settings.confluent_conf())
    prefix = f"{dep.settings.app_id}-"
    return sorted(t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix))


def test_the_broker_leading_the_inputs_killed_while_a_worker_drains_a_backlog(
    three_brokers: tuple[Cluster, localstack.Settings], tmp_path: Path
) -> None:
    cluster, stack = three_brokers
    # no replication setting: what the cluster reports decides (three brokers: 3 and 2)
    dep = deployment(cluster, tmp_path, partitions=3)
    assert (dep.settings.replication_factor, dep.settings.min_insync_replicas) == (None, None)
    created = replication_of(dep, [t.name for t in dep.topics.all()])
    assert set(created.values()) == {(3, "2")}, created

    began = time.monotonic()
    steps = steady_stream(EXECUTIONS)
    feeder = Backfill(dep, steps)
    feeder.start()
    expected = offline(steps, dep.settings)
    feeder.finish()
    progress = Progress(dep)
    print(f"{progress.records} execution-status records of {len(steps)} on the log {since(began)}")
    with contextlib.ExitStack() as workers:
        data = ["--data-dir", str(tmp_path / "data")]
        w = workers.enter_context(worker(dep, reticks=False, env=SESSION, extra_args=data))
        # the worker's own topics (changelogs, Faust's leader topic), replicated the same
        made = changelogs(dep)
        assert any(name.endswith("-changelog") for name in made), made
        assert set(replication_of(dep, made).values()) == {(3, "2")}

        print(f"worker ready {since(began)}")
        done = progress.reach(int(KILL_AT * progress.records), [w], timeout=90)
        leaders = input_leaders(dep)
        victim, led = leaders.most_common(1)[0]
        pid = localstack.broker_pids(stack)[victim]
        os.killpg(pid, signal.SIGKILL)
        print(f"killed broker {victim} (leading {led} input partitions) at {done} {since(began)}")
        # (the outputs are read through the new leaders: a read meanwhile only times out)
        print(f"leaders elected in {moved_away_from(dep, victim):.1f}s")
        got = until_complete_through_elections(dep, expected)
        assert w.poll() is None, "the worker died with the broker"
        print(f"drained {since(began)}")
    assert 0 < done < progress.records, "the broker died before or after the drain"
    assert_same_as_offline(got, expected)
    final_states(got, expected)


def since(began: float) -> str:
    return f"at {time.monotonic() - began:.0f}s"


def test_the_catalogue_asks_for_more_replicas_than_one_broker_has(cluster: Cluster) -> None:
    """On the session's single broker, an explicit factor of 3 is refused with the setting
    named, before anything is created; unset, the broker's one replica is taken."""
    from streams.kafka.admin import admin_client, cluster_replication, create_topics
    from streams.kafka.topics import Replication, ReplicationError, Topics
    from streams.settings import Settings

    settings = replace(
        Settings.from_env(),
        bootstrap_servers=cluster.bootstrap_servers,
        schema_registry_url=cluster.schema_registry_url,
        topic_prefix=f"never-{os.getpid()}",
    )
    metadata = admin_client(settings).list_topics(timeout=30)
    brokers = len(metadata.brokers)
    if brokers != 1:
        pytest.skip(f"the session cluster has {brokers} brokers")
    assert cluster_replication(settings, metadata) == Replication(1, 1)
    with pytest.raises(ReplicationError, match="VIGIL_REPLICATION_FACTOR=3"):
        create_topics(replace(settings, replication_factor=3))
    names = {t.name for t in Topics.from_settings(settings).all()}
    assert not names & set(admin_client(settings).list_topics(timeout=30).topics)
