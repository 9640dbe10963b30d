"""vigil alerts as Alertmanager alerts (the v2 API's ``postableAlert``), without I/O or a clock.

Alertmanager identifies an alert by its label set, so the labels carry only what stays the
same for the life of one vigil alert: ``alertname`` (from the kind), ``kind``, ``verdict`` (the
verdict or status that fired it), ``severity`` (lower case, as Prometheus rules write it),
``owner`` (routing key), ``subject``, ``execution`` and ``alert_id``. Status is not a label: a
RESOLVED vigil alert ends the FIRING one by posting the *same* labels with ``endsAt`` set, so
the bridge remembers the labels of the alerts it fired (a RESOLVED record has severity INFO and
the verdict it moved to, not the ones that fired).

Alertmanager expires an alert at its ``endsAt``; a firing alert is therefore posted with an
``endsAt`` a validity ahead and posted again before that passes (see ``streams.alert_bridge``).
Every alert ends when its RESOLVED record comes (docs/rules.md#alert-lifecycle), FORBIDDEN_RETRY
and ANOMALY alerts too. Those two kinds had none before ``Alert.ends_with_resolved``: an alert of
theirs written without that flag is never ended by vigil, so it stays active for a fixed time
after the bridge first saw it, then expires.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from streams.contracts.models.enums import AlertKind
from streams.contracts.models.outputs import Alert

#: kinds no RESOLVED record closed before ``Alert.ends_with_resolved``: one of these without
#: that flag lapses instead (``firing``)
POINT_IN_TIME: frozenset[AlertKind] = frozenset({AlertKind.FORBIDDEN_RETRY, AlertKind.ANOMALY})
#: bounds that keep one alert's payload small whatever the evidence holds
MAX_LABEL_CHARS = 512
MAX_EVIDENCE_ITEMS = 20
MAX_ANNOTATION_CHARS = 2000


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def alertname(kind: AlertKind | str) -> str:
    """``APPROVAL_VERDICT`` → ``VigilApprovalVerdict``."""
    return "Vigil" + "".join(part.capitalize() for part in str(kind).split("_"))


def alert_labels(alert: Alert) -> dict[str, str]:
    """The identity of a FIRING alert in Alertmanager (empty values are left out: Alertmanager
    treats an empty label as an absent one)."""
    labels = {
        "alertname": alertname(alert.kind),
        "kind": str(alert.kind),
        "verdict": alert.verdict or "",
        "severity": str(alert.severity).lower(),
        "owner": str(alert.owner),
        "subject": alert.subject_id,
        "execution": alert.execution_id,
        "alert_id": alert.alert_id,
    }
    return {k: _bounded(v, MAX_LABEL_CHARS) for k, v in labels.items() if v}


def evidence_text(evidence: tuple[str, ...]) -> str:
    """Evidence codes one per line, at most ``MAX_EVIDENCE_ITEMS`` of them and
    ``MAX_ANNOTATION_CHARS`` in all, saying how many were left out."""
    shown = list(evidence[:MAX_EVIDENCE_ITEMS])
    more = len(evidence) - len(shown)
    text = "\n".join(shown)
    if len(text) > MAX_ANNOTATION_CHARS - 40:
        text = text[: MAX_ANNOTATION_CHARS - 40].rsplit("\n", 1)[0]
        more = len(evidence) - text.count("\n") - 1
    if more > 0:
        text += f"\n… ({more} more)"
    return text


def console_link(console_url: str, execution_id: str) -> str:
    """The console page of the execution the alert belongs to (the fleet page without one)."""
    base = console_url.rstrip("/")
    if not execution_id:
        return f"{base}/#/fleet"
    return f"{base}/#/executions/{quote(execution_id, safe='')}"


@dataclass(frozen=True, slots=True)
class Firing:
    """What the bridge keeps of a FIRING alert to post it again or end it."""

    alert_id: str
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    starts_at: datetime
    generator_url: str
    #: point-in-time alerts: when they stop being posted (None: until a RESOLVED record)
    expires_at: datetime | None

    def payload(self, ends_at: datetime) -> dict[str, Any]:
        """A ``postableAlert`` (``endsAt`` never before ``startsAt``: Alertmanager refuses it)."""
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": _iso(self.starts_at),
            "endsAt": _iso(max(ends_at, self.starts_at)),
            "generatorURL": self.generator_url,
        }


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def firing(alert: Alert, *, console_url: str, seen_at: datetime, event_ttl: timedelta) -> Firing:
    """The Alertmanager form of a FIRING alert. ``seen_at`` is when the bridge first saw it:
    the alert starts at its event time, or then if that is ahead. An alert that vigil ends
    (``ends_with_resolved``) stays active until its RESOLVED record; a FORBIDDEN_RETRY or
    ANOMALY alert written before they were ended stays active ``event_ttl`` past the later of
    the two, since nothing would end it."""
    link = console_link(console_url, alert.execution_id)
    what = alert.verdict or str(alert.kind)
    annotations = {
        "summary": _bounded(
            f"{what} ({alert.kind}) on {alert.subject_id}, execution {alert.execution_id or '-'}",
            MAX_LABEL_CHARS,
        ),
        "next_step": _bounded(alert.next_step, MAX_ANNOTATION_CHARS),
        "evidence": evidence_text(alert.evidence),
        "occurred_at": _iso(alert.occurred_at),
        "console": link,
    }
    lapses = alert.kind in POINT_IN_TIME and not alert.ends_with_resolved
    expires = max(seen_at, alert.occurred_at) + event_ttl if lapses else None
    return Firing(
        alert_id=alert.alert_id,
        labels=tuple(alert_labels(alert).items()),
        annotations=tuple((k, v) for k, v in annotations.items() if v),
        # an event time ahead of the bridge's clock would start (and so end) the alert later
        starts_at=min(alert.occurred_at, seen_at),
        generator_url=link,
        expires_at=expires,
    )


def refresh_ends_at(f: Firing, now: datetime, validity: timedelta) -> datetime:
    """``endsAt`` of a firing alert posted at ``now``: a validity ahead, never past its expiry."""
    ends = now + validity
    return ends if f.expires_at is None else min(ends, f.expires_at)


def resolved_ends_at(f: Firing, resolved: Alert, now: datetime) -> datetime:
    """``endsAt`` that ends ``f``: the RESOLVED record's time, or now if that is still ahead
    (an ``endsAt`` in the future would keep the alert active until then)."""
    return max(f.starts_at, min(resolved.occurred_at, now))


def with_resolution(f: Firing, resolved: Alert) -> Firing:
    """``f`` with the RESOLVED record's account added to its annotations (labels unchanged)."""
    notes: Mapping[str, str] = dict(f.annotations) | {
        "resolution": _bounded(resolved.next_step, MAX_ANNOTATION_CHARS),
        "resolved_by": resolved.alert_id,
    }
    return Firing(
        f.alert_id, f.labels, tuple(notes.items()), f.starts_at, f.generator_url, f.expires_at
    )
