"""Hostile input and schema evolution, on the real broker and registry.

One deployment and one worker subprocess serve the whole module. Every case owns a partition
(the ids it uses are chosen to hash there and raw records are produced to it explicitly), so
the cases do not disturb each other's stream time, and each ends with a valid record on the
same partition, after the bad ones: seeing that record's output proves the worker carried on
past them.

Not covered: "counted in metrics". The worker counts dead letters and anomalies in
``Processor.counters`` but exposes no metrics endpoint yet, so there is nothing to read from a
running worker.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, topic_record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from streams.contracts.codec import AvroCodec, DecodeError
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AnomalyKind,
    DecisionCode,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
)
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalRequested,
    ClockTick,
    ExecutionStatusChanged,
    OperationEvent,
    RequesterHeartbeat,
)
from streams.contracts.models.outputs import Anomaly, DeadLetter, ExecutionState, OperationState
from streams.kafka.partitioning import partition_of
from tests.support import Deployment, deployment, worker

pytestmark = pytest.mark.kafka

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
FAR_FUTURE = T0 + timedelta(days=3650)
BEFORE_1970 = datetime(1969, 7, 20, 20, 17, tzinfo=UTC)
PARTITIONS = 8
# One partition per case. FRESH never gets a tick: its clock must not exist when its case runs.
DEAD, ANOMALY, BURST, ORPHAN, EVOLVE, FRESH, FUTURE, DECISION = range(PARTITIONS)
TICKED = (DEAD, ANOMALY, BURST, ORPHAN, EVOLVE, FUTURE, DECISION)
BURST_SIZE = 10_000


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def now_ms() -> int:
    return int(time.time() * 1000)


def key_in(prefix: str, partition: int) -> str:
    """The first ``prefix-N`` that murmur2 puts in ``partition``."""
    n = 0
    while partition_of(f"{prefix}-{n}", PARTITIONS) != partition:
        n += 1
    return f"{prefix}-{n}"


def status(ex: str, seq: int, st: ExecutionStatus, at: datetime, eid: str | None = None) -> Any:
    return ExecutionStatusChanged(
        event_id=eid or f"{ex}-{seq}", execution_id=ex, sequence=seq, status=st, occurred_at=at
    )


def extended_enum(model: type[Record], field: str, symbol: str) -> dict[str, Any]:
    """``model``'s schema with one more enum symbol: what a newer producer would write."""
    schema = model.avro_schema()
    spec = next(f for f in schema["fields"] if f["name"] == field)
    symbols = spec["type"]["symbols"]
    symbols.insert(symbols.index("UNRECOGNIZED"), symbol)
    return schema


@dataclass(frozen=True)
class Seen:
    topic: str
    partition: int
    key: str | None
    record: Record


class Outputs:
    """One consumer over every output topic for the whole module; what it read accumulates,
    so a case waits for its own records without re-reading the topics."""

    def __init__(self, dep: Deployment) -> None:
        self.codec = dep.codec
        self.consumer = Consumer(
            dep.settings.confluent_conf()
            | {
                "group.id": f"{dep.settings.app_id}-hostile-reader",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.assign(
            [
                TopicPartition(spec.name, p, -2)
                for spec in dep.topics.outputs()
                for p in range(spec.partitions)
            ]
        )
        self.seen: list[Seen] = []

    def close(self) -> None:
        self.consumer.close()

    def _poll(self, seconds: float) -> int:
        got = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            batch = self.consumer.consume(5000, 0.2)
            for msg in batch:
                if msg.error():
                    continue
                try:
                    record = self.codec.decode(msg.topic(), msg.value())
                except DecodeError as exc:  # pragma: no cover - the worker writes contracts
                    raise AssertionError(f"undecodable output on {msg.topic()}: {exc}") from exc
                key = msg.key().decode(errors="replace") if msg.key() is not None else None
                self.seen.append(Seen(msg.topic(), msg.partition(), key, record))
                got += 1
        return got

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; read {len(self.seen)}")
            self._poll(0.5)

    def settle(self, idle: float = 2.0) -> None:
        """Read until nothing new comes for ``idle`` seconds: outputs the worker sent just
        before the one a case waited for are in by then."""
        while self._poll(idle):
            pass

    def records(self, kind: type[Record]) -> list[Any]:
        return [s.record for s in self.seen if isinstance(s.record, kind)]

    def dead_letters(self, partition: int) -> dict[str, DeadLetter]:
        return {
            d.dead_letter_id: d for d in self.records(DeadLetter) if d.source_partition == partition
        }

    def anomalies_of(self, event_id: str) -> list[Anomaly]:
        return [a for a in self.records(Anomaly) if a.event_id == event_id]

    def states_of(self, execution_id: str) -> list[ExecutionState]:
        return [s for s in self.records(ExecutionState) if s.execution_id == execution_id]


@dataclass
class Live:
    dep: Deployment
    proc: Any
    outputs: Outputs
    raw: Producer

    @property
    def registry(self) -> Any:
        return self.dep.codec.registry

    def topic_of(self, model: type[Record]) -> str:
        return next(t.name for t in self.dep.topics.inputs() if model in t.value_types)

    def send_bytes(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        self.raw.produce(topic, key=key, value=value, partition=partition, **kwargs)
        self.raw.poll(0)

    def send(
        self,
        record: Record,
        partition: int,
        *,
        key: str | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """A record with the current contract; by default keyed by its execution id and
        stamped with its event time, like a well-behaved producer."""
        topic = self.topic_of(type(record))
        k = record.kafka_key() if key is None else key
        ts = timestamp_ms if timestamp_ms is not None else ms(record.occurred_at)  # type: ignore[attr-defined]
        value = self.dep.codec.encode(topic, record)
        self.send_bytes(topic, partition, k.encode() if k is not None else None, value, ts)

    def tick(self, partition: int, at: datetime) -> None:
        for spec in self.dep.topics.inputs():
            tick = ClockTick(ticker_id="hostile-test", partition=partition, occurred_at=at)
            self.send_bytes(
                spec.name, partition, None, self.dep.codec.encode(spec.name, tick), ms(at)
            )

    def flush(self) -> None:
        """Deliver what was sent. Time moves only by a case's own ticks on its own partition
        (``tick``, ``sentinel``): a tick on another case's partition would make that case's
        events late there (written behind their topic partition's time), and a late event is
        judged at that later time."""
        assert self.raw.flush(30) == 0

    def encode_as(self, schema: dict[str, Any], topic: str, value: dict[str, Any]) -> bytes:
        """Serialize like a new producer would: its own schema, auto-registered under the
        topic-record subject."""
        serializer = AvroSerializer(
            self.registry,
            json.dumps(schema),
            conf={
                "auto.register.schemas": True,
                "subject.name.strategy": topic_record_subject_name_strategy,
            },
        )
        data = serializer(value, SerializationContext(topic, MessageField.VALUE))
        assert data is not None
        return data

    def subject(self, model: type[Record]) -> str:
        return f"{self.topic_of(model)}-{model.avro_fullname()}"

    def register_current(self, model: type[Record]) -> None:
        """Version 1 of ``model``'s subject is today's contract (idempotent)."""
        self.registry.register_schema(self.subject(model), Schema(model.avro_schema_str(), "AVRO"))

    def sentinel(self, partition: int, name: str, at: datetime = T0) -> str:
        """A valid first event of a fresh execution on ``partition``, sent after the bad
        records: its state proves the worker read past them."""
        ex = key_in(f"ok-{name}", partition)
        self.send(status(ex, 1, ExecutionStatus.CREATED, at), partition)
        # the worker releases an event once every input of its partition is past its time
        self.tick(partition, at + timedelta(seconds=1))
        return ex

    def wait_state(self, execution_id: str, **fields: Any) -> ExecutionState:
        def match() -> ExecutionState | None:
            for s in self.outputs.states_of(execution_id):
                if all(getattr(s, k) == v for k, v in fields.items()):
                    return s
            return None

        self.outputs.wait(f"state of {execution_id} {fields}", lambda: match() is not None)
        assert self.proc.poll() is None, "the worker died"
        found = match()
        assert found is not None
        return found


@pytest.fixture(scope="module")
def live(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    dep = deployment(cluster, tmp_path_factory.mktemp("hostile"), partitions=PARTITIONS)
    raw = Producer({"bootstrap.servers": dep.settings.bootstrap_servers, "linger.ms": 5})
    lv = Live(dep, None, Outputs(dep), raw)
    for model in (ExecutionStatusChanged, OperationEvent, ApprovalDecision):
        lv.register_current(model)
    for p in TICKED:  # every ticked partition has a stream time (T0) before its case runs
        lv.tick(p, T0)
    lv.flush()
    with worker(dep) as proc:
        lv.proc = proc
        yield lv
    lv.outputs.close()


# -- dead letters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BadBytes:
    topic: str  # an attribute of Topics
    value: bytes | None
    reason: str  # a fragment the dead letter's reason must contain


def dead_letter_cases(lv: Live) -> dict[str, BadBytes]:
    # A hostile producer writes record types under subjects vigil never registers there, so
    # its codec registers what it encodes (vigil's own clients only look schemas up).
    codec = AvroCodec(lv.dep.codec.registry, auto_register=True)
    es = lv.dep.topics.execution_status.name
    good = codec.encode(es, status("x", 1, ExecutionStatus.CREATED, T0))
    (writer_id,) = struct.unpack(">I", good[1:5])
    empty_execution = ExecutionStatusChanged.model_construct(
        event_id="e-1",
        execution_id="",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0,
        agent_id=None,
        reason=None,
    )
    empty_event = ExecutionStatusChanged.model_construct(
        **{**dict(empty_execution), "event_id": "", "execution_id": "x"}
    )
    no_execution_field = RequesterHeartbeat.avro_schema()
    no_execution_field["fields"] = [
        f for f in no_execution_field["fields"] if f["name"] != "execution_id"
    ]
    rs = lv.dep.topics.run_signals.name
    heartbeat_without_id = lv.encode_as(
        no_execution_field, rs, {"event_id": "hb-1", "occurred_at": T0, "resume_handle": None}
    )
    op = OperationEvent(
        event_id="wt-1",
        execution_id="x",
        operation_id="op-x",
        attempt=1,
        connector="c",
        kind=OperationEventKind.SENT,
        occurred_at=T0,
    )
    state = ExecutionState(
        execution_id="x",
        status=ExecutionStatus.CREATED,
        since=T0,
        first_seen_at=T0,
        last_event_at=T0,
        last_sequence=1,
        terminal=False,
        state_id="s-1",
    )
    cut = good[: 5 + (len(good) - 5) // 2]
    assert cut[0] == 0 and struct.unpack(">I", cut[1:5]) == (writer_id,)
    return {
        "truncated-avro": BadBytes(
            "execution_status",
            cut,
            "undecodable Avro for vigil.v1.events.ExecutionStatusChanged: EOFError",
        ),
        "truncated-header": BadBytes("execution_status", b"\x00\x00\x01", "truncated header"),
        "wrong-magic": BadBytes("execution_status", b"\x01" + good[1:], "wrong magic byte 0x01"),
        "not-avro": BadBytes("execution_status", b'{"status": "CREATED"}', "wrong magic byte"),
        "unknown-schema-id": BadBytes(
            "execution_status",
            b"\x00" + struct.pack(">I", 999_999) + good[5:],
            "unknown schema id 999999",
        ),
        "empty-value": BadBytes("execution_status", b"", "empty value"),
        "null-value": BadBytes("execution_status", None, "empty value"),
        "type-not-on-topic": BadBytes(
            "execution_status",
            codec.encode(es, op),
            f"record type vigil.v1.events.OperationEvent does not belong on topic {es}",
        ),
        "output-type-on-input": BadBytes(
            "execution_status", codec.encode(es, state), "does not belong on topic"
        ),
        "empty-execution-id": BadBytes(
            "execution_status",
            codec.encode(es, empty_execution),
            "execution_id: String should have at least 1 character",
        ),
        "empty-event-id": BadBytes(
            "execution_status",
            codec.encode(es, empty_event),
            "event_id: String should have at least 1 character",
        ),
        "missing-execution-id": BadBytes(
            "run_signals", heartbeat_without_id, "No default value for field execution_id"
        ),
    }


CASES = [
    "truncated-avro",
    "truncated-header",
    "wrong-magic",
    "not-avro",
    "unknown-schema-id",
    "empty-value",
    "null-value",
    "type-not-on-topic",
    "output-type-on-input",
    "empty-execution-id",
    "empty-event-id",
    "missing-execution-id",
]


@pytest.fixture(scope="module")
def dead_lettered(live: Live) -> dict[str, tuple[BadBytes, DeadLetter | None]]:
    """Every undecodable case sent once to partition DEAD, then a valid event after them."""
    cases = dead_letter_cases(live)
    assert sorted(cases) == sorted(CASES)
    for name, case in cases.items():
        topic = getattr(live.dep.topics, case.topic).name
        live.send_bytes(topic, DEAD, f"bad-{name}".encode(), case.value, now_ms())
    live.flush()
    ok = live.sentinel(DEAD, "dead")
    live.flush()
    live.wait_state(ok, last_sequence=1)
    live.outputs.settle()
    by_key = {
        d.original_key.decode(): d
        for d in live.outputs.dead_letters(DEAD).values()
        if d.original_key is not None
    }
    return {name: (case, by_key.get(f"bad-{name}")) for name, case in cases.items()}


@pytest.mark.parametrize("case", CASES)
def test_undecodable_record_is_dead_lettered_with_its_reason(
    live: Live, dead_lettered: dict[str, tuple[BadBytes, DeadLetter | None]], case: str
) -> None:
    bad, letter = dead_lettered[case]
    assert letter is not None, f"no dead letter for {case}"
    assert bad.reason in letter.reason
    assert letter.source_topic == getattr(live.dep.topics, bad.topic).name
    assert letter.source_partition == DEAD
    assert letter.original_value == (bad.value if bad.value is not None else None)
    # nothing of it leaked into the anomalies or the states
    assert not [a for a in live.outputs.records(Anomaly) if a.source_partition == DEAD]


# -- anomalies ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anomalies(live: Live) -> dict[str, tuple[str, list[Anomaly]]]:
    """Decodable but wrong records on partition ANOMALY. After each, a valid event of the
    same execution *with the same sequence* follows: it is applied as that execution's first
    event only if the bad one was not applied."""
    at = T0 + timedelta(seconds=1)
    es = live.topic_of(ExecutionStatusChanged)
    sent: dict[str, tuple[str, str]] = {}  # case -> (event id, execution id)

    ex = key_in("unknown-status", ANOMALY)
    value = status(ex, 1, ExecutionStatus.CREATED, at).to_avro() | {"status": "HIBERNATING"}
    data = live.encode_as(extended_enum(ExecutionStatusChanged, "status", "HIBERNATING"), es, value)
    live.send_bytes(es, ANOMALY, ex.encode(), data, ms(at))
    sent["unknown-status-symbol"] = (f"{ex}-1", ex)

    ex = key_in("unknown-kind", ANOMALY)
    op = OperationEvent(
        event_id=f"{ex}-op",
        execution_id=ex,
        operation_id=f"{ex}-op",
        attempt=1,
        connector="c",
        kind=OperationEventKind.UNRECOGNIZED,
        occurred_at=at,
    )
    live.send(op, ANOMALY)
    sent["unrecognized-operation-kind"] = (op.event_id, ex)

    ex = key_in("mismatch", ANOMALY)
    live.send(status(ex, 1, ExecutionStatus.CREATED, at), ANOMALY, key=key_in("other", ANOMALY))
    sent["key-mismatch"] = (f"{ex}-1", ex)

    ex = key_in("no-key", ANOMALY)
    record = status(ex, 1, ExecutionStatus.CREATED, at)
    live.send_bytes(es, ANOMALY, None, live.dep.codec.encode(es, record), ms(at))
    sent["no-key"] = (f"{ex}-1", ex)

    ex = key_in("moon", ANOMALY)
    live.send(status(ex, 1, ExecutionStatus.CREATED, BEFORE_1970), ANOMALY, timestamp_ms=now_ms())
    sent["before-1970"] = (f"{ex}-1", ex)

    live.flush()
    for case, (_, ex) in sent.items():
        if case == "unrecognized-operation-kind":
            live.send(
                op.model_copy(update={"event_id": "ok", "kind": OperationEventKind.PREPARED}),
                ANOMALY,
            )
        live.send(status(ex, 1, ExecutionStatus.CREATED, at, eid=f"{ex}-ok"), ANOMALY)
    live.tick(ANOMALY, at + timedelta(seconds=1))
    live.flush()
    for _, ex in sent.values():
        live.wait_state(ex, last_sequence=1, first_seen_at=at)
    live.outputs.settle()
    return {case: (ex, live.outputs.anomalies_of(eid)) for case, (eid, ex) in sent.items()}


@pytest.mark.parametrize(
    ("case", "kind", "reason"),
    [
        ("unknown-status-symbol", AnomalyKind.UNRECOGNIZED_SYMBOL, "unrecognized execution status"),
        (
            "unrecognized-operation-kind",
            AnomalyKind.UNRECOGNIZED_SYMBOL,
            "operation event kind UNRECOGNIZED",
        ),
        ("key-mismatch", AnomalyKind.KEY_MISMATCH, "differs from execution_id"),
        ("no-key", AnomalyKind.KEY_MISMATCH, "Kafka key None differs"),
        ("before-1970", AnomalyKind.TIME_OUT_OF_RANGE, "before 1971"),
    ],
)
def test_inconsistent_record_is_an_anomaly_and_not_applied(
    live: Live,
    anomalies: dict[str, tuple[str, list[Anomaly]]],
    case: str,
    kind: AnomalyKind,
    reason: str,
) -> None:
    ex, found = anomalies[case]
    assert [a.kind for a in found] == [kind]
    (anomaly,) = found
    assert reason in anomaly.reason
    assert anomaly.execution_id == ex
    assert anomaly.source_partition == ANOMALY
    # not applied: the follow-up with the same sequence was the execution's first event
    states = live.outputs.states_of(ex)
    assert states
    assert {(s.last_sequence, s.first_seen_at) for s in states} == {(1, T0 + timedelta(seconds=1))}
    if case == "unrecognized-operation-kind":
        ops = [o for o in live.outputs.records(OperationState) if o.execution_id == ex]
        assert [o.status for o in ops] == [OperationStatus.PREPARED]


def test_event_far_in_the_future_is_an_anomaly(live: Live) -> None:
    ex = key_in("future", FUTURE)
    # a producer with a broken clock: the record timestamp is now, occurred_at ten years on
    live.send(status(ex, 1, ExecutionStatus.CREATED, FAR_FUTURE), FUTURE, timestamp_ms=now_ms())
    live.flush()
    live.send(status(ex, 1, ExecutionStatus.CREATED, T0, eid=f"{ex}-ok"), FUTURE)
    live.tick(FUTURE, T0 + timedelta(seconds=1))
    live.flush()
    # the worker carried on, and did not apply the future event (same sequence accepted)
    live.wait_state(ex, last_sequence=1, first_seen_at=T0)
    live.outputs.settle()
    found = live.outputs.anomalies_of(f"{ex}-1")
    assert [a.kind for a in found] == [AnomalyKind.TIME_OUT_OF_RANGE]
    assert "ahead of its record timestamp" in found[0].reason


def test_far_future_event_first_on_a_partition_is_not_applied(live: Live) -> None:
    ex = key_in("future-first", FRESH)
    live.send(status(ex, 1, ExecutionStatus.CREATED, FAR_FUTURE), FRESH, timestamp_ms=now_ms())
    live.flush()
    live.send(status(ex, 2, ExecutionStatus.VALIDATING, T0), FRESH)
    live.sentinel(FRESH, "fresh")
    live.flush()
    live.wait_state(key_in("ok-fresh", FRESH), last_sequence=1)
    live.outputs.settle()
    # refused, the future event leaves no trace: seq 2 is the execution's first event
    assert [(s.last_sequence, s.first_seen_at) for s in live.outputs.states_of(ex)] == [(2, T0)]


def test_decision_with_unknown_symbol_is_an_anomaly(live: Live) -> None:
    ex = key_in("defer", DECISION)
    ae = live.topic_of(ApprovalDecision)
    request = ApprovalRequested(
        event_id=f"{ex}-rq",
        execution_id=ex,
        request_id=f"{ex}-req",
        action="deploy",
        action_digest="d1",
        occurred_at=T0,
    )
    live.send(request, DECISION)
    decision = ApprovalDecision(
        event_id=f"{ex}-dec",
        execution_id=ex,
        request_id=request.request_id,
        occurred_at=T0 + timedelta(seconds=1),
        decision=DecisionCode.ACCEPT,
    ).to_avro() | {"decision": "DEFER"}
    data = live.encode_as(extended_enum(ApprovalDecision, "decision", "DEFER"), ae, decision)
    live.send_bytes(ae, DECISION, ex.encode(), data, ms(T0 + timedelta(seconds=1)))
    live.flush()
    live.tick(DECISION, T0 + timedelta(minutes=1))
    ok = live.sentinel(DECISION, "decision", T0 + timedelta(minutes=1))
    live.flush()
    live.wait_state(ok, last_sequence=1)
    live.outputs.settle()
    found = live.outputs.anomalies_of(f"{ex}-dec")
    assert [a.kind for a in found] == [AnomalyKind.UNRECOGNIZED_SYMBOL]


def test_decision_for_a_request_that_never_comes_is_an_anomaly(live: Live) -> None:
    ex = key_in("orphan", ORPHAN)
    live.send(
        ApprovalDecision(
            event_id=f"{ex}-dec",
            execution_id=ex,
            request_id=f"{ex}-never",
            occurred_at=T0 + timedelta(seconds=1),
            decision=DecisionCode.ACCEPT,
        ),
        ORPHAN,
    )
    live.flush()
    # stream time moves on well past any grace and the closed-request retention (24 h)
    for hours in (1, 25, 49):
        live.tick(ORPHAN, T0 + timedelta(hours=hours))
    ok = live.sentinel(ORPHAN, "orphan", T0 + timedelta(hours=49))
    live.flush()
    live.wait_state(ok, last_sequence=1)
    live.outputs.settle()
    found = [a for a in live.outputs.records(Anomaly) if a.execution_id == ex]
    assert [a.kind for a in found] == [AnomalyKind.ORPHAN_FACT], "the orphan never surfaced"
    assert f"{ex}-never" in found[0].reason


# -- burst ----------------------------------------------------------------------------------


def garbage(i: int, writer_id: int) -> bytes:
    """Ten kinds of undecodable value, none of which can decode by chance."""
    kind = i % 10
    if kind == 0:
        return b""
    if kind == 1:
        return b"\x00" + struct.pack(">I", writer_id)  # header, no body
    if kind == 2:
        return b"\x00" + struct.pack(">I", writer_id) + b"\x40"  # a 32-byte string, cut
    if kind == 3 and i % 1000 == 3:
        return b"\x00" + struct.pack(">I", 999_999) + b"\x02"  # a few unknown ids
    if kind == 4:
        return b"\x00\x00"
    return bytes([1 + (i * 7) % 255]) + f"garbage {i}".encode()  # not Confluent-framed


def test_burst_of_ten_thousand_garbage_records_all_dead_lettered(live: Live) -> None:
    es = live.topic_of(ExecutionStatusChanged)
    (writer_id,) = struct.unpack(
        ">I", live.dep.codec.encode(es, status("x", 1, ExecutionStatus.CREATED, T0))[1:5]
    )
    inputs = [t.name for t in live.dep.topics.inputs()]
    keys = set()
    started = time.monotonic()
    for i in range(BURST_SIZE):
        key = f"junk-{i}"
        keys.add(key)
        live.send_bytes(inputs[i % len(inputs)], BURST, key.encode(), garbage(i, writer_id))
    live.flush()
    ok = live.sentinel(BURST, "burst")
    live.flush()

    def letters() -> dict[str, DeadLetter]:
        return {
            i: d
            for i, d in live.outputs.dead_letters(BURST).items()
            if d.original_key and d.original_key.startswith(b"junk-")
        }

    live.outputs.wait(
        f"{BURST_SIZE} dead letters", lambda: len(letters()) >= BURST_SIZE, timeout=150
    )
    live.wait_state(ok, last_sequence=1)
    live.outputs.settle()
    got = letters()
    assert len(got) == BURST_SIZE
    assert {d.original_key.decode() for d in got.values()} == keys  # type: ignore[union-attr]
    assert {d.source_topic for d in got.values()} == set(inputs)
    by_reason = {r: sum(r in d.reason for d in got.values()) for r in ("magic", "empty", "EOF")}
    assert all(by_reason.values()), by_reason
    elapsed = time.monotonic() - started
    assert elapsed < 150, f"burst took {elapsed:.0f}s"


# -- schema evolution -----------------------------------------------------------------------


def operation(ex: str, op: str, at: datetime) -> OperationEvent:
    return OperationEvent(
        event_id=f"{op}-prep",
        execution_id=ex,
        operation_id=op,
        attempt=1,
        connector="crm",
        kind=OperationEventKind.PREPARED,
        occurred_at=at,
    )


def with_tenant(required: bool = False) -> dict[str, Any]:
    schema = OperationEvent.avro_schema()
    field: dict[str, Any] = {"name": "tenant", "type": ["null", "string"], "default": None}
    if required:
        field = {"name": "tenant", "type": "string", "doc": "required, no default"}
    schema["fields"].append(field)
    return schema


def test_new_optional_field_from_a_new_producer_is_read_by_the_worker(live: Live) -> None:
    oe = live.topic_of(OperationEvent)
    subject = live.subject(OperationEvent)
    old_ex, new_ex = key_in("evolve-old", EVOLVE), key_in("evolve-new", EVOLVE)
    live.send(operation(old_ex, "op-old", T0), EVOLVE)  # the current producer: version 1
    live.flush()
    before = live.registry.get_versions(subject)
    new = operation(new_ex, "op-new", T0 + timedelta(seconds=1))
    data = live.encode_as(with_tenant(), oe, new.to_avro() | {"tenant": "acme"})
    after = live.registry.get_versions(subject)
    assert len(after) == len(before) + 1, (before, after)
    latest = json.loads(live.registry.get_latest_version(subject).schema.schema_str)
    assert "tenant" in [f["name"] for f in latest["fields"]]
    live.send_bytes(oe, EVOLVE, new_ex.encode(), data, ms(new.occurred_at))
    live.tick(EVOLVE, new.occurred_at + timedelta(seconds=1))
    live.flush()

    def op_states() -> dict[str, OperationState]:
        return {
            o.operation_id: o
            for o in live.outputs.records(OperationState)
            if o.operation_id in ("op-old", "op-new")
        }

    live.outputs.wait("both operation states", lambda: len(op_states()) == 2)
    live.outputs.settle()
    state = op_states()["op-new"]
    assert (state.execution_id, state.status, state.since) == (
        new_ex,
        OperationStatus.PREPARED,
        new.occurred_at,
    )
    assert not live.outputs.dead_letters(EVOLVE)
    assert not [a for a in live.outputs.records(Anomaly) if a.source_partition == EVOLVE]


@pytest.mark.parametrize("change", ["required-field-without-default", "changed-field-type"])
def test_incompatible_version_is_refused_before_it_reaches_the_topic(
    live: Live, change: str
) -> None:
    oe = live.topic_of(OperationEvent)
    subject = live.subject(OperationEvent)
    live.register_current(OperationEvent)
    versions = live.registry.get_versions(subject)
    low, high = _end_offsets(live, oe)
    ex = key_in("incompatible", EVOLVE)
    value = operation(ex, "op-bad", T0).to_avro()
    if change == "required-field-without-default":
        schema = with_tenant(required=True)
        value |= {"tenant": "acme"}
    else:
        schema = OperationEvent.avro_schema()
        next(f for f in schema["fields"] if f["name"] == "attempt")["type"] = "string"
        value |= {"attempt": "1"}
    with pytest.raises(SchemaRegistryError) as refused:
        live.send_bytes(oe, EVOLVE, ex.encode(), live.encode_as(schema, oe, value))
    assert refused.value.http_status_code == 409
    assert live.raw.flush(30) == 0
    assert live.registry.get_versions(subject) == versions
    assert _end_offsets(live, oe) == (low, high)


def _end_offsets(live: Live, topic: str) -> tuple[int, int]:
    c = Consumer(live.dep.settings.confluent_conf() | {"group.id": "hostile-offsets"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, EVOLVE), timeout=10)
    finally:
        c.close()
