"""On the real broker, registry and worker: inputs too large to store, and approval facts that
contradict the facts held (issue 26, parts 4 and 5).

One deployment with default settings, one partition of interest (2 of 6), one stream:

- the issue's case: an execution, then ten SENT operations each with a 149,336-character
  idempotency key, then a tick. Before, the execution's entry (2.3 MB) could never be written
  to its changelog: every batch failed and was read again for ever, each attempt published
  execution states with 1 to 10 open operations the worker's API never showed, nothing was
  reported, and every later event of the partition waited. Now each is a VALUE_TOO_LARGE
  anomaly naming the field and its length;
- an approval request issued again under its id with a new digest, then accepted for it and
  resumed; and a request accepted, then declined: a CONFLICTING_REQUEST and a
  CONFLICTING_DECISION anomaly;
- a later execution on the same partition, which must be applied.

The worker's outputs are the pure Processor's over the same records (nothing missing,
nothing else, no id with two contents), no batch fails, the API says what the topics say, and
a restart publishes nothing new and still agrees.

A second deployment's executions changelog takes records of at most 64 KiB: an execution whose
operations each stay within the field bounds (1,024-character keys) but add up past what fits
has the operations that would take its entry past the bound quarantined (a dead letter and a
CRITICAL alert each), and everything else applied. The bound the processor keeps entries
within (``VIGIL_MAX_ENTRY_BYTES``, 512 KiB by default, lowered to what the changelog takes) is
the same mechanism at any size; ``tests/test_entry_bounds.py`` holds it at the default too.
"""

from __future__ import annotations

import random
import string
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.contracts.models import events as ev
from streams.contracts.models.enums import (
    AlertKind,
    AnomalyKind,
    DecisionCode,
    ExecutionStatus,
    OperationEventKind,
    Severity,
)
from streams.contracts.models.outputs import Alert, Anomaly, DeadLetter, ExecutionState
from streams.kafka.partitioning import partition_of
from tests.support import Deployment, by_id, deployment, worker
from tests.test_faults_kafka import T0, at, worker_logs
from tests.test_poison_kafka import Inputs, assert_same_as_pure, metric, until_published
from vigil_worker.pipeline import ENTRY_RECORD_OVERHEAD, entry_bound

pytestmark = pytest.mark.kafka

PARTITIONS = 6
PARTITION = 2
KEY_CHARS = 149_336
BOUNDED_KEY_CHARS = 1024
BOUNDED_OPERATIONS = 80


def on_partition(prefix: str) -> str:
    """The first id ``prefix-N`` whose execution lives on ``PARTITION``."""
    return next(
        f"{prefix}-{n}"
        for n in range(1000)
        if partition_of(f"{prefix}-{n}", PARTITIONS) == PARTITION
    )


HUGE = on_partition("issue-26-keys")
GROWING = on_partition("issue-26-grows")
APPROVING = on_partition("issue-26-approves")
LATER = on_partition("issue-26-later")


def incompressible(n: int, length: int) -> str:
    rng = random.Random(n)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=length))


def status(ex: str, seq: int, st: ExecutionStatus, t: float) -> ev.ExecutionStatusChanged:
    return ev.ExecutionStatusChanged(
        event_id=f"{ex}-s{seq}", execution_id=ex, sequence=seq, status=st, occurred_at=at(t)
    )


def sent(ex: str, n: int, t: float, key: str) -> ev.OperationEvent:
    return ev.OperationEvent(
        event_id=f"{ex}-op-{n}-sent",
        execution_id=ex,
        operation_id=f"{ex}-op-{n}",  # unique across executions (issue 26, part 1)
        attempt=1,
        idempotency_key=key,
        connector="payments",
        kind=OperationEventKind.SENT,
        occurred_at=at(t),
    )


def approval_facts() -> list[Any]:
    ex = APPROVING

    def request(rid: str, digest: str, t: float) -> ev.ApprovalRequested:
        return ev.ApprovalRequested(
            event_id=f"{rid}-{digest}",
            execution_id=ex,
            request_id=rid,
            action="deploy",
            action_digest=digest,
            occurred_at=at(t),
            approver_ref="alice",
            resume_handle="h",
        )

    def decide(rid: str, code: DecisionCode, digest: str, t: float) -> ev.ApprovalDecision:
        return ev.ApprovalDecision(
            event_id=f"{rid}-{code}-{t}",
            execution_id=ex,
            request_id=rid,
            occurred_at=at(t),
            decision=code,
            action_digest=digest,
        )

    return [
        status(ex, 1, ExecutionStatus.WAITING_FOR_APPROVAL, 7),
        request("reissued", "d1", 7),
        ev.CurrentActionDigest(
            event_id="digest-d2", execution_id=ex, occurred_at=at(8), action_digest="d2"
        ),
        request("reissued", "d2", 9),
        decide("reissued", DecisionCode.ACCEPT, "d2", 10),
        ev.ResumeReceipt(
            event_id="reissued-rr", execution_id=ex, request_id="reissued", occurred_at=at(11)
        ),
        request("redecided", "d2", 12),
        decide("redecided", DecisionCode.ACCEPT, "d2", 13),
        decide("redecided", DecisionCode.DECLINE, "d2", 14),
    ]


def write_stream(inputs: Inputs) -> None:
    inputs.tick(T0)
    inputs.event(status(HUGE, 1, ExecutionStatus.RUNNING, 1))
    for n in range(10):
        inputs.event(sent(HUGE, n, 2 + n / 10, incompressible(n, KEY_CHARS)))
    inputs.tick(at(5))
    for fact in approval_facts():
        inputs.event(fact)
    inputs.event(status(LATER, 1, ExecutionStatus.RUNNING, 20))
    inputs.event(status(LATER, 2, ExecutionStatus.WAITING_FOR_TOOL, 21))
    inputs.tick(at(60))
    inputs.flush()


def last_states(got: list[Any]) -> dict[str, ExecutionState]:
    """Each execution's last state on the compacted topic (offset order per key)."""
    out: dict[str, ExecutionState] = {}
    for r in got:
        if isinstance(r.record, ExecutionState):
            out[r.record.execution_id] = r.record
    return out


def api(port: int, execution_id: str) -> dict[str, Any]:
    answer = httpx.get(f"http://127.0.0.1:{port}/v1/executions/{execution_id}", timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def observe(dep: Deployment, w: Any, expected: dict[str, Any]) -> dict[str, Any]:
    got = until_published(dep, expected, quiet=45, timeout=120)
    states = last_states(got)
    return {
        "got": got,
        "failures": metric(w, "vigil_batch_failures_total"),
        "quarantined": metric(w, "vigil_quarantined_total"),
        "api": {ex: api(w.web_port, ex) for ex in (HUGE, APPROVING, LATER)},
        "states": states,
        "log": w.log_path.read_text(errors="replace"),
    }


@pytest.fixture(scope="module")
def runs(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The stream through one worker, then through a second one started after it stopped."""
    dep = deployment(cluster, tmp_path_factory.mktemp("bounds"), partitions=PARTITIONS)
    inputs = Inputs(dep)
    write_stream(inputs)
    expected = inputs.expected()
    with worker(dep, reticks=False, ready_timeout=60) as w:
        first = observe(dep, w, expected)
    with worker(dep, reticks=False, ready_timeout=60) as w:
        again = observe(dep, w, expected)
    return {"dep": dep, "expected": expected, "first": first, "again": again}


def test_the_worker_publishes_what_the_pure_processor_does_before_and_after_a_restart(
    runs: dict[str, Any],
) -> None:
    for run in ("first", "again"):
        assert_same_as_pure(runs[run]["got"], runs["expected"])
        assert runs[run]["failures"] == 0, worker_logs(runs["dep"])
    # the restart published nothing new (what it published again, if anything, has the ids
    # and contents published before)
    assert by_id(runs["again"]["got"]) == by_id(runs["first"]["got"])


def test_oversized_fields_are_anomalies_naming_the_field_and_its_length(
    runs: dict[str, Any],
) -> None:
    live = by_id(runs["first"]["got"]).values()
    reported = [r for r in live if isinstance(r, Anomaly) and r.execution_id == HUGE]
    assert len(reported) == 10
    for a in reported:
        assert a.kind == AnomalyKind.VALUE_TOO_LARGE
        assert f"OperationEvent.idempotency_key has {KEY_CHARS:,} characters" in a.reason
        assert a.source_partition == PARTITION
    alerts = [r for r in live if isinstance(r, Alert) and r.verdict == "VALUE_TOO_LARGE"]
    assert len(alerts) == 10
    # nothing of them is held, on the topic or in the worker, before or after the restart
    for run in ("first", "again"):
        state, view = runs[run]["states"][HUGE], runs[run]["api"][HUGE]
        assert (state.status, state.open_operation_ids) == (ExecutionStatus.RUNNING, ())
        assert (view["status"], view["operations"]) == ("RUNNING", [])
    assert "MessageSizeTooLarge" not in runs["first"]["log"]


def test_conflicting_approval_facts_are_reported(runs: dict[str, Any]) -> None:
    live = by_id(runs["first"]["got"]).values()
    kinds = sorted(
        (r.kind, r.event_id) for r in live if isinstance(r, Anomaly) and r.execution_id == APPROVING
    )
    assert kinds == [
        (AnomalyKind.CONFLICTING_DECISION, "redecided-DECLINE-14"),
        (AnomalyKind.CONFLICTING_REQUEST, "reissued-d2"),
    ]


def test_the_partition_moves_on(runs: dict[str, Any]) -> None:
    """The later execution on the same partition is applied, live and after the restart."""
    for run in ("first", "again"):
        assert runs[run]["states"][LATER].last_sequence == 2
        assert runs[run]["api"][LATER]["status"] == "WAITING_FOR_TOOL"
    assert LATER != HUGE and partition_of(LATER, PARTITIONS) == PARTITION


# -- a changelog topic that takes less than the bound needs -------------------------------------
CHANGELOG_MAX_BYTES = 65_536


def test_a_changelog_that_takes_less_lowers_the_bound_and_nothing_stalls(
    cluster: Any, tmp_path: Path
) -> None:
    """The executions changelog was created with ``max.message.bytes`` = 64 KiB, below what
    the default ``VIGIL_MAX_ENTRY_BYTES`` needs. Before, the first entry past 64 KiB failed its
    batch at the broker for ever. Now the worker reads the topic's limit before its first
    batch, keeps entries within nine tenths of what fits, says so in its log, and sets aside
    the inputs past it: its outputs are the pure Processor's with that bound."""
    from confluent_kafka.admin import AdminClient, NewTopic

    dep = deployment(cluster, tmp_path, partitions=PARTITIONS)
    admin = AdminClient(dep.settings.confluent_conf())
    changelog = NewTopic(
        f"{dep.settings.app_id}-executions-changelog",
        num_partitions=PARTITIONS,
        replication_factor=1,
        config={"cleanup.policy": "compact", "max.message.bytes": str(CHANGELOG_MAX_BYTES)},
    )
    for future in admin.create_topics([changelog]).values():
        future.result(timeout=30)
    inputs = Inputs(dep)
    inputs.tick(T0)
    inputs.event(status(GROWING, 1, ExecutionStatus.RUNNING, 1))
    for n in range(BOUNDED_OPERATIONS):
        inputs.event(sent(GROWING, n, 2 + n / 100, incompressible(n, BOUNDED_KEY_CHARS)))
    inputs.event(status(LATER, 1, ExecutionStatus.RUNNING, 5))
    inputs.tick(at(60))
    inputs.flush()
    bound = entry_bound(dep.settings.max_entry_bytes, CHANGELOG_MAX_BYTES - ENTRY_RECORD_OVERHEAD)
    assert bound < dep.settings.max_entry_bytes
    inputs.dep = replace(dep, settings=replace(dep.settings, max_entry_bytes=bound))
    expected = inputs.expected()
    letters = [r for r in expected.values() if isinstance(r, DeadLetter)]
    assert letters and len(letters) < BOUNDED_OPERATIONS, "the stream must cross the bound"

    with worker(dep, reticks=False, ready_timeout=60) as w:
        got = until_published(dep, expected, quiet=45, timeout=120)
        failures = metric(w, "vigil_batch_failures_total")
        quarantined = metric(w, "vigil_quarantined_total")
        view = api(w.web_port, GROWING)
    assert_same_as_pure(got, expected)
    assert failures == 0, worker_logs(dep)
    assert "leaves too little room below" in w.log_path.read_text(errors="replace")
    live = by_id(got).values()
    published = [r for r in live if isinstance(r, DeadLetter)]
    assert {d.dead_letter_id for d in published} == {d.dead_letter_id for d in letters}
    assert all("it would make the entry of execution" in d.reason for d in published)
    assert {d.source_partition for d in published} == {PARTITION}
    alerts = {r.subject_id: r for r in live if isinstance(r, Alert) and r.verdict == "QUARANTINED"}
    assert set(alerts) == {d.dead_letter_id for d in published}
    assert {(a.kind, a.severity) for a in alerts.values()} == {
        (AlertKind.ANOMALY, Severity.CRITICAL)
    }
    assert quarantined == len(published)
    # what the topic says the execution holds, the worker holds; the partition moved on
    state = last_states(got)[GROWING]
    assert len(state.open_operation_ids) == BOUNDED_OPERATIONS - len(letters)
    assert sorted(o["operation_id"] for o in view["operations"]) == sorted(state.open_operation_ids)
    assert last_states(got)[LATER].status == ExecutionStatus.RUNNING
