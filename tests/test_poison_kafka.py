"""On the real broker: records that cannot be processed or
published as they are, clock ticks a broken clock dates a year ahead, and events read again
after a failed batch.

Each test runs one worker on a deployment of its own. The inputs go through ``Inputs``, which
produces them in order from one idempotent producer and knows the offset each gets, so the
pure ``Processor`` can be run over exactly the records the worker reads (decoded the same way,
``open_envelope``): what the worker publishes is compared with what it computes
(``assert_same_as_pure``: nothing missing, nothing else, repeated ids only identical).

Test-only faults come from ``tests/sites/poison`` on the worker's ``PYTHONPATH`` (see there):
a core that raises on one event, a broker that refuses one output once.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
import urllib.request
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from streams.contracts.envelope import open_envelope
from streams.contracts.models.base import Record
from streams.contracts.models.enums import AlertKind, AnomalyKind, Severity, WorkItemKind
from streams.contracts.models.events import ClockTick
from streams.contracts.models.outputs import (
    Alert,
    Anomaly,
    DeadLetter,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
)
from streams.engine.processor import Processor, Stores
from streams.kafka.clients import ConsumedRecord
from streams.kafka.partitioning import partition_of
from streams.local.scenario import Tick
from tests.support import ROOT, Deployment, by_id, deployment, worker
from tests.test_faults_kafka import (
    T0,
    K,
    S,
    at,
    op,
    outputs,
    read_now,
    rid,
    status,
    steady_stream,
    worker_logs,
)

pytestmark = pytest.mark.kafka

SITE = ROOT / "tests" / "sites" / "poison"
RAISED = "injected core failure"  # as in the site hook's errors
REFUSED = "injected output refusal"
Position = tuple[str, int, int]


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


class Inputs:
    """Input records produced in order by one idempotent producer, with the offset each gets
    on the deployment's fresh topics (checked against the log ends by ``flush``)."""

    def __init__(self, dep: Deployment, **conf: Any) -> None:
        self.dep = dep
        self.allowed = {t.name: t.value_types for t in dep.topics.inputs()}
        self.producer = Producer(
            dep.settings.confluent_conf() | {"enable.idempotence": True, "linger.ms": 5} | conf
        )
        self.next: Counter[tuple[str, int]] = Counter()
        #: (topic, partition, offset, timestamp ms, key, value) in the order produced
        self.log: list[tuple[str, int, int, int, bytes | None, bytes]] = []
        self.errors: list[str] = []

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def raw(
        self, topic: str, partition: int, key: bytes | None, value: bytes, timestamp_ms: int
    ) -> Position:
        offset = self.next[(topic, partition)]
        self.next[(topic, partition)] += 1
        self.producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            timestamp=timestamp_ms,
            on_delivery=self._delivered,
        )
        self.producer.poll(0)
        self.log.append((topic, partition, offset, timestamp_ms, key, value))
        return topic, partition, offset

    def topic_of(self, record: Record) -> str:
        return next(t.name for t in self.dep.topics.inputs() if type(record) in t.value_types)

    def event(
        self, record: Any, *, key: bytes | None = None, timestamp_ms: int | None = None
    ) -> Position:
        """An event to its execution's partition, keyed by its execution id and stamped with
        its event time, as a well-behaved producer writes it, unless told otherwise."""
        topic = self.topic_of(record)
        return self.raw(
            topic,
            partition_of(record.execution_id, self.dep.settings.partitions),
            record.execution_id.encode() if key is None else key,
            self.dep.codec.encode(topic, record),
            ms(record.occurred_at) if timestamp_ms is None else timestamp_ms,
        )

    def tick(
        self,
        when: datetime,
        *,
        partitions: list[int] | None = None,
        topics: list[str] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """A clock tick into every partition (or those named) of every input topic (or those
        named), stamped with its time unless told otherwise."""
        for spec in self.dep.topics.inputs():
            if topics is not None and spec.name not in topics:
                continue
            for p in range(spec.partitions) if partitions is None else partitions:
                tick = ClockTick(ticker_id="poison-test", partition=p, occurred_at=when)
                self.raw(
                    spec.name,
                    p,
                    None,
                    self.dep.codec.encode(spec.name, tick),
                    ms(when) if timestamp_ms is None else timestamp_ms,
                )

    def steps(self, steps: list[Any]) -> dict[str, Position]:
        """Scenario steps in order; returns where each event went, by event id."""
        where = {}
        for s in steps:
            if isinstance(s, Tick):
                self.tick(s.at)
            else:
                where[s.event_id] = self.event(s)
        return where

    def flush(self) -> None:
        assert self.producer.flush(60) == 0, "inputs not delivered"
        assert not self.errors, self.errors
        c = Consumer(self.dep.settings.confluent_conf() | {"group.id": "poison-reader"})
        try:
            ends = {
                tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=10)[1] for tp in self.next
            }
        finally:
            c.close()
        assert ends == dict(self.next), "the input topics do not hold exactly what was produced"

    def expected(
        self, *, skip: Position | None = None, quarantine: dict[Position, str] | None = None
    ) -> dict[str, Record]:
        """What the pure Processor publishes for every record produced, by output id: without
        ``skip``, and with the records of ``quarantine`` set aside with their reason."""
        proc = Processor.from_settings(self.dep.settings, self.dep.topics, Stores())
        out: dict[str, Record] = {}
        for topic, p, offset, ts, key, value in self.log:
            position = (topic, p, offset)
            if position == skip:
                continue
            env = open_envelope(self.dep.codec, self.allowed, topic, p, offset, ts, key, value)
            if quarantine and position in quarantine:
                emissions = proc.quarantine(env, quarantine[position])
            else:
                emissions = proc.handle(env)
            for em in emissions:
                key_ = rid(em.record)
                assert out.setdefault(key_, em.record) == em.record, f"{key_} published twice"
        return out


def until_published(
    dep: Deployment, expected: dict[str, Record], *, quiet: float = 15, timeout: float = 45
) -> list[ConsumedRecord]:
    """Everything published once every expected id is there and nothing new came for 3 s.
    Fails once something is still missing after ``quiet`` seconds with nothing new (the
    partition is stuck), or after ``timeout`` (a batch failing again and again keeps
    publishing the outputs before its failure)."""
    deadline = time.monotonic() + timeout
    count, changed = -1, time.monotonic()
    while True:
        got = read_now(dep, outputs(dep))
        now = time.monotonic()
        if len(got) != count:
            count, changed = len(got), now
        missing = expected.keys() - {rid(r.record) for r in got if r.record is not None}
        if not missing and now - changed > 3:
            return got
        if missing and (now - changed > quiet or now > deadline):
            kinds = Counter(type(expected[k]).__name__ for k in missing)
            raise AssertionError(
                f"{len(missing)} expected records never came ({dict(kinds)}; nothing new for "
                f"{now - changed:.0f}s)\n{worker_logs(dep)}"
            )
        time.sleep(1)


def assert_same_as_pure(got: list[ConsumedRecord], expected: dict[str, Record]) -> None:
    """The published records, by id (a repeated id only ever an identical record), are the
    pure Processor's: none missing, none else, none different."""
    live = by_id(got)
    missing = sorted(expected.keys() - live.keys())
    unexpected = sorted(live.keys() - expected.keys())
    different = sorted(k for k in expected.keys() & live.keys() if live[k] != expected[k])
    assert not missing, f"{len(missing)} missing: {[expected[k] for k in missing[:3]]}"
    assert not unexpected, f"{len(unexpected)} unexpected: {[live[k] for k in unexpected[:3]]}"
    assert not different, f"{len(different)} differ: {[live[k] for k in different[:3]]}"


def metric(proc: Any, name: str) -> float:
    """One unlabelled sample of the worker's ``/metrics``."""
    url = f"http://127.0.0.1:{proc.web_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = answer.read().decode()
    found = re.search(rf"^{name} (\S+)$", body, re.M)
    assert found is not None, f"{name} not in /metrics"
    return float(found.group(1))


def published(dep: Deployment) -> list[Any]:
    return [r.record for r in read_now(dep, outputs(dep))]


def fault(**variables: str) -> dict[str, str]:
    return {**variables, "PYTHONPATH": f"{SITE}{os.pathsep}{ROOT}"}


# -- 2: a record the core fails on ------------------------------------------------------------
def test_a_record_the_core_fails_on_is_quarantined_and_everything_else_applied(
    cluster: Any, tmp_path: Path
) -> None:
    """The core raises whenever it applies one event (as it raised OverflowError on a duration
    the schema allows). Before, every batch that applied it failed, for ever, and its partition
    (and with it the worker) never moved on. Now, after ``VIGIL_MAX_RECORD_FAILURES`` (2)
    failed batches, it is set aside as a dead letter with a CRITICAL alert and every other
    record is applied: the outputs are the pure Processor's for the stream without it."""
    dep = deployment(cluster, tmp_path, partitions=3)
    steps = steady_stream(6)
    bad_id = "run-0-s5"  # run-0 RUNNING at 5 s; run-2 and run-5 share its partition, later
    inputs = Inputs(dep)
    where = inputs.steps(steps)
    inputs.flush()
    bad = where[bad_id]
    without = inputs.expected(skip=bad)
    # the stream is worth the test: states after the bad event on its partition and elsewhere
    states = [r for r in without.values() if isinstance(r, ExecutionState)]
    assert any(
        partition_of(s.execution_id, 3) == bad[1] and s.execution_id != "run-0" for s in states
    )
    assert {partition_of(s.execution_id, 3) for s in states} == {0, 1, 2}

    env = fault(VIGIL_TEST_RAISE_ON_EVENT=bad_id, VIGIL_MAX_RECORD_FAILURES="2")
    with worker(dep, env=env, reticks=False, ready_timeout=40) as w:
        got = until_published(dep, without, quiet=15, timeout=45)
        quarantined = metric(w, "vigil_quarantined_total")
    log = w.log_path.read_text(errors="replace")
    assert log.count(f"OverflowError: {RAISED} on {bad_id}") >= 2, worker_logs(dep)

    reason = f"2 batches failed on it; last: OverflowError: {RAISED} on {bad_id}"
    assert_same_as_pure(got, inputs.expected(quarantine={bad: reason}))
    live = by_id(got).values()
    (letter,) = [r for r in live if isinstance(r, DeadLetter)]
    assert letter.reason == f"quarantined: {reason}"
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == bad
    (alert,) = [r for r in live if isinstance(r, Alert) and r.verdict == "QUARANTINED"]
    assert (alert.kind, alert.severity, alert.subject_id) == (
        AlertKind.ANOMALY,
        Severity.CRITICAL,
        letter.dead_letter_id,
    )
    assert quarantined == 1


# -- 2: outputs larger than the topics accept -------------------------------------------------
def test_an_undecodable_record_of_a_megabyte_is_dead_lettered_by_digest(
    cluster: Any, tmp_path: Path
) -> None:
    """A 1 MB undecodable record: its dead letter, keeping the bytes, was larger than the
    worker's producer sends (1,000,000 bytes), so its batch failed for ever while the counter
    counted a dead letter per attempt. Now the dead letter carries its size and digest, the
    partition moves on, and the counter counts what the topic holds."""
    dep = deployment(cluster, tmp_path, partitions=1)
    inputs = Inputs(dep, **{"message.max.bytes": 2_000_000})
    es = dep.topics.execution_status.name
    big = b"\x01" + random.Random(17).randbytes(1_010_000)  # wrong magic byte: undecodable
    inputs.tick(T0)
    inputs.raw(es, 0, b"small-1", b"\x01junk", ms(T0))
    huge = inputs.raw(es, 0, b"big-1", big, ms(T0))
    inputs.raw(es, 0, b"small-2", b"", ms(T0))
    inputs.event(status("after-big", 1, S.CREATED, 1))  # a later record of the partition
    inputs.tick(at(2))
    inputs.flush()
    expected = inputs.expected()

    with worker(dep, reticks=False, ready_timeout=40) as w:
        got = until_published(dep, expected, quiet=15, timeout=45)
        counted = metric(w, "vigil_dead_letters_total")
    assert_same_as_pure(got, expected)
    live = by_id(got).values()
    letters = {r.dead_letter_id: r for r in live if isinstance(r, DeadLetter)}
    assert counted == len(letters) == 3
    (letter,) = [d for d in letters.values() if d.source_offset == huge[2]]
    assert letter.original_key is None and letter.original_value is None
    assert letter.original_size == len(b"big-1") + len(big)
    assert letter.original_sha256 == hashlib.sha256(big).hexdigest()
    assert "wrong magic byte" in letter.reason
    assert [s.last_sequence for s in live if isinstance(s, ExecutionState)] == [1]


def test_a_700_kb_record_with_a_mismatched_key_is_a_bounded_anomaly(
    cluster: Any, tmp_path: Path
) -> None:
    """A 700 KB status event whose Kafka key differs from its execution id: the anomaly (and
    its alert) quoted the id and the key, more than the broker takes, and the batch failed for
    ever. Now they quote a bounded head and digest, and the partition moves on."""
    dep = deployment(cluster, tmp_path, partitions=1)
    inputs = Inputs(dep)
    huge_id = "x" * 700_000
    inputs.tick(T0)
    mismatched = inputs.event(status(huge_id, 1, S.CREATED, 1, "huge-1"), key=b"another-key")
    inputs.event(status("after-huge", 1, S.CREATED, 1))
    inputs.tick(at(2))
    inputs.flush()
    value = next(v for t, p, o, _, _, v in inputs.log if (t, p, o) == mismatched)
    assert len(value) > 700_000  # the record as sent, on the broker
    expected = inputs.expected()

    with worker(dep, reticks=False, ready_timeout=40):
        got = until_published(dep, expected, quiet=15, timeout=45)
    assert_same_as_pure(got, expected)
    live = by_id(got).values()
    (anomaly,) = [r for r in live if isinstance(r, Anomaly)]
    assert anomaly.kind == AnomalyKind.KEY_MISMATCH
    assert anomaly.source_offset == mismatched[2]
    assert anomaly.execution_id is not None and anomaly.execution_id.startswith("x" * 200)
    for r in live:
        assert len(r.model_dump_json()) < 16_000, type(r).__name__
    assert [s.execution_id for s in live if isinstance(s, ExecutionState)] == ["after-huge"]


# -- 5: clock ticks out of range -----------------------------------------------------------------
def test_ticks_a_year_ahead_are_anomalies_and_deadlines_still_fire(
    cluster: Any, tmp_path: Path
) -> None:
    """A ticker whose clock says next year, stamping its ticks with a record timestamp of now
    (the broker refuses timestamps a year ahead). Before, the ticks were accepted and moved the
    watermark a year on: an operation sent afterwards was applied as a late event and its reply
    timeout never fired. Now each tick is a TIME_OUT_OF_RANGE anomaly and moves no clock."""
    dep = deployment(cluster, tmp_path, partitions=1)
    inputs = Inputs(dep)
    inputs.tick(T0)
    inputs.tick(T0 + timedelta(days=365), timestamp_ms=int(time.time() * 1000))
    inputs.event(op("tick-run", "op-late", 1, K.SENT, 10, reply_due_at=at(20)))
    for s in (25, 30):
        inputs.tick(at(s))
    inputs.flush()
    expected = inputs.expected()

    with worker(dep, reticks=False, ready_timeout=40):
        got = until_published(dep, expected, quiet=15, timeout=45)
    live = by_id(got).values()
    # deadline firing is not frozen: the reply timeout fired at its deadline
    items = [r for r in live if isinstance(r, ReconciliationWorkItem)]
    assert [(i.operation_id, i.kind, i.deadline) for i in items] == [
        ("op-late", WorkItemKind.REPLY_TIMEOUT, at(20))
    ]
    assert [o.status for o in live if isinstance(o, OperationState)] == ["SENT", "UNKNOWN"]
    # and the ticks were refused, one anomaly each
    refused = [r for r in live if isinstance(r, Anomaly)]
    assert [a.kind for a in refused] == [AnomalyKind.TIME_OUT_OF_RANGE] * 4
    assert {a.source_topic for a in refused} == {t.name for t in dep.topics.inputs()}
    assert all(a.event_type == "ClockTick" for a in refused)
    assert_same_as_pure(got, expected)


# -- 7: events read again after a failed batch ---------------------------------------------------
def committed_to_the_end(dep: Deployment, topics: list[str]) -> bool:
    """Whether the group's committed offset is the log end of every partition of ``topics``."""
    c = Consumer(dep.settings.confluent_conf() | {"group.id": dep.settings.app_id})
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(dep.settings.partitions)]
        committed = {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
        return all(
            committed[(tp.topic, tp.partition)] == c.get_watermark_offsets(tp, timeout=10)[1]
            for tp in tps
        )
    finally:
        c.close()


def wait_committed(dep: Deployment, topics: list[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not committed_to_the_end(dep, topics):
        assert time.monotonic() < deadline, f"{topics} never committed\n{worker_logs(dep)}"
        time.sleep(0.5)


def test_events_read_again_after_a_failed_batch_are_applied_without_another_tick(
    cluster: Any, tmp_path: Path
) -> None:
    """Events held for the watermark; the ticks of three input topics past them, read and
    acknowledged; then the fourth topic's tick releases them, and the broker refuses one of
    their outputs. The batch fails and its records come again, and no tick follows. Before,
    the stored clock had not kept the acknowledged ticks (it was saved only when the watermark
    moved), so the events read again waited for a tick that never came. Now they are applied
    at once: the outputs are the pure Processor's."""
    dep = deployment(cluster, tmp_path, partitions=1)
    names = [t.name for t in dep.topics.inputs()]
    es, oe, ae, rs = (
        dep.topics.execution_status.name,
        dep.topics.operation_events.name,
        dep.topics.approval_events.name,
        dep.topics.run_signals.name,
    )
    assert sorted(names) == sorted([es, oe, ae, rs])  # the watermark waits for these four
    inputs = Inputs(dep)
    inputs.tick(T0)
    inputs.flush()
    env = fault(VIGIL_TEST_REFUSE_OUTPUT_ONCE="again-1")
    with worker(dep, env=env, reticks=False, ready_timeout=40) as w:
        wait_committed(dep, names)
        for seq, st in enumerate((S.CREATED, S.VALIDATING, S.RESOLVING_CONTEXT), 1):
            inputs.event(status("again-1", seq, st, seq))
        inputs.event(status("again-1", 9, S.COMPLETED, 3.5))  # an anomaly, and its alert
        inputs.tick(at(5), topics=[es, oe, ae])
        inputs.flush()
        wait_committed(dep, [oe, ae])  # their ticks acknowledged; the events still held
        assert not committed_to_the_end(dep, [es])
        assert published(dep) == []
        inputs.tick(at(5), topics=[rs])  # releases the events; the last tick of the test
        inputs.flush()
        expected = inputs.expected()
        got = until_published(dep, expected, quiet=12, timeout=40)
    log = w.log_path.read_text(errors="replace")
    assert f"{REFUSED}:" in log and "it will be read again" in log, worker_logs(dep)
    assert_same_as_pure(got, expected)
    assert {type(r) for r in expected.values()} >= {ExecutionState, Anomaly, Alert}
