"""The recorder without a broker: what each call becomes (validation, ids, digests, sequence),
the spool file, and the delivery thread's order and completeness through outages, against a
scripted producer."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import DecisionCode, ExecutionStatus, OperationEventKind
from streams.contracts.models.events import ApprovalDecision, ExecutionStatusChanged
from streams.recorder import InvalidFact, Recorder, RecorderSettings, SpoolInUse, action_digest
from streams.recorder import facts as f
from streams.recorder.delivery import Delivery, Fact
from streams.recorder.spool import Spool
from streams.settings import Settings

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)

# ---------------------------------------------------------------------------------------------
# The action digest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6), st.randoms())
def test_digest_does_not_depend_on_key_order(arguments: dict[str, Any], rnd: Any) -> None:
    items = list(arguments.items())
    rnd.shuffle(items)
    assert action_digest("refund", dict(items)) == action_digest("refund", arguments)


@given(st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=6))
def test_digest_is_sha256_of_the_canonical_text(arguments: dict[str, Any]) -> None:
    text = f.canonical_json({"action": "refund", "arguments": arguments})
    assert json.loads(text) == {"action": "refund", "arguments": arguments}
    expected = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert action_digest("refund", arguments) == expected


def test_canonical_text_is_sorted_compact_utf8() -> None:
    """The documented form, for implementations in other languages to match."""
    text = f.canonical_json({"b": 1, "a": [1.5, "é", None, True], "c": {"y": 2.0, "x": ()}})
    assert text == '{"a":[1.5,"é",null,true],"b":1,"c":{"x":[],"y":2}}'


def test_digest_tells_actions_and_material_arguments_apart() -> None:
    a = action_digest("refund", {"amount": 10, "account": "A"})
    assert a != action_digest("refund", {"amount": 11, "account": "A"})
    assert a != action_digest("payout", {"amount": 10, "account": "A"})
    assert action_digest("refund", {"amount": 10.0, "account": "A"}) == a
    assert action_digest("refund", None) == action_digest("refund", {})


@pytest.mark.parametrize("bad", [{"s": {1, 2}}, {"f": float("nan")}, {"o": object()}, {1: "x"}])
def test_digest_refuses_what_is_not_plain_json(bad: dict[Any, Any]) -> None:
    with pytest.raises(InvalidFact) as err:
        action_digest("refund", bad)
    assert err.value.field == "arguments"


# ---------------------------------------------------------------------------------------------
# Ids and sequence

ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
kinds = st.sampled_from([k for k in OperationEventKind if k != "UNRECOGNIZED"])


@given(ids, ids, st.integers(1, 2**31 - 1), kinds, st.integers(0, 10**9))
def test_operation_event_id_is_the_fact_not_the_moment(
    ex: str, op: str, attempt: int, kind: OperationEventKind, later_ms: int
) -> None:
    one = f.operation_event(ex, op, attempt, kind, T0, connector="c")
    again = f.operation_event(
        ex, op, attempt, kind, T0 + timedelta(milliseconds=later_ms), connector="c"
    )
    assert one.event_id == again.event_id
    other = f.operation_event(
        ex, op, attempt + 1 if attempt < 2**31 - 1 else 1, kind, T0, connector="c"
    )
    assert other.event_id != one.event_id


def test_repeatable_facts_include_their_time_once_facts_do_not() -> None:
    hb = [f.requester_heartbeat("ex", T0 + timedelta(seconds=s)) for s in (0, 0, 30)]
    assert hb[0].event_id == hb[1].event_id != hb[2].event_id
    d = [f.current_action_digest("ex", "sha256:a", T0 + timedelta(seconds=s)) for s in (0, 9)]
    assert d[0].event_id != d[1].event_id
    dec = [f.approval_decision("ex", "r", "accept", T0 + timedelta(seconds=s)) for s in (0, 9)]
    assert dec[0].event_id == dec[1].event_id
    assert f.approval_decision("ex", "r", "decline", T0).event_id != dec[0].event_id
    rcp = [f.resume_receipt("ex", "r", T0 + timedelta(seconds=s)) for s in (0, 9)]
    assert rcp[0].event_id == rcp[1].event_id


@given(st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=30))
def test_sequence_strictly_increases_and_follows_the_clock(offsets_ms: list[int]) -> None:
    previous = None
    for ms in offsets_ms:
        at = T0 + timedelta(milliseconds=ms)
        seq = f.next_sequence(previous, at)
        assert previous is None or seq > previous
        assert seq >= f.millis(at)
        previous = seq


# ---------------------------------------------------------------------------------------------
# Validation at the call site, through a recorder that never reaches a broker


@pytest.fixture
def offline(tmp_path: Path) -> Any:
    """A recorder pointed at nothing: its calls are judged on the caller's thread."""
    settings = replace(
        Settings(), bootstrap_servers="127.0.0.1:9", schema_registry_url="http://127.0.0.1:9"
    )
    rs = replace(RecorderSettings(), spool_dir=str(tmp_path / "spool"), close_timeout=0)
    rec = Recorder(settings, recorder_settings=rs, clock=lambda: T0, exit_hook=False)
    yield rec
    rec.close(0)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda run: run.status("runing"), "status"),
        (lambda run: run.status("UNRECOGNIZED"), "status"),
        (lambda run: run.request("r").decided("maybe"), "decision"),
        (lambda run: run.request("r").decided("timeout"), "decision"),
        (lambda run: run.operation("op", connector="c", attempt=0), "attempt"),
        (lambda run: run.operation("op", connector="c", attempt=-1), "attempt"),
        (lambda run: run.operation("op", connector="c").sent(at=datetime(2026, 1, 1)), "at"),
        (lambda run: run.operation("op", connector="c").sent(reply_due=-5), "reply_due"),
        (lambda run: run.approval("r", action="a", risk="medium"), "risk"),
        (lambda run: run.approval("r", action="a", grace=-1), "grace"),
        (lambda run: run.approval("", action="a"), "request_id"),
        (lambda run: run.status("running", sequence=-3), "sequence"),
    ],
)
def test_an_illegal_argument_raises_at_the_call_naming_the_field(
    offline: Recorder, call: Any, field: str
) -> None:
    run = offline.execution("ex-1")
    with pytest.raises(InvalidFact) as err:
        call(run)
    assert err.value.field == field
    assert field in str(err.value)
    assert offline.counts.recorded == 0  # nothing was queued


def test_calls_build_the_records_the_worker_reads(offline: Recorder) -> None:
    run = offline.execution("ex-1", agent_id="agent-7")
    first = run.status("running")
    second = run.status(ExecutionStatus.WAITING_FOR_APPROVAL)
    assert isinstance(first, ExecutionStatusChanged)
    assert (first.status, first.agent_id, first.occurred_at) == ("RUNNING", "agent-7", T0)
    assert second.sequence > first.sequence  # same clock reading: one more
    op = run.operation("op-1", connector="payments", idempotency_key="k-1")
    sent = op.sent(reply_due=timedelta(seconds=30))
    assert sent.reply_due_at == T0 + timedelta(seconds=30) and sent.attempt == 1
    assert op.retry().sent().attempt == 2
    req = run.approval(
        "req-1",
        action="deploy",
        arguments={"service": "api"},
        approver="role:release-owner",
        resume_handle="h",
        risk="high",
        policy="prod",
        expires=timedelta(hours=1),
        grace=timedelta(minutes=2),
    )
    assert req.requested is not None
    assert req.requested.action_digest == action_digest("deploy", {"service": "api"})
    assert (req.requested.risk, req.requested.grace_seconds) == ("HIGH", 120)
    decision = req.decided("Cancel")
    assert isinstance(decision, ApprovalDecision)
    assert decision.decision is DecisionCode.CANCEL  # a cancel is never a decline
    assert decision.action_digest == req.requested.action_digest
    assert offline.counts.recorded == 6


def test_trace_context_is_taken_when_given(offline: Recorder) -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert offline.execution("ex").heartbeat(traceparent=tp).traceparent == tp


# ---------------------------------------------------------------------------------------------
# The spool file


def test_spool_keeps_order_and_cursor_and_refuses_a_second_process(tmp_path: Path) -> None:
    path = tmp_path / "r.spool"
    spool = Spool(path)
    records = [f.requester_heartbeat("ex", T0 + timedelta(seconds=i)) for i in range(5)]
    for i, r in enumerate(records):
        spool.append(i, "p.run-signals", r)
    spool.sync(force=True)
    with pytest.raises(SpoolInUse, match=str(path)):
        Spool(path)
    read = list(spool.read(spool.cursor))
    assert [s.record for s in read] == records
    spool.advance(read[1].end, 2)
    spool.close()
    again = Spool(path)  # a later process: the cursor says where to go on
    assert again.backlog == 3
    assert [s.record for s in again.read(again.cursor)] == records[2:]
    again.rewrite([(99, "p.run-signals", records[0])], skip={read[3].end})
    assert [s.record for s in again.read(again.cursor)] == [records[0], records[2], records[4]]
    again.close()


# ---------------------------------------------------------------------------------------------
# The delivery thread against a scripted producer


class FakeMessage:
    def __init__(self, topic: str, value: bytes) -> None:
        self._topic, self._value = topic, value

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes:
        return self._value


class FakeBroker:
    """A producer whose broker is up or down: up, ``poll`` delivers everything queued in
    order; down, nothing; ``purge`` hands the queue back; a full queue raises BufferError."""

    def __init__(self, capacity: int = 8) -> None:
        self.up = False
        self.capacity = capacity
        self.log: list[bytes] = []
        self.lock = threading.Lock()

    def factory(self, _conf: dict[str, Any]) -> Any:
        broker = self

        class Producer:
            def __init__(self) -> None:
                self.queue: list[tuple[FakeMessage, Any]] = []
                self.reports: list[tuple[KafkaError | None, FakeMessage, Any]] = []

            def produce(
                self, topic: str, key: Any, value: bytes, timestamp: int, on_delivery: Any
            ) -> None:
                if len(self.queue) >= broker.capacity:
                    raise BufferError("queue full")
                self.queue.append((FakeMessage(topic, value), on_delivery))

            def poll(self, _timeout: float = 0) -> int:
                with broker.lock:
                    if broker.up:
                        for msg, cb in self.queue:
                            broker.log.append(msg.value())
                            self.reports.append((None, msg, cb))
                        self.queue = []
                reports, self.reports = self.reports, []
                for err, msg, cb in reports:
                    cb(err, msg)
                return len(reports)

            def purge(
                self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True
            ) -> None:
                err = KafkaError(KafkaError._PURGE_QUEUE)
                self.reports.extend((err, msg, cb) for msg, cb in self.queue)
                self.queue = []

        return Producer()


class FakeCodec:
    def encode(self, topic: str, record: Any) -> bytes:
        return record.event_id.encode()


steps = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(1, 12)),
        st.tuples(st.just("up"), st.booleans()),
        st.tuples(st.just("wait"), st.floats(0.0, 0.08)),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps)
def test_every_fact_is_delivered_once_in_order_through_outages(
    tmp_path_factory: pytest.TempPathFactory, script: list[tuple[str, Any]]
) -> None:
    """Whatever the broker does while facts are recorded (down, up, down again, a queue
    that fills), once it answers every fact is delivered exactly once, in the order recorded
    (the order of one partition: one execution here), and the spool ends empty."""
    broker = FakeBroker()
    spool = tmp_path_factory.mktemp("spool") / "r.spool"
    d = Delivery(
        {},
        FakeCodec(),
        spool,
        spool_after=0.02,
        retry_max=0.02,  # type: ignore[arg-type]
        producer_factory=broker.factory,
    )
    recorded: list[bytes] = []
    n = 0
    for action, arg in script:
        if action == "record":
            for _ in range(arg):
                r = f.requester_heartbeat("ex", T0 + timedelta(milliseconds=n))
                d.put(Fact(n, "p.run-signals", r))
                recorded.append(r.event_id.encode())
                n += 1
        elif action == "up":
            with broker.lock:
                broker.up = arg
        else:
            time.sleep(arg)
    with broker.lock:
        broker.up = True
    assert d.flush(10) == 0
    assert d.close(1) == 0
    assert broker.log == recorded
    assert d.counts.delivered == len(recorded)
    assert spool.stat().st_size == 0


def test_facts_left_at_close_are_spooled_and_sent_first_by_the_next(tmp_path: Path) -> None:
    down = FakeBroker()
    spool = tmp_path / "r.spool"
    first = Delivery(
        {},
        FakeCodec(),
        spool,
        spool_after=0.02,  # type: ignore[arg-type]
        producer_factory=down.factory,
    )
    old = [f.requester_heartbeat("ex", T0 + timedelta(seconds=i)) for i in range(20)]
    for i, r in enumerate(old):
        first.put(Fact(i, "p.run-signals", r))
    assert first.close(0.2) == 20
    assert first.counts.outages >= 1
    up = FakeBroker()
    up.up = True
    second = Delivery(
        {},
        FakeCodec(),
        spool,
        spool_after=0.02,  # type: ignore[arg-type]
        producer_factory=up.factory,
    )
    assert second.spooling  # an earlier run's facts go first
    new = f.requester_heartbeat("ex", T0 + timedelta(minutes=5))
    second.put(Fact(0, "p.run-signals", new))
    assert second.flush(10) == 0
    second.close(1)
    assert up.log == [r.event_id.encode() for r in [*old, new]]
    assert second.counts.delivered == 21
    # The new fact goes through the spool when it arrives before the leftovers are all
    # delivered, and straight to the producer after: either way it is sent after them.
    assert second.counts.replayed in (20, 21)


def test_an_earlier_runs_facts_and_this_runs_share_a_batch(tmp_path: Path) -> None:
    """Facts left by an earlier process carry its fact numbers, which this process counts
    again from 0: when both are in one replay batch, each delivery report still settles its
    own fact (a batch keyed by fact number never completed and the spool never drained)."""
    spool = tmp_path / "r.spool"
    first = Delivery(
        {},
        FakeCodec(),
        spool,
        spool_after=0.02,  # type: ignore[arg-type]
        producer_factory=FakeBroker().factory,
    )
    old = [f.requester_heartbeat("ex", T0 + timedelta(seconds=i)) for i in range(5)]
    for i, r in enumerate(old):
        first.put(Fact(i, "p.run-signals", r))
    assert first.close(0.1) == 5
    broker = FakeBroker()  # down: the first replay of the leftovers is taken back
    second = Delivery(
        {},
        FakeCodec(),
        spool,
        spool_after=0.05,
        retry_max=0.05,  # type: ignore[arg-type]
        producer_factory=broker.factory,
    )
    new = [f.requester_heartbeat("ex", T0 + timedelta(minutes=1, seconds=i)) for i in range(5)]
    for i, r in enumerate(new):
        second.put(Fact(i, "p.run-signals", r))  # the same numbers as the leftovers
    time.sleep(0.2)
    with broker.lock:
        broker.up = True
    assert second.flush(5) == 0
    second.close(1)
    assert broker.log == [r.event_id.encode() for r in [*old, *new]]


def test_async_recorder_flushes_without_blocking_the_loop(tmp_path: Path) -> None:
    import asyncio

    from streams.recorder import AsyncRecorder

    settings = replace(
        Settings(), bootstrap_servers="127.0.0.1:9", schema_registry_url="http://127.0.0.1:9"
    )
    rs = replace(RecorderSettings(), spool_dir=str(tmp_path / "spool"), close_timeout=0)

    async def agent() -> tuple[int, int, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        async with AsyncRecorder(settings, recorder_settings=rs, exit_hook=False) as rec:
            run = rec.execution("ex-async")
            run.status("running")
            run.heartbeat()
            before = ticks
            left = await rec.flush(0.5)  # nothing reachable: the two wait, none is lost
            during = ticks - before
        task.cancel()
        return left, during, rec.counts.recorded

    left, during, recorded = asyncio.run(agent())
    assert (left, recorded) == (2, 2)
    assert during >= 3  # the loop kept running while the flush waited (a blocking one: 0)
    assert len((tmp_path / "spool" / "recorder.spool").read_bytes().splitlines()) == 2


RECORDER_VARIABLES = (
    "VIGIL_RECORDER_SPOOL_DIR",
    "VIGIL_RECORDER_NAME",
    "VIGIL_RECORDER_SPOOL_AFTER",
    "VIGIL_RECORDER_QUEUE",
)


def test_recorder_variables_are_read_refused_and_documented(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from streams.settings import SettingsError

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert [v for v in RECORDER_VARIABLES if f"`{v}`" not in readme] == []
    monkeypatch.setenv("VIGIL_RECORDER_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("VIGIL_RECORDER_NAME", "agent-a")
    monkeypatch.setenv("VIGIL_RECORDER_SPOOL_AFTER", "750ms")
    monkeypatch.setenv("VIGIL_RECORDER_QUEUE", "5000")
    rs = RecorderSettings.from_env(Settings())
    assert rs.spool_path == tmp_path / "agent-a.spool"
    assert (rs.spool_after, rs.queue_max) == (timedelta(milliseconds=750), 5000)
    monkeypatch.setenv("VIGIL_RECORDER_SPOOL_AFTER", "soon")
    with pytest.raises(SettingsError, match="VIGIL_RECORDER_SPOOL_AFTER='soon'"):
        RecorderSettings.from_env(Settings())
    monkeypatch.setenv("VIGIL_RECORDER_SPOOL_AFTER", "5s")
    monkeypatch.setenv("VIGIL_RECORDER_QUEUE", "0")
    with pytest.raises(SettingsError, match="VIGIL_RECORDER_QUEUE='0'"):
        RecorderSettings.from_env(Settings())


def test_the_current_opentelemetry_span_is_the_traceparent(offline: Recorder) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("agent")
    run = offline.execution("ex-traced")
    assert run.heartbeat().traceparent is None  # no span active
    with tracer.start_as_current_span("tool-call") as span:
        ctx = span.get_span_context()
        sent = run.operation("op", connector="c").sent()
    flags = int(ctx.trace_flags)
    assert sent.traceparent == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{flags:02x}"
    assert flags & 1  # sampled
    from streams.core.trace import valid_traceparent

    assert valid_traceparent(sent.traceparent)


def test_counts_are_exported_to_prometheus(offline: Recorder) -> None:
    from prometheus_client import REGISTRY

    before = REGISTRY.get_sample_value("vigil_recorder_facts_total", {"outcome": "recorded"})
    offline.execution("ex-m").heartbeat()
    after = REGISTRY.get_sample_value("vigil_recorder_facts_total", {"outcome": "recorded"})
    assert after == (before or 0) + 1
    assert REGISTRY.get_sample_value("vigil_recorder_backlog") is not None


def test_an_unreadable_spool_line_is_rejected_not_sent_and_does_not_block(tmp_path: Path) -> None:
    """A line this version cannot read (a newer record type, a torn edit) is copied to the
    rejected file and said; the readable facts around it are sent and the spool drains."""
    from streams.recorder.spool import line_of

    spool = tmp_path / "r.spool"
    facts = [f.requester_heartbeat("ex", T0 + timedelta(seconds=i)) for i in range(2)]
    garbage = b'{"n": 9, "topic": "p.run-signals", "type": "FromTheFuture", "record": {}}\n'
    spool.write_bytes(line_of(0, "p.run-signals", facts[0]) + garbage)
    broker = FakeBroker()
    broker.up = True
    d = Delivery(
        {},
        FakeCodec(),
        spool,
        spool_after=0.02,  # type: ignore[arg-type]
        producer_factory=broker.factory,
    )
    assert d.flush(5) == 0
    assert not d.spooling  # the unreadable line last: the spool drains all the same
    d.put(Fact(0, "p.run-signals", facts[1]))
    assert d.flush(5) == 0
    d.close(1)
    assert broker.log == [r.event_id.encode() for r in facts]
    assert (tmp_path / "r.spool.rejected").read_bytes() == garbage
    assert spool.read_bytes() == b""


def test_a_fatal_producer_error_hands_its_facts_to_a_new_producer(tmp_path: Path) -> None:
    """An idempotent producer can fail for good: the first delivery report says so and the
    producer reports nothing more. A new producer takes over and every fact arrives, in
    order (a producer left holding them was never polled again, and they waited for ever)."""
    broken_once = {"done": False}
    broker = FakeBroker(capacity=100)
    broker.up = True
    healthy = broker.factory

    def factory(conf: dict[str, Any]) -> Any:
        producer = healthy(conf)
        if broken_once["done"]:
            return producer
        broken_once["done"] = True

        def poll(_timeout: float = 0) -> int:
            if not producer.queue:
                return 0
            msg, cb = producer.queue.pop(0)  # the rest it keeps, and never reports
            cb(KafkaError(KafkaError._FATAL, "fenced", fatal=True), msg)
            return 1

        producer.poll = poll
        return producer

    d = Delivery(
        {},
        FakeCodec(),
        tmp_path / "r.spool",
        spool_after=0.05,  # type: ignore[arg-type]
        retry_max=0.05,
        producer_factory=factory,
    )
    facts = [f.requester_heartbeat("ex", T0 + timedelta(seconds=i)) for i in range(6)]
    for i, r in enumerate(facts):
        d.put(Fact(i, "p.run-signals", r))
    assert d.flush(5) == 0
    d.close(1)
    assert broker.log == [r.event_id.encode() for r in facts]


def test_spooled_lines_are_fsynced_within_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line written is handed to the OS at once and fsynced by the first sync after the
    interval, even when nothing more is written (it waited for the next write)."""
    import os as os_module

    synced: list[int] = []
    real = os_module.fsync
    monkeypatch.setattr("streams.recorder.spool.os.fsync", lambda fd: synced.append(fd) or real(fd))
    spool = Spool(tmp_path / "r.spool", fsync_interval=0.05)
    spool.append(0, "p.run-signals", f.requester_heartbeat("ex", T0))
    spool.sync()
    assert (tmp_path / "r.spool").read_bytes().count(b"\n") == 1  # with the OS already
    time.sleep(0.06)
    spool.sync()  # nothing new written since
    assert synced
    spool.close()


def test_threads_recording_one_execution_queue_its_sequences_in_order(offline: Recorder) -> None:
    """Several threads recording status changes of one execution: the queue (here the spool
    file, the registry being unreachable) holds them in strictly increasing sequence, or the
    worker would refuse the lower one as OUT_OF_ORDER."""
    from streams.recorder.spool import parse_line

    run = offline.execution("ex-threads")

    def agent(k: int) -> None:
        for i in range(400):
            run.status("running" if (i + k) % 2 else "waiting_for_tool")

    threads = [threading.Thread(target=agent, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert offline.close(0) == 1600
    lines = (offline.options.spool_path).read_bytes().splitlines()
    sequences = [parse_line(line)[2].sequence for line in lines]  # type: ignore[attr-defined]
    assert len(sequences) == 1600
    assert all(a < b for a, b in itertools.pairwise(sequences))
