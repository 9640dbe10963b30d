"""Issue 7, faults: a worker killed with SIGKILL, a worker leaving and rejoining a group, and
the broker restarting, each in the middle of a steady stream on the real broker.

Every test produces one deterministic list of scenario steps (many executions' status
sequences, operations whose replies come in time, late or never, forbidden retries, approvals,
duplicates and illegal events, ticks every second of event time) from a background thread
while the fault happens, and compares what the workers published with ``offline()`` of the
same steps: every expected record is there, a repeated id is only ever an identical record
(``by_id`` asserts that) and there is nothing else.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streams.clients import ConsumedRecord
from streams.models import events as ev
from streams.models.base import Record
from streams.models.enums import (
    AnomalyKind,
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
    Risk,
)
from streams.models.outputs import (
    Anomaly,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
)
from streams.scenario import Step, Tick
from tests.support import Deployment, by_id, deployment, kill_hard, worker
from tests.test_pipeline_kafka import offline

pytestmark = pytest.mark.kafka

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
S = ExecutionStatus
K = OperationEventKind
ID_FIELDS = (
    "state_id",
    "resolution_id",
    "work_item_id",
    "verdict_id",
    "alert_id",
    "anomaly_id",
    "dead_letter_id",
)


# -- the stream ----------------------------------------------------------------------------
def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def status(ex: str, seq: int, st: ExecutionStatus, t: float, eid: str | None = None) -> Record:
    return ev.ExecutionStatusChanged(
        event_id=eid or f"{ex}-s{seq}",
        execution_id=ex,
        sequence=seq,
        status=st,
        occurred_at=at(t),
    )


def op(
    ex: str,
    operation: str,
    attempt: int,
    kind: OperationEventKind,
    t: float,
    source: EvidenceSource = EvidenceSource.RUNTIME,
    **kw: Any,
) -> Record:
    return ev.OperationEvent(
        event_id=f"{operation}-{attempt}-{kind.lower()}",
        execution_id=ex,
        operation_id=operation,
        attempt=attempt,
        idempotency_key=f"idem-{operation}",
        connector="sms",
        kind=kind,
        occurred_at=at(t),
        evidence_source=source,
        **kw,
    )


def approval(ex: str, t: float, receipt: bool) -> list[Record]:
    """A high-risk request delivered, acknowledged and accepted; with or without the resume
    receipt (without: STUCK_AFTER_DECISION once the 5 s grace has passed)."""
    rid = f"req-{ex}"
    facts: list[Record] = [
        ev.ApprovalRequested(
            event_id=f"{rid}-requested",
            execution_id=ex,
            request_id=rid,
            action="deploy",
            action_digest="sha256:d1",
            occurred_at=at(t),
            expires_at=at(t + 600),
            approver_ref="role:release-owner",
            resume_handle=f"interrupt://{ex}/1",
            risk=Risk.HIGH,
            grace_seconds=5,
        ),
        ev.RequesterHeartbeat(
            event_id=f"{rid}-hb",
            execution_id=ex,
            occurred_at=at(t + 0.1),
            resume_handle=f"interrupt://{ex}/1",
        ),
        ev.ApprovalDelivery(
            event_id=f"{rid}-delivery",
            execution_id=ex,
            request_id=rid,
            occurred_at=at(t + 0.2),
            outcome=DeliveryOutcome.DELIVERED,
            route_ref="role:release-owner",
        ),
        ev.ApproverAcknowledgement(
            event_id=f"{rid}-ack",
            execution_id=ex,
            request_id=rid,
            occurred_at=at(t + 0.3),
            approver_ref="role:release-owner",
        ),
        ev.ApprovalDecision(
            event_id=f"{rid}-decision",
            execution_id=ex,
            request_id=rid,
            occurred_at=at(t + 0.4),
            decision=DecisionCode.ACCEPT,
            action_digest="sha256:d1",
        ),
    ]
    if receipt:
        facts.append(
            ev.ResumeReceipt(
                event_id=f"{rid}-receipt", execution_id=ex, request_id=rid, occurred_at=at(t + 0.6)
            )
        )
    return facts


def execution(i: int, start: float) -> list[Record]:
    """One execution from CREATED to its end, with one operation; the variant by ``i``:
    0 answered and verified in time, 1 no reply (UNKNOWN, work item) settled later by the
    reconciler, 2 no reply plus a forbidden retry, then FAILED. Some carry an approval, a
    redelivered status (DUPLICATE) or an illegal status (ILLEGAL_TRANSITION)."""
    ex, o = f"run-{i}", f"op-{i}"
    out: list[Record] = []
    chain = [S.CREATED, S.VALIDATING, S.RESOLVING_CONTEXT, S.PLANNING, S.RUNNING]
    out += [status(ex, n, st, start + n) for n, st in enumerate(chain, 1)]
    if i % 4 == 0:
        out += approval(ex, start + 5.2, receipt=i % 8 == 0)
    out.append(status(ex, 6, S.WAITING_FOR_TOOL, start + 6))
    out.append(op(ex, o, 1, K.SENT, start + 6.5, reply_due_at=at(start + 12)))
    variant = i % 3
    if variant == 0:
        out += [
            op(ex, o, 1, K.ACKNOWLEDGED, start + 7, EvidenceSource.CONNECTOR),
            op(ex, o, 1, K.VERIFIED, start + 8, EvidenceSource.RECONCILER, effect_ref=f"e-{i}"),
        ]
        tail = [(S.RUNNING, 9), (S.VALIDATING_OUTPUT, 10), (S.COMPLETED, 11)]
    elif variant == 1:
        out.append(op(ex, o, 1, K.VERIFIED, start + 22, EvidenceSource.RECONCILER))
        tail = [(S.RUNNING, 14), (S.VALIDATING_OUTPUT, 15), (S.COMPLETED, 16)]
    else:
        out.append(op(ex, o, 2, K.SENT, start + 8, reply_due_at=at(start + 18)))
        tail = [(S.FAILED, 20)]
    out += [status(ex, n, st, start + dt) for n, (st, dt) in enumerate(tail, 7)]
    if i % 5 == 1:
        out.append(status(ex, 3, S.RESOLVING_CONTEXT, start + 3.5))  # redelivered: DUPLICATE
    if i % 7 == 2:
        out.append(status(ex, 50, S.CREATED, start + 6.2, eid=f"{ex}-bad"))  # ILLEGAL
    return out


def steady_stream(executions: int, *, every: float = 1.5, extra: list[Record] = ()) -> list[Step]:
    """Executions starting every ``every`` seconds of event time, ticks every second until
    every deadline of the stream has passed; in event-time order (ticks after the events of
    their instant), as producers write them."""
    events = [e for i in range(executions) for e in execution(i, i * every)] + list(extra)
    end = max(e.occurred_at for e in events) + timedelta(seconds=25)  # type: ignore[attr-defined]
    ticks = [Tick(at(s)) for s in range(int((end - T0).total_seconds()) + 1)]
    steps: list[Step] = [*events, *ticks]
    return sorted(steps, key=lambda s: (_time(s), isinstance(s, Tick)))


def _time(s: Step) -> datetime:
    return s.at if isinstance(s, Tick) else s.occurred_at  # type: ignore[attr-defined]


# -- producing and checking ------------------------------------------------------------------
class Feeder(threading.Thread):
    """Produces the steps in order, one second of event time per batch, ``pace`` seconds
    apart, from one idempotent producer (so the offsets are the ones ``offline`` assumes).
    With ``gate``, waits before the first step at or after ``gate_at`` until it is set."""

    def __init__(
        self,
        dep: Deployment,
        steps: list[Step],
        *,
        pace: float = 0.1,
        gate: threading.Event | None = None,
        gate_at: datetime | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.dep, self.steps, self.pace = dep, steps, pace
        self.gate, self.gate_at = gate, gate_at
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            p = self.dep.producer()
            inputs = self.dep.topics.inputs()
            batch_second: int | None = None
            for s in self.steps:
                t = _time(s)
                if self.gate is not None and self.gate_at is not None and t >= self.gate_at:
                    p.flush(180)
                    assert self.gate.wait(240), "gate never opened"
                    self.gate = None
                second = int((t - T0).total_seconds())
                if batch_second is not None and second != batch_second:
                    p.flush(180)
                    time.sleep(self.pace)
                batch_second = second
                if isinstance(s, Tick):
                    for spec in inputs:
                        p.tick(spec.name, spec.partitions, s.at, "test-ticker")
                else:
                    p.send(next(x.name for x in inputs if type(s) in x.value_types), s)
                self.sent += 1
            p.flush(180)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self, timeout: float = 240) -> None:
        self.join(timeout)
        assert not self.is_alive(), "feeder did not finish"
        if self.error is not None:
            raise self.error


def rid(rec: Record) -> str:
    return next(getattr(rec, f) for f in ID_FIELDS if hasattr(rec, f))


def outputs(dep: Deployment) -> list[str]:
    return [t.name for t in dep.topics.outputs()]


def wait_for(
    dep: Deployment, done: Callable[[list[ConsumedRecord]], bool], timeout: float
) -> list[ConsumedRecord]:
    return dep.read_until(outputs(dep), done, timeout=timeout)


def until_complete(
    dep: Deployment, expected: dict[str, Record], timeout: float = 120
) -> list[ConsumedRecord]:
    """Every expected id published, then one more quiet read for stragglers."""
    want = {rid(r) for r in expected.values()}
    wait_for(dep, lambda rs: want <= set(by_id(rs)), timeout)
    return dep.read(outputs(dep), idle=3.0)


def assert_same_as_offline(got: list[ConsumedRecord], expected: dict[str, Record]) -> None:
    live = {r.model_dump_json(): r for r in by_id(got).values()}
    missing = sorted(set(expected) - set(live))
    unexpected = sorted(set(live) - set(expected))
    assert not missing and not unexpected, (
        f"{len(missing)} missing, {len(unexpected)} unexpected;\n"
        f"missing: {missing[:4]}\nunexpected: {unexpected[:4]}"
    )


def final_states(got: list[ConsumedRecord], expected: dict[str, Record]) -> None:
    """What a reader of the compacted topics ends with, per execution and per operation: the
    last record per key in log order, equal to the last one the core computed."""

    def last(records: list[Any], key: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for r in records:
            out[getattr(r, key)] = r
        return out

    in_log_order = sorted(got, key=lambda r: (r.topic, r.partition, r.offset))
    for cls, key in ((ExecutionState, "execution_id"), (OperationState, "operation_id")):
        live = last([r.record for r in in_log_order if isinstance(r.record, cls)], key)
        core = last([r for r in expected.values() if isinstance(r, cls)], key)
        assert live == core, {k: (live.get(k), core.get(k)) for k in core if live.get(k) != core[k]}


def sigterm(proc: Any) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


# -- 1 and 2: kill -9 and restart ----------------------------------------------------------
SPLIT = 70.0  # event time (s) produced only after the restart


def kill_and_restart(cluster: Any, tmp_path: Path, store: str) -> None:
    """SIGKILL in the middle of the stream, restart on the same data dir. State written before
    the kill is needed after it: ``op-hold`` was SENT before the kill and its deadline fires
    after the restart (exactly one UNKNOWN and one work item); ``hold-st`` waits for a tool
    before the kill and its VALIDATING_OUTPUT after it is illegal; ``hold-ok`` completes
    after the restart from the VALIDATING_OUTPUT it reached before."""
    dep = deployment(cluster, tmp_path, partitions=3, store=store)
    extra = [
        op("hold-op", "op-hold", 1, K.SENT, 1, reply_due_at=at(SPLIT + 20)),
        status("hold-st", 1, S.RUNNING, 1),
        status("hold-st", 2, S.WAITING_FOR_TOOL, 2),
        status("hold-st", 3, S.VALIDATING_OUTPUT, SPLIT + 5),
        status("hold-ok", 1, S.RUNNING, 1),
        status("hold-ok", 2, S.VALIDATING_OUTPUT, 2),
        status("hold-ok", 3, S.COMPLETED, SPLIT + 6),
    ]
    steps = steady_stream(40, extra=extra)
    expected = offline(steps, dep.settings)
    restarted = threading.Event()
    feeder = Feeder(dep, steps, pace=0.15, gate=restarted, gate_at=at(SPLIT))

    def before_kill(rs: list[ConsumedRecord]) -> bool:
        recs = [r.record for r in rs]
        return (
            len(recs) >= 60
            and any(isinstance(r, OperationState) and r.operation_id == "op-hold" for r in recs)
            and any(
                isinstance(r, ExecutionState)
                and r.execution_id == "hold-ok"
                and r.last_sequence == 2
                for r in recs
            )
        )

    with worker(dep) as w:
        feeder.start()
        wait_for(dep, before_kill, timeout=90)
        kill_hard(w)
        killed_at = feeder.sent
    assert killed_at < len(steps), "the stream was over before the kill"
    with worker(dep):
        restarted.set()
        feeder.finish()
        got = until_complete(dep, expected)

    assert_same_as_offline(got, expected)
    records = [r.record for r in got]
    items = {
        r.work_item_id
        for r in records
        if isinstance(r, ReconciliationWorkItem) and r.operation_id == "op-hold"
    }
    unknown = {
        r.state_id
        for r in records
        if isinstance(r, OperationState)
        and r.operation_id == "op-hold"
        and r.status == OperationStatus.UNKNOWN
    }
    assert len(items) == 1 and len(unknown) == 1
    assert any(
        isinstance(r, Anomaly)
        and r.execution_id == "hold-st"
        and r.kind == AnomalyKind.ILLEGAL_TRANSITION
        for r in records
    )
    (done,) = {
        r.state_id: r
        for r in records
        if isinstance(r, ExecutionState) and r.execution_id == "hold-ok" and r.terminal
    }.values()
    assert done.status == S.COMPLETED and done.first_seen_at == at(1)
    final_states(got, expected)


def test_kill_9_and_restart_memory_store(cluster, tmp_path: Path) -> None:
    kill_and_restart(cluster, tmp_path, "memory://")


ROCKSDB = importlib.util.find_spec("rocksdict") or importlib.util.find_spec("rocksdb")


@pytest.mark.skipif(
    ROCKSDB is None, reason="no RocksDB binding for Faust installed (pip install rocksdict)"
)
def test_kill_9_and_restart_rocksdb_store(cluster, tmp_path: Path) -> None:
    # faust-streaming's rocksdb:// store uses rocksdict when python-rocksdb is absent
    kill_and_restart(cluster, tmp_path, "rocksdb://")


# -- 3: a worker leaves and rejoins ---------------------------------------------------------
def test_worker_leaves_and_rejoins_under_load(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=4)
    steps = steady_stream(48, every=1.0)
    expected = offline(steps, dep.settings)
    feeder = Feeder(dep, steps, pace=0.2)

    def more_than(n: int) -> Callable[[list[ConsumedRecord]], bool]:
        return lambda rs: len(rs) > n

    with contextlib.ExitStack() as stack:
        a = stack.enter_context(worker(dep, extra_args=["--data-dir", str(tmp_path / "a")]))
        b = stack.enter_context(worker(dep, extra_args=["--data-dir", str(tmp_path / "b")]))
        feeder.start()
        first = len(wait_for(dep, more_than(50), timeout=90))
        sigterm(b)  # leaves: its partitions move to a
        second = len(wait_for(dep, more_than(first + 100), timeout=90))
        stack.enter_context(worker(dep, extra_args=["--data-dir", str(tmp_path / "b2")]))
        assert feeder.sent < len(steps), "the stream was over before the rejoin"
        wait_for(dep, more_than(second + 100), timeout=90)
        feeder.finish()
        got = until_complete(dep, expected)
        assert a.poll() is None
    assert_same_as_offline(got, expected)
    final_states(got, expected)


# -- 4: the broker restarts (last: it disturbs everyone on the cluster) ---------------------
def test_broker_restart_during_processing(cluster, cluster_origin, tmp_path: Path) -> None:
    if cluster_origin != "local":
        pytest.skip(f"the broker can only be restarted on the local stack, not {cluster_origin}")
    from streams import localstack

    dep = deployment(cluster, tmp_path, partitions=3)
    steps = steady_stream(30)
    expected = offline(steps, dep.settings)
    feeder = Feeder(dep, steps, pace=0.2)
    try:
        with worker(dep) as w:
            feeder.start()
            wait_for(dep, lambda rs: len(rs) > 60, timeout=90)
            localstack.down(services=("kafka",))
            time.sleep(3)
            localstack.up()
            assert feeder.sent < len(steps), "the stream was over before the broker restart"
            feeder.finish()
            got = until_complete(dep, expected, timeout=180)
            assert w.poll() is None, "the worker died with the broker"
    finally:
        localstack.up()
    assert_same_as_offline(got, expected)
    final_states(got, expected)


@contextlib.contextmanager
def _noop() -> Iterator[None]:
    yield
