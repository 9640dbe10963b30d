"""Faults: a worker killed with SIGKILL, a worker leaving and rejoining a group, and
the broker restarting, each in the middle of a steady stream on the real broker.

Every test produces one deterministic list of scenario steps (many executions' status
sequences, operations whose replies come in time, late or never, forbidden retries, approvals,
duplicates and illegal events, ticks every second of event time) from a background thread
while the fault happens, and compares what the workers published with ``offline()`` of the
same steps: every expected record is there, a repeated id is only ever an identical record
(``by_id`` asserts that) and there is nothing else.

Two failures these tests found, each with its own exception so a regression says which:
``ReprocessedAsAnomaly`` (inputs the tables already held processed again after a restart or a
rebalance, reported as anomalies a single run never publishes; fixed by the applied positions
in each execution entry, ``streams/engine/state.py``) and ``MissingOutputs`` (Faust skipping input
records after a rebalance; fixed by the offset guard, ``streams/kafka/offsets.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AnomalyKind,
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
    Risk,
)
from streams.contracts.models.outputs import (
    Alert,
    Anomaly,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
)
from streams.kafka.clients import ConsumedRecord
from streams.kafka.partitioning import partition_of
from streams.local.scenario import Step, Tick
from tests.support import Deployment, by_id, deployment, kill_hard, own_brokers, worker
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
    With ``gate``, waits before the first step at or after ``gate_at`` until it is set
    (``at_gate`` tells when it got there, with everything before it delivered)."""

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
        self.at_gate = threading.Event()
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
                    self.at_gate.set()
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
        """Wait until everything is produced; check the input topics hold exactly the steps
        (the offsets ``offline`` assumes), nothing duplicated by producer retries."""
        self.join(timeout)
        assert not self.is_alive(), "feeder did not finish"
        if self.error is not None:
            raise self.error
        want: Counter[tuple[str, int]] = Counter()
        for s in self.steps:
            if isinstance(s, Tick):
                for spec in self.dep.topics.inputs():
                    want.update((spec.name, p) for p in range(spec.partitions))
            else:
                spec = next(x for x in self.dep.topics.inputs() if type(s) in x.value_types)
                want[(spec.name, partition_of(s.execution_id, spec.partitions))] += 1
        c = Consumer(self.dep.settings.confluent_conf() | {"group.id": "faults-reader"})
        try:
            have = {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=10)[1] for tp in want}
        finally:
            c.close()
        assert have == dict(want), "the input topics do not hold exactly the produced steps"


def rid(rec: Record) -> str:
    return next(getattr(rec, f) for f in ID_FIELDS if hasattr(rec, f))


def outputs(dep: Deployment) -> list[str]:
    return [t.name for t in dep.topics.outputs()]


def read_now(dep: Deployment, topics: list[str], timeout: float = 30) -> list[ConsumedRecord]:
    """Everything in ``topics`` up to their end offsets at the time of the call (reading
    until idle never ends while a steady stream is being processed)."""
    c = Consumer(
        dep.settings.confluent_conf() | {"group.id": "faults-reader", "enable.auto.commit": False}
    )
    out: list[ConsumedRecord] = []
    try:
        ends: dict[tuple[str, int], int] = {}
        assignment = []
        meta = c.list_topics(timeout=10)
        for t in topics:
            for p in meta.topics[t].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if high > low:
                    ends[(t, p)] = high
                    assignment.append(TopicPartition(t, p, low))
        c.assign(assignment)
        deadline = time.monotonic() + timeout
        while ends:
            assert time.monotonic() < deadline, f"could not read up to {ends}"
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            t, p = msg.topic(), msg.partition()
            out.append(
                ConsumedRecord(
                    topic=t,
                    partition=p,
                    offset=msg.offset(),
                    timestamp_ms=msg.timestamp()[1],
                    key=msg.key().decode() if msg.key() is not None else None,
                    headers={k: (v or b"").decode() for k, v in (msg.headers() or [])},
                    record=dep.codec.decode(t, msg.value()),
                    error=None,
                    raw=msg.value(),
                )
            )
            if (t, p) in ends and msg.offset() + 1 >= ends[(t, p)]:
                del ends[(t, p)]
    finally:
        c.close()
    return out


def wait_for(
    dep: Deployment,
    done: Callable[[list[ConsumedRecord]], bool],
    timeout: float,
    topics: list[str] | None = None,
) -> list[ConsumedRecord]:
    deadline = time.monotonic() + timeout
    while True:
        got = read_now(dep, topics or outputs(dep))
        if done(got):
            return got
        assert time.monotonic() < deadline, f"timed out with {len(got)} records\n{worker_logs(dep)}"
        time.sleep(0.3)


def worker_logs(dep: Deployment, tail: int = 3000) -> str:
    """The end of every worker log of this deployment: what a timeout needs to be read."""
    return "\n".join(
        f"--- {log.name}:\n{log.read_text(errors='replace')[-tail:]}"
        for log in sorted(dep.workdir.glob("worker-*.log"))
    )


class MissingOutputs(AssertionError):
    """Expected records never came although the workers had gone quiet: input was lost."""


class ReprocessedAsAnomaly(AssertionError):
    """Nothing is missing, and every unexpected record is an anomaly about an input the run
    had already applied, or its ANOMALY alert: the input was processed again."""


REPROCESSED = {AnomalyKind.DUPLICATE, AnomalyKind.OUT_OF_ORDER, AnomalyKind.AFTER_TERMINAL}


def split(
    got: list[ConsumedRecord], expected: dict[str, Record]
) -> tuple[dict[str, Record], list[Record]]:
    """Live records by id, and apart from them what processing an input again produces: an
    anomaly the core never computed (DUPLICATE, OUT_OF_ORDER, AFTER_TERMINAL), or an expected
    anomaly re-judged against a later state (same id, another reason), and their ANOMALY
    alerts. ``by_id`` asserts that every other repeated id is an identical record."""
    want = {rid(r): r for r in expected.values()}

    def again(rec: Record | None) -> bool:
        if isinstance(rec, Alert) and rec.kind == AlertKind.ANOMALY:
            kind = rec.verdict
        elif isinstance(rec, Anomaly):
            kind = rec.kind
        else:
            return False
        assert rec is not None
        known = want.get(rid(rec))
        return (known is None and kind in REPROCESSED) or (known is not None and known != rec)

    aside = [r.record for r in got if again(r.record)]
    live = by_id(r for r in got if not again(r.record))
    return live, aside


def until_complete(
    dep: Deployment, expected: dict[str, Record], *, quiet: float = 15, timeout: float = 150
) -> list[ConsumedRecord]:
    """Wait until every expected id is published, then until nothing more comes. If nothing
    has come for ``quiet`` seconds and something is still missing, it is lost."""
    want = {rid(r): r for r in expected.values()}
    deadline = time.monotonic() + timeout
    count, changed = -1, time.monotonic()
    while True:
        got = read_now(dep, outputs(dep))
        now = time.monotonic()
        if len(got) != count:
            count, changed = len(got), now
        live, _ = split(got, expected)
        missing = [r for k, r in want.items() if k not in live]
        if not missing and now - changed > 3:
            return got
        if missing and (now - changed > quiet or now > deadline):
            raise MissingOutputs(
                f"{len(missing)} expected records never came (nothing new for "
                f"{now - changed:.0f}s): {[m.model_dump_json() for m in missing[:5]]}"
            )
        time.sleep(1)


def assert_same_as_offline(got: list[ConsumedRecord], expected: dict[str, Record]) -> None:
    live, aside = split(got, expected)
    live_json = {r.model_dump_json() for r in live.values()}
    missing = sorted(set(expected) - live_json)
    unexpected = sorted(live_json - set(expected))
    if missing:
        raise MissingOutputs(f"{len(missing)} missing: {missing[:4]}")
    assert not unexpected, f"{len(unexpected)} unexpected: {unexpected[:4]}"
    if aside:
        kinds = Counter(str(r.kind) for r in aside if isinstance(r, Anomaly))
        if any(rid(r) in live for r in aside):
            kinds["re-judged with another reason"] = sum(rid(r) in live for r in aside)
        raise ReprocessedAsAnomaly(
            f"{len(aside)} records from inputs processed twice, anomalies {dict(kinds)}: "
            f"{[r.model_dump_json() for r in aside[:3]]}"
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
        diverged = {k: (live.get(k), v) for k, v in core.items() if live.get(k) != v}
        if any(v[0] is None for v in diverged.values()):
            raise MissingOutputs(f"no final state: {diverged}")
        assert not diverged, f"final states diverge (live, core): {diverged}"


def sigterm(proc: Any) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


# -- 1 and 2: kill -9 and restart ----------------------------------------------------------
SPLIT = 70.0  # event time (s) produced only after the restart
STORES = {"memory": "memory://"}
if importlib.util.find_spec("rocksdict") or importlib.util.find_spec("rocksdb"):
    # faust-streaming's rocksdb:// store uses rocksdict when python-rocksdb is absent
    STORES["rocksdb"] = "rocksdb://"


@dataclass
class Outcome:
    got: list[ConsumedRecord] = field(default_factory=list)
    expected: dict[str, Record] = field(default_factory=dict)
    error: BaseException | None = None


def kill_and_restart(cluster: Any, tmp_path: Path, store: str) -> Outcome:
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
    gate_index = next(i for i, s in enumerate(steps) if _time(s) >= at(SPLIT))
    outcome = Outcome(expected=offline(steps, dep.settings))
    restarted = threading.Event()
    feeder = Feeder(dep, steps, pace=0.2, gate=restarted, gate_at=at(SPLIT))

    def before_kill(rs: list[ConsumedRecord]) -> bool:
        recs = [r.record for r in rs]
        hold_op = any(isinstance(r, OperationState) and r.operation_id == "op-hold" for r in recs)
        hold_ok = any(
            isinstance(r, ExecutionState) and r.execution_id == "hold-ok" and r.last_sequence == 2
            for r in recs
        )
        return len(recs) >= 40 and hold_op and hold_ok

    try:
        with worker(dep, reticks=False) as w:
            feeder.start()
            states = [dep.topics.execution_state.name, dep.topics.operation_state.name]
            wait_for(dep, before_kill, 90, states)
            kill_hard(w)
        assert feeder.sent < gate_index, "the first part of the stream was over before the kill"
        with worker(dep, reticks=False):
            restarted.set()
            feeder.finish()
            outcome.got = until_complete(dep, outcome.expected)
    except BaseException as exc:
        outcome.error = exc
    finally:
        restarted.set()
    return outcome


RUNNING: list[Restarts] = []


class Restarts:
    """The kill-and-restart scenarios, one per store, running in background threads."""

    def __init__(self, cluster: Any, tmp_path_factory: Any) -> None:
        self.results: dict[str, Outcome] = {}
        self.threads = {
            name: threading.Thread(
                target=self._run, args=(name, cluster, tmp_path_factory.mktemp(name), store)
            )
            for name, store in STORES.items()
        }
        for t in self.threads.values():
            t.start()
        RUNNING.append(self)

    def _run(self, name: str, cluster: Any, tmp_path: Path, store: str) -> None:
        self.results[name] = kill_and_restart(cluster, tmp_path, store)

    def result(self, name: str) -> Outcome:
        self.threads[name].join(300)
        return self.results.get(name) or Outcome(error=AssertionError(f"{name} never finished"))

    def join(self) -> None:
        for name in self.threads:
            self.result(name)


@pytest.fixture(scope="module")
def restarts(cluster, tmp_path_factory) -> Iterator[Restarts]:
    """Started by the first test that asks for it and run in the background: a restarted
    worker waits out the dead member's session (Faust's broker_session_timeout, 60 s) before
    it gets partitions, and the file has 4 minutes. Joined before the broker test."""
    runs = Restarts(cluster, tmp_path_factory)
    yield runs
    runs.join()


def check_restart(outcome: Outcome) -> None:
    if outcome.error is not None:
        raise outcome.error
    got, expected = outcome.got, outcome.expected
    final_states(got, expected)
    live, _ = split(got, expected)
    records = list(live.values())
    items = [r for r in records if isinstance(r, ReconciliationWorkItem)]
    assert len([r for r in items if r.operation_id == "op-hold"]) == 1
    unknown = [
        r
        for r in records
        if isinstance(r, OperationState)
        and r.operation_id == "op-hold"
        and r.status == OperationStatus.UNKNOWN
    ]
    assert len(unknown) == 1 and unknown[0].since == at(SPLIT + 20)
    assert [r.kind for r in records if isinstance(r, Anomaly) and r.execution_id == "hold-st"] == [
        AnomalyKind.ILLEGAL_TRANSITION
    ]
    (done,) = [r for r in records if isinstance(r, ExecutionState) and r.execution_id == "hold-ok"][
        -1:
    ]
    assert done.status == S.COMPLETED and done.first_seen_at == at(1)
    assert_same_as_offline(got, expected)


# -- 3: a worker leaves and rejoins ---------------------------------------------------------
def assigned_inputs(proc: Any, dep: Deployment) -> set[int]:
    """The partitions of the execution-status topic in the worker's latest assignment (from
    the table Faust logs after "Setting newly assigned partitions")."""
    text = proc.log_path.read_text(errors="replace")
    last = text.rsplit("Setting newly assigned partitions", 1)
    if len(last) < 2:
        return set()
    table = last[1].split("for group", 1)[0]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 2 and cells[0] == dep.topics.execution_status.name:
            spec = cells[1].strip("{}")
            out: set[int] = set()
            for part in spec.split(","):
                lo, _, hi = part.partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
            return out
    return set()


def settled(workers: list[Any], dep: Deployment, timeout: float = 60) -> list[set[int]]:
    """Wait until the workers' latest assignments split all partitions between them, each
    worker holding some."""
    deadline = time.monotonic() + timeout
    while True:
        parts = [assigned_inputs(w, dep) for w in workers]
        together = sorted(p for ps in parts for p in ps)
        if all(parts) and together == list(range(dep.settings.partitions)):
            return parts
        assert time.monotonic() < deadline, f"assignments never settled: {parts}"
        time.sleep(0.5)


def test_worker_leaves_and_rejoins_under_load(cluster, tmp_path: Path, restarts) -> None:
    """a and b share the partitions; b leaves (SIGTERM) and its partitions move to a; b2
    joins and takes some back; all while the stream is being produced. (``restarts`` only to
    run the kill scenarios meanwhile.)"""
    dep = deployment(cluster, tmp_path, partitions=4)
    steps = steady_stream(48, every=1.0)
    expected = offline(steps, dep.settings)
    feeder = Feeder(dep, steps, pace=0.2)

    def more_than(n: int) -> Callable[[list[ConsumedRecord]], bool]:
        return lambda rs: len(rs) > n

    with contextlib.ExitStack() as stack:
        a = stack.enter_context(
            worker(dep, reticks=False, extra_args=["--data-dir", str(tmp_path / "a")])
        )
        b = stack.enter_context(
            worker(dep, reticks=False, extra_args=["--data-dir", str(tmp_path / "b")])
        )
        settled([a, b], dep)
        feeder.start()
        first = len(wait_for(dep, more_than(100), timeout=60))
        sigterm(b)
        settled([a], dep)  # b's partitions moved to a
        second = len(wait_for(dep, more_than(first + 100), timeout=60))
        b2 = stack.enter_context(
            worker(dep, reticks=False, extra_args=["--data-dir", str(tmp_path / "b2")])
        )
        assert feeder.sent < len(steps), "the stream was over before the rejoin"
        settled([a, b2], dep)  # partitions come back
        wait_for(dep, more_than(second + 100), timeout=60)
        feeder.finish()
        got = until_complete(dep, expected)
        assert a.poll() is None and b2.poll() is None
    final_states(got, expected)
    assert_same_as_offline(got, expected)


# -- 1 and 2, results ---------------------------------------------------------------------
def test_kill_9_and_restart_memory_store(restarts) -> None:
    check_restart(restarts.result("memory"))


@pytest.mark.skipif("rocksdb" not in STORES, reason="no RocksDB binding (pip install rocksdict)")
def test_kill_9_and_restart_rocksdb_store(restarts) -> None:
    check_restart(restarts.result("rocksdb"))


# -- 4: the broker restarts ------------------------------------------------------------------
def test_broker_restart_during_processing(
    cluster, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A broker of the test's own (``own_brokers``: restarting the session's would disturb
    every test after it) is stopped (SIGTERM) and started again while the worker processes a
    steady stream; the worker stays up, reconnects and carries on."""
    from streams.local import stack as localstack

    for runs in RUNNING:
        runs.join()  # the kill scenarios run on their own meanwhile: let them finish first
    with own_brokers(cluster, tmp_path_factory.mktemp("restarted-broker")) as (own, stack):
        dep = deployment(own, tmp_path, partitions=3)
        steps = steady_stream(20)
        expected = offline(steps, dep.settings)
        # Production pauses while the broker is away: records in flight across a broker
        # restart were seen written twice (despite enable.idempotence), and the offsets would
        # then no longer be the ones offline() assumes.
        resume = threading.Event()
        feeder = Feeder(dep, steps, pace=0.1, gate=resume, gate_at=at(35))
        try:
            with worker(dep, reticks=False) as w:
                feeder.start()
                assert feeder.at_gate.wait(90), "the first half of the stream was never produced"
                done_before = len(read_now(dep, outputs(dep)))
                # while the worker digests the first half
                localstack.down(services=("kafka",), settings=stack)
                time.sleep(3)
                localstack.up(settings=stack, services=("kafka",))
                resume.set()
                feeder.finish()
                got = until_complete(dep, expected, quiet=30, timeout=180)
                assert w.poll() is None, "the worker died with the broker"
        finally:
            resume.set()
    assert 0 < done_before < len(expected)
    assert_same_as_offline(got, expected)
    final_states(got, expected)
