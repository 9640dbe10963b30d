"""A worker recovers state that an earlier version wrote, on the real broker.

Before entries were packed (``streams/engine/compact.py``), the executions table logged each
entry as a JSON string. A worker of this version must read such a changelog on start-up and carry on
from it. Otherwise an upgrade would forget every execution in flight."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.outputs import ExecutionState
from streams.core import executions as ex
from streams.engine.state import Entry
from streams.kafka.partitioning import partition_of
from tests.support import deployment, worker
from tests.test_worker_kafka import T0, status

pytestmark = pytest.mark.kafka


def test_a_worker_carries_on_from_entries_logged_as_json_strings(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    settings = dep.settings
    first = status("ex-old", 1, ExecutionStatus.CREATED)
    second = status("ex-old", 2, ExecutionStatus.VALIDATING, 1)
    before = ex.apply_status(None, ex.status_event(first))
    assert isinstance(before.slot, ex.InFlight)

    # What a worker of the earlier version logged after ``first``: the entry's text as a JSON
    # string, under the JSON key, in the execution's partition of the table's changelog.
    changelog = f"{settings.app_id}-executions-changelog"
    admin = AdminClient(settings.confluent_conf())
    created = admin.create_topics(
        [
            NewTopic(
                changelog,
                num_partitions=settings.partitions,
                replication_factor=1,
                config={"cleanup.policy": "compact"},
            )
        ]
    )
    for future in created.values():
        future.result(timeout=30)
    legacy = Entry(inflight=ex.dump_slot(before.slot)).encode()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(
        changelog,
        key=json.dumps("ex-old").encode(),
        value=json.dumps(legacy).encode(),
        partition=partition_of("ex-old", settings.partitions),
    )
    assert producer.flush(30) == 0

    dep.produce([second])
    dep.tick(T0 + timedelta(minutes=2))
    with worker(dep):
        got = dep.read_until([dep.topics.execution_state.name], lambda rs: len(rs) >= 1)

    # ``second`` continues the recovered execution: first seen at ``first``'s time, one step on.
    # A worker that could not read the entry would have started a new execution at ``second``.
    expected = ex.apply_status(before.slot, ex.status_event(second)).published
    assert [r.record for r in got if isinstance(r.record, ExecutionState)] == [expected]
    assert expected is not None and expected.first_seen_at == first.occurred_at
