"""Blind retries across executions through the real broker, registry and worker
(docs/rules.md#blind-retries-across-executions): two executions in different partitions send
with the same connector and idempotency key. A's send times out (UNKNOWN), then B sends: one
FORBIDDEN_RETRY alert naming both executions, and both operation states FORBIDDEN, held by the
other execution's attempt. The same outputs with the partitions split between two workers, and
from a replay of the inputs (the join in-process). A's attempt FAILED before B sends: no alert,
no hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.contracts.models.enums import (
    AlertKind,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    RetryVerdict,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import Alert, ClaimsProgress, OperationState
from streams.kafka.partitioning import partition_of
from streams.replay import run_replay
from tests.support import deployment, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 9, 16, 5, tzinfo=UTC)
PARTITIONS = 2
K = OperationEventKind


def _on(partition: int, stem: str) -> str:
    """An execution id that murmur2 puts on ``partition``."""
    return next(
        f"{stem}-{i}" for i in range(1000) if partition_of(f"{stem}-{i}", PARTITIONS) == partition
    )


def op(
    ex: str, n: int, kind: OperationEventKind, at: timedelta, key: str, **kw: Any
) -> OperationEvent:
    return OperationEvent(
        event_id=f"{ex}-{n}",
        execution_id=ex,
        operation_id="charge-1",  # agent frameworks reuse such names across runs
        attempt=1,
        idempotency_key=key,
        connector="payments",
        kind=kind,
        occurred_at=T0 + at,
        **kw,
    )


def scenario(a: str, b: str, key: str, *, a_fails_first: bool) -> list[OperationEvent]:
    """A sends at T0 (reply due 30 s later); then either A is rejected at +40 s or not; B
    sends at +4 min, with the same connector and key."""
    events = [op(a, 1, K.SENT, timedelta(0), key, reply_due_at=T0 + timedelta(seconds=30))]
    if a_fails_first:
        events.append(
            op(a, 2, K.FAILED, timedelta(seconds=40), key, evidence_source=EvidenceSource.CONNECTOR)
        )
    events.append(
        op(b, 1, K.SENT, timedelta(minutes=4), key, reply_due_at=T0 + timedelta(minutes=9))
    )
    return events


def run(cluster: Any, tmp_path: Path, workers: int) -> dict[str, Any]:
    """Both cases in one deployment, under two keys: A UNKNOWN then B sends (``order-42``),
    and C FAILED then D sends (``order-43``); A and C on partition 0, B and D on 1."""
    dep = deployment(cluster, tmp_path, partitions=PARTITIONS)
    a, b = _on(0, "exec-a"), _on(1, "exec-b")
    c, d = _on(0, "exec-c"), _on(1, "exec-d")
    dep.produce(scenario(a, b, "order-42", a_fails_first=False))
    dep.produce(scenario(c, d, "order-43", a_fails_first=True))
    dep.tick(T0 + timedelta(minutes=5))
    topics = [dep.topics.alerts.name, dep.topics.operation_state.name]

    def settled(rs: list[Any]) -> bool:
        held = {
            r.record.execution_id
            for r in rs
            if isinstance(r.record, OperationState) and r.record.held_by_execution_id
        }
        d_sent = any(
            isinstance(r.record, OperationState)
            and r.record.execution_id == d
            and r.record.status is OperationStatus.SENT
            for r in rs
        )
        return held == {a, b} and d_sent

    with _workers(dep, workers) as procs:
        dep.read_until(topics, settled, timeout=90)
        dep.tick(T0 + timedelta(minutes=6))  # one more round: nothing further may come
        got = dep.read(topics, idle=3.0)
        owners = {ex: _owner(procs, ex) for ex in (a, b)}
        views = {
            ex: httpx.get(
                f"http://127.0.0.1:{procs[owners[ex]].web_port}/v1/executions/{ex}", timeout=10
            ).json()
            for ex in (a, b)
        }
        claims = dep.read([dep.topics.idempotency_claims.name], idle=2.0)
    return {
        "dep": dep,
        "a": a,
        "b": b,
        "c": c,
        "d": d,
        "records": [r.record for r in got],
        "owners": owners,
        "claims": claims,
        "views": views,
    }


def _owner(procs: list[Any], execution_id: str) -> int:
    """Which worker owns the execution: the one whose API answers for it itself (the others
    redirect, 307)."""
    answers = []
    for i, proc in enumerate(procs):
        url = f"http://127.0.0.1:{proc.web_port}/v1/executions/{execution_id}"
        status = httpx.get(url, follow_redirects=False, timeout=10).status_code
        answers.append((status, i))
    (owner,) = [i for status, i in answers if status != 307]
    return owner


class _workers:
    """One or two worker processes on the deployment."""

    def __init__(self, dep: Any, n: int) -> None:
        self.contexts = [worker(dep) for _ in range(n)]

    def __enter__(self) -> list[Any]:
        return [c.__enter__() for c in self.contexts]

    def __exit__(self, *exc: Any) -> None:
        for c in reversed(self.contexts):
            c.__exit__(*exc)


def replay(dep: Any) -> Any:
    """``vigil replay`` of the deployment's inputs from before T0, the join in-process, its
    outputs on the topics with the suffix ``-replay``."""
    return run_replay(
        dep.settings,
        dep.codec,
        T0 - timedelta(minutes=1),
        output_suffix="-replay",
        show_progress=False,
        processes=1,
    )


def _forbidden(records: list[Any]) -> list[Alert]:
    return [r for r in records if isinstance(r, Alert) and r.kind is AlertKind.FORBIDDEN_RETRY]


def _anomalies(records: list[Any]) -> list[Alert]:
    """Inputs refused or quarantined: none in these runs."""
    return [r for r in records if isinstance(r, Alert) and r.kind is AlertKind.ANOMALY]


def _last_states(records: list[Any]) -> dict[str, OperationState]:
    last: dict[str, OperationState] = {}
    for r in records:
        if isinstance(r, OperationState):
            last[r.execution_id] = r
    return last


def _of(records: list[Any], *executions: str) -> list[Any]:
    return [r for r in records if getattr(r, "execution_id", None) in executions]


def _outcome(run_: dict[str, Any]) -> tuple[Any, ...]:
    """What must not depend on how many workers there are: the alerts by id and the final
    state of each operation."""
    alerts = sorted((a.alert_id, a.execution_id, a.evidence) for a in _forbidden(run_["records"]))
    states = _last_states(run_["records"])
    return tuple(alerts), tuple(sorted((k, v.state_id) for k, v in states.items()))


@pytest.fixture(scope="module")
def one_worker(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(cluster, tmp_path_factory.mktemp("one"), 1)


def test_a_send_behind_another_executions_unknown_attempt_is_a_forbidden_retry(
    one_worker: dict[str, Any],
) -> None:
    a, b = one_worker["a"], one_worker["b"]
    assert _anomalies(one_worker["records"]) == []
    records = _of(one_worker["records"], a, b)
    (alert,) = {x.alert_id: x for x in _forbidden(records)}.values()
    assert alert.execution_id == b and alert.subject_id == "charge-1"
    assert alert.verdict == "UNKNOWN"
    assert f"execution={b}" in alert.evidence and f"previous_execution={a}" in alert.evidence
    assert "idempotency_key=order-42" in alert.evidence
    assert alert.occurred_at == T0 + timedelta(minutes=4)  # B's send: event time, not arrival
    states = _last_states(records)
    held_a, held_b = states[a], states[b]
    assert held_b.status is OperationStatus.SENT and held_b.retry is RetryVerdict.FORBIDDEN
    assert (held_b.held_by_execution_id, held_b.held_by_operation_id) == (a, "charge-1")
    assert (held_b.held_by_attempt, held_b.held_by_status) == (1, OperationStatus.UNKNOWN)
    assert held_a.status is OperationStatus.UNKNOWN and held_a.retry is RetryVerdict.FORBIDDEN
    assert (held_a.held_by_execution_id, held_a.held_by_operation_id) == (b, "charge-1")
    assert held_a.held_by_status is OperationStatus.SENT
    # the worker's API shows the same verdicts
    for ex, other in ((a, b), (b, a)):
        (shown,) = one_worker["views"][ex]["operations"]
        assert (shown["retry"], shown["held_by_execution_id"]) == ("FORBIDDEN", other)


def test_two_workers_give_the_same_outputs(
    cluster: Any, tmp_path: Path, one_worker: dict[str, Any]
) -> None:
    two = run(cluster, tmp_path, 2)
    # different deployments: the execution ids are the same, so are the ids derived from them
    assert (two["a"], two["b"]) == (one_worker["a"], one_worker["b"])
    assert two["owners"][two["a"]] != two["owners"][two["b"]]  # A and B on different workers
    assert _outcome(two) == _outcome(one_worker)


def test_a_replay_gives_the_live_alert_and_held_states(one_worker: dict[str, Any]) -> None:
    """``vigil replay`` of the live run's inputs, the join run in-process: the same
    FORBIDDEN_RETRY (same id, both executions named) and the same final operation states,
    held by the other execution's attempt; none of the join's records among its outputs."""
    dep = one_worker["dep"]
    summary = replay(dep)
    assert summary.joined and summary.retry_links > 0 and summary.dead_letters == 0
    names = {dep.topics.alerts.name, dep.topics.operation_state.name}
    replayed = [n + "-replay" for n in sorted(names)]
    assert set(replayed) <= set(summary.output_topics)
    got = {"records": [r.record for r in dep.read(replayed, idle=2.0)]}
    assert _forbidden(got["records"]) and _outcome(got) == _outcome(one_worker)
    held = _last_states(got["records"])
    assert (
        held[one_worker["a"]].held_by_execution_id,
        held[one_worker["b"]].held_by_execution_id,
    ) == (
        one_worker["b"],
        one_worker["a"],
    )
    internal = {t.name for t in dep.topics.internal()}
    assert not any(t.removesuffix("-replay") in internal for t in summary.outputs_by_topic)


def test_a_new_send_after_the_other_attempt_failed_is_no_retry(
    one_worker: dict[str, Any],
) -> None:
    c, d = one_worker["c"], one_worker["d"]
    # the join had what it needed to decide D's send: every claims partition heard from every
    # input partition past it
    sent_d = T0 + timedelta(minutes=4)
    heard = {
        (r.partition, r.record.source_partition)
        for r in one_worker["claims"]
        if isinstance(r.record, ClaimsProgress) and r.record.occurred_at > sent_d
    }
    assert heard == {(p, s) for p in range(PARTITIONS) for s in range(PARTITIONS)}
    records = _of(one_worker["records"], c, d)
    assert _forbidden(records) == []
    states = [s for s in records if isinstance(s, OperationState)]
    assert states and all(s.held_by_execution_id is None for s in states)
    assert _last_states(records)[d].retry is RetryVerdict.WAIT
    assert _last_states(records)[c].status is OperationStatus.FAILED
