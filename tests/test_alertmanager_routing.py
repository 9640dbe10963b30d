"""The shipped Alertmanager configuration (docker/alertmanager/alertmanager.yml), run by a real
Alertmanager: each owner's alerts reach that owner's receiver, and a critical alert silences
only the same owner's warnings about the same subject of the same execution.

The case that matters is a duplicate send: a FORBIDDEN_RETRY (critical, runtime owner) about
an operation whose attempts are UNKNOWN (warnings, connector owner). The connector owner must
still be told to reconcile, whatever the runtime owner is told.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.alertmanager_support import BINARY, Alertmanager, Hooks, wait_for

if BINARY is None:
    pytest.skip(
        "no Alertmanager binary (apt-get install prometheus-alertmanager)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.server.shutdown()


@pytest.fixture(scope="module")
def am(tmp_path_factory: pytest.TempPathFactory, hooks: Hooks) -> Iterator[Alertmanager]:
    a = Alertmanager(Path(tmp_path_factory.mktemp("am")), hooks)
    a.start()
    yield a
    a.stop()


def _alert(**labels: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "labels": {"alert_id": f"alert-{uuid.uuid4().hex[:12]}", **labels},
        "annotations": {"next_step": "test"},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=5)).isoformat(),
    }


def _post(am: Alertmanager, *alerts: dict[str, Any]) -> None:
    httpx.post(f"{am.url}/api/v2/alerts", json=list(alerts), timeout=5).raise_for_status()


def _inhibited_by(am: Alertmanager, alert_id: str) -> list[str]:
    got = wait_for(f"{alert_id} listed", lambda: am.alert(alert_id), 15)
    return list(got["status"]["inhibitedBy"])


def test_a_critical_alert_never_silences_another_owners_warning(
    am: Alertmanager, hooks: Hooks
) -> None:
    execution, subject = f"exec-{uuid.uuid4().hex[:6]}", "charge-1"
    critical = _alert(
        alertname="VigilForbiddenRetry",
        kind="FORBIDDEN_RETRY",
        severity="critical",
        owner="RUNTIME_OWNER",
        subject=subject,
        execution=execution,
    )
    connector_warning = _alert(
        alertname="VigilOperationUnknown",
        kind="OPERATION_UNKNOWN",
        severity="warning",
        owner="CONNECTOR_OWNER",
        subject=subject,
        execution=execution,
    )
    _post(am, critical, connector_warning)
    assert _inhibited_by(am, connector_warning["labels"]["alert_id"]) == []
    wait_for(
        "the connector owner notified",
        lambda: hooks.notified(
            "/connector-owner", connector_warning["labels"]["alert_id"], "firing"
        ),
        20,
    )


def test_a_critical_alert_silences_the_same_owners_warning_about_the_same_subject(
    am: Alertmanager,
) -> None:
    execution, other = f"exec-{uuid.uuid4().hex[:6]}", f"exec-{uuid.uuid4().hex[:6]}"
    common = {"owner": "RUNTIME_OWNER", "subject": "req-1"}
    critical = _alert(
        alertname="VigilApprovalVerdict", severity="critical", execution=execution, **common
    )
    same = _alert(
        alertname="VigilApprovalVerdict", severity="warning", execution=execution, **common
    )
    # The same request id in another execution is another request.
    elsewhere = _alert(
        alertname="VigilApprovalVerdict", severity="warning", execution=other, **common
    )
    _post(am, critical)
    wait_for("the critical alert listed", lambda: am.alert(critical["labels"]["alert_id"]), 15)
    _post(am, same, elsewhere)
    assert _inhibited_by(am, same["labels"]["alert_id"]) != []
    assert _inhibited_by(am, elsewhere["labels"]["alert_id"]) == []
