"""Blind retries across executions in a replay (docs/rules.md#blind-retries-across-executions,
topology.md, "Replays and backfills"): the replay's processor (``replay_processor``) with the
claims join in-process (``streams/local_join.py``), driven record by record as
``replay_partitions`` drives it, without Kafka. A's send times out (UNKNOWN), then B, in another
partition, sends with the same connector and key: one FORBIDDEN_RETRY naming both executions and
both states held; A FAILED before B sends: neither. Whatever order the partitions are read in,
the same outputs; none of the join's own records among them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streams.contracts.envelope import Envelope
from streams.contracts.models.enums import (
    AlertKind,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    RetryVerdict,
)
from streams.contracts.models.events import ClockTick, OperationEvent
from streams.contracts.models.outputs import Alert, OperationState
from streams.engine.emission import Emission
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.local_join import route
from streams.replay import replay_processor
from streams.settings import Settings

T0 = datetime(2026, 7, 26, 9, 16, 5, tzinfo=UTC)
PARTITIONS = 2
SETTINGS = replace(Settings(partitions=PARTITIONS), output_suffix="-replay")
TOPICS = Topics.from_settings(SETTINGS)
K = OperationEventKind


def _on(partition: int, stem: str) -> str:
    return next(
        f"{stem}-{i}" for i in range(1000) if partition_of(f"{stem}-{i}", PARTITIONS) == partition
    )


A, B, C, D = _on(0, "exec-a"), _on(1, "exec-b"), _on(0, "exec-c"), _on(1, "exec-d")


def op(ex: str, n: int, kind: OperationEventKind, at: timedelta, key: str, **kw: Any) -> Any:
    return OperationEvent(
        event_id=f"{ex}-{n}",
        execution_id=ex,
        operation_id="charge-1",
        attempt=1,
        idempotency_key=key,
        connector="payments",
        kind=kind,
        occurred_at=T0 + at,
        **kw,
    )


def scenario(a: str, b: str, key: str, *, a_fails_first: bool) -> list[OperationEvent]:
    """A sends at T0 (reply due 30 s later), is rejected at +40 s or not; B sends at +4 min."""
    events = [op(a, 1, K.SENT, timedelta(0), key, reply_due_at=T0 + timedelta(seconds=30))]
    if a_fails_first:
        events.append(
            op(a, 2, K.FAILED, timedelta(seconds=40), key, evidence_source=EvidenceSource.CONNECTOR)
        )
    events.append(
        op(b, 1, K.SENT, timedelta(minutes=4), key, reply_due_at=T0 + timedelta(minutes=9))
    )
    return events


def _env(topic: str, record: Any, offset: int, partition: int) -> Envelope:
    ts = int(record.occurred_at.timestamp() * 1000)
    key = getattr(record, "execution_id", None)
    return Envelope(topic, partition, offset, ts, key.encode() if key else None, b"", record, None)


def partition_log(partition: int) -> list[Envelope]:
    """What partition ``partition`` of the inputs holds: the operation events of both cases
    whose executions live there, then ticks at +5 min on every input topic."""
    events = scenario(A, B, "order-42", a_fails_first=False) + scenario(
        C, D, "order-43", a_fails_first=True
    )
    mine = [e for e in events if partition_of(e.execution_id, PARTITIONS) == partition]
    envs = [_env(TOPICS.operation_events.name, e, i, partition) for i, e in enumerate(mine)]
    at = T0 + timedelta(minutes=5)
    for spec in TOPICS.inputs():
        tick = ClockTick(ticker_id="t", partition=partition, occurred_at=at)
        envs.append(_env(spec.name, tick, 100, partition))
    return envs


def replay(order: list[int]) -> list[Emission]:
    """The replay of both partitions, read one after the other in ``order``."""
    processor, join = replay_processor(SETTINGS, None)
    assert join is not None  # one process replaying every partition runs the join
    out: list[Emission] = []
    for p in order:
        for env in partition_log(p):
            out += route(processor, join, processor.handle(env))
    out += route(processor, join, processor.publish_progress())
    return out


def _forbidden(out: list[Emission]) -> list[Alert]:
    return [
        e.record
        for e in out
        if isinstance(e.record, Alert) and e.record.kind is AlertKind.FORBIDDEN_RETRY
    ]


def _last_states(out: list[Emission]) -> dict[str, OperationState]:
    return {e.record.execution_id: e.record for e in out if isinstance(e.record, OperationState)}


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
def test_a_replay_finds_a_blind_retry_across_executions(order: list[int]) -> None:
    out = replay(order)
    published = {t.name for t in TOPICS.outputs()}
    assert {e.topic for e in out} <= published  # no claims, progress or links among them
    (alert,) = [a for a in _forbidden(out) if a.execution_id in (A, B)]
    assert alert.execution_id == B and alert.subject_id == "charge-1"
    assert alert.verdict == "UNKNOWN" and alert.occurred_at == T0 + timedelta(minutes=4)
    assert f"execution={B}" in alert.evidence and f"previous_execution={A}" in alert.evidence
    states = _last_states(out)
    held_a, held_b = states[A], states[B]
    assert held_a.status is OperationStatus.UNKNOWN and held_a.retry is RetryVerdict.FORBIDDEN
    assert (held_a.held_by_execution_id, held_a.held_by_status) == (B, OperationStatus.SENT)
    assert held_b.status is OperationStatus.SENT and held_b.retry is RetryVerdict.FORBIDDEN
    assert (held_b.held_by_execution_id, held_b.held_by_status) == (A, OperationStatus.UNKNOWN)


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
def test_a_replay_finds_no_retry_after_the_other_attempt_failed(order: list[int]) -> None:
    out = replay(order)
    assert [a for a in _forbidden(out) if a.execution_id in (C, D)] == []
    mine = [e.record for e in out if getattr(e.record, "execution_id", None) in (C, D)]
    states = [r for r in mine if isinstance(r, OperationState)]
    assert states and all(s.held_by_execution_id is None for s in states)
    last = _last_states(out)
    assert last[C].status is OperationStatus.FAILED and last[D].retry is RetryVerdict.WAIT


def test_the_partitions_read_order_changes_no_output() -> None:
    def outputs(order: list[int]) -> dict[tuple[str, str | None], list[Any]]:
        per_key: dict[tuple[str, str | None], list[Any]] = {}
        for e in replay(order):
            per_key.setdefault((e.topic, e.key), []).append(e.record)
        return per_key

    assert outputs([0, 1]) == outputs([1, 0])


def test_a_share_of_the_partitions_runs_no_join() -> None:
    processor, join = replay_processor(SETTINGS, [0])
    assert join is None and not processor.cross_execution
    out: list[Emission] = []
    for env in partition_log(0):
        out += processor.handle(env)
    assert {e.topic for e in out} <= {t.name for t in TOPICS.outputs()}


def _settled_log(partition: int, a_at: timedelta, b_at: timedelta) -> list[Envelope]:
    """``partition_log``, then A rejected and B verified by the connector at the given times,
    then ticks past both on every input topic."""
    envs = partition_log(partition)
    later = [
        op(A, 3, K.FAILED, a_at, "order-42", evidence_source=EvidenceSource.CONNECTOR),
        op(B, 2, K.VERIFIED, b_at, "order-42", evidence_source=EvidenceSource.CONNECTOR),
    ]
    mine = [e for e in later if partition_of(e.execution_id, PARTITIONS) == partition]
    envs += [_env(TOPICS.operation_events.name, e, 50 + i, partition) for i, e in enumerate(mine)]
    at = T0 + max(a_at, b_at) + timedelta(minutes=1)
    for spec in TOPICS.inputs():
        tick = ClockTick(ticker_id="t", partition=partition, occurred_at=at)
        envs.append(_env(spec.name, tick, 200, partition))
    return envs


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
@pytest.mark.parametrize("last", ["A", "B"])
def test_the_blind_retry_alert_ends_once_both_attempts_are_settled(
    order: list[int], last: str
) -> None:
    """A rejected, B verified: one RESOLVED alert of B's execution names the blind retry's
    alert, stamped with the later settling, whichever side settles last and whatever order
    the partitions are read in (docs/rules.md#alert-lifecycle)."""
    a_at, b_at = timedelta(minutes=7), timedelta(minutes=6)  # A settles last
    if last == "B":
        a_at, b_at = b_at, a_at
    processor, join = replay_processor(SETTINGS, None)
    assert join is not None
    out: list[Emission] = []
    for p in order:
        for env in _settled_log(p, a_at, b_at):
            out += route(processor, join, processor.handle(env))
    out += route(processor, join, processor.publish_progress())
    fired = [a for a in _forbidden(out) if a.execution_id == B and a.status == "FIRING"]
    ended = [a for a in _forbidden(out) if a.status == "RESOLVED"]
    assert len(fired) == 1 and len(ended) == 1
    (end,) = ended
    assert end.execution_id == B and end.resolves_alert_id == fired[0].alert_id
    assert end.occurred_at == T0 + max(a_at, b_at)
    assert f"previous_execution={A}" in end.evidence
