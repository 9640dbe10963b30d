"""``vigil alert-bridge`` between the real broker and a real Alertmanager (Debian's
``prometheus-alertmanager``), routed by docker/alertmanager/alertmanager.yml to webhook
receivers this test serves.

- An ORPHANED_WAIT alert on the alerts topic reaches Alertmanager's API with owner RUNTIME_OWNER
  and severity critical, is notified to the runtime owner's receiver, and is resolved (and the
  resolution notified) when its RESOLVED record follows.
- With Alertmanager stopped, the bridge commits nothing past what Alertmanager accepted; once
  Alertmanager is back (a restart: it forgot every alert), the alerts produced meanwhile and the
  one fired before the outage are all in it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from streams.contracts.models.enums import AlertKind, AlertStatus, Owner, Severity
from streams.contracts.models.outputs import Alert
from streams.engine.processor import alert_headers
from streams.local.stack import Cluster
from tests.alertmanager_support import BINARY, Alertmanager, Hooks, wait_for
from tests.support import Deployment, deployment, free_port

pytestmark = pytest.mark.kafka

if BINARY is None:
    pytest.skip(
        "no Alertmanager binary (apt-get install prometheus-alertmanager)",
        allow_module_level=True,
    )


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.server.shutdown()


@pytest.fixture
def am(tmp_path: Path, hooks: Hooks) -> Iterator[Alertmanager]:
    a = Alertmanager(tmp_path, hooks)
    a.start()
    yield a
    a.stop()


@pytest.fixture
def dep(cluster: Cluster, tmp_path: Path) -> Deployment:
    return deployment(cluster, tmp_path, partitions=2)


def start_bridge(dep: Deployment, am: Alertmanager, **env: str) -> subprocess.Popen[bytes]:
    """The real command, as compose runs it (``env``: more settings)."""
    log = (dep.workdir / f"bridge-{uuid.uuid4().hex[:6]}.log").open("wb")
    status_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "alert-bridge"],
        env=dep.env()
        | {
            "VIGIL_ALERTMANAGER_URL": am.url,
            "VIGIL_CONSOLE_URL": "http://console.test:6080",
            "VIGIL_ALERT_BRIDGE_REFRESH": "2s",
            "VIGIL_ALERT_BRIDGE_VALIDITY": "60s",
            "VIGIL_ALERT_BRIDGE_RETRY_MAX": "1s",
            "VIGIL_ALERT_BRIDGE_PORT": str(status_port),
        }
        | env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=dep.workdir,
        start_new_session=True,
    )
    proc.log_path = Path(log.name)  # type: ignore[attr-defined]
    proc.status_url = f"http://127.0.0.1:{status_port}"  # type: ignore[attr-defined]
    return proc


def stop_bridge(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    return proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]


def firing(alert_id: str, subject: str, **kw: Any) -> Alert:
    fields: dict[str, Any] = dict(
        alert_id=alert_id,
        kind=AlertKind.APPROVAL_VERDICT,
        status=AlertStatus.FIRING,
        severity=Severity.CRITICAL,
        execution_id=f"exec-{subject}",
        subject_id=subject,
        verdict="ORPHANED_WAIT",
        owner=Owner.RUNTIME_OWNER,
        next_step="the run is gone: restart it or cancel the request",
        evidence=("heartbeat:STALE:no requester heartbeat",),
        occurred_at=datetime.now(UTC),
    )
    fields.update(kw)
    return Alert(**fields)


def publish(dep: Deployment, *alerts: Alert) -> None:
    p = dep.producer()
    for a in alerts:
        p.send(dep.topics.alerts.name, a, headers=dict(alert_headers(a)))
    p.flush()


def committed(dep: Deployment) -> int:
    """Offsets the bridge's group has committed, summed over the alerts topic's partitions."""
    c = Consumer(
        dep.settings.confluent_conf() | {"group.id": f"{dep.settings.app_id}-alert-bridge"}
    )
    try:
        tps = [TopicPartition(dep.topics.alerts.name, p) for p in range(dep.settings.partitions)]
        return sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=10))
    finally:
        c.close()


def test_orphaned_wait_is_routed_to_the_runtime_owner_and_resolved(
    dep: Deployment, am: Alertmanager, hooks: Hooks
) -> None:
    bridge = start_bridge(dep, am)
    try:
        alert = firing("alert-orphaned-1", "req-1")
        publish(dep, alert)
        got = wait_for("the alert in Alertmanager", lambda: am.alert(alert.alert_id), 45)
        labels = got["labels"]
        assert labels["owner"] == "RUNTIME_OWNER" and labels["severity"] == "critical"
        assert labels["alertname"] == "VigilApprovalVerdict"
        assert labels["verdict"] == "ORPHANED_WAIT" and labels["subject"] == "req-1"
        assert got["status"]["state"] == "active"
        assert got["annotations"]["next_step"] == alert.next_step
        assert got["generatorURL"] == "http://console.test:6080/#/executions/exec-req-1"
        assert [r["name"] for r in got["receivers"]] == ["runtime-owner"]
        wait_for(
            "the runtime owner's notification",
            lambda: hooks.notified("/runtime-owner", alert.alert_id, "firing"),
        )

        resolved = Alert(
            **{
                **alert.model_dump(),
                "alert_id": "alert-resolved-1",
                "status": AlertStatus.RESOLVED,
                "severity": Severity.INFO,
                "verdict": "RESUMED",
                "next_step": "resolved: ORPHANED_WAIT → RESUMED",
                "occurred_at": datetime.now(UTC),
                "resolves_alert_id": alert.alert_id,
            }
        )
        publish(dep, resolved)
        wait_for("the alert gone from Alertmanager", lambda: am.alert(alert.alert_id) is None)
        note = wait_for(
            "the resolution notified",
            lambda: hooks.notified("/runtime-owner", alert.alert_id, "resolved"),
        )
        assert note["labels"] == labels
        assert not [p for p, _ in hooks.received if p != "/runtime-owner"]
        wait_for("both offsets committed", lambda: committed(dep) == 2)

        status = bridge.status_url  # type: ignore[attr-defined]
        health = httpx.get(f"{status}/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "OK", health.text
        metrics = {
            s.name: s.value
            for f in text_string_to_metric_families(httpx.get(f"{status}/metrics").text)
            for s in f.samples
        }
        assert metrics["vigil_alert_bridge_alerts_read_total"] == 2
        assert metrics["vigil_alert_bridge_posts_accepted_total"] >= 2  # fired, then ended
        assert metrics["vigil_alert_bridge_commits_total"] >= 1
        assert metrics["vigil_alert_bridge_alerts_firing"] == 0
        assert metrics["vigil_alert_bridge_partitions_assigned"] == 2
    finally:
        log = stop_bridge(bridge)
    assert "Traceback" not in log, log


def test_nothing_is_lost_while_alertmanager_is_down(
    dep: Deployment, am: Alertmanager, hooks: Hooks
) -> None:
    bridge = start_bridge(dep, am)
    try:
        before = firing("alert-before", "req-before")
        publish(dep, before)
        wait_for("the first alert", lambda: am.alert(before.alert_id), 45)
        wait_for("its offset committed", lambda: committed(dep) == 1)

        am.stop()
        during = [
            firing("alert-during-1", "req-d1"),
            firing(
                "alert-during-2",
                "op-d2",
                kind=AlertKind.OPERATION_UNKNOWN,
                severity=Severity.WARNING,
                owner=Owner.CONNECTOR_OWNER,
                verdict="UNKNOWN",
            ),
        ]
        publish(dep, *during)
        time.sleep(5)  # the bridge has read them and keeps retrying
        assert bridge.poll() is None
        assert committed(dep) == 1  # nothing committed that Alertmanager did not accept

        am.start()  # a restart: Alertmanager holds no alert now
        for a in [before, *during]:
            wait_for(f"{a.alert_id} in Alertmanager", lambda a=a: am.alert(a.alert_id), 30)
        wait_for("every offset committed", lambda: committed(dep) == 3)
        wait_for(
            "the connector owner's notification",
            lambda: hooks.notified("/connector-owner", "alert-during-2", "firing"),
        )
    finally:
        log = stop_bridge(bridge)
    assert "unavailable" in log and "Alertmanager back after" in log, log
    assert "Traceback" not in log, log


def resolution_of(alert: Alert, alert_id: str) -> Alert:
    return Alert(
        **{
            **alert.model_dump(),
            "alert_id": alert_id,
            "status": AlertStatus.RESOLVED,
            "severity": Severity.INFO,
            "verdict": "RESUMED",
            "next_step": "resolved: ORPHANED_WAIT → RESUMED",
            "occurred_at": datetime.now(UTC),
            "resolves_alert_id": alert.alert_id,
        }
    )


def test_a_restarted_bridge_ends_alerts_fired_before_it_started(
    dep: Deployment, am: Alertmanager
) -> None:
    alert = firing("alert-old", "req-old")
    first = start_bridge(dep, am)
    try:
        publish(dep, alert)
        wait_for("the alert in Alertmanager", lambda: am.alert(alert.alert_id), 45)
        wait_for("its offset committed", lambda: committed(dep) == 1)
    finally:
        stop_bridge(first)
    # an alert in Alertmanager the bridge never fired (posted by an earlier deployment)
    stranger = firing("alert-stranger", "req-stranger", severity=Severity.WARNING)
    httpx.post(
        f"{am.url}/api/v2/alerts",
        json=[{"labels": {"alert_id": stranger.alert_id, "alertname": "Elsewhere"}}],
        timeout=5,
    ).raise_for_status()
    second = start_bridge(dep, am)
    try:
        # the RESOLVED record carries severity INFO and verdict RESUMED: only the labels
        # rebuilt from the topic end the alert that fired as critical ORPHANED_WAIT
        publish(dep, resolution_of(alert, "alert-old-resolved"))
        publish(dep, resolution_of(stranger, "alert-stranger-resolved"))
        wait_for("the old alert ended", lambda: am.alert(alert.alert_id) is None, 45)
        wait_for("the stranger ended", lambda: am.alert(stranger.alert_id) is None, 20)
        wait_for("every offset committed", lambda: committed(dep) == 3)
    finally:
        log = stop_bridge(second)
    assert "rebuilt 1 firing alerts from 1 records" in log, log
    assert "Traceback" not in log, log


def test_forbidden_retry_and_anomaly_alerts_end_in_alertmanager_with_their_resolved_record(
    dep: Deployment, am: Alertmanager, hooks: Hooks
) -> None:
    """The records the core publishes for a forbidden retry that is then decided (both
    attempts FAILED) and for an anomaly whose alert expires (docs/rules.md#alert-lifecycle):
    each reaches its owner's receiver firing, stays active past VIGIL_ALERT_BRIDGE_EVENT_TTL
    (it is no longer left to lapse), and ends, notified as resolved, when its RESOLVED record
    comes."""
    from datetime import timedelta

    from streams.contracts.models.enums import AnomalyKind, EvidenceSource, OperationEventKind
    from streams.contracts.models.events import OperationEvent
    from streams.contracts.models.outputs import Anomaly
    from streams.core import alerts as al
    from streams.core.operations import OperationConfig, apply_event

    now = datetime.now(UTC).replace(microsecond=0)
    K = OperationEventKind

    def op(attempt: int, kind: OperationEventKind, seconds: int) -> OperationEvent:
        return OperationEvent(
            event_id=f"e-{attempt}-{kind}",
            execution_id="exec-am",
            operation_id="op-am",
            attempt=attempt,
            idempotency_key="k-am",
            connector="payments",
            kind=kind,
            occurred_at=now + timedelta(seconds=seconds),
            evidence_source=EvidenceSource.CONNECTOR
            if kind is K.FAILED
            else EvidenceSource.RUNTIME,
        )

    book, records = None, []
    for e in (op(1, K.SENT, 0), op(2, K.SENT, 1), op(1, K.FAILED, 2), op(2, K.FAILED, 3)):
        step = apply_event(book, e, OperationConfig())
        book = step.book
        records += [r for r in step.outputs if isinstance(r, Alert)]
    (retry,) = [r for r in records if r.status is AlertStatus.FIRING]
    (retry_end,) = [r for r in records if r.status is AlertStatus.RESOLVED]
    anomaly = al.anomaly_alert(
        Anomaly(
            anomaly_id="anomaly-am",
            kind=AnomalyKind.DUPLICATE,
            reason="applied before",
            execution_id="exec-am",
            event_id="e-dup",
            source_topic="t",
            source_partition=0,
            source_offset=1,
            detected_at=now,
        )
    )
    ends, _ = al.add_end(None, al.anomaly_end(anomaly, 1000))
    _, (anomaly_end,) = al.due_ends(ends, 10**15)
    assert retry.ends_with_resolved and anomaly.ends_with_resolved

    bridge = start_bridge(dep, am, VIGIL_ALERT_BRIDGE_EVENT_TTL="2s")
    try:
        publish(dep, retry, anomaly)
        for a, path in ((retry, "/runtime-owner"), (anomaly, "/operator")):
            wait_for(f"{a.kind} in Alertmanager", lambda a=a: am.alert(a.alert_id), 45)
            wait_for(
                f"{a.kind} notified",
                lambda a=a, path=path: hooks.notified(path, a.alert_id, "firing"),
            )
        # past the event TTL and a refresh: still active, nothing lets them lapse
        time.sleep(4)
        assert am.alert(retry.alert_id) is not None and am.alert(anomaly.alert_id) is not None
        publish(dep, retry_end, anomaly_end)
        for a, path in ((retry, "/runtime-owner"), (anomaly, "/operator")):
            wait_for(f"{a.kind} ended", lambda a=a: am.alert(a.alert_id) is None, 30)
            note = wait_for(
                f"{a.kind} resolution notified",
                lambda a=a, path=path: hooks.notified(path, a.alert_id, "resolved"),
            )
            assert note["labels"]["kind"] == a.kind
        wait_for("every offset committed", lambda: committed(dep) == 4)
    finally:
        log = stop_bridge(bridge)
    assert "Traceback" not in log, log
