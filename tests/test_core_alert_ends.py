"""What ends a FORBIDDEN_RETRY alert and an ANOMALY alert (docs/rules.md#alert-lifecycle), in
the pure core: examples for each rule, then properties over random operation stories and
random anomaly times."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import AlertKind, AlertStatus, OperationStatus, Severity
from streams.contracts.models.outputs import Alert, RetryLink
from streams.core import alerts as al
from streams.core import cross
from streams.core.operations import (
    SETTLED,
    AttemptRecord,
    OperationBook,
    advance,
    dump_book,
    duplicate_effect,
    load_book,
    retry_resolved_id,
)
from tests.test_core_operations import EXE, E, K, _play, _steps, at, ev, ms, run

S = OperationStatus


def retry_alerts(outputs: tuple | list, status: AlertStatus) -> list[Alert]:
    return [
        o
        for o in outputs
        if isinstance(o, Alert) and o.kind is AlertKind.FORBIDDEN_RETRY and o.status is status
    ]


# --- FORBIDDEN_RETRY ------------------------------------------------------------------------


def test_a_retry_alert_ends_once_both_attempts_are_settled_and_not_before() -> None:
    book = run(ev(K.SENT), ev(K.SENT, 5, attempt=2)).book  # attempt 2 while 1 is in flight
    book = advance(book, ms(60)).book  # both UNKNOWN
    fired = retry_alerts(run(ev(K.SENT), ev(K.SENT, 5, attempt=2)).outputs, AlertStatus.FIRING)
    assert len(fired) == 1
    # attempt 2 (the retry) fails: attempt 1 is still UNKNOWN, the risk is not decided
    step = run(ev(K.FAILED, 100, attempt=2, source=E.CONNECTOR), book=book)
    assert retry_alerts(step.outputs, AlertStatus.RESOLVED) == []
    assert step.book.operations["op-1"].attempts[2].retry_alert_id == fired[0].alert_id
    # attempt 1 verified at the source: both settled, one effect at most
    step = run(
        ev(K.VERIFIED, 200, source=E.RECONCILER, event_id="e-verify", effect_ref="r-1"),
        book=step.book,
    )
    (ended,) = retry_alerts(step.outputs, AlertStatus.RESOLVED)
    assert ended.resolves_alert_id == fired[0].alert_id
    assert ended.alert_id == retry_resolved_id(fired[0].alert_id)
    assert (ended.severity, ended.owner, ended.subject_id) == (
        Severity.INFO,
        fired[0].owner,
        "op-1",
    )
    assert ended.occurred_at == at(200) and ended.verdict == "FAILED"
    assert ended.evidence == (
        "attempt=op-1#2:FAILED",
        "previous=op-1#1:VERIFIED",
        "event=e-verify",
    )
    assert step.outputs[-1] == ended  # published last
    assert step.book.operations["op-1"].attempts[2].retry_alert_id is None
    assert not ended.ends_with_resolved and fired[0].ends_with_resolved


def test_the_shared_key_verification_ends_the_demo_retry_at_once() -> None:
    """The demo's duplicate send: two attempts under one key, both UNKNOWN; a person verifies
    the second, which settles the first with it (one effect): the retry alert ends in the same
    step, after the work items' resolutions."""
    book = run(ev(K.SENT), ev(K.SENT, 5, attempt=2)).book
    book = advance(book, ms(60)).book
    step = run(ev(K.VERIFIED, 100, attempt=2, source=E.HUMAN), book=book)
    kinds = [(type(o).__name__, getattr(o, "kind", None)) for o in step.outputs]
    assert kinds[-1] == ("Alert", AlertKind.FORBIDDEN_RETRY)
    (ended,) = retry_alerts(step.outputs, AlertStatus.RESOLVED)
    assert ended.next_step.startswith("none: every attempt it named is settled")


def test_two_confirmed_effects_keep_the_alert_firing() -> None:
    # no key: two verified sends are two effects
    step = run(
        ev(K.SENT, key=None),
        ev(K.VERIFIED, 1, key=None, source=E.CONNECTOR),
        ev(K.SENT, 10, attempt=2, key=None),
        ev(K.VERIFIED, 11, attempt=2, key=None, source=E.CONNECTOR),
    )
    assert len(retry_alerts(step.outputs, AlertStatus.FIRING)) == 1
    assert retry_alerts(step.outputs, AlertStatus.RESOLVED) == []
    # one key, but the source names two different effects
    step = run(
        ev(K.SENT),
        ev(K.VERIFIED, 1, source=E.CONNECTOR, effect_ref="pay-1"),
        ev(K.SENT, 10, attempt=2),
        ev(K.VERIFIED, 11, attempt=2, source=E.CONNECTOR, effect_ref="pay-2"),
    )
    assert retry_alerts(step.outputs, AlertStatus.RESOLVED) == []
    # one key, one effect named: the connector honoured the key
    step = run(
        ev(K.SENT),
        ev(K.VERIFIED, 1, source=E.CONNECTOR, effect_ref="pay-1"),
        ev(K.SENT, 10, attempt=2),
        ev(K.VERIFIED, 11, attempt=2, source=E.CONNECTOR, effect_ref="pay-1"),
    )
    assert len(retry_alerts(step.outputs, AlertStatus.RESOLVED)) == 1


def test_a_retry_under_another_operation_id_ends_with_both_operations() -> None:
    step = run(ev(K.SENT, op="op-1", key="pay-7"), ev(K.SENT, 5, op="op-2", key="pay-7"))
    (fired,) = retry_alerts(step.outputs, AlertStatus.FIRING)
    assert step.book.operations["op-2"].attempts[1].retry_of == (("op-1", 1),)
    step = run(ev(K.FAILED, 6, op="op-2", key="pay-7", source=E.CONNECTOR), book=step.book)
    assert retry_alerts(step.outputs, AlertStatus.RESOLVED) == []
    step = run(ev(K.CANCELLED, 7, op="op-1", key="pay-7", source=E.CONNECTOR), book=step.book)
    (ended,) = retry_alerts(step.outputs, AlertStatus.RESOLVED)
    assert ended.subject_id == "op-2" and ended.resolves_alert_id == fired.alert_id


def test_an_open_retry_alert_is_stored_with_the_book() -> None:
    book = run(ev(K.SENT), ev(K.SENT, 5, attempt=2)).book
    assert load_book(dump_book(book)) == book
    # a book stored before retry alerts were kept reads with none open
    plain = run(ev(K.SENT)).book
    assert '"alert-' not in dump_book(plain)
    assert load_book(dump_book(plain)) == plain


@settings(max_examples=400, deadline=None)
@given(_steps)
def test_a_retry_alert_ends_once_exactly_when_its_attempts_are_decided(steps: list) -> None:
    """Each FORBIDDEN_RETRY alert ends at most once, at or after it fired, by a RESOLVED alert
    naming it; once the story is over, an alert has ended if and only if every attempt it
    named is settled with no duplicate effect among them (settled is final, so the condition
    holds from the step that made it true on)."""
    fired: dict[str, tuple[str, int, tuple[tuple[str, int], ...]]] = {}
    ended: dict[str, Alert] = {}
    book: OperationBook | None = None
    for _, step, _ in _play(steps):
        book = step.book
        for a in retry_alerts(step.outputs, AlertStatus.FIRING):
            rec = _the_retry(book, a)
            fired[a.alert_id] = (a.subject_id, rec.attempt, rec.retry_of)
        for r in retry_alerts(step.outputs, AlertStatus.RESOLVED):
            assert r.resolves_alert_id in fired and r.resolves_alert_id not in ended
            ended[r.resolves_alert_id] = r
    if book is None:
        return
    for alert_id, (op, attempt, named) in fired.items():
        attempts = [book.operations[op].attempts[attempt]] + [
            book.operations[o].attempts[n] for o, n in named
        ]
        decided = all(a.status in SETTLED for a in attempts) and not duplicate_effect(attempts)
        assert (alert_id in ended) == decided
        still = book.operations[op].attempts[attempt].retry_alert_id
        assert still == (None if decided else alert_id)


def _the_retry(book: OperationBook, alert: Alert) -> AttemptRecord:
    """The attempt whose send raised ``alert`` (it may have ended in the same step)."""
    (attempt,) = [e for e in alert.evidence if e.startswith("attempt=")]
    number = int(attempt.rsplit("#", 1)[1])
    rec = book.operations[alert.subject_id].attempts[number]
    if rec.retry_alert_id is None:  # ended at once: the attempts it named are in the alert
        named = tuple(
            (ref.split("=", 1)[1].split("#")[0], int(ref.split("#")[1].split(":")[0]))
            for ref in alert.evidence
            if ref.startswith("previous=")
        )
        return rec._replace(retry_of=named)
    return rec


# --- blind retries across executions --------------------------------------------------------


def _link(kind: str, role: str, status: S, seconds: float, n: int) -> RetryLink:
    return RetryLink(
        link_id=f"link-{n}",
        conflict_id="conflict-1",
        kind=kind,
        role=role,
        execution_id=EXE,
        operation_id="op-1",
        attempt=1,
        other_execution_id="exe-0",
        other_operation_id="op-0",
        other_attempt=1,
        other_status=status,
        connector="sms",
        idempotency_key="key-1",
        occurred_at=at(seconds),
    )


def test_a_blind_retry_alert_ends_when_both_executions_attempts_are_settled() -> None:
    link = _link("CONFLICT", "RETRY", S.UNKNOWN, 5, 1)
    links, _ = cross.apply_link(None, link, ms(5))
    fired = cross.blind_retry_alert(link)
    assert fired is not None and fired.ends_with_resolved
    book = run(ev(K.SENT, 5)).book
    assert cross.ended_alerts(links, book, ["op-1"])[1] == []
    book = run(ev(K.VERIFIED, 50, source=E.CONNECTOR), book=book).book
    assert cross.ended_alerts(links, book, ["op-1"])[1] == []  # the other still UNKNOWN
    links, _ = cross.apply_link(links, _link("UPDATE", "RETRY", S.FAILED, 80, 2), ms(80))
    assert cross.load_links(cross.dump_links(links)) == links
    new, (ended,) = cross.ended_alerts(links, book, ["op-1"])
    assert ended.resolves_alert_id == fired.alert_id and ended.occurred_at == at(80)
    assert "previous_execution=exe-0" in ended.evidence
    assert cross.ended_alerts(new, book, ["op-1"])[1] == []  # once
    assert cross.load_links(cross.dump_links(new)) == new
    # learnt the other way round (the other side settled first): the same record
    links, _ = cross.apply_link(None, link, ms(5))
    links, _ = cross.apply_link(links, _link("UPDATE", "RETRY", S.FAILED, 80, 2), ms(80))
    assert cross.ended_alerts(links, run(ev(K.SENT, 5)).book, ["op-1"])[1] == []
    assert cross.ended_alerts(links, book, ["op-1"])[1] == [ended]


def test_the_held_side_of_a_blind_retry_makes_no_alert_and_ends_none() -> None:
    links, _ = cross.apply_link(None, _link("CONFLICT", "HELD", S.SENT, 5, 1), ms(5))
    book = run(ev(K.SENT), ev(K.FAILED, 9, source=E.CONNECTOR)).book
    links, _ = cross.apply_link(links, _link("UPDATE", "HELD", S.FAILED, 9, 2), ms(9))
    assert cross.ended_alerts(links, book, ["op-1"])[1] == []


# --- ANOMALY: ends by stream time ------------------------------------------------------------

TTL = 3_600_000


def anomaly(n: int, seconds: int) -> Alert:
    return Alert(
        alert_id=f"alert-{n}",
        kind=AlertKind.ANOMALY,
        status=AlertStatus.FIRING,
        severity=Severity.WARNING,
        execution_id=EXE,
        subject_id=f"ev-{n}",
        verdict="DUPLICATE",
        owner="OPERATOR",
        next_step="inspect",
        occurred_at=at(seconds),
        ends_with_resolved=True,
    )


def test_an_anomaly_alert_ends_its_ttl_after_the_anomaly() -> None:
    end = al.anomaly_end(anomaly(1, 10), TTL)
    ends, early = al.add_end(None, end)
    assert early == () and al.next_end(ends) == ms(10) + TTL
    assert al.due_ends(ends, ms(10) + TTL - 1) == (ends, ())
    rest, (resolved,) = al.due_ends(ends, ms(10) + TTL)
    assert rest == () and resolved.resolves_alert_id == "alert-1"
    assert resolved.occurred_at == at(10) + timedelta(hours=1)
    assert (resolved.status, resolved.kind, resolved.subject_id) == (
        AlertStatus.RESOLVED,
        AlertKind.ANOMALY,
        "ev-1",
    )
    assert al.add_end(ends, end) == (ends, ())  # the same anomaly found again: nothing new
    assert al.load_ends(al.dump_ends(ends)) == ends


def test_beyond_the_bound_the_first_end_is_brought_forward() -> None:
    ends: al.Ends = ()
    for n in range(3):
        ends, early = al.add_end(ends, al.anomaly_end(anomaly(n, 10 * n), TTL), limit=2)
    assert [e.alert_id for e in ends] == ["alert-1", "alert-2"]
    (brought,) = early
    assert brought.resolves_alert_id == "alert-0" and brought.occurred_at == at(20)
    assert "ended early" in brought.next_step


_times = st.lists(st.integers(0, 20_000), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_times, st.lists(st.integers(0, 30_000), max_size=10))
def test_anomaly_ends_are_a_function_of_the_anomalies_alone(
    times: list[int], stops: list[int]
) -> None:
    """Whatever the order the anomalies are found in and however stream time advances, each
    alert ends once, at its own time plus the TTL, and advancing in steps gives what one big
    step gives."""
    alerts = [anomaly(n, t) for n, t in enumerate(times)]

    def collect(order: list[Alert], horizons: list[int]) -> list[Alert]:
        ends: al.Ends = ()
        out: list[Alert] = []
        for a in order:
            ends, early = al.add_end(ends, al.anomaly_end(a, TTL))
            assert early == ()  # within the bound
        for h in [*sorted(horizons), 10**15]:
            ends, resolved = al.due_ends(ends, h)
            out += resolved
            assert al.next_end(ends) is None or al.next_end(ends) > h
        return out

    one = collect(alerts, [])
    assert sorted(a.resolves_alert_id for a in one) == sorted(a.alert_id for a in alerts)
    assert all(
        r.occurred_at == a.occurred_at + timedelta(hours=1)
        for r in one
        for a in alerts
        if a.alert_id == r.resolves_alert_id
    )
    assert [r.occurred_at for r in one] == sorted(r.occurred_at for r in one)
    assert collect(list(reversed(alerts)), [s * 1000 for s in stops]) == one
