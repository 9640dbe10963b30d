"""The alert bridge's mapping and book, without Kafka or Alertmanager: vigil alerts as
Alertmanager ``postableAlert``s, a RESOLVED record ending the alert with the labels it fired
with, duplicates and redeliveries changing nothing, point-in-time alerts lapsing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.alert_bridge import AlertBook, BridgeSettings, Unmatched
from streams.contracts.models.enums import AlertKind, AlertStatus, Owner, Severity
from streams.contracts.models.outputs import Alert
from streams.core.alertmanager import (
    MAX_ANNOTATION_CHARS,
    MAX_EVIDENCE_ITEMS,
    alert_labels,
    alertname,
    console_link,
    evidence_text,
    firing,
)
from streams.settings import SettingsError

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CONSOLE = "http://console.example:6080/"
BRIDGE = BridgeSettings(
    console_url=CONSOLE,
    refresh=timedelta(minutes=1),
    validity=timedelta(minutes=5),
    event_ttl=timedelta(hours=1),
)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def orphaned(alert_id: str = "alert-1", at: datetime = T0, **kw: object) -> Alert:
    fields: dict[str, object] = dict(
        alert_id=alert_id,
        kind=AlertKind.APPROVAL_VERDICT,
        status=AlertStatus.FIRING,
        severity=Severity.CRITICAL,
        execution_id="exec/1 ü",
        subject_id="req-1",
        verdict="ORPHANED_WAIT",
        owner=Owner.RUNTIME_OWNER,
        next_step="restart the run's resume handler",
        evidence=("heartbeat:STALE:no heartbeat for 10m",),
        occurred_at=at,
    )
    fields.update(kw)
    return Alert(**fields)  # type: ignore[arg-type]


def resolved(of: str = "alert-1", at: datetime = T0 + timedelta(minutes=3)) -> Alert:
    return Alert(
        alert_id=f"resolved-{of}",
        kind=AlertKind.APPROVAL_VERDICT,
        status=AlertStatus.RESOLVED,
        severity=Severity.INFO,
        execution_id="exec/1 ü",
        subject_id="req-1",
        verdict="RESUMED",
        owner=Owner.RUNTIME_OWNER,
        next_step="resolved: ORPHANED_WAIT → RESUMED; none",
        occurred_at=at,
        resolves_alert_id=of,
    )


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def test_orphaned_wait_as_an_alertmanager_alert() -> None:
    book = AlertBook(BRIDGE)
    now = T0 + timedelta(seconds=2)
    post = book.apply(orphaned(), 0, now)
    assert isinstance(post, dict)
    assert post["labels"] == {
        "alertname": "VigilApprovalVerdict",
        "kind": "APPROVAL_VERDICT",
        "verdict": "ORPHANED_WAIT",
        "severity": "critical",
        "owner": "RUNTIME_OWNER",
        "subject": "req-1",
        "execution": "exec/1 ü",
        "alert_id": "alert-1",
    }
    assert post["annotations"]["next_step"] == "restart the run's resume handler"
    assert post["annotations"]["evidence"] == "heartbeat:STALE:no heartbeat for 10m"
    assert post["generatorURL"] == "http://console.example:6080/#/executions/exec%2F1%20%C3%BC"
    assert post["annotations"]["console"] == post["generatorURL"]
    assert parse(post["startsAt"]) == T0
    assert parse(post["endsAt"]) == now + BRIDGE.validity


def test_resolved_ends_the_alert_with_the_labels_it_fired_with() -> None:
    book = AlertBook(BRIDGE)
    fired = book.apply(orphaned(), 0, T0)
    now = T0 + timedelta(minutes=10)
    ended = book.apply(resolved(), 0, now)
    assert isinstance(fired, dict) and isinstance(ended, dict)
    assert ended["labels"] == fired["labels"]  # severity critical, verdict ORPHANED_WAIT
    assert parse(ended["endsAt"]) == T0 + timedelta(minutes=3)  # the RESOLVED record's time
    assert ended["startsAt"] == fired["startsAt"]
    assert "RESUMED" in ended["annotations"]["resolution"]
    assert book.active == {} and book.due(now) == []


def test_resolution_ahead_of_the_clock_ends_now() -> None:
    book = AlertBook(BRIDGE)
    book.apply(orphaned(), 0, T0)
    now = T0 + timedelta(minutes=1)
    ended = book.apply(resolved(at=T0 + timedelta(hours=2)), 0, now)
    assert isinstance(ended, dict) and parse(ended["endsAt"]) == now


def test_duplicate_firing_posts_the_same_alert_and_a_firing_after_its_resolution_nothing() -> None:
    book = AlertBook(BRIDGE)
    first = book.apply(orphaned(), 0, T0)
    again = book.apply(orphaned(), 0, T0 + timedelta(seconds=30))
    assert isinstance(first, dict) and isinstance(again, dict)
    assert again["labels"] == first["labels"] and again["startsAt"] == first["startsAt"]
    book.apply(resolved(), 0, T0 + timedelta(minutes=4))
    # the worker published the FIRING record again after a restart: it must not page again
    assert book.apply(orphaned(), 0, T0 + timedelta(minutes=5)) is None
    assert book.due(T0 + timedelta(minutes=5)) == []


def test_resolved_for_an_alert_never_seen_is_handed_back_as_unmatched() -> None:
    book = AlertBook(BRIDGE)
    now = T0 + timedelta(minutes=4)
    got = book.apply(resolved(of="older"), 2, now)
    assert isinstance(got, Unmatched) and got.alert_id == "older"
    assert got.ends_at == T0 + timedelta(minutes=3)
    # a FIRING read after its RESOLVED stays ended
    assert book.apply(orphaned("older"), 2, now) is None


def test_refresh_posts_every_active_alert_with_endsat_a_validity_ahead() -> None:
    book = AlertBook(BRIDGE)
    book.apply(orphaned("a"), 0, T0)
    book.apply(orphaned("b", subject_id="req-2"), 1, T0)
    later = T0 + timedelta(days=3)
    due = book.due(later)
    assert sorted(p["labels"]["alert_id"] for p in due) == ["a", "b"]
    assert all(parse(p["endsAt"]) == later + BRIDGE.validity for p in due)
    book.drop([1])  # partition 1 revoked: another bridge refreshes its alerts
    assert [p["labels"]["alert_id"] for p in book.due(later)] == ["a"]


def test_point_in_time_alerts_lapse_after_the_event_ttl() -> None:
    book = AlertBook(BRIDGE)
    seen = T0 + timedelta(minutes=30)  # read late (a backlog): the ttl counts from then
    anomaly = orphaned(
        "an-1", kind=AlertKind.ANOMALY, severity=Severity.WARNING, owner=Owner.OPERATOR
    )
    post = book.apply(anomaly, 0, seen)
    assert isinstance(post, dict)
    assert post["labels"]["alertname"] == "VigilAnomaly"
    assert parse(post["endsAt"]) == seen + BRIDGE.validity
    near_end = seen + BRIDGE.event_ttl - timedelta(minutes=1)
    (refreshed,) = book.due(near_end)
    assert parse(refreshed["endsAt"]) == seen + BRIDGE.event_ttl  # never past its expiry
    assert book.due(seen + BRIDGE.event_ttl) == [] and book.active == {}


def test_retry_and_anomaly_alerts_vigil_ends_stay_until_their_resolved_record() -> None:
    """Since vigil ends FORBIDDEN_RETRY and ANOMALY alerts (``ends_with_resolved``), they no
    longer lapse: they stay active past the event TTL, and their RESOLVED record ends them
    like any other; one written before still lapses."""
    book = AlertBook(BRIDGE)
    retry = orphaned("fr-1", kind=AlertKind.FORBIDDEN_RETRY, ends_with_resolved=True)
    old = orphaned("fr-old", kind=AlertKind.FORBIDDEN_RETRY)
    book.apply(retry, 0, T0)
    book.apply(old, 0, T0)
    later = T0 + BRIDGE.event_ttl + timedelta(minutes=1)
    assert [p["labels"]["alert_id"] for p in book.due(later)] == ["fr-1"]
    end = resolved("fr-1", at=later)
    post = book.apply(end.model_copy(update={"kind": AlertKind.FORBIDDEN_RETRY}), 0, later)
    assert isinstance(post, dict) and parse(post["endsAt"]) == later
    assert post["labels"] == alert_labels(retry)
    assert book.due(later) == []


def test_rebuilt_point_in_time_alert_counts_from_its_own_time() -> None:
    f = firing(
        orphaned(kind=AlertKind.FORBIDDEN_RETRY),
        console_url=CONSOLE,
        seen_at=T0,
        event_ttl=timedelta(hours=1),
    )
    assert f.expires_at == T0 + timedelta(hours=1)
    assert (
        firing(orphaned(), console_url=CONSOLE, seen_at=T0, event_ttl=timedelta(1)).expires_at
        is None
    )


def test_alertname_and_console_link() -> None:
    assert alertname(AlertKind.OPERATION_UNKNOWN) == "VigilOperationUnknown"
    assert console_link("http://c:1/", "") == "http://c:1/#/fleet"
    assert console_link("http://c:1", "e#1") == "http://c:1/#/executions/e%231"


def test_evidence_is_bounded_and_says_how_much_was_left_out() -> None:
    many = tuple(f"proof-{i}:STATE:{'x' * 30}" for i in range(100))
    text = evidence_text(many)
    assert len(text) <= MAX_ANNOTATION_CHARS
    assert text.endswith(f"… ({100 - MAX_EVIDENCE_ITEMS} more)")
    huge = tuple("y" * 1500 for _ in range(5))
    text = evidence_text(huge)
    assert len(text) <= MAX_ANNOTATION_CHARS and text.endswith("(4 more)")
    assert evidence_text(()) == ""


def test_settings_refuse_a_validity_the_refresh_would_let_lapse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VIGIL_ALERTMANAGER_URL", "http://am:9093")
    monkeypatch.setenv("VIGIL_ALERT_BRIDGE_REFRESH", "30s")
    s = BridgeSettings.from_env()
    assert s.alertmanager_url == "http://am:9093" and s.refresh == timedelta(seconds=30)
    assert s.validity == timedelta(minutes=5) and s.event_ttl == timedelta(hours=1)
    monkeypatch.setenv("VIGIL_ALERT_BRIDGE_VALIDITY", "20s")
    with pytest.raises(SettingsError, match="VIGIL_ALERT_BRIDGE_VALIDITY"):
        BridgeSettings.from_env()
    monkeypatch.setenv("VIGIL_ALERT_BRIDGE_VALIDITY", "soon")
    with pytest.raises(SettingsError, match="VIGIL_ALERT_BRIDGE_VALIDITY"):
        BridgeSettings.from_env()


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(list(AlertKind)),
    severity=st.sampled_from([s for s in Severity if s is not Severity.INFO]),
    owner=st.sampled_from(list(Owner)),
    verdict=st.none() | texts,
    subject=texts.filter(bool),
    execution=texts,
    evidence=st.lists(texts, max_size=40).map(tuple),
    next_step=texts,
    starts=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    delay=st.timedeltas(min_value=timedelta(hours=-48), max_value=timedelta(days=60)),
    resolve_after=st.timedeltas(min_value=timedelta(hours=-1), max_value=timedelta(days=9)),
)
def test_any_alert_maps_to_a_valid_postable_alert_and_ends_with_the_same_labels(
    kind: AlertKind,
    severity: Severity,
    owner: Owner,
    verdict: str | None,
    subject: str,
    execution: str,
    evidence: tuple[str, ...],
    next_step: str,
    starts: datetime,
    delay: timedelta,
    resolve_after: timedelta,
) -> None:
    alert = orphaned(
        kind=kind,
        severity=severity,
        owner=owner,
        verdict=verdict,
        subject_id=subject,
        execution_id=execution,
        evidence=evidence,
        next_step=next_step,
        at=starts,
    )
    labels = alert_labels(alert)
    assert all(LABEL_NAME.fullmatch(k) and v for k, v in labels.items())
    assert {"alertname", "severity", "owner", "subject", "alert_id"} <= labels.keys()
    book = AlertBook(BRIDGE)
    now = starts + delay
    post = book.apply(alert, 0, now)
    assert isinstance(post, dict) and post["labels"] == labels
    # never ahead of the bridge's clock (payload times are in milliseconds)
    assert (
        timedelta(0)
        <= min(alert.occurred_at, now) - parse(post["startsAt"])
        < timedelta(milliseconds=1)
    )
    assert parse(post["startsAt"]) <= parse(post["endsAt"])  # Alertmanager refuses otherwise
    assert all(len(v) <= MAX_ANNOTATION_CHARS for v in post["annotations"].values())
    assert book.apply(alert, 0, now) == post  # a redelivery posts the very same alert
    end = Alert(
        **{**resolved().model_dump(), "occurred_at": starts + resolve_after}  # type: ignore[arg-type]
    )
    ended = book.apply(end, 0, now + timedelta(minutes=1))
    assert isinstance(ended, dict) and ended["labels"] == labels
    assert parse(post["startsAt"]) <= parse(ended["endsAt"]) <= now + timedelta(minutes=1)
