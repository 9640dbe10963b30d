"""Records that cannot be processed or published as they are never stall a partition: without
Kafka, the processor's bounded dead letters and anomalies, quarantine, the key check on bytes,
counters that go back with a failed batch, and the membership lease that fences a zombie."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta

from streams.contracts.envelope import Envelope
from streams.contracts.models.enums import AlertKind, AnomalyKind, ExecutionStatus, Severity
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import Alert, Anomaly, DeadLetter
from streams.engine.processor import MAX_TEXT, Processor, Stores, bounded
from tests.test_processor import T0, TOPICS, env, ticks

MIB = 1024 * 1024


def _undecodable(value: bytes, key: bytes | None = b"k") -> Envelope:
    return Envelope(TOPICS.execution_status.name, 0, 7, 1, key, value, None, "not Avro")


def test_a_dead_letter_keeps_small_originals_as_they_are() -> None:
    proc = Processor(TOPICS, Stores())
    (em,) = proc.handle(_undecodable(b"\x00garbage"))
    dl = em.record
    assert isinstance(dl, DeadLetter)
    assert (dl.original_key, dl.original_value) == (b"k", b"\x00garbage")
    assert dl.original_size is None and dl.original_sha256 is None


def test_a_dead_letter_of_a_record_too_large_to_keep_carries_its_digest_and_coordinates() -> None:
    """A 1 MiB undecodable record: kept, its dead letter was larger than the topic accepts and
    the batch failed for ever; now the dead letter is small and says which record it was."""
    value = b"\x01" * MIB
    proc = Processor(TOPICS, Stores())
    (em,) = proc.handle(_undecodable(value))
    dl = em.record
    assert isinstance(dl, DeadLetter)
    assert dl.original_value is None and dl.original_key is None
    assert dl.original_size == MIB + 1
    assert dl.original_sha256 == hashlib.sha256(value).hexdigest()
    assert (dl.source_topic, dl.source_partition, dl.source_offset) == (
        TOPICS.execution_status.name,
        0,
        7,
    )
    assert len(dl.model_dump_json()) < 4096


def test_an_anomaly_about_a_huge_key_and_id_stays_small() -> None:
    """A 700 KB record whose key differs from its execution id: the anomaly quoted both."""
    huge = "x" * 700_000
    record = ExecutionStatusChanged(
        event_id="e", execution_id=huge, sequence=1, status=ExecutionStatus.CREATED, occurred_at=T0
    )
    e = env(record, key="other")
    out = [em for em in Processor(TOPICS, Stores()).handle(e)]
    anomaly = next(em.record for em in out if isinstance(em.record, Anomaly))
    assert anomaly.kind == AnomalyKind.KEY_MISMATCH
    assert anomaly.execution_id is not None and len(anomaly.execution_id) < MAX_TEXT + 100
    assert len(anomaly.reason) < 3 * MAX_TEXT
    for em in out:
        assert len(em.record.model_dump_json()) < 8 * MAX_TEXT
        assert em.key is None or len(em.key) < MAX_TEXT + 100


def test_bounded_text_is_the_text_when_short_and_a_head_and_digest_when_long() -> None:
    assert bounded("abc", 10) == "abc"
    long = "y" * 5000
    b = bounded(long, 1024)
    assert len(b) < 1024 and b.startswith("y" * 200)
    assert hashlib.sha256(long.encode()).hexdigest()[:32] in b
    assert bounded(long, 1024) != bounded(long + "z", 1024)


def test_a_key_that_is_not_utf8_is_compared_as_bytes() -> None:
    """``b"ex-1\\xff"`` decoded lossily is ``"ex-1\\ufffd"``: an execution id with that
    character passed the check before; bytes against bytes it does not."""
    record = ExecutionStatusChanged(
        event_id="e",
        execution_id="ex-1\ufffd",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0,
    )
    e = env(record)
    e = Envelope(e.topic, e.partition, e.offset, e.timestamp_ms, b"ex-1\xff", b"", record, None)
    kinds = [
        em.record.kind
        for em in Processor(TOPICS, Stores()).handle(e)
        if isinstance(em.record, Anomaly)
    ]
    assert kinds == [AnomalyKind.KEY_MISMATCH]


def test_quarantine_sets_the_record_aside_with_a_dead_letter_and_a_critical_alert() -> None:
    proc = Processor(TOPICS, Stores())
    token = object()
    record = ExecutionStatusChanged(
        event_id="e",
        execution_id="ex-q",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0,
    )
    e = env(record)
    out = proc.quarantine(e, "3 batches failed on it; last: OverflowError: too big", token=token)
    dl, alert = (em.record for em in out)
    assert isinstance(dl, DeadLetter) and dl.reason.startswith("quarantined: 3 batches failed")
    assert dl.original_key == b"ex-q"
    assert isinstance(alert, Alert)
    assert (alert.kind, alert.severity, alert.verdict) == (
        AlertKind.ANOMALY,
        Severity.CRITICAL,
        "QUARANTINED",
    )
    assert alert.subject_id == dl.dead_letter_id
    assert proc.drain_done() == [token]  # acknowledged: its partition moves on
    assert proc.counters.quarantined == 1 and proc.counters.dead_letters == 1


def test_the_input_being_applied_is_named_when_the_core_raises() -> None:
    """The pipeline blames the input that raised, not the record whose arrival released it."""
    proc = Processor(TOPICS, Stores())
    record = ExecutionStatusChanged(
        event_id="e",
        execution_id="ex-r",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0,
    )
    e = env(record)

    def boom(*_: object) -> None:
        raise OverflowError("date value out of range")

    proc._on_input = boom  # type: ignore[method-assign]
    # behind no watermark: held, then released by the ticks of every input
    proc.handle(e)
    try:
        ticks(proc, T0 + timedelta(seconds=1))
    except OverflowError:
        pass
    else:  # pragma: no cover - the test needs the failure
        raise AssertionError("the core did not raise")
    assert proc.applying is e


def test_counters_go_back_to_a_snapshot() -> None:
    proc = Processor(TOPICS, Stores())
    before = proc.counters.snapshot()
    proc.handle(_undecodable(b"\x00"))
    assert proc.counters.dead_letters == 1
    proc.counters = before
    assert proc.counters.dead_letters == 0 and proc.counters.outputs == before.outputs


# -- the membership lease ------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeCoordinator:
    def __init__(self, clock: FakeClock, answers: list[bool]) -> None:
        self.clock, self.answers = clock, answers

    async def _do_heartbeat(self) -> bool:
        self.clock.now += 0.5  # the round trip
        return self.answers.pop(0)


def test_the_lease_runs_out_a_session_after_the_last_accepted_heartbeat_was_sent() -> None:
    from vigil_worker.lease import MembershipLease

    clock = FakeClock()
    lease = MembershipLease(10.0, margin=1.0, clock=clock)
    assert lease.valid()  # nothing seen yet: no group coordinator to prove anything
    coordinator = FakeCoordinator(clock, [True, False, True])
    lease.watch(coordinator)
    lease.watch(coordinator)  # watching twice wraps once
    asyncio.run(coordinator._do_heartbeat())  # sent at 100, accepted
    assert lease.proven_at == 100.0
    clock.now = 108.9
    assert lease.valid()
    clock.now = 109.0  # 10 s session, 1 s margin, counted from when it was sent
    assert not lease.valid()
    asyncio.run(coordinator._do_heartbeat())  # refused: still not valid
    assert not lease.valid()
    asyncio.run(coordinator._do_heartbeat())  # accepted: proven again
    assert lease.valid() and lease.proven_at == 109.5


def test_a_stopped_worker_holds_its_batch_until_membership_is_proven() -> None:
    """A SIGSTOP past the session: when the process runs again, the clock has jumped and the
    lease has run out, whatever the worker was doing; it is valid again only after a heartbeat
    sent after the stop was accepted."""
    from vigil_worker.lease import MembershipLease

    clock = FakeClock()
    lease = MembershipLease(30.0, clock=clock)
    lease.renew()
    clock.now += 45.0  # stopped for 45 s
    assert not lease.valid()
    lease.renew(sent_at=clock.now - 50)  # an old heartbeat answered late proves nothing new
    assert not lease.valid()
    lease.renew(sent_at=clock.now)
    assert lease.valid()
