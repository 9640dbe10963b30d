"""W3C trace context carried from inputs to outputs, without Kafka (issue 20, section 4)."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

from fastavro import parse_schema, schemaless_writer
from hypothesis import given
from hypothesis import strategies as st

from streams.contracts.avro_writer import compile_writer
from streams.contracts.envelope import Envelope
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    ApprovalVerdictCode,
    ExecutionStatus,
    OperationStatus,
)
from streams.contracts.models.events import INPUT_MODELS, ClockTick, ExecutionStatusChanged
from streams.contracts.models.outputs import (
    OUTPUT_MODELS,
    Alert,
    ApprovalVerdict,
    OperationState,
    ReconciliationWorkItem,
)
from streams.core import trace
from streams.engine.processor import Emission, Processor, Stores
from streams.engine.state import SEP, Entry
from streams.local.scenario import Tick, demo_scenario
from tests.test_processor import T0, TOPICS, env, sent, ticks

HEX = "0123456789abcdef"


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def trace_id(execution_id: str) -> str:
    """The agent run's trace: one per execution."""
    return _hex(f"trace:{execution_id}", 32)


def traced(record: Record) -> Record:
    """The record with the traceparent of its own span in its execution's trace."""
    if isinstance(record, ClockTick):
        return record
    tp = f"00-{trace_id(record.execution_id)}-{_hex(record.event_id, 16)}-01"  # type: ignore[attr-defined]
    return record.model_copy(update={"traceparent": tp})


def play(steps: list, proc: Processor | None = None) -> list[Emission]:
    proc = proc or Processor(TOPICS, Stores())
    out: list[Emission] = []
    for s in steps:
        if isinstance(s, Tick):
            for spec in TOPICS.inputs():
                for p in range(3):
                    tick = ClockTick(ticker_id="t", partition=p, occurred_at=s.at)
                    out += proc.handle(env(tick, spec.name, key="", partition=p))
        else:
            out += proc.handle(env(s))
    return out


def without_trace(record: Record) -> Record:
    return record.model_copy(update={"traceparent": None})


# -- the format --------------------------------------------------------------------------------


def test_traceparent_examples() -> None:
    ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert trace.valid_traceparent(ok)
    assert trace.valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
    for bad in (
        ok.upper(),  # uppercase hex
        ok[:-1],  # 54 characters
        ok + "-x",  # a later version's extra fields: not version 00's layout
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # invalid version
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "",
        None,
        55,
    ):
        assert not trace.valid_traceparent(bad), bad


@given(
    st.text(HEX, min_size=2, max_size=2).filter(lambda v: v != "ff"),
    st.text(HEX, min_size=32, max_size=32).filter(lambda v: set(v) != {"0"}),
    st.text(HEX, min_size=16, max_size=16).filter(lambda v: set(v) != {"0"}),
    st.text(HEX, min_size=2, max_size=2),
    st.data(),
)
def test_traceparent_format_property(version, tid, pid, flags, data) -> None:
    good = f"{version}-{tid}-{pid}-{flags}"
    assert trace.valid_traceparent(good)
    # any one character changed to something that is not lowercase hex breaks it
    i = data.draw(st.integers(0, len(good) - 1))
    c = data.draw(st.characters().filter(lambda ch: ch not in HEX and ch != good[i]))
    assert not trace.valid_traceparent(good[:i] + c + good[i + 1 :])


def test_remembered_traces_are_bounded_most_recent_kept() -> None:
    traces: dict[str, str] | None = None
    for i in range(trace.MAX_KEPT + 10):
        traces = trace.remember(traces, f"op:{i}", f"tp{i}")
    assert traces is not None and len(traces) == trace.MAX_KEPT
    assert "op:0" not in traces and traces[f"op:{trace.MAX_KEPT + 9}"]
    again = trace.remember(traces, "op:10", "new")
    assert next(reversed(again)) == "op:10" and traces["op:10"] == "tp10"  # not mutated


# -- carried end to end through the processor ----------------------------------------------------


def test_every_output_of_the_scenario_carries_its_runs_trace_and_nothing_else_changes() -> None:
    steps = demo_scenario()
    plain = play(steps)
    with_trace = play([traced(s) if not isinstance(s, Tick) else s for s in steps])
    # the same records, in the same order, with the same ids: only the trace context differs
    assert [without_trace(e.record) for e in with_trace] == [e.record for e in plain]
    assert all(e.record.traceparent is None for e in plain)  # type: ignore[attr-defined]
    for e in with_trace:
        r = e.record
        tp = r.traceparent  # type: ignore[attr-defined]
        assert tp is not None, r
        assert tp.split("-")[1] == trace_id(r.execution_id), r  # type: ignore[attr-defined]
        if isinstance(r, Alert):
            assert dict(e.headers)["traceparent"] == tp
    # headers without a trace context are what they were: five, no traceparent
    assert all(
        len(e.headers) == 5 and "traceparent" not in dict(e.headers)
        for e in plain
        if isinstance(e.record, Alert)
    )


def test_a_stuck_verdict_links_to_the_latest_fact_of_its_request() -> None:
    steps = [traced(s) if not isinstance(s, Tick) else s for s in demo_scenario()]
    out = play(steps)
    stuck = next(
        e.record
        for e in out
        if isinstance(e.record, ApprovalVerdict)
        and e.record.verdict is ApprovalVerdictCode.STUCK_AFTER_DECISION
    )
    facts = [
        s
        for s in steps
        if not isinstance(s, Tick)
        and s.__dict__.get("request_id") == stuck.request_id
        and s.occurred_at <= stuck.evaluated_at
    ]
    latest = max(f.occurred_at for f in facts)
    assert stuck.traceparent in {f.traceparent for f in facts if f.occurred_at == latest}
    alert = next(
        e
        for e in out
        if isinstance(e.record, Alert)
        and e.record.kind is AlertKind.APPROVAL_VERDICT
        and e.record.verdict == "STUCK_AFTER_DECISION"
    )
    assert alert.record.traceparent == stuck.traceparent  # type: ignore[attr-defined]
    assert ("traceparent", stuck.traceparent) in alert.headers


def test_an_unknown_operation_links_to_its_send_after_a_restart() -> None:
    """The trace context is state: kept in the execution's entry, it reaches an output
    decided at a deadline by a processor started afresh on the same tables."""
    stores = Stores()
    first = Processor(TOPICS, stores)
    send = traced(sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    status = traced(
        ExecutionStatusChanged(
            event_id="s1",
            execution_id="ex-1",
            sequence=1,
            status=ExecutionStatus.RUNNING,
            occurred_at=T0,
        )
    )
    play([status, send, Tick(T0 + timedelta(seconds=1))], first)
    restarted = Processor(TOPICS, stores)
    fired = ticks(restarted, T0 + timedelta(seconds=31))
    unknown = [
        r for r in fired if isinstance(r, OperationState) and r.status is OperationStatus.UNKNOWN
    ]
    item = [r for r in fired if isinstance(r, ReconciliationWorkItem)]
    alerts = [r for r in fired if isinstance(r, Alert)]
    assert unknown and item and alerts
    for r in [*unknown, *item, *alerts]:
        assert r.traceparent == send.traceparent  # type: ignore[attr-defined]


def test_a_malformed_traceparent_is_dropped_and_counted_the_event_applied() -> None:
    proc = Processor(TOPICS, Stores())
    bad = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"
    status = ExecutionStatusChanged(
        event_id="s1",
        execution_id="ex-1",
        sequence=1,
        status=ExecutionStatus.RUNNING,
        occurred_at=T0,
        traceparent=bad,
    )
    out = play([status, Tick(T0 + timedelta(seconds=1))], proc)
    records = [e.record for e in out]
    assert [type(r).__name__ for r in records] == ["ExecutionState"]
    assert records[0].traceparent is None  # type: ignore[attr-defined]
    assert proc.counters.traceparents_dropped == 1
    assert proc.counters.anomalies == {}


def test_an_anomaly_carries_the_trace_of_the_input_it_reports() -> None:
    status = traced(
        ExecutionStatusChanged(
            event_id="s1",
            execution_id="ex-1",
            sequence=1,
            status=ExecutionStatus.RUNNING,
            occurred_at=T0,
        )
    )
    again = traced(status.model_copy(update={"event_id": "s1-again"}))
    out = play([status, again, Tick(T0 + timedelta(seconds=1))])
    anomaly = next(e.record for e in out if type(e.record).__name__ == "Anomaly")
    alert = next(e for e in out if isinstance(e.record, Alert))
    assert anomaly.traceparent == again.traceparent  # type: ignore[attr-defined]
    assert alert.record.traceparent == again.traceparent  # type: ignore[attr-defined]
    assert ("traceparent", again.traceparent) in alert.headers


# -- nothing changes without it ----------------------------------------------------------------


#: Fields added to an output schema after ``traceparent`` (later compatible evolutions), in
#: order: each must be a boolean, whose Avro encoding is one byte.
LATER_FIELDS: dict[str, tuple[str, ...]] = {"Alert": ("ends_with_resolved",)}


def _traceparent_at(model: type[Record]) -> tuple[dict, int]:
    """The schema and the index of its ``traceparent``, after which only ``LATER_FIELDS``."""
    schema = model.avro_schema()
    names = [f["name"] for f in schema["fields"]]
    i = names.index("traceparent")
    assert tuple(names[i + 1 :]) == LATER_FIELDS.get(model.avro_name, ())
    return schema, i


def _schema_before(model: type[Record]) -> dict:
    schema, i = _traceparent_at(model)
    return {**schema, "fields": schema["fields"][:i]}


def _schema_with(model: type[Record]) -> dict:
    """The schema as ``traceparent`` left it: up to and with it."""
    schema, i = _traceparent_at(model)
    return {**schema, "fields": schema["fields"][: i + 1]}


def test_outputs_without_a_trace_are_the_old_bytes_plus_one_null() -> None:
    """An output with no trace context is, byte for byte, what the schema before the field
    gave, then the null branch of the appended union (one zero byte); fastavro and the
    compiled writers agree."""
    proc = Processor(TOPICS, Stores())
    records = [e.record for e in play(demo_scenario(), proc)]
    first = next(s for s in demo_scenario() if isinstance(s, ExecutionStatusChanged))
    # a duplicate, an anomaly: written late, it is judged once time passes its topic's
    end = max(s.at for s in demo_scenario() if isinstance(s, Tick)) + timedelta(minutes=1)
    records += [e.record for e in play([first, Tick(end)], proc)]
    topic = TOPICS.execution_status.name
    undecodable = Envelope(topic, 0, 10**6, 1_700_000_000_000, b"k", b"\x00?", None, "bad")
    records += [e.record for e in proc.handle(undecodable)]  # a dead letter
    assert {type(r) for r in records} == set(OUTPUT_MODELS)
    for model in OUTPUT_MODELS:
        old = parse_schema(_schema_before(model))
        new = parse_schema(_schema_with(model))
        compiled = compile_writer(model.avro_schema())
        for r in [r for r in records if type(r) is model][:50]:
            before, after = io.BytesIO(), io.BytesIO()
            schemaless_writer(before, old, r.to_avro())
            schemaless_writer(after, new, r.to_avro())
            assert after.getvalue() == before.getvalue() + b"\x00"
            later = bytes(int(getattr(r, f)) for f in LATER_FIELDS.get(model.avro_name, ()))
            assert compiled(r.__dict__) == after.getvalue() + later


def test_every_input_schema_but_the_tick_and_every_output_schema_end_with_it() -> None:
    """``traceparent`` is the last field, but for fields added after it (``LATER_FIELDS``)."""
    for model in (*INPUT_MODELS, *OUTPUT_MODELS):
        if model is ClockTick:
            assert model.avro_schema()["fields"][-1]["name"] != "traceparent"
            continue
        schema, i = _traceparent_at(model)
        field = schema["fields"][i]
        assert field["type"] == ["null", "string"] and field["default"] is None
        later = LATER_FIELDS.get(model.avro_name, ())
        assert list(model.model_fields)[-1 - len(later)] == "traceparent"


def test_state_entries_without_traces_keep_their_five_fields() -> None:
    stores = Stores()
    play(demo_scenario(), Processor(TOPICS, stores))
    for raw in stores.executions.values():
        e = Entry.decode(raw)
        assert e.traces is None and e.encode().count(SEP) == 4
    traced_stores = Stores()
    play(
        [traced(s) if not isinstance(s, Tick) else s for s in demo_scenario()],
        Processor(TOPICS, traced_stores),
    )
    with_traces = [Entry.decode(raw) for raw in traced_stores.executions.values()]
    assert with_traces and all(e.traces for e in with_traces)
    for e in with_traces:
        assert Entry.decode(e.pack()).traces == e.traces


def test_dropped_traceparents_are_exported_as_a_metric() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from streams.read.metrics import VigilCollector

    proc = Processor(TOPICS, Stores())
    bad = sent("op-1").model_copy(update={"traceparent": "not-a-traceparent"})
    play([bad, Tick(T0 + timedelta(seconds=1))], proc)
    registry = CollectorRegistry()
    registry.register(VigilCollector(proc, lambda: {}))
    assert "vigil_traceparents_dropped_total 1.0" in generate_latest(registry).decode()
