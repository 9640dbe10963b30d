"""Manual review, pure part: the request body, the event a review publishes, and the
refusals, checked against the pipeline's own core on real operation books."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.console.review import (
    KIND,
    Refusal,
    ReviewAction,
    ReviewRequest,
    cross_site,
    decide,
    parse_request,
    review_event_id,
    write_allowed,
)
from streams.contracts.models.enums import EvidenceSource, OperationEventKind, OperationStatus
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import OperationState
from streams.core import operations as ops
from streams.core.executions import to_ms

K, S = OperationEventKind, OperationStatus
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
NOW = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
EX = "exec-1"
CONFIG = ops.OperationConfig(reply_timeout=timedelta(seconds=30))


def _event(op: str, attempt: int, kind: K, at: datetime, source: EvidenceSource, n: int):
    return OperationEvent(
        event_id=f"e{n}",
        execution_id=EX,
        operation_id=op,
        attempt=attempt,
        # a key per attempt: a VERIFIED of one attempt then settles no other
        # (docs/rules.md#shared-idempotency-key-evidence)
        idempotency_key=f"key-{op}-{attempt}",
        connector="sms",
        kind=kind,
        occurred_at=at,
        evidence_source=source,
    )


def _book(steps: list[tuple[str, int, K, EvidenceSource, int]]) -> ops.OperationBook:
    """A real book: the core applies each event, advancing stream time between them (so
    reply timeouts fire and attempts become UNKNOWN with work items)."""
    book = ops.OperationBook(EX)
    t = T0
    for n, (op, attempt, kind, source, gap) in enumerate(steps):
        t += timedelta(seconds=gap)
        book = ops.advance(book, to_ms(t)).book
        book = ops.apply_event(book, _event(op, attempt, kind, t, source, n), CONFIG).book
    return ops.advance(book, to_ms(t + timedelta(minutes=1))).book


def _state(book: ops.OperationBook, op: str) -> OperationState:
    return next(s for s in ops.current_states(book) if s.operation_id == op)


#: every kind; SENT more often, so that timeouts, reviews and hand-backs are common
KINDS = [k for k in K if k is not K.UNRECOGNIZED] + [K.SENT] * 3 + [K.MANUAL_REVIEW, K.RECONCILING]
SOURCES = [s for s in EvidenceSource if s is not EvidenceSource.UNRECOGNIZED]
steps_strategy = st.lists(
    st.tuples(
        st.sampled_from(["op-a", "op-b"]),
        st.integers(1, 2),
        st.sampled_from(KINDS),
        st.sampled_from(SOURCES),
        st.integers(0, 60),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(
    steps=steps_strategy,
    action=st.sampled_from(list(ReviewAction)),
    attempt=st.sampled_from([None, None, None, 1, 2, 3]),
    op=st.sampled_from(["op-a", "op-b"]),
)
def test_refuses_exactly_what_the_core_would_refuse(steps, action, attempt, op) -> None:
    """On a real book the core built, the console sees only the published state of the
    operation; what it decides from that alone is what the core does with the event on the
    real book: published ⇔ applied, refused ⇔ an anomaly of the same kind."""
    book = _book(steps)
    if op not in book.operations:
        return
    state = _state(book, op)
    request = ReviewRequest(action, "checked the gateway log", "alice", attempt)
    got = decide(state, op, request, NOW)
    if isinstance(got, Refusal):
        assert got.status == 409, got
        if "not known to the console" in got.message:
            # an older attempt the state does not name: the view cannot judge it
            assert attempt not in (None, state.attempt, state.held_by_attempt)
            return
        target = attempt or state.attempt
        # the same event the console would have built, judged by the core on the real book
        event = OperationEvent(
            event_id=review_event_id(state, target, action),
            execution_id=EX,
            operation_id=op,
            attempt=target,
            connector=state.connector,
            kind=KIND[action],
            occurred_at=NOW,
            evidence_source=EvidenceSource.HUMAN,
        )
        real = ops.apply_event(book, event, CONFIG)
        assert real.anomalies, f"console refused what the core applies: {got.message}"
        assert str(real.anomalies[0].kind) in got.message
        return
    assert isinstance(got, OperationEvent)
    assert got.kind is KIND[action] and got.evidence_source is EvidenceSource.HUMAN
    assert got.execution_id == EX and got.operation_id == op
    real = ops.apply_event(book, got, CONFIG)
    assert not real.anomalies, f"console would publish what the core refuses: {real.anomalies}"
    # the core applied it: the attempt now has the status the action names
    assert real.book.operations[op].attempts[got.attempt].status.value == KIND[action].value


def _unknown_book() -> ops.OperationBook:
    """op-a attempt 1 sent and never answered: UNKNOWN with a work item."""
    return _book([("op-a", 1, K.SENT, EvidenceSource.RUNTIME, 0)])


def _req(action: str, attempt: int | None = None) -> ReviewRequest:
    return ReviewRequest(ReviewAction(action), "seen at the source", "alice", attempt)


def test_settling_an_unknown_operation_publishes_a_human_event() -> None:
    book = _unknown_book()
    state = _state(book, "op-a")
    assert state.status is S.UNKNOWN
    event = decide(state, "op-a", _req("verified"), NOW)
    assert isinstance(event, OperationEvent)
    assert event.kind is K.VERIFIED and event.evidence_source is EvidenceSource.HUMAN
    assert event.attempt == 1 and event.execution_id == EX and event.connector == "sms"
    assert event.occurred_at == datetime(2026, 12, 1, 12, 0, 0, 123000, tzinfo=UTC)
    assert "alice" in (event.detail or "") and "seen at the source" in (event.detail or "")
    # the pipeline settles it: the resolution and the RESOLVED alert come out
    out = ops.apply_event(book, event, CONFIG).outputs
    assert {type(r).__name__ for r in out} >= {
        "OperationState",
        "WorkItemResolution",
        "Alert",
    }


def test_a_double_click_is_one_event_id() -> None:
    state = _state(_unknown_book(), "op-a")
    for action in ReviewAction:
        a = decide(state, "op-a", _req(action), NOW)
        b = decide(state, "op-a", _req(action), NOW + timedelta(seconds=3))
        assert isinstance(a, OperationEvent) and isinstance(b, OperationEvent)
        assert a.event_id == b.event_id
    ids = {decide(state, "op-a", _req(a), NOW).event_id for a in ReviewAction}  # type: ignore[union-attr]
    assert len(ids) == 3


def test_take_again_after_a_hand_back_is_a_new_event() -> None:
    """take → MANUAL_REVIEW, the reconciler takes it back (RECONCILING), take again: the
    core applies the second take, so its id must differ from the first (a repeated id is a
    DUPLICATE to the core)."""
    book = _unknown_book()
    first = decide(_state(book, "op-a"), "op-a", _req("take"), NOW)
    assert isinstance(first, OperationEvent)
    book = ops.apply_event(book, first, CONFIG).book
    back = _event(
        "op-a", 1, K.RECONCILING, NOW + timedelta(minutes=1), EvidenceSource.RECONCILER, 99
    )
    book = ops.apply_event(book, back, CONFIG).book
    second = decide(_state(book, "op-a"), "op-a", _req("take"), NOW + timedelta(minutes=2))
    assert isinstance(second, OperationEvent)
    assert second.event_id != first.event_id
    assert not ops.apply_event(book, second, CONFIG).anomalies


@pytest.mark.parametrize(
    ("action", "anomaly"),
    [("verified", "DUPLICATE"), ("failed", "ILLEGAL_TRANSITION"), ("take", "AFTER_TERMINAL")],
)
def test_a_verified_operation_is_refused(action: str, anomaly: str) -> None:
    book = _book(
        [
            ("op-a", 1, K.SENT, EvidenceSource.RUNTIME, 0),
            ("op-a", 1, K.VERIFIED, EvidenceSource.CONNECTOR, 1),
        ]
    )
    got = decide(_state(book, "op-a"), "op-a", _req(action), NOW)
    assert isinstance(got, Refusal) and got.status == 409
    assert "VERIFIED" in got.message and anomaly in got.message


def test_taking_an_operation_already_in_review_is_refused() -> None:
    book = _unknown_book()
    take = decide(_state(book, "op-a"), "op-a", _req("take"), NOW)
    assert isinstance(take, OperationEvent)
    book = ops.apply_event(book, take, CONFIG).book
    got = decide(_state(book, "op-a"), "op-a", _req("take"), NOW)
    assert isinstance(got, Refusal) and got.status == 409 and "DUPLICATE" in got.message
    # settling it from review is what comes next
    assert isinstance(decide(_state(book, "op-a"), "op-a", _req("failed"), NOW), OperationEvent)


def test_an_unknown_operation_is_404() -> None:
    got = decide(None, "op-nope", _req("verified"), NOW)
    assert isinstance(got, Refusal) and got.status == 404 and "op-nope" in got.message


def test_the_attempt_holding_the_verdict_can_be_settled() -> None:
    """Attempt 1 UNKNOWN, attempt 2 settled VERIFIED: the state is attempt 2's and names
    attempt 1 as the holder; attempt 1 can be reviewed, an attempt 3 cannot."""
    book = _book(
        [
            ("op-a", 1, K.SENT, EvidenceSource.RUNTIME, 0),
            ("op-a", 2, K.SENT, EvidenceSource.RUNTIME, 40),
            ("op-a", 2, K.VERIFIED, EvidenceSource.CONNECTOR, 1),
        ]
    )
    state = _state(book, "op-a")
    assert state.attempt == 2 and state.held_by_attempt == 1 and state.held_by_status is S.UNKNOWN
    ok = decide(state, "op-a", _req("verified", attempt=1), NOW)
    assert isinstance(ok, OperationEvent) and ok.attempt == 1
    assert not ops.apply_event(book, ok, CONFIG).anomalies
    latest = decide(state, "op-a", _req("verified"), NOW)
    assert isinstance(latest, Refusal) and latest.status == 409
    other = decide(state, "op-a", _req("verified", attempt=3), NOW)
    assert isinstance(other, Refusal) and "not known" in other.message


def test_a_status_this_build_cannot_read_is_refused() -> None:
    state = _state(_unknown_book(), "op-a").model_copy(update={"status": S.UNRECOGNIZED})
    got = decide(state, "op-a", _req("verified"), NOW)
    assert isinstance(got, Refusal) and got.status == 409 and "cannot read" in got.message


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ([], "JSON object"),
        ({"action": "delete", "note": "n", "reviewer": "r"}, "action must be"),
        ({"action": "take", "note": " ", "reviewer": "r"}, "note is required"),
        ({"action": "take", "note": "n"}, "reviewer is required"),
        ({"action": "take", "note": "n", "reviewer": 7}, "reviewer is required"),
        ({"action": "take", "note": "x" * 2001, "reviewer": "r"}, "longer than"),
        ({"action": "take", "note": "n", "reviewer": "r", "attempt": 0}, "attempt must be"),
        ({"action": "take", "note": "n", "reviewer": "r", "attempt": True}, "attempt must be"),
        ({"action": "take", "note": "n", "reviewer": "r", "attempt": "1"}, "attempt must be"),
        ({"action": "take", "note": "n", "reviewer": "r", "by": "x"}, "unknown field"),
    ],
)
def test_bad_bodies_are_400_with_the_allowed_values(body: object, needle: str) -> None:
    got = parse_request(body)
    assert isinstance(got, Refusal) and got.status == 400 and needle in got.message
    assert got.body()["allowed"]["action"] == ["take", "verified", "failed"]


def test_a_good_body() -> None:
    got = parse_request({"action": "failed", "note": " gateway says no ", "reviewer": "bob"})
    assert got == ReviewRequest(ReviewAction.FAILED, "gateway says no", "bob", None)
    got = parse_request({"action": "take", "note": "n", "reviewer": "bob", "attempt": 2})
    assert isinstance(got, ReviewRequest) and got.attempt == 2


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({}, False),  # a client that is not a browser: its token decides
        ({"Origin": "http://console.local:6080"}, False),
        ({"Origin": "http://CONSOLE.local:6080", "Sec-Fetch-Site": "same-origin"}, False),
        ({"Sec-Fetch-Site": "none"}, False),
        ({"Origin": "https://evil.example"}, True),
        ({"Origin": "http://console.local:6081"}, True),
        ({"Origin": "null"}, True),
        ({"Sec-Fetch-Site": "cross-site"}, True),
        ({"Sec-Fetch-Site": "same-site"}, True),
        ({"Origin": "http://console.local:6080", "Sec-Fetch-Site": "cross-site"}, True),
    ],
)
def test_cross_site_requests_are_recognised(headers: dict[str, str], refused: bool) -> None:
    assert (cross_site(headers, "console.local:6080") is not None) is refused


def test_the_write_token_is_compared_whole() -> None:
    assert write_allowed("Bearer w-token", "w-token")
    assert not write_allowed("Bearer w-toke", "w-token")
    assert not write_allowed("Bearer w-token-and-more", "w-token")
    assert not write_allowed("w-token", "w-token")
    assert not write_allowed("", None) and not write_allowed("Bearer ", "")


def test_review_event_ids_are_scoped_by_the_execution() -> None:
    """The same action on ``charge-1`` attempt 1 of two executions is two events."""
    from streams.console.review import ReviewAction, review_event_id

    state = _state(_unknown_book(), "op-a")
    other = state.model_copy(update={"execution_id": "exec-2"})
    for action in ReviewAction:
        assert review_event_id(state, 1, action) != review_event_id(other, 1, action)
        assert review_event_id(state, 1, action) == review_event_id(state, 1, action)
