"""Values the contracts allow but the domain cannot use: reported before the core sees them.

A decodable record may carry any long the schema allows: a heartbeat freshness of 10**12
seconds, a negative grace period, an expiry in the year 9999. The core adds such durations to
times and raises (``OverflowError``, a threshold's own validation error); the shell retries the
batch, and the partition stalls for good. ``streams.core.bounds.out_of_domain`` finds them
first; these tests hold its bounds field by field, and the property that matters: whatever it
accepts, the core processes without raising, however far time then moves.
"""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AnomalyKind,
    ApprovalVerdictCode,
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    Risk,
)
from streams.contracts.models.outputs import Anomaly, ApprovalVerdict
from streams.core import approvals as ap
from streams.core.bounds import (
    EARLIEST,
    LATEST,
    MAX_DURATION,
    MAX_SECONDS,
    SECONDS_FIELDS,
    TIME_FIELDS,
    UNBOUNDED_NUMBERS,
    out_of_domain,
)
from streams.core.operations import OperationConfig
from streams.engine.processor import Processor, Stores
from streams.policies import PolicyError, load_policies
from streams.settings import Settings, SettingsError
from tests.test_processor import TOPICS, env, ticks

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)
EX = "ex-1"

#: One valid record of every input type, with every optional time and duration set.
BASE: dict[type[Record], dict[str, Any]] = {
    ev.ExecutionStatusChanged: dict(
        event_id="s1", execution_id=EX, sequence=1, status=ExecutionStatus.RUNNING, occurred_at=T0
    ),
    ev.OperationEvent: dict(
        event_id="o1",
        execution_id=EX,
        operation_id="op-1",
        attempt=1,
        connector="sms",
        kind=OperationEventKind.SENT,
        occurred_at=T0,
        reply_due_at=T0 + timedelta(seconds=30),
        verify_due_at=T0 + timedelta(minutes=5),
    ),
    ev.ApprovalRequested: dict(
        event_id="r1",
        execution_id=EX,
        request_id="q1",
        action="deploy",
        action_digest="d1",
        occurred_at=T0,
        expires_at=T0 + timedelta(hours=1),
        grace_seconds=300,
        heartbeat_fresh_seconds=600,
        delivery_deadline_seconds=300,
    ),
    ev.ApprovalDelivery: dict(
        event_id="dl1",
        execution_id=EX,
        request_id="q1",
        occurred_at=T0,
        outcome=DeliveryOutcome.DELIVERED,
    ),
    ev.ApproverAcknowledgement: dict(
        event_id="ak1", execution_id=EX, request_id="q1", occurred_at=T0
    ),
    ev.ApprovalDecision: dict(
        event_id="dc1",
        execution_id=EX,
        request_id="q1",
        occurred_at=T0,
        decision=DecisionCode.ACCEPT,
    ),
    ev.CurrentActionDigest: dict(
        event_id="cd1", execution_id=EX, occurred_at=T0, action_digest="d1"
    ),
    ev.ResumeReceipt: dict(event_id="rr1", execution_id=EX, request_id="q1", occurred_at=T0),
    ev.RequesterHeartbeat: dict(event_id="hb1", execution_id=EX, occurred_at=T0),
    ev.ClockTick: dict(ticker_id="t", partition=0, occurred_at=T0),
}

TIME_CASES = [(cls, name) for cls, names in TIME_FIELDS.items() for name in names]
SECONDS_CASES = [(cls, name) for cls, names in SECONDS_FIELDS.items() for name in names]


def make(cls: type[Record], **changes: Any) -> Record:
    return cls(**{**BASE[cls], **changes})


def _ids(case: tuple[type[Record], str]) -> str:
    return f"{case[0].__name__}.{case[1]}"


# -- the tables cover the contracts ----------------------------------------------------------


def _avro_numbers(cls: type[Record]) -> tuple[set[str], set[str]]:
    """The ``timestamp-millis`` fields and the other int/long fields of a contract."""
    times, numbers = set(), set()
    for f in cls.avro_schema()["fields"]:
        text = json.dumps(f["type"])
        if "timestamp-millis" in text:
            times.add(f["name"])
        elif '"long"' in text or '"int"' in text:
            numbers.add(f["name"])
    return times, numbers


@pytest.mark.parametrize("cls", ev.INPUT_MODELS, ids=lambda c: c.__name__)
def test_every_time_and_number_of_every_input_is_classified(cls: type[Record]) -> None:
    """A field added to an input contract fails here until it is given a bound (or a reason
    for none): the check covers what the schema lets a producer write."""
    times, numbers = _avro_numbers(cls)
    assert set(TIME_FIELDS[cls]) == times
    assert set(SECONDS_FIELDS.get(cls, ())) | set(UNBOUNDED_NUMBERS.get(cls, ())) == numbers


@pytest.mark.parametrize("cls", ev.INPUT_MODELS, ids=lambda c: c.__name__)
def test_ordinary_records_are_in_the_domain(cls: type[Record]) -> None:
    assert out_of_domain(make(cls)) is None


# -- each bound: just inside accepted, just outside reported ----------------------------------


@pytest.mark.parametrize("case", TIME_CASES, ids=_ids)
def test_time_bounds(case: tuple[type[Record], str]) -> None:
    cls, name = case
    for inside in (EARLIEST, LATEST - MS):
        assert out_of_domain(make(cls, **{name: inside})) is None, inside
    for outside, where in ((EARLIEST - MS, "before 1971"), (LATEST, "in 9000 or later")):
        finding = out_of_domain(make(cls, **{name: outside}))
        assert finding is not None, outside
        assert finding.kind is AnomalyKind.TIME_OUT_OF_RANGE
        assert f"{cls.avro_name}.{name}" in finding.reason and where in finding.reason


@pytest.mark.parametrize("case", SECONDS_CASES, ids=_ids)
def test_duration_bounds(case: tuple[type[Record], str]) -> None:
    cls, name = case
    assert MAX_SECONDS == 365 * 24 * 3600
    for inside in (0, 1, MAX_SECONDS, None):
        assert out_of_domain(make(cls, **{name: inside})) is None, inside
    for outside, problem in (
        (-1, "is negative"),
        (MAX_SECONDS + 1, "exceeds"),
        (10**12, "exceeds"),
        (-(2**63), "is negative"),
        (2**63 - 1, "exceeds"),
    ):
        finding = out_of_domain(make(cls, **{name: outside}))
        assert finding is not None, outside
        assert finding.kind is AnomalyKind.VALUE_OUT_OF_RANGE
        assert f"{cls.avro_name}.{name} = {outside} s {problem}" in finding.reason


def test_numbers_without_a_bound_take_the_full_schema_range() -> None:
    for value in (-(2**63), 2**63 - 1):
        assert out_of_domain(make(ev.ExecutionStatusChanged, sequence=value)) is None
    assert out_of_domain(make(ev.OperationEvent, attempt=2**31 - 1)) is None
    for value in (-(2**31), 2**31 - 1):
        assert out_of_domain(make(ev.ClockTick, partition=value)) is None


def test_the_first_offending_field_is_named_times_first() -> None:
    record = make(
        ev.ApprovalRequested,
        expires_at=datetime(9999, 12, 31, tzinfo=UTC),
        heartbeat_fresh_seconds=10**12,
    )
    finding = out_of_domain(record)
    assert finding is not None and finding.kind is AnomalyKind.TIME_OUT_OF_RANGE
    assert "ApprovalRequested.expires_at" in finding.reason


# -- the defect: what reaches the core unchecked ----------------------------------------------


def test_a_heartbeat_freshness_of_10_12_seconds_raises_in_the_evaluator() -> None:
    """Regression (issue 17, defect 2): ``heartbeat_fresh_seconds = 10**12`` is a long the
    schema allows. Without the guard it reaches the approval evaluator, which adds it to the
    request time and raises ``OverflowError`` (the live worker retried the batch forever, every
    partition stalled). The core is not meant to take it: ``out_of_domain`` reports it."""
    record = make(ev.ApprovalRequested, heartbeat_fresh_seconds=10**12)
    book = ap.add_fact(ap.ApprovalBook(execution_id=EX), record)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        ap.advance(book, T0 + timedelta(seconds=1), ap.threshold_resolver())
    finding = out_of_domain(record)
    assert finding is not None and finding.kind is AnomalyKind.VALUE_OUT_OF_RANGE


def test_a_negative_grace_raises_in_the_core() -> None:
    """Regression: a negative ``grace_seconds`` makes the core's threshold model refuse it,
    inside ``add_fact``: an exception, not an anomaly. ``out_of_domain`` reports it."""
    record = make(ev.ApprovalRequested, grace_seconds=-1)
    with pytest.raises(ValueError, match="cannot be negative"):
        ap.add_fact(ap.ApprovalBook(execution_id=EX), record)  # type: ignore[arg-type]
    finding = out_of_domain(record)
    assert finding is not None and finding.kind is AnomalyKind.VALUE_OUT_OF_RANGE


def test_the_processor_reports_the_record_and_carries_on() -> None:
    """Through the shell: ``Processor._check`` asks ``out_of_domain``, so the record is an
    anomaly stamped with its own (valid) event time, and time moves on without a raise (on the
    code before, the ticks raised ``OverflowError``)."""
    proc = Processor(TOPICS, Stores())
    record = make(ev.ApprovalRequested, heartbeat_fresh_seconds=10**12)
    out = [e.record for e in proc.handle(env(record))]
    out += ticks(proc, T0 + timedelta(days=1))
    anomalies = [r for r in out if isinstance(r, Anomaly)]
    assert [a.kind for a in anomalies] == [AnomalyKind.VALUE_OUT_OF_RANGE]
    assert anomalies[0].detected_at == T0  # its own event time: the time is not the fault


@pytest.mark.parametrize(
    "at",
    [
        datetime(2004, 5, 30, 8, 39, 59, 1000, tzinfo=UTC),
        datetime(2243, 1, 1, 0, 0, 0, 43000, tzinfo=UTC),
    ],
)
def test_a_deadline_at_any_millisecond_fires_once_and_time_moves_on(at: datetime) -> None:
    """Found by the property below: these milliseconds are ones that ``int(t.timestamp() *
    1000)`` truncates to the one before (floating point; about one in 200 from 2038 on, and in
    bands before). A change point there was scheduled a millisecond early, judged short of
    itself, and scheduled again: the processor looped for ever on an ordinary request with the
    default configuration. Due times are whole milliseconds counted exactly."""
    proc = Processor(TOPICS, Stores())
    record = make(ev.ApprovalRequested, occurred_at=at, expires_at=None)
    with no_stall(seconds=5):
        proc.handle(env(record))
        out = ticks(proc, at + MS) + ticks(proc, at + timedelta(hours=1))
    verdicts = [r.verdict for r in out if isinstance(r, ApprovalVerdict)]
    assert verdicts and verdicts[-1] is ApprovalVerdictCode.ORPHANED_WAIT


# -- the property: whatever is accepted, the core processes ----------------------------------

_MIN = datetime.min.replace(tzinfo=UTC)
_MAX = datetime.max.replace(tzinfo=UTC)
EDGE_TIMES = (_MIN, EARLIEST - MS, EARLIEST, T0, LATEST - MS, LATEST, _MAX)
times = st.one_of(
    st.sampled_from(EDGE_TIMES),
    st.datetimes(
        min_value=EARLIEST.replace(tzinfo=None),
        max_value=datetime(9000, 1, 1),
        timezones=st.just(UTC),
    ),
    st.datetimes(timezones=st.just(UTC)),  # the whole range a timestamp-millis decodes to
)
optional_times = st.none() | times
LONG = (-(2**63), 2**63 - 1)
longs = st.one_of(
    st.sampled_from([-1, 0, 1, 300, MAX_SECONDS, MAX_SECONDS + 1, 10**12, *LONG]),
    st.integers(*LONG),
)
optional_longs = st.none() | longs
ids = st.sampled_from(["a", "b"])
requests = st.sampled_from(["q1", "q2"])
digests = st.sampled_from(["d1", "d2"])

records: st.SearchStrategy[Record] = st.one_of(
    st.builds(
        ev.ExecutionStatusChanged,
        event_id=ids,
        execution_id=st.just(EX),
        sequence=longs,
        status=st.sampled_from(ExecutionStatus),
        occurred_at=times,
    ),
    st.builds(
        ev.OperationEvent,
        event_id=ids,
        execution_id=st.just(EX),
        operation_id=st.sampled_from(["op-1", "op-2"]),
        attempt=st.sampled_from([1, 2, 2**31 - 1]),
        connector=st.sampled_from(["sms", "bank"]),
        kind=st.sampled_from(OperationEventKind),
        occurred_at=times,
        reply_due_at=optional_times,
        verify_due_at=optional_times,
        evidence_source=st.sampled_from(EvidenceSource),
    ),
    st.builds(
        ev.ApprovalRequested,
        event_id=ids,
        execution_id=st.just(EX),
        request_id=requests,
        action=st.sampled_from(["deploy", "export"]),
        action_digest=digests,
        occurred_at=times,
        expires_at=optional_times,
        approver_ref=st.none() | st.just("approver"),
        resume_handle=st.none() | st.just("handle"),
        risk=st.sampled_from(Risk),
        policy=st.none() | st.just("deploy"),
        grace_seconds=optional_longs,
        heartbeat_fresh_seconds=optional_longs,
        delivery_deadline_seconds=optional_longs,
    ),
    st.builds(
        ev.ApprovalDelivery,
        event_id=ids,
        execution_id=st.just(EX),
        request_id=requests,
        occurred_at=times,
        outcome=st.sampled_from(DeliveryOutcome),
    ),
    st.builds(
        ev.ApproverAcknowledgement,
        event_id=ids,
        execution_id=st.just(EX),
        request_id=requests,
        occurred_at=times,
    ),
    st.builds(
        ev.ApprovalDecision,
        event_id=ids,
        execution_id=st.just(EX),
        request_id=requests,
        occurred_at=times,
        decision=st.sampled_from(DecisionCode),
        action_digest=st.none() | digests,
    ),
    st.builds(
        ev.CurrentActionDigest,
        event_id=ids,
        execution_id=st.just(EX),
        occurred_at=times,
        action_digest=digests,
    ),
    st.builds(
        ev.ResumeReceipt,
        event_id=ids,
        execution_id=st.just(EX),
        request_id=requests,
        occurred_at=times,
    ),
    st.builds(
        ev.RequesterHeartbeat,
        event_id=ids,
        execution_id=st.just(EX),
        occurred_at=times,
        resume_handle=st.none() | st.just("handle"),
    ),
)

# whole milliseconds, as the settings and the policies file take them
durations = st.one_of(
    st.sampled_from([timedelta(0), MS, MAX_DURATION]),
    st.integers(0, MAX_DURATION // MS).map(lambda n: n * MS),
)
positive = st.one_of(
    st.sampled_from([MS, MAX_DURATION]), st.integers(1, MAX_DURATION // MS).map(lambda n: n * MS)
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A processor's configuration anywhere inside the bounds settings and policies enforce
    (keyword arguments of ``Processor``, so that a failing example shows them)."""
    return dict(
        max_future_skew=draw(durations),
        allowed_lateness=draw(durations),
        operation_config=OperationConfig(
            reply_timeout=draw(positive),
            verify_timeout=draw(positive),
            overrides={"bank": (draw(positive), draw(positive))},
        ),
        thresholds=ap.ThresholdSet(
            grace=draw(durations),
            heartbeat_fresh=draw(durations),
            delivery_deadline=draw(durations),
        ),
        policies={
            "deploy": ap.ThresholdOverrides(
                grace=draw(durations),
                heartbeat_fresh=draw(durations),
                delivery_deadline=draw(durations),
            )
        },
        closed_retention=draw(durations),
        orphan_after=draw(durations),
    )


@cache
def _parsed_schema(cls: type[Record]) -> Any:
    return fastavro.parse_schema(json.loads(cls.avro_schema_str()))


def _publishable(record: Record) -> None:
    """Raises if the output cannot be written with its contract (a value beyond a long)."""
    fastavro.schemaless_writer(io.BytesIO(), _parsed_schema(type(record)), record.to_avro())


@contextmanager
def no_stall(seconds: int) -> Iterator[None]:
    """Processing that never ends (a deadline due at an instant the processor never reaches,
    scheduled again each time) stalls a partition as surely as an exception: it fails here."""

    def stalled(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still processing after {seconds} s: the partition would stall")

    previous = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_through_the_core(
    proc: Processor, inputs: list[Record], accept: Any, extra_ticks: list[datetime]
) -> tuple[list[Record], list[Record]]:
    """The inputs ``accept`` lets through, then rounds of ticks on every input partition: the
    first just past the newest of them (every one is applied), then ``extra_ticks``, the last
    at the latest accepted instant (every deadline before it fires). Returns what was taken
    and the outputs."""
    taken = [r for r in inputs if accept(r)]
    out = [e.record for r in taken for e in proc.handle(env(r))]
    newest = max((r.occurred_at for r in taken), default=EARLIEST)  # type: ignore[attr-defined]
    first = min(newest + MS, LATEST - MS)
    rounds = sorted({first, LATEST - MS, *(t for t in extra_ticks if first < t < LATEST)})
    for at in rounds:
        out += ticks(proc, at)
    return taken, out


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    config=configs(),
    inputs=st.lists(records, min_size=1, max_size=8),
    extra_ticks=st.lists(times, max_size=3),
)
def test_whatever_is_accepted_the_core_processes_without_raising(
    config: dict[str, Any], inputs: list[Record], extra_ticks: list[datetime]
) -> None:
    """Records accepted by ``out_of_domain`` (drawn with extreme times and durations, over the
    schema's whole long range), under any configuration inside the settings' bounds, go
    through the processor, and time then moves to the latest accepted instant: nothing raises,
    every output can be written with its contract, and no record waits but those at the very
    last instant (for a watermark past them)."""
    proc = Processor(TOPICS, Stores(), **config)
    with no_stall(seconds=5):
        taken, out = run_through_the_core(
            proc, inputs, lambda r: out_of_domain(r) is None, extra_ticks
        )
    for record in out:
        _publishable(record)
    # nothing before the last watermark (the last instant less the lateness) is left waiting
    # (some may have been refused instead) but the records placed at or after it: stamped
    # there, or written after one stamped at the last instant on the same topic (late, placed
    # at its topic's time less the lateness: docs/rules.md#time)
    watermark = LATEST - MS - config["allowed_lateness"]
    newest: dict[str, datetime] = {}
    last = 0
    for r in taken:
        topic = next(t.name for t in TOPICS.inputs() if type(r) in t.value_types)
        t = r.occurred_at  # type: ignore[attr-defined]
        before = newest.get(topic)
        last += t >= watermark or (before is not None and before >= LATEST - MS)
        newest[topic] = t if before is None else max(before, t)
    assert proc.held() <= last


# -- configuration: the same bounds where it is loaded ----------------------------------------

DOMAIN_SETTINGS = {
    "grace": ("VIGIL_GRACE", False),
    "heartbeat_fresh": ("VIGIL_HEARTBEAT_FRESH", False),
    "delivery_deadline": ("VIGIL_DELIVERY_DEADLINE", False),
    "reply_timeout": ("VIGIL_REPLY_TIMEOUT", True),
    "verify_timeout": ("VIGIL_VERIFY_TIMEOUT", True),
    "closed_retention": ("VIGIL_CLOSED_RETENTION", False),
    "orphan_after": ("VIGIL_ORPHAN_AFTER", False),
    "anomaly_alert_ttl": ("VIGIL_ANOMALY_ALERT_TTL", True),
    "max_future_skew": ("VIGIL_MAX_FUTURE_SKEW", False),
    "allowed_lateness": ("VIGIL_ALLOWED_LATENESS", False),
}


@pytest.mark.parametrize("name", DOMAIN_SETTINGS)
def test_settings_refuse_durations_out_of_bounds(name: str) -> None:
    variable, positive_only = DOMAIN_SETTINGS[name]
    Settings(**{name: MAX_DURATION})
    Settings(**{name: MS})
    outside = [MAX_DURATION + MS, -MS] + ([timedelta(0)] if positive_only else [])
    for value in outside:
        with pytest.raises(SettingsError, match=rf"{variable} \({name}\)"):
            Settings(**{name: value})
    if not positive_only:
        Settings(**{name: timedelta(0)})


@pytest.mark.parametrize("name", DOMAIN_SETTINGS)
def test_settings_from_env_name_the_variable(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A duration too large even for ``timedelta`` (``OverflowError`` today) or beyond the
    bound is refused at load, naming the variable; a bound one is taken."""
    variable, _ = DOMAIN_SETTINGS[name]
    monkeypatch.setenv(variable, "365d")
    assert getattr(Settings.from_env(), name) == MAX_DURATION
    for text in ("366d", "99999999999d", "1" + "0" * 30):
        monkeypatch.setenv(variable, text)
        with pytest.raises(SettingsError, match=variable):
            Settings.from_env()


DEFAULTS = dict(
    grace=timedelta(minutes=5),
    heartbeat_fresh=timedelta(minutes=10),
    delivery_deadline=timedelta(minutes=5),
    reply_timeout=timedelta(seconds=30),
    verify_timeout=timedelta(minutes=5),
)


@pytest.mark.parametrize(
    ("section", "entry", "field", "value"),
    [
        ("approval_policies", "deploy", "grace", "366d"),
        ("approval_policies", "deploy", "heartbeat_fresh", "99999999999d"),
        ("approval_policies", "deploy", "delivery_deadline", "1" + "0" * 30),
        ("connectors", "bank", "reply_timeout", "366d"),
        ("connectors", "bank", "verify_timeout", "99999999999d"),
        ("connectors", "bank", "reply_timeout", "0"),
        ("connectors", "bank", "verify_timeout", "0s"),
    ],
)
def test_policies_refuse_durations_out_of_bounds(
    tmp_path: Path, section: str, entry: str, field: str, value: str
) -> None:
    """Each refused with the file, the entry and the field named; a zero connector timeout
    used to fall back silently to the default (a zero timedelta is falsy)."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps({section: {entry: {field: value}}}))
    with pytest.raises(PolicyError, match=rf"p\.json(.|\n)*{entry}(.|\n)*{field}"):
        load_policies(f, **DEFAULTS)
    f.write_text(json.dumps({section: {entry: {field: "365d"}}}))
    load_policies(f, **DEFAULTS)


def test_policies_refuse_defaults_out_of_bounds() -> None:
    with pytest.raises(PolicyError, match="heartbeat_fresh"):
        load_policies(None, **{**DEFAULTS, "heartbeat_fresh": timedelta(seconds=10**12)})
    with pytest.raises(PolicyError, match="reply_timeout"):
        load_policies(None, **{**DEFAULTS, "reply_timeout": timedelta(0)})
