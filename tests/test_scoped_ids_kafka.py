"""Ids and keys scoped by the execution, through the real broker, registry and worker: issue
26's case, a VERIFIED settling the attempts that share its idempotency key, and an upgrade
from what the version before (83a7350) stored and published.

One deployment, one worker run:

- **The upgrade.** ``fixtures/state_83a7350.json`` holds issue 26's case up to the timeouts
  as 83a7350 left it: the inputs, the execution entries and clocks (written to the tables'
  changelogs as its worker would have, the group's offsets committed after them), and its
  outputs, written to the output topics under their old keys (both executions' operation
  states under ``charge-1``, both work items with one id). ``vigil topics rekey`` carries the
  operation-state topic over; then the new worker resolves the old work items (their stored
  ids, resolutions and RESOLVED alerts scoped), opens a new one (scoped id), and every
  operation's state sits under its scoped key, the old key tombstoned.
- **Issue 26's case, fresh.** Two more executions each send ``charge-1`` attempt 1 (SENT
  09:16:05Z due 09:16:35Z, SENT 09:20:05Z due 09:20:35Z, the next day), both time out, the
  connector rejects both: every id and key differs.
- **Shared idempotency key.** Attempts 1 and 2 of an operation under one key and a keyless
  attempt 3 all time out; the connector verifies attempt 2: attempt 1 is settled with it,
  attempt 3 stays open.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.contracts.envelope import Envelope
from streams.contracts.models import events as ev
from streams.contracts.models import outputs as out
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
    WorkItemKind,
)
from streams.core.operations import resolution_id, work_item_id
from streams.engine.processor import Stores
from streams.kafka.clients import ConsumedRecord
from streams.settings import Settings
from tests.support import ROOT, Deployment, deployment, play, worker
from tests.test_state_upgrade_worker_kafka import _clock, _names, _produce_inputs, _write_changelogs

pytestmark = pytest.mark.kafka

FIXTURE = json.loads((Path(__file__).parent / "fixtures/state_83a7350.json").read_text())
DAY = datetime.fromisoformat("2026-11-02T00:00:00+00:00")
NEXT = DAY + timedelta(days=1)
OLD_WORK_ITEM = "wi-efc461527188cbc977926975"  # the id issue 26 quotes, as 83a7350 stored it
K = OperationEventKind
S = OperationStatus
MODELS = {m.__name__: m for m in (*out.OUTPUT_MODELS, *ev.INPUT_MODELS)}


def _fixture_inputs(names: dict[str, str]) -> list[Envelope]:
    envs = []
    for i in FIXTURE["inputs"]:
        record = MODELS[i["type"]].model_validate(i["record"])
        key = None if i["key"] is None else i["key"].encode()
        envs.append(
            Envelope(
                names[i["topic"]],
                i["partition"],
                i["offset"],
                i["timestamp_ms"],
                key,
                b"",
                record,
                None,
            )
        )
    return envs


def _commit_ends(dep: Deployment, envs: list[Envelope]) -> None:
    """The group's offsets where 83a7350's worker stopped: after every input it had read."""
    ends: dict[tuple[str, int], int] = {}
    for env in envs:
        ends[(env.topic, env.partition)] = env.offset + 1
    admin = AdminClient(dep.settings.confluent_conf())
    request = ConsumerGroupTopicPartitions(
        dep.settings.app_id, [TopicPartition(t, p, o) for (t, p), o in sorted(ends.items())]
    )
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(timeout=30)


def _old_outputs(dep: Deployment, names: dict[str, str]) -> None:
    """83a7350's outputs, on the deployment's output topics under the keys it used."""
    producer = dep.producer()
    for o in FIXTURE["outputs"]:
        record = MODELS[o["type"]].model_validate(o["record"])
        producer.send(names[o["topic"]], record, key=o["key"], headers=dict(o["headers"]))
    producer.flush()


def _status(execution_id: str, seq: int, status: ExecutionStatus, at: datetime) -> Any:
    return ev.ExecutionStatusChanged(
        event_id=f"{execution_id}-s{seq}",
        execution_id=execution_id,
        sequence=seq,
        status=status,
        occurred_at=at,
    )


def _op(
    execution_id: str,
    kind: K,
    at: datetime,
    op: str = "charge-1",
    attempt: int = 1,
    key: str | None = None,
    source: EvidenceSource = EvidenceSource.RUNTIME,
) -> Any:
    return ev.OperationEvent(
        event_id=f"{execution_id}-{op}-{attempt}-{kind}",
        execution_id=execution_id,
        operation_id=op,
        attempt=attempt,
        idempotency_key=key,
        connector="payments",
        kind=kind,
        occurred_at=at,
        reply_due_at=at + timedelta(seconds=30) if kind is K.SENT else None,
        evidence_source=source,
    )


def _tick(at: datetime) -> Any:
    from streams.local.scenario import Tick

    return Tick(at)


def _steps() -> list[Any]:
    """What the new worker reads after the upgrade, in log order."""
    rejected = EvidenceSource.CONNECTOR
    at = DAY + timedelta(hours=9)
    steps: list[Any] = [
        # the upgraded executions: both rejected, and a new operation that times out
        _op("exec-a", K.FAILED, at + timedelta(minutes=23), source=rejected),
        _op("exec-b", K.FAILED, at + timedelta(minutes=24), source=rejected),
        _op("exec-a", K.SENT, at + timedelta(minutes=25), op="charge-2"),
        _tick(at + timedelta(minutes=26)),
    ]
    at = NEXT + timedelta(hours=9)
    # issue 26's case, fresh: SENT 09:16:05Z due 09:16:35Z and SENT 09:20:05Z due 09:20:35Z
    for execution_id, sent in (
        ("exec-c", at + timedelta(minutes=16, seconds=5)),
        ("exec-d", at + timedelta(minutes=20, seconds=5)),
    ):
        steps += [
            _status(execution_id, 1, ExecutionStatus.RUNNING, sent - timedelta(seconds=5)),
            _status(execution_id, 2, ExecutionStatus.WAITING_FOR_TOOL, sent),
            _op(execution_id, K.SENT, sent),
        ]
    steps += [
        _tick(at + timedelta(minutes=21)),
        _op("exec-c", K.FAILED, at + timedelta(minutes=22), source=rejected),
        _op("exec-d", K.FAILED, at + timedelta(minutes=23), source=rejected),
        _tick(at + timedelta(minutes=24)),
    ]
    # the shared idempotency key
    steps += [
        _status("exec-e", 1, ExecutionStatus.RUNNING, at + timedelta(minutes=29)),
        _status("exec-e", 2, ExecutionStatus.WAITING_FOR_TOOL, at + timedelta(minutes=30)),
        _op("exec-e", K.SENT, at + timedelta(minutes=30), key="pay-e"),
        _op("exec-e", K.SENT, at + timedelta(minutes=31), attempt=2, key="pay-e"),
        _op("exec-e", K.SENT, at + timedelta(minutes=32), attempt=3),
        _tick(at + timedelta(minutes=35)),
        _op(
            "exec-e",
            K.VERIFIED,
            at + timedelta(minutes=36),
            attempt=2,
            key="pay-e",
            source=EvidenceSource.CONNECTOR,
        ),
        _tick(at + timedelta(minutes=40)),
    ]
    return steps


def _last_per_key(records: list[ConsumedRecord]) -> dict[str | None, ConsumedRecord]:
    """What compaction leaves of a topic: the last record of each key."""
    return {r.key: r for r in records}


def _of(records: list[ConsumedRecord], cls: type, **match: Any) -> list[Any]:
    return [
        r.record
        for r in records
        if isinstance(r.record, cls) and all(getattr(r.record, k) == v for k, v in match.items())
    ]


def test_scoped_ids_through_the_worker_after_an_upgrade_from_83a7350(
    cluster, tmp_path: Path
) -> None:
    dep = deployment(cluster, tmp_path, partitions=Settings.from_env().partitions)
    names = _names(dep)
    envs = _fixture_inputs(names)
    stores = Stores(
        executions={k: base64.b64decode(v) for k, v in FIXTURE["stores"]["executions"].items()},
        clocks={p: _clock(t, names) for p, t in FIXTURE["stores"]["clocks"].items()},
    )
    _produce_inputs(dep, envs)
    _write_changelogs(dep, stores, envs)
    _commit_ends(dep, envs)
    _old_outputs(dep, names)
    t = dep.topics

    # The carry-over, with the real command.
    cli = [sys.executable, "-m", "streams.cli", "topics", "rekey"]
    done = subprocess.run(cli, env=dep.env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["carried_over"], summary["tombstoned"]) == (2, 1), summary
    states = _last_per_key(dep.read([t.operation_state.name], idle=2.0))
    assert states["charge-1"].raw is None  # the old key: a tombstone
    old_unknown = {
        o["record"]["execution_id"]: o["record"]["state_id"]
        for o in FIXTURE["outputs"]
        if o["type"] == "OperationState" and o["record"]["status"] == "UNKNOWN"
    }
    for execution_id in ("exec-a", "exec-b"):  # each carried over unchanged
        record = states[f"{execution_id}/charge-1"].record
        assert record is not None and record.state_id == old_unknown[execution_id]
    again = subprocess.run(
        cli, env=dep.env(), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    nothing = json.loads(again.stdout)
    assert (nothing["carried_over"], nothing["tombstoned"]) == (0, 0), nothing

    play(dep, _steps())
    outputs = [t.operation_state.name, t.reconciliation_work.name, t.alerts.name]

    def complete(got: list[ConsumedRecord]) -> bool:
        resolved = {(r.execution_id, r.attempt) for r in _of(got, out.WorkItemResolution)}
        opened = {
            r.operation_id for r in _of(got, out.ReconciliationWorkItem, execution_id="exec-a")
        }
        wanted = {("exec-a", 1), ("exec-b", 1), ("exec-c", 1), ("exec-d", 1), ("exec-e", 2)}
        return wanted <= resolved and ("exec-e", 1) in resolved and "charge-2" in opened

    with worker(dep):
        got = dep.read_until(outputs, complete, timeout=120)
    work = [r for r in got if r.topic == t.reconciliation_work.name]
    alerts = [r for r in got if r.topic == t.alerts.name]
    resolutions = {
        (r.execution_id, r.operation_id, r.attempt): r for r in _of(work, out.WorkItemResolution)
    }

    # -- the upgrade: old work items resolved under their stored ids, the rest scoped --------
    for execution_id in ("exec-a", "exec-b"):
        r = resolutions[(execution_id, "charge-1", 1)]
        assert r.work_item_id == OLD_WORK_ITEM  # as 83a7350 stored it, shared by both
        assert r.resolution_id == resolution_id(execution_id, "charge-1", OLD_WORK_ITEM, S.FAILED)
    old_alert = {o["record"]["alert_id"] for o in FIXTURE["outputs"] if o["type"] == "Alert"}
    assert len(old_alert) == 1  # the collision as it was: one alert id for both
    resolved_old = [
        a
        for a in _of(alerts, out.Alert, status=AlertStatus.RESOLVED)
        if a.execution_id in ("exec-a", "exec-b")
    ]
    assert {a.resolves_alert_id for a in resolved_old} == old_alert
    assert len({a.alert_id for a in resolved_old}) == 2
    (charge_2,) = _of(
        work, out.ReconciliationWorkItem, execution_id="exec-a", operation_id="charge-2"
    )
    assert charge_2.work_item_id == work_item_id(
        "exec-a", "charge-2", 1, WorkItemKind.REPLY_TIMEOUT
    )

    # -- issue 26's case, fresh: nothing shared ------------------------------------------------
    items = {
        r.execution_id: r
        for r in _of(work, out.ReconciliationWorkItem)
        if r.execution_id in ("exec-c", "exec-d")
    }
    assert items["exec-c"].deadline != items["exec-d"].deadline
    assert items["exec-c"].work_item_id != items["exec-d"].work_item_id
    assert (
        resolutions[("exec-c", "charge-1", 1)].resolution_id
        != resolutions[("exec-d", "charge-1", 1)].resolution_id
    )
    for status in (AlertStatus.FIRING, AlertStatus.RESOLVED):
        ids = {
            a.execution_id: a.alert_id
            for a in _of(alerts, out.Alert, status=status, kind=AlertKind.OPERATION_UNKNOWN)
            if a.execution_id in ("exec-c", "exec-d")
        }
        assert len(ids) == 2 and ids["exec-c"] != ids["exec-d"]
    alert_keys = {
        r.key
        for r in alerts
        if r.record is not None and r.record.execution_id in ("exec-c", "exec-d")
    }
    assert alert_keys == {"exec-c/charge-1", "exec-d/charge-1"}

    # -- the shared idempotency key --------------------------------------------------------
    sibling = resolutions[("exec-e", "charge-1", 1)]
    assert sibling.outcome is S.VERIFIED and sibling.evidence == (
        "verified_by=charge-1#2",
        "idempotency_key=pay-e",
    )
    assert ("exec-e", "charge-1", 3) not in resolutions  # no key: may be a second effect

    # -- every operation's last state under its scoped key, the old key tombstoned ------------
    states = _last_per_key(dep.read([t.operation_state.name], idle=2.0))
    live = {k: r.record for k, r in states.items() if r.raw is not None}
    assert {k: (s.execution_id, s.operation_id, s.status) for k, s in live.items()} == {
        "exec-a/charge-1": ("exec-a", "charge-1", S.FAILED),
        "exec-b/charge-1": ("exec-b", "charge-1", S.FAILED),
        "exec-a/charge-2": ("exec-a", "charge-2", S.UNKNOWN),
        "exec-c/charge-1": ("exec-c", "charge-1", S.FAILED),
        "exec-d/charge-1": ("exec-d", "charge-1", S.FAILED),
        "exec-e/charge-1": ("exec-e", "charge-1", S.UNKNOWN),  # attempt 3, keyless
    }
    assert live["exec-e/charge-1"].attempt == 3
