"""An upgraded worker carries on from the state an older version left on the real broker.

An upgrade replaces the worker process and keeps everything else: the input logs, the
consumer group's committed offsets and the tables' changelogs, written by the version before.
``test_state_upgrade.py`` shows that the in-process ``Processor`` reads what commit 6733ee4
(the state format before the execution aggregate) stored; this test runs the real path
instead: ``vigil worker`` recovering its tables from changelog records in that format and
resuming its group's offsets, through the broker and the schema registry.

The state is ``fixtures/state_6733ee4.json``: the execution entries (the packed bytes 6733ee4
wrote) and partition clocks that 6733ee4 left half-way through a small benchmark workload.
The test produces the whole workload to a fresh deployment's input topics (so each record
sits at the offset the workload gives it), writes the entries and clocks into the tables'
changelogs as 6733ee4's worker would have (the table's key and value serializers, the
partition of the execution's inputs), commits the group's offsets where the second half
starts, and starts the new worker. What it publishes must be exactly what the new Processor
publishes in-process carrying on from the same tables over the second half: the same records,
headers and timestamps per (topic, key), in the same order, none missing, none extra.

Topic names: a deployment has its own topic prefix, and both an anomaly's id and its record
name the input topic, as a partition clock names its inputs. So the clocks are written with
the deployment's topic names (what 6733ee4's worker of this deployment would have stored), and
the in-process run that the worker is compared with reads the same records under the same
names. That run is tied to 6733ee4's own outputs (``FIXTURE["rest"]``): under the default
names it publishes exactly those but for the ids, scoped by the execution since
(``assert_carries_on_like_6733ee4``), and under the deployment's the same records but for the
topic names and the ids made from them (anomalies, and alerts on them).

What the outputs cannot show: the clocks. Events are held until their partition's watermark
passes them and the second half ticks every partition again, so the outputs are the same
whether the old clocks are recovered or not (by design: outputs do not depend on where the
ticks fall). The test writes them as 6733ee4 left them and the worker must start on them; the
entries and the committed offsets are what the comparison proves read.
"""

from __future__ import annotations

import base64
import json
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import faust
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench import core
from streams.contracts.models.events import ClockTick
from streams.contracts.models.outputs import Anomaly, ExecutionState
from streams.engine.emission import record_time_ms
from streams.engine.processor import Processor, Stores
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings
from tests.support import Deployment, deployment, worker
from tests.test_state_upgrade import assert_carries_on_like_6733ee4
from vigil_worker.pipeline import _table

pytestmark = pytest.mark.kafka

FIXTURE = json.loads((Path(__file__).parent / "fixtures/state_6733ee4.json").read_text())


def _names(dep: Deployment) -> dict[str, str]:
    """Each default topic name (the workload's, the fixture's) -> the deployment's topic of
    the same role."""
    default = Topics.from_settings(Settings.from_env())
    return {getattr(default, f).name: getattr(dep.topics, f).name for f in vars(default)}


def _clock(text: str, names: dict[str, str]) -> str:
    """A stored partition clock (6733ee4's JSON text) with its topic names mapped, in the
    same form: compact JSON, topics sorted."""
    clock = json.loads(text)
    clock["inputs"] = sorted(names[t] for t in clock["inputs"])
    clock["maxima"] = sorted([names[t], at] for t, at in clock["maxima"])
    clock["through"] = sorted([names[t], offset] for t, offset in clock["through"])
    return json.dumps(clock, separators=(",", ":"))


def _stores(names: dict[str, str]) -> Stores:
    saved = FIXTURE["stores"]
    return Stores(
        executions={k: base64.b64decode(v) for k, v in saved["executions"].items()},
        clocks={p: _clock(text, names) for p, text in saved["clocks"].items()},
    )


def _carry_on(settings: Settings, stores: Stores, envs: list[Any]) -> list[Any]:
    """What the new Processor publishes carrying on from ``stores`` over ``envs``."""
    processor = Processor.from_settings(
        settings, Topics.from_settings(settings), stores, write_behind=True
    )
    out: list[Any] = []
    for env in envs:
        out.extend(processor.handle(env))
    return out


def _produce_inputs(dep: Deployment, envs: list[Any]) -> None:
    """Every input record of the workload, in order, to its partition, keyed and stamped as
    the workload has it (Confluent-framed Avro through the project's producer)."""
    producer = dep.producer()
    for env in envs:
        assert record_time_ms(env.record) == env.timestamp_ms
        if isinstance(env.record, ClockTick):
            assert env.record.partition == env.partition and env.key is None
        else:
            assert partition_of(env.key.decode(), dep.settings.partitions) == env.partition
        producer.send(
            env.topic,
            env.record,
            key=None if env.key is None else env.key.decode(),
            partition=env.partition,
        )
    producer.flush()
    got = dep.read([t.name for t in dep.topics.inputs()], idle=2.0)
    at = {(r.topic, r.partition, r.offset): r for r in got}
    assert len(at) == len(got) == len(envs)
    for env in envs:  # each record at the offset the workload gives it
        r = at[(env.topic, env.partition, env.offset)]
        assert r.record == env.record
        assert r.key == (None if env.key is None else env.key.decode())
        assert r.timestamp_ms == env.timestamp_ms


def _write_changelogs(dep: Deployment, stores: Stores, envs: list[Any]) -> None:
    """The tables' changelogs as 6733ee4's worker left them: each entry and clock serialized
    by the worker's own table (``vigil_worker/pipeline._table``), in its partition."""
    settings = dep.settings
    n = settings.partitions
    app = faust.App(settings.app_id, broker=f"kafka://{settings.bootstrap_servers}")
    executions = _table(app, "executions", n, packed=True)
    clocks = _table(app, "partition-clocks", n)
    admin = AdminClient(settings.confluent_conf())
    created = admin.create_topics(
        [
            NewTopic(
                t.changelog_topic.get_topic_name(),
                num_partitions=n,
                replication_factor=1,
                config={"cleanup.policy": "compact"},
            )
            for t in (executions, clocks)
        ]
    )
    for future in created.values():
        future.result(timeout=30)
    # An entry lives in the partition of its execution's inputs.
    input_partition = {
        env.record.execution_id: env.partition
        for env in envs
        if not isinstance(env.record, ClockTick)
    }
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for table, store in ((executions, stores.executions), (clocks, stores.clocks)):
        topic = table.changelog_topic
        for key, value in store.items():
            if table is executions:
                partition = partition_of(key, n)
                assert partition == input_partition[key], key
            else:
                partition = int(key)
            producer.produce(
                topic.get_topic_name(),
                key=topic.prepare_key(key, table.key_serializer)[0],
                value=topic.prepare_value(value, table.value_serializer)[0],
                partition=partition,
            )
    assert producer.flush(30) == 0


def _commit_split(dep: Deployment, envs: list[Any], split: int) -> None:
    """The group's offsets where 6733ee4's worker stopped: per input partition, the first
    offset of the second half (the partition's end where the second half has none)."""
    ends: dict[tuple[str, int], int] = defaultdict(int)
    for env in envs:
        ends[(env.topic, env.partition)] = env.offset + 1
    at = dict(ends)
    for env in reversed(envs[split:]):
        at[(env.topic, env.partition)] = env.offset
    for env in envs[:split]:  # the halves split each partition in two: no offset overlaps
        assert env.offset < at[(env.topic, env.partition)]
    assert set(at) == {(t.name, p) for t in dep.topics.inputs() for p in range(t.partitions)}
    settings = dep.settings
    admin = AdminClient(settings.confluent_conf())
    request = ConsumerGroupTopicPartitions(
        settings.app_id, [TopicPartition(t, p, offset) for (t, p), offset in sorted(at.items())]
    )
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(timeout=30)


def _per_key(items: list[tuple[str, str | None, Any, dict[str, str], int | None]]) -> Any:
    """Outputs as (topic, key) -> [(type, JSON, headers, timestamp), ...] in published order."""
    out: dict[tuple[str, str | None], list[tuple[str, str, dict[str, str], int | None]]] = (
        defaultdict(list)
    )
    for topic, key, record, headers, ts in items:
        out[(topic, key)].append((type(record).__name__, record.model_dump_json(), headers, ts))
    return dict(out)


def _settle(dep: Deployment, topics: list[str], expected: int, timeout: float = 120.0) -> None:
    """Until ``expected`` outputs are there, or their number has stopped growing for 20 s (the
    comparison that follows then says what is missing)."""
    deadline = time.monotonic() + timeout
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(dep.read(topics, idle=1.0))
        if now >= expected:
            return
        if now != count:
            count, since = now, time.monotonic()
        elif now and time.monotonic() - since > 20:
            return
        time.sleep(0.5)


def test_the_new_worker_carries_on_from_6733ee4_state_on_the_broker(
    cluster, tmp_path: Path
) -> None:
    envs = core.workload(FIXTURE["executions"])
    split = FIXTURE["split"]
    dep = deployment(cluster, tmp_path, partitions=Settings.from_env().partitions)
    names = _names(dep)
    mapped = [replace(env, topic=names[env.topic]) for env in envs]

    # The in-process run under the default names publishes what 6733ee4 published, and under
    # the deployment's names the very same records but for the topic names and the ids made
    # from them.
    default_run = _carry_on(Settings.from_env(), _stores({n: n for n in names}), envs[split:])
    assert_carries_on_like_6733ee4(default_run)
    expected = _carry_on(dep.settings, _stores(names), mapped[split:])
    assert len(expected) == len(default_run)
    for old, new in zip(default_run, expected, strict=True):
        assert (names[old.topic], old.key, type(old.record)) == (
            new.topic,
            new.key,
            type(new.record),
        )
        if not isinstance(new.record, Anomaly) and new.topic != dep.topics.alerts.name:
            assert new == old._replace(topic=new.topic)
    # Written back with the identity mapping, a clock is 6733ee4's text to the byte.
    assert _stores({n: n for n in names}).clocks == FIXTURE["stores"]["clocks"]

    stores = _stores(names)
    _produce_inputs(dep, mapped)
    _write_changelogs(dep, stores, mapped)
    _commit_split(dep, mapped, split)
    ticks = [env.record.occurred_at for env in mapped if isinstance(env.record, ClockTick)]
    dep.last_tick = max(ticks)  # sent again while the worker runs: heals a missed tick only

    outputs = [t.name for t in dep.topics.outputs()]
    started = time.monotonic()
    with worker(dep):
        ready = time.monotonic()
        _settle(dep, outputs, len(expected))
        done = time.monotonic()
        time.sleep(3)  # anything more would come now
        got = dep.read(outputs, idle=2.0)
    print(f"worker ready after {ready - started:.1f}s, outputs settled {done - ready:.1f}s later")

    assert all(r.record is not None for r in got), [r.error for r in got if r.error][:3]
    published = _per_key([(r.topic, r.key, r.record, r.headers, r.timestamp_ms) for r in got])
    want = _per_key(
        [(em.topic, em.key, em.record, dict(em.headers), em.timestamp_ms) for em in expected]
    )
    assert published.keys() == want.keys()
    for key, records in want.items():
        assert published[key] == records, key
    assert len(got) == len(expected)

    # every kind of output the in-process run has, and no anomaly it does not have
    kinds = {(em.topic, type(em.record)) for em in expected}
    assert {(r.topic, type(r.record)) for r in got} == kinds
    assert len(kinds) >= 6
    assert sorted(r.record.anomaly_id for r in got if isinstance(r.record, Anomaly)) == sorted(
        em.record.anomaly_id for em in expected if isinstance(em.record, Anomaly)
    )

    # The old entries were applied: each execution state published concerns an execution whose
    # entry came from 6733ee4, and carries the time it was first seen, before the second half
    # began, which only that entry holds.
    second_half = {
        env.record.execution_id: env.record.occurred_at
        for env in reversed(mapped[split:])
        if not isinstance(env.record, ClockTick)
    }
    states = [r.record for r in got if isinstance(r.record, ExecutionState)]
    assert states and {s.execution_id for s in states} <= stores.executions.keys()
    assert all(s.first_seen_at < second_half[s.execution_id] for s in states)
