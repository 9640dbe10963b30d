"""Issue 2's proof on the real broker and registry: typed event in, typed output out through a
worker subprocess; garbage lands on the dead-letter topic and the worker carries on."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import DeadLetter, ExecutionState
from streams.core.executions import apply_status, status_event
from streams.local.stack import Cluster
from streams.settings import Settings
from tests.support import deployment, made, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def status(ex: str, seq: int, st: ExecutionStatus, minutes: int = 0) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(
        event_id=f"{ex}-{seq}",
        execution_id=ex,
        sequence=seq,
        status=st,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


def test_worker_publishes_typed_output_and_dead_letters_garbage(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    first = status("ex-a", 1, ExecutionStatus.CREATED)
    after = status("ex-a", 2, ExecutionStatus.VALIDATING, 1)
    dep.produce([first])
    raw = Producer(
        {"bootstrap.servers": dep.settings.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    raw.produce(dep.topics.execution_status.name, key=b"ex-a", value=b"\x00\x00garbage")
    raw.flush()
    dep.produce([after])
    dep.tick(T0 + timedelta(minutes=2))  # the watermark releases events strictly before it

    expected_first = apply_status(None, status_event(first)).published
    expected_after = apply_status(
        apply_status(None, status_event(first)).slot, status_event(after)
    ).published

    with worker(dep):
        got = dep.read_until(
            [dep.topics.execution_state.name, dep.topics.dead_letters.name],
            lambda rs: len(rs) >= 3,
        )
    states = [r.record for r in got if isinstance(r.record, ExecutionState)]
    letters = [r for r in got if isinstance(r.record, DeadLetter)]
    assert states == [expected_first, expected_after]
    assert len(letters) == 1
    dl = letters[0].record
    assert dl.original_value == b"\x00\x00garbage"
    assert dl.original_key == b"ex-a"
    assert dl.source_topic == dep.topics.execution_status.name
    assert "truncated" in dl.reason or "schema id" in dl.reason
    # outputs carry the event time as the Kafka timestamp, never the send time
    state_ts = [r.timestamp_ms for r in got if isinstance(r.record, ExecutionState)]
    assert state_ts == [
        int(first.occurred_at.timestamp() * 1000),
        int(after.occurred_at.timestamp() * 1000),
    ]


def test_producer_partitions_like_the_worker(cluster, tmp_path: Path) -> None:
    """murmur2 on both sides: the partition a record lands in is the one the worker's tables
    and our partition_of() expect."""
    from streams.kafka.partitioning import partition_of

    dep = deployment(cluster, tmp_path, partitions=6)
    events = [status(f"ex-{i}", 1, ExecutionStatus.CREATED) for i in range(40)]
    dep.produce(events)
    got = dep.read([dep.topics.execution_status.name], idle=2.0)
    assert len(got) == 40
    for r in got:
        assert r.partition == partition_of(r.key, 6)


def test_registry_refuses_incompatible_change(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    dep.produce([status("ex-b", 1, ExecutionStatus.CREATED)])  # registers v1
    registry = dep.codec.registry
    subject = f"{dep.topics.execution_status.name}-vigil.v1.events.ExecutionStatusChanged"
    assert registry.get_versions(subject) == [1]  # registered by the producer
    v1 = registry.get_latest_version(subject).schema.schema_str
    import json

    incompatible = json.loads(v1)
    incompatible["fields"].append({"name": "tenant", "type": "string", "doc": "no default"})
    with pytest.raises(SchemaRegistryError) as err:
        registry.register_schema(subject, Schema(json.dumps(incompatible), "AVRO"))
    assert err.value.http_status_code == 409

    compatible = json.loads(v1)
    compatible["fields"].append(
        {"name": "tenant", "type": ["null", "string"], "default": None, "doc": "optional"}
    )
    assert registry.register_schema(subject, Schema(json.dumps(compatible), "AVRO")) > 0


def test_ticker_writes_into_every_partition_of_every_input_topic(cluster, tmp_path: Path) -> None:
    import subprocess
    import sys

    from streams.contracts.models.events import ClockTick

    dep = deployment(cluster, tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "streams.cli", "ticker", "--count", "2", "--interval", "100ms"],
        env=dep.env(),
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    got = dep.read([t.name for t in dep.topics.inputs()], idle=2.0)
    ticks = [r for r in got if isinstance(r.record, ClockTick)]
    cells = {(r.topic, r.partition) for r in ticks}
    assert cells == {(t.name, p) for t in dep.topics.inputs() for p in range(t.partitions)}
    assert len(ticks) == 2 * len(cells)
    assert all(r.record.partition == r.partition for r in ticks)
    # a tick's Kafka timestamp is its time: wall clock enters only as data
    assert all(r.timestamp_ms == int(r.record.occurred_at.timestamp() * 1000) for r in ticks)


def test_demo_stops_everything_it_started_on_ctrl_c(cluster, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(
        os.environ,
        KAFKA_BOOTSTRAP_SERVERS=cluster.bootstrap_servers,
        SCHEMA_REGISTRY_URL=cluster.schema_registry_url,
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "demo", "--pace", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        start_new_session=True,
    )
    out = b""
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while b"Playing the scenario" not in out and time.monotonic() < deadline:
        out += proc.stdout.read() or b""
        time.sleep(0.3)
    assert b"Playing the scenario" in out, out.decode()[-2000:]
    # the demo keeps its topics for the user to look at; the test's are deleted after it
    prefix = re.search(rb"Topics (vigil-demo-\d+)\.\* created", out)
    assert prefix is not None, out.decode()[-2000:]
    made.append((_settings_of(cluster), prefix.group(1).decode()))
    # the worker API's address is printed, and it answers there
    api = re.search(rb"Worker API:\s+(http://127\.0\.0\.1:\d+)", out)
    assert api is not None, out.decode()[-2000:]
    assert httpx.get(api.group(1).decode() + "/metrics", timeout=10).status_code == 200
    time.sleep(3)
    workers_before = _demo_workers(tmp_path)
    assert workers_before, "the demo's worker should be running"
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    out += proc.stdout.read() or b""
    assert rc == 130, out.decode()[-3000:]
    time.sleep(1)
    assert _demo_workers(tmp_path) == [], "the demo left its worker running"


def _settings_of(cluster: Cluster) -> Settings:
    return replace(
        Settings.from_env(),
        bootstrap_servers=cluster.bootstrap_servers,
        schema_registry_url=cluster.schema_registry_url,
    )


def _demo_workers(tmp_path: Path) -> list[int]:
    """Worker processes started by a demo (their data dir is a vigil-demo- temp dir)."""
    import subprocess

    res = subprocess.run(
        ["pgrep", "-f", "streams.cli worker .*vigil-demo-"], capture_output=True, text=True
    )
    return [int(x) for x in res.stdout.split()]
