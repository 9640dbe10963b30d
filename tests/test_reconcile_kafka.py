"""``vigil reconcile`` against a real source: local payments providers (streams/local/provider.py)
started by the tests, the real broker and registry, one real worker shared by the module, and
the reconciler as a real process (killed, restarted, run twice).

Each test makes operations go UNKNOWN (a SENT whose reply deadline passes) and checks, on the
topics, that the outputs are exactly those the rules give (docs/rules.md#the-reconciler):
the reconciler's events, the operation states, the work items' resolutions and its own
progress records, nothing missing and nothing published twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streams.contracts.models.base import Record, to_millis
from streams.contracts.models.enums import (
    CheckFinding,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    ReconciliationState,
    RetryVerdict,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import (
    Anomaly,
    OperationState,
    ReconciliationCheck,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.local.provider import Provider, reconcilers_toml
from tests.support import Deployment, deployment, free_port, worker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

TOKEN = "provider-s3cret"
#: checks are fast here: 200 ms backoff doubling to 1 s, at most a few checks
FAST = {"backoff_initial": "200ms", "backoff_max": "1s", "timeout": "1s"}
SETTLE = timedelta(seconds=4)


@dataclass
class Stack:
    dep: Deployment
    providers: dict[str, Provider]
    config: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        log_path = self.dep.workdir / f"reconcile-{uuid.uuid4().hex[:6]}.log"
        env = self.dep.env() | {
            "VIGIL_RECONCILERS_FILE": str(self.config),
            "VIGIL_DEMO_PROVIDER_TOKEN": TOKEN,
            "VIGIL_RECONCILER_PORT": str(free_port()),
            # the broker's least: a killed replica's partitions move on after 6 s
            "VIGIL_SESSION_TIMEOUT": "6s",
        }
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "streams.cli", "reconcile"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dep.workdir,
                start_new_session=True,
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "assigned" in log_path.read_text(errors="replace"):
                return proc
            if proc.poll() is not None:
                raise AssertionError(log_path.read_text()[-3000:])
            time.sleep(0.2)
        raise AssertionError(f"reconciler not assigned:\n{log_path.read_text()[-3000:]}")

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for p in list(self.procs):
            self.stop(p)

    def running(self, n: int) -> None:
        """Exactly ``n`` reconcilers running (started or stopped to get there)."""
        self.procs = [p for p in self.procs if p.poll() is None]
        while len(self.procs) > n:
            self.stop(self.procs[-1])
        while len(self.procs) < n:
            self.start()


def _ticker(dep: Deployment, stop: threading.Event) -> None:
    """Wall-clock ticks, as `vigil ticker` writes them: the reconciler stamps its events with
    the wall clock, and the pipeline applies them once time has moved past."""
    producer = dep.producer()
    while not stop.wait(0.5):
        now = datetime.now(UTC)
        for spec in dep.topics.inputs():
            producer.tick(spec.name, spec.partitions, now, "test-ticker")
        producer.flush()


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory) -> Iterator[Stack]:
    dep = deployment(cluster, tmp_path_factory.mktemp("reconcile"))
    providers = {
        "good": Provider(token=TOKEN).start(),
        "down": Provider(token=TOKEN, mode="down").start(),
        "unauthorized": Provider(token="another-token").start(),
        "malformed": Provider(token=TOKEN, mode="malformed").start(),
        "slow": Provider(token=TOKEN, delay=3.0).start(),
        "killed": Provider(token=TOKEN, delay=4.0).start(),
    }
    parts = [
        reconcilers_toml(
            providers["good"].url,
            "pay",
            settle_delay="4s",
            max_attempts=40,
            **FAST,
        ),
        # a person settles it while its next check waits: 20 s between checks
        reconcilers_toml(
            providers["good"].url, "pay-patient", backoff_initial="20s", backoff_max="20s"
        ),
        reconcilers_toml(providers["killed"].url, "pay-killed", timeout="10s"),
    ]
    for name in ("down", "unauthorized", "malformed", "slow"):
        parts.append(
            reconcilers_toml(
                providers[name].url,
                f"pay-{name}",
                max_attempts=3,
                **(FAST | ({"timeout": "500ms"} if name == "slow" else {})),
            )
        )
    config = dep.workdir / "reconcilers.toml"
    config.write_text("\n".join(parts))
    stop = threading.Event()
    with worker(dep, reticks=False):
        ticker = threading.Thread(target=_ticker, args=(dep, stop), daemon=True)
        ticker.start()
        s = Stack(dep, providers, config)
        try:
            yield s
        finally:
            s.stop_all()
            stop.set()
            for p in providers.values():
                p.stop()


def unknown(dep: Deployment, connector: str, n: int = 1, due_in: float = 0.5) -> list[str]:
    """``n`` operations sent now whose reply is due in ``due_in`` seconds and never comes:
    each goes UNKNOWN with a REPLY_TIMEOUT work item. Their ids (also their idempotency
    keys: ``key-<id>``)."""
    now = to_millis(datetime.now(UTC))
    ops = [f"op-{connector}-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    dep.produce(
        OperationEvent(
            event_id=f"{op}-sent",
            execution_id=f"exec-{op}",
            operation_id=op,
            attempt=1,
            idempotency_key=f"key-{op}",
            connector=connector,
            kind=OperationEventKind.SENT,
            occurred_at=now,
            reply_due_at=now + timedelta(seconds=due_in),
        )
        for op in ops
    )
    return ops


@dataclass
class Seen:
    states: dict[str, OperationState]  # latest per operation
    items: dict[str, ReconciliationWorkItem]  # by operation
    resolutions: list[WorkItemResolution]
    checks: dict[str, ReconciliationCheck]  # latest per operation
    events: list[OperationEvent]  # every operation event, reconciler's and others
    anomalies: list[Anomaly]


def read_to_end(dep: Deployment, topics: list[str]) -> list[Record]:
    """Every record of ``topics`` up to their end offsets as of the call: the ticks of the
    test's ticker never leave the input topics idle."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        dep.settings.confluent_conf()
        | {"group.id": "reconcile-test-reader", "enable.auto.commit": False}
    )
    out: list[Record] = []
    try:
        ends: dict[tuple[str, int], int] = {}
        for t in topics:
            for p in range(dep.settings.partitions):
                low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if high > low:
                    ends[(t, p)] = high
        c.assign([TopicPartition(t, p, -2) for (t, p) in ends])  # -2: the beginning
        while ends:
            for msg in c.consume(1000, 1.0):
                if msg.error():
                    continue
                key = (msg.topic(), msg.partition())
                if key not in ends or msg.offset() >= ends[key]:
                    continue
                if msg.offset() + 1 >= ends[key]:
                    del ends[key]
                if msg.value() is not None:
                    out.append(dep.codec.decode(msg.topic(), msg.value()))
    finally:
        c.close()
    return out


def seen(dep: Deployment, ops: list[str]) -> Seen:
    t = dep.topics
    records = read_to_end(
        dep,
        [
            t.operation_state.name,
            t.reconciliation_work.name,
            t.reconciliation_checks.name,
            t.operation_events.name,
            t.anomalies.name,
        ],
    )
    want = set(ops)
    out = Seen({}, {}, [], {}, [], [])
    for rec in records:
        op = getattr(rec, "operation_id", None)
        if isinstance(rec, Anomaly):
            if rec.execution_id in {f"exec-{o}" for o in want}:
                out.anomalies.append(rec)
            continue
        if op not in want:
            continue
        if isinstance(rec, OperationState):
            out.states[op] = rec
        elif isinstance(rec, ReconciliationWorkItem):
            out.items[op] = rec
        elif isinstance(rec, WorkItemResolution):
            out.resolutions.append(rec)
        elif isinstance(rec, ReconciliationCheck):
            out.checks[op] = rec
        elif isinstance(rec, OperationEvent):
            out.events.append(rec)
    return out


def wait(dep: Deployment, ops: list[str], done, timeout: float = 60.0) -> Seen:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    s = seen(dep, ops)
    while time.monotonic() < deadline:
        if done(s):
            return s
        time.sleep(0.5)
        s = seen(dep, ops)
    raise AssertionError(
        f"timed out: states {[(o, s.status) for o, s in s.states.items()]}, "
        f"checks {[(o, c.state, [x.detail for x in c.checks]) for o, c in s.checks.items()]}"
    )


def reconciler_events(s: Seen) -> list[OperationEvent]:
    return [e for e in s.events if e.evidence_source is EvidenceSource.RECONCILER]


def settled(status: OperationStatus):  # type: ignore[no-untyped-def]
    return lambda ops: (
        lambda s: all(o in s.states and s.states[o].status is status and o in s.checks for o in ops)
    )


def assert_once_each(s: Seen, ops: list[str], kind: OperationEventKind) -> None:
    """One reconciler event per operation, of ``kind``, nothing else from it, no anomaly."""
    events = reconciler_events(s)
    assert sorted(e.operation_id for e in events) == sorted(ops), events
    assert {e.kind for e in events} == {kind}
    assert len({e.event_id for e in events}) == len(ops)
    assert not s.anomalies, s.anomalies


# ----------------------------------------------------------------------------------- tests


def test_an_effect_that_exists_ends_verified_with_the_providers_reference(stack: Stack) -> None:
    stack.running(1)
    ops = unknown(stack.dep, "pay", 3)
    for op in ops:
        stack.providers["good"].pay(f"key-{op}", f"pi_{op}")
    s = wait(stack.dep, ops, settled(OperationStatus.VERIFIED)(ops))
    s = wait(stack.dep, ops, lambda s: len(s.resolutions) == len(ops))
    for op in ops:
        state = s.states[op]
        assert state.effect_ref == f"pi_{op}" and state.retry is RetryVerdict.NOT_NEEDED
        assert s.checks[op].state is ReconciliationState.VERIFIED
        assert s.checks[op].effect_ref == f"pi_{op}"
        assert [c.finding for c in s.checks[op].checks] == [CheckFinding.VERIFIED]
    # resolved by the reconciler, no person involved
    assert {(r.operation_id, r.outcome, r.evidence_source) for r in s.resolutions} == {
        (op, OperationStatus.VERIFIED, EvidenceSource.RECONCILER) for op in ops
    }
    assert not [e for e in s.events if e.evidence_source is EvidenceSource.HUMAN]
    assert_once_each(s, ops, OperationEventKind.VERIFIED)


def test_a_missing_effect_is_failed_only_after_the_settle_delay_then_safe(stack: Stack) -> None:
    stack.running(1)
    (op,) = unknown(stack.dep, "pay")
    s = wait(stack.dep, [op], settled(OperationStatus.FAILED)([op]))
    check = s.checks[op]
    assert check.state is ReconciliationState.FAILED
    item = s.items[op]
    (event,) = reconciler_events(s)
    # the source said "absent" before the settle delay, and that was not yet FAILED
    assert check.checks[0].finding is CheckFinding.ABSENT
    assert check.checks[0].at < item.deadline + SETTLE
    assert event.kind is OperationEventKind.FAILED
    assert event.occurred_at >= item.deadline + SETTLE
    assert s.states[op].retry is RetryVerdict.SAFE
    assert_once_each(s, [op], OperationEventKind.FAILED)
    assert len(s.resolutions) == 1 and s.resolutions[0].outcome is OperationStatus.FAILED


#: provider → what each of its checks is recorded as
CANNOT_ANSWER = {
    "down": "http_503",
    "unauthorized": "http_401",
    "malformed": "malformed_json_http_200",
    "slow": "timeout",
}


def test_a_provider_that_cannot_answer_leads_to_manual_review_with_the_checks_made(
    stack: Stack,
) -> None:
    """Down (503), refusing the token (401), answering a body that is not JSON, too slow for
    the timeout: each connector's three checks fail and its operation goes to MANUAL_REVIEW
    with them, unresolved (a person still has to settle it)."""
    stack.running(1)
    ops = {name: unknown(stack.dep, f"pay-{name}")[0] for name in CANNOT_ANSWER}
    s = wait(
        stack.dep, list(ops.values()), settled(OperationStatus.MANUAL_REVIEW)(list(ops.values()))
    )
    for name, detail in CANNOT_ANSWER.items():
        op = ops[name]
        check = s.checks[op]
        assert check.state is ReconciliationState.MANUAL_REVIEW
        assert [(c.finding, c.detail) for c in check.checks] == [(CheckFinding.ERROR, detail)] * 3
        (event,) = [e for e in reconciler_events(s) if e.operation_id == op]
        assert event.kind is OperationEventKind.MANUAL_REVIEW
        assert f"3 ERROR; last ERROR ({detail})" in (event.detail or "")
        assert s.states[op].retry is RetryVerdict.OWNER_DECIDES
    assert not s.resolutions
    assert_once_each(s, list(ops.values()), OperationEventKind.MANUAL_REVIEW)
    # the secret never reaches a log
    for proc in stack.procs:
        assert TOKEN not in proc.log_path.read_text()  # type: ignore[attr-defined]


def test_a_person_settling_it_while_a_check_is_pending_stops_the_checks(stack: Stack) -> None:
    from streams.console.review import ReviewAction, ReviewRequest, decide

    stack.running(1)
    good = stack.providers["good"]
    (op,) = unknown(stack.dep, "pay-patient")
    good.pay(f"key-{op}", f"pi_{op}", status="processing")  # the source: not settled yet
    s = wait(
        stack.dep,
        [op],
        lambda s: op in s.checks and len(s.checks[op].checks) == 1 and op in s.states,
    )
    assert s.checks[op].state is ReconciliationState.CHECKING
    assert s.checks[op].next_check_at is not None
    # what the console publishes for "failed" by a person (streams/console/review.py)
    event = decide(
        s.states[op],
        op,
        ReviewRequest(ReviewAction.FAILED, "refunded by hand", "alice"),
        datetime.now(UTC),
    )
    assert isinstance(event, OperationEvent)
    stack.dep.produce([event])
    s = wait(
        stack.dep,
        [op],
        lambda s: op in s.checks and s.checks[op].state is ReconciliationState.RESOLVED,
    )
    asked = good.requests.count(f"/v1/payments/by-key/key-{op}")
    assert asked == 1
    assert s.states[op].status is OperationStatus.FAILED
    assert [(r.outcome, r.evidence_source) for r in s.resolutions] == [
        (OperationStatus.FAILED, EvidenceSource.HUMAN)
    ]
    assert not reconciler_events(s) and not s.anomalies
    good.pay(f"key-{op}", f"pi_{op}")  # whatever the source says now, it is not asked again
    time.sleep(1)
    assert good.requests.count(f"/v1/payments/by-key/key-{op}") == asked
    assert not reconciler_events(seen(stack.dep, [op]))


def test_killed_mid_check_and_restarted_it_publishes_the_outcome_once(stack: Stack) -> None:
    stack.running(1)
    killed = stack.providers["killed"]  # answers after 4 s
    (op,) = unknown(stack.dep, "pay-killed")
    killed.pay(f"key-{op}", f"pi_{op}")
    path = f"/v1/payments/by-key/key-{op}"
    deadline = time.monotonic() + 30
    while path not in killed.requests and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path in killed.requests  # the check is in flight
    stack.stop(stack.procs[0], signal.SIGKILL)
    s = seen(stack.dep, [op])
    # The item's first progress record (CHECKING, no check made) is handed to the producer
    # before the check starts, not awaited: killed before the broker had it, the record is
    # lost, and so is nothing else, since the item's offset is committed only once it is
    # there (the item is read again). Either way no check is on record.
    if op in s.checks:
        assert s.checks[op].state is ReconciliationState.CHECKING and not s.checks[op].checks
    stack.running(1)
    s = wait(stack.dep, [op], settled(OperationStatus.VERIFIED)([op]))
    assert s.states[op].effect_ref == f"pi_{op}"
    assert killed.requests.count(path) == 2  # checked again after the restart
    assert_once_each(s, [op], OperationEventKind.VERIFIED)


def test_two_replicas_share_the_items_and_publish_each_outcome_once(stack: Stack) -> None:
    stack.running(2)
    ops = unknown(stack.dep, "pay", 8)
    for op in ops:
        stack.providers["good"].pay(f"key-{op}", f"pi_{op}")
    s = wait(stack.dep, ops, settled(OperationStatus.VERIFIED)(ops))
    assert_once_each(s, ops, OperationEventKind.VERIFIED)
    assert {s.states[op].effect_ref for op in ops} == {f"pi_{op}" for op in ops}
    logs = [p.log_path.read_text() for p in stack.procs]  # type: ignore[attr-defined]
    assert all("assigned [" in text for text in logs)
