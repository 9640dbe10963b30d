"""Late events are judged from the log alone (docs/rules.md#time): whether an event is late,
and what it does, depends on the records of its own topic partition, never on how far the
worker had read the other topics. The pure processor over a log with records written late
(the two cases of issue 26 exactly, and a late approval decision), read in many
interleavings of its topic partitions and crashed anywhere: the same outputs every time.

The cases, in the order the producers wrote them (``WRITTEN``):

- an ACK stamped 09:00:15, before its 09:00:35 reply deadline, written after the ticks of
  09:03:00 on every input: late on its topic partition by 2 min 45 s, so the deadline fires
  first (UNKNOWN, a REPLY_TIMEOUT work item) and the ACK then settles nothing
  (``late_acknowledgement_ignored``), in every run;
- a status event seq 3 (RUNNING at +60 s) written after seq 4 (FAILED at +90 s) and the ticks
  after it: applied after seq 4, an AFTER_TERMINAL anomaly in every run;
- an accept stamped +20 s written after the ticks of +180 s: a fact all the same; the run
  never sends its receipt, so the wait is STUCK_AFTER_DECISION once the grace (5 min) after
  the decision's own time is over.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streams.contracts.envelope import Envelope
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AnomalyKind,
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
    Risk,
    WorkItemKind,
)
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ClockTick,
    ExecutionStatusChanged,
    OperationEvent,
    RequesterHeartbeat,
)
from streams.contracts.models.outputs import (
    Anomaly,
    ApprovalVerdict,
    OperationState,
    ReconciliationWorkItem,
)
from streams.core.clock import PartitionClock, placed_at, watermark_ms
from streams.engine.processor import Processor, Stores
from streams.kafka.topics import Topics
from streams.settings import Settings
from tests.test_event_time_order import PHASES, Broker, Crash, Published

T = datetime(2026, 7, 27, 9, 0, tzinfo=UTC)
TOPICS = Topics.from_settings(Settings(partitions=1))
INPUTS = [t.name for t in TOPICS.inputs()]
S = ExecutionStatus
K = OperationEventKind


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


class Tick:
    """A clock tick written into every input topic (as ``vigil ticker`` does)."""

    def __init__(self, seconds: float) -> None:
        self.at = at(seconds)


def status(ex: str, seq: int, st_: ExecutionStatus, seconds: float) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(
        event_id=f"{ex}-s{seq}", execution_id=ex, sequence=seq, status=st_, occurred_at=at(seconds)
    )


def written(suffix: str = "") -> list[Record | Tick]:
    """Every record of the three cases in the order it was written (a ``Tick`` is a tick into
    every input topic); ``suffix`` names another copy of the same executions."""
    ack, seq, apr = f"ex-ack{suffix}", f"ex-seq{suffix}", f"ex-apr{suffix}"

    def op(kind: OperationEventKind, seconds: float, **kw: Any) -> OperationEvent:
        return OperationEvent(
            event_id=f"{ack}-{kind}",
            execution_id=ack,
            operation_id="charge-1",
            attempt=1,
            idempotency_key="idem-charge-1",
            connector="payments",
            kind=kind,
            occurred_at=at(seconds),
            **kw,
        )

    def approval(cls: type[Record], seconds: float, **kw: Any) -> Record:
        return cls(
            event_id=f"{apr}-{cls.__name__}-{seconds}",
            execution_id=apr,
            occurred_at=at(seconds),
            **kw,
        )

    return [
        status(ack, 1, S.RUNNING, 0),
        status(seq, 1, S.RUNNING, 0),
        status(apr, 1, S.RUNNING, 0),
        status(apr, 2, S.WAITING_FOR_APPROVAL, 2),
        approval(
            ApprovalRequested,
            2,
            request_id=f"req-1{suffix}",
            action="refund",
            action_digest="d1",
            expires_at=at(3600),
            approver_ref="alice",
            resume_handle="h1",
            risk=Risk.LOW,
        ),
        approval(
            ApprovalDelivery, 3, request_id=f"req-1{suffix}", outcome=DeliveryOutcome.DELIVERED
        ),
        status(ack, 2, S.WAITING_FOR_TOOL, 4),
        op(K.SENT, 5, reply_due_at=at(35)),
        approval(RequesterHeartbeat, 10, resume_handle="h1"),
        Tick(20),
        status(seq, 2, S.WAITING_FOR_TOOL, 30),
        Tick(40),
        Tick(60),
        Tick(80),
        status(seq, 4, S.FAILED, 90),
        *(Tick(s) for s in range(100, 181, 20)),
        # written late: each behind the 09:03:00 ticks of its own topic partition
        status(seq, 3, S.RUNNING, 60),
        op(K.ACKNOWLEDGED, 15, evidence_source=EvidenceSource.CONNECTOR),
        approval(ApprovalDecision, 20, request_id=f"req-1{suffix}", decision=DecisionCode.ACCEPT),
        *(Tick(s) for s in range(200, 401, 20)),
    ]


WRITTEN = written()
#: where the late records start: everything before, the ticks of 09:03:00 included, was
#: written before them
LATE_FROM = 1 + next(
    i for i, item in enumerate(WRITTEN) if isinstance(item, Tick) and item.at == at(180)
)


def topic_of(record: Record) -> str:
    return next(t.name for t in TOPICS.inputs() if type(record) in t.value_types)


def build_log(written: Iterable[Record | Tick]) -> tuple[list[Envelope], dict[str, list[Envelope]]]:
    """The records as written (the live read order) and, per input topic, its partition's
    log. Each record's Kafka timestamp is its event time, as vigil's producers set it: the
    timestamp cannot tell a record written late."""
    offsets = dict.fromkeys(INPUTS, 0)
    order: list[Envelope] = []
    for item in written:
        if isinstance(item, Tick):
            pairs: list[tuple[str, Record]] = [
                (topic, ClockTick(ticker_id="t", partition=0, occurred_at=item.at))
                for topic in INPUTS
            ]
        else:
            pairs = [(topic_of(item), item)]
        for topic, record in pairs:
            key = getattr(record, "execution_id", None)
            order.append(
                Envelope(
                    topic,
                    0,
                    offsets[topic],
                    int(record.occurred_at.timestamp() * 1000),  # type: ignore[attr-defined]
                    key.encode() if key is not None else None,
                    b"",
                    record,
                    None,
                )
            )
            offsets[topic] += 1
    per_topic = {topic: [e for e in order if e.topic == topic] for topic in INPUTS}
    return order, per_topic


LIVE, LOG = build_log(WRITTEN)


def interleave(
    choices: Iterable[tuple[int, int]], log: dict[str, list[Envelope]] | None = None
) -> list[Envelope]:
    """Another read order of the same log (``LOG`` by default): each choice takes a burst
    from one topic."""
    queues = {topic: list(records) for topic, records in (log or LOG).items()}
    order: list[Envelope] = []
    for which, burst in choices:
        live = [topic for topic in INPUTS if queues[topic]]
        if not live:
            break
        topic = live[which % len(live)]
        order += queues[topic][:burst]
        del queues[topic][:burst]
    for topic in INPUTS:
        order += queues[topic]
    return order


@dataclass
class Run(Published):
    """What a run published, and the records themselves in the order published."""

    records: list[Record] = field(default_factory=list)

    def add(self, topic: str, key: str | None, record: Any) -> None:
        super().add(topic, key, record)
        self.records.append(record)


def run(order: list[Envelope], **kw: Any) -> Run:
    proc = Processor(TOPICS, Stores(), **kw)
    out = Run()
    for e in order:
        for em in proc.handle(e):
            out.add(em.topic, em.key, em.record)
    return out


def assert_the_rule(published: Run) -> None:
    """What the rules say of the three late writes (docs/rules.md#time)."""
    out = published.records
    states = sorted(
        (r for r in out if isinstance(r, OperationState) and r.operation_id == "charge-1"),
        key=lambda r: r.since,
    )
    assert OperationStatus.ACKNOWLEDGED not in {s.status for s in states}
    assert [(s.status, s.reason) for s in states if s.status == OperationStatus.UNKNOWN] == [
        (OperationStatus.UNKNOWN, "reply_timeout"),
        (OperationStatus.UNKNOWN, "late_acknowledgement_ignored"),
    ]
    items = [r for r in out if isinstance(r, ReconciliationWorkItem)]
    assert [(i.kind, i.created_at) for i in items] == [(WorkItemKind.REPLY_TIMEOUT, at(35))]
    anomalies = [(a.execution_id, a.kind) for a in out if isinstance(a, Anomaly)]
    assert anomalies == [("ex-seq", AnomalyKind.AFTER_TERMINAL)]
    verdicts = sorted(
        (v for v in out if isinstance(v, ApprovalVerdict)), key=lambda v: v.evaluated_at
    )
    assert (verdicts[-1].verdict, verdicts[-1].evaluated_at) == ("STUCK_AFTER_DECISION", at(320))


EXPECTED = run(LIVE)


def assert_same(got: Published) -> None:
    assert got.by_id == EXPECTED.by_id
    assert got.per_key == EXPECTED.per_key


# -- the rule itself ----------------------------------------------------------------------


def test_placed_at_its_own_time_unless_further_behind_its_topic_than_the_lateness() -> None:
    assert placed_at(1_000, None, 0) == 1_000  # the first record of its topic partition
    assert placed_at(1_000, 1_000, 0) == 1_000  # at its topic's time: on time
    assert placed_at(999, 1_000, 0) == 1_000  # behind it: late, at the topic's time
    assert placed_at(500, 1_000, 500) == 500  # within the lateness: at its own time
    assert placed_at(499, 1_000, 500) == 500  # beyond it: at the topic time minus the lateness
    assert watermark_ms((3_000, 1_000, 2_000), 0) == 1_000
    assert watermark_ms((3_000, 1_000, 2_000), 250) == 750
    clock = PartitionClock.start(INPUTS).observe(INPUTS[0], at(180))
    assert clock.placed_at(INPUTS[0], at(15), timedelta(0)) == at(180)
    assert clock.placed_at(INPUTS[0], at(15), timedelta(minutes=5)) == at(15)
    assert clock.placed_at(INPUTS[1], at(15), timedelta(0)) == at(15)


@given(
    event=st.integers(0, 10**9),
    topic_time=st.none() | st.integers(0, 10**9),
    lateness=st.integers(0, 10**6),
    others=st.lists(st.integers(0, 10**9), max_size=3),
)
def test_property_no_event_is_ever_placed_before_the_watermark(
    event: int, topic_time: int | None, lateness: int, others: list[int]
) -> None:
    """The invariant the determinism rests on: whatever the other topics' times, an event read
    now is placed no earlier than the watermark, so nothing decided already could have
    needed it; and it is placed at its own time exactly when it is not late."""
    placed = placed_at(event, topic_time, lateness)
    assert placed >= event
    if topic_time is not None:
        assert placed >= topic_time - lateness
        assert placed >= watermark_ms((topic_time, *others), lateness)
        assert (placed == event) == (event >= topic_time - lateness)


# -- the cases, under every interleaving --------------------------------------------------


def test_the_live_order_gives_what_the_rules_say() -> None:
    assert_the_rule(EXPECTED)


def test_each_topic_read_entirely_in_turn_gives_the_same_outputs() -> None:
    """A replay reading one topic partition far ahead of the others: the ACK and seq 3 are
    read long before the other topics' ticks pass their deadlines, and are judged late all the
    same. Every order of the four topics."""
    for topics in itertools.permutations(INPUTS):
        order = [e for topic in topics for e in LOG[topic]]
        got = run(order)
        assert_the_rule(got)
        assert_same(got)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), max_size=40))
@example([(1, 100)])  # operation-events first: the ACK read before any other topic ticks
@example([(0, 100)])  # execution-status first: seq 3 read while seq 4 is still held
def test_any_interleaving_of_the_topics_publishes_the_same_records(
    choices: list[tuple[int, int]],
) -> None:
    assert_same(run(interleave(choices)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choices=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), max_size=30),
    batch=st.integers(3, 40),
    crashes=st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from(PHASES)), min_size=1, max_size=4
    ),
)
def test_a_crash_anywhere_publishes_the_same_records(
    choices: list[tuple[int, int]], batch: int, crashes: list[tuple[int, str]]
) -> None:
    """A simulated live worker crashed in any phase of any batch, started again from the
    committed offsets and the tables: a late event placed before the crash is placed alike
    after it (its topic time comes back with the stored clock and the records read again)."""
    broker = Broker(interleave(choices), topics=TOPICS)
    for crash in crashes:
        with contextlib.suppress(Crash):
            broker.run(batch, crash)
    broker.run(batch, None)
    assert_same(broker.published)


# -- the allowed lateness -----------------------------------------------------------------

#: the cases with time to judge the ACK's verification deadline with a lateness of 5 min
LONGER = [*WRITTEN, *(Tick(s) for s in range(420, 1001, 20))]


def test_a_lateness_that_covers_the_delay_puts_the_events_back_in_time_order() -> None:
    """``VIGIL_ALLOWED_LATENESS`` at 5 min: every decision waits 5 min of stream time, and the
    three writes (at most 2 min 45 s behind their topics) are judged at their own times, in
    every interleaving: the ACK is in time (ACKNOWLEDGED, then VERIFICATION_TIMEOUT at its
    verification deadline), seq 3 comes before seq 4 (no anomaly)."""
    lateness = timedelta(minutes=5)
    live, log = build_log(LONGER)
    reference = run(live, allowed_lateness=lateness)
    out = reference.records
    states = [r for r in out if isinstance(r, OperationState) and r.operation_id == "charge-1"]
    assert {s.status for s in states} == {OperationStatus.SENT, OperationStatus.ACKNOWLEDGED}
    items = [r for r in out if isinstance(r, ReconciliationWorkItem)]
    assert [(i.kind, i.created_at) for i in items] == [
        (WorkItemKind.VERIFICATION_TIMEOUT, at(15) + timedelta(minutes=5))
    ]
    assert [a for a in out if isinstance(a, Anomaly)] == []
    for topics in itertools.permutations(INPUTS):
        got = run([e for topic in topics for e in log[topic]], allowed_lateness=lateness)
        assert got.by_id == reference.by_id and got.per_key == reference.per_key


def test_a_lateness_shorter_than_the_delay_still_finds_the_events_late() -> None:
    """At 1 min the ACK (2 min 45 s behind) and the accept are late, and so is seq 3 (it
    follows the ticks of 09:03:00 too): the same outputs as with no lateness at all, only
    decided a minute of stream time later."""
    live, _ = build_log([*WRITTEN, *(Tick(s) for s in range(420, 501, 20))])
    got = run(live, allowed_lateness=timedelta(minutes=1))
    assert_the_rule(got)
    assert got.by_id == run(live).by_id


def test_a_replay_to_t_reads_what_may_still_be_judged_before_t() -> None:
    """``vigil replay --to T`` with a lateness L reads each topic partition up to its first
    record stamped after T + L, then closes the range with ticks just past T + L: an ACK
    stamped before T, written within L after records stamped past T, is judged before T as
    the live run judges it (ACKNOWLEDGED, no reply timeout), not left out."""
    from streams.replay import end_ticks, in_range

    lateness, end = timedelta(minutes=1), at(40)
    ack = written()[7]  # the SENT, due at +35
    reply = ack.model_copy(
        update={"event_id": "ack", "kind": K.ACKNOWLEDGED, "occurred_at": at(30)}
    )
    _, log = build_log(
        [*WRITTEN[:7], ack, Tick(20), Tick(60), reply, Tick(80), Tick(120), Tick(200)]
    )
    proc = Processor(TOPICS, Stores(), allowed_lateness=lateness)
    out: list[Record] = []
    end_ms, lateness_ms = int(end.timestamp() * 1000), 60_000
    for topic in INPUTS:  # a replay may read the topics in any order
        for e in log[topic]:
            if not in_range(e.timestamp_ms, end_ms, lateness_ms):
                break
            out += [em.record for em in proc.handle(e)]
    for e in end_ticks(TOPICS, None, end, lateness):
        out += [em.record for em in proc.handle(e)]
    states = [r for r in out if isinstance(r, OperationState)]
    assert [s.status for s in states] == [OperationStatus.SENT, OperationStatus.ACKNOWLEDGED]
    assert not [r for r in out if isinstance(r, ReconciliationWorkItem)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choices=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), max_size=40),
    batch=st.integers(3, 40),
    crashes=st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from(PHASES)), min_size=1, max_size=4
    ),
)
def test_with_a_lateness_a_crash_anywhere_publishes_the_same_records(
    choices: list[tuple[int, int]], batch: int, crashes: list[tuple[int, str]]
) -> None:
    """Within the lateness, events of one topic partition are applied out of offset order
    (seq 3 before seq 4, held after it): after a crash Kafka delivers again from the first
    unacknowledged offset, and what was applied already is recognised by its position."""
    lateness = timedelta(minutes=5)
    live, log = build_log(LONGER)
    reference = run(live, allowed_lateness=lateness)
    order = interleave(choices, log)
    broker = Broker(order, topics=TOPICS, options={"allowed_lateness": lateness})
    for crash in crashes:
        with contextlib.suppress(Crash):
            broker.run(batch, crash)
    broker.run(batch, None)
    assert broker.published.by_id == reference.by_id
    assert broker.published.per_key == reference.per_key
