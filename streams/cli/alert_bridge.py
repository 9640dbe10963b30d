"""``vigil alert-bridge`` (mounted by ``streams.cli.main``)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from streams.cli.options import BootstrapOpt, RegistryOpt, codec_for, settings_from_flags


def _duration(value: str | None):  # type: ignore[no-untyped-def]
    from streams.durations import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def alert_bridge(
    alertmanager: Annotated[
        str | None,
        typer.Option(
            "--alertmanager",
            envvar="VIGIL_ALERTMANAGER_URL",
            help="Alertmanager's base URL (default http://127.0.0.1:9093).",
        ),
    ] = None,
    console_url: Annotated[
        str | None,
        typer.Option(
            "--console",
            envvar="VIGIL_CONSOLE_URL",
            help="The console's address, linked from each alert (generatorURL) "
            "(default http://127.0.0.1:6080).",
        ),
    ] = None,
    refresh: Annotated[
        str | None,
        typer.Option(
            help="Post every firing alert again this often (env VIGIL_ALERT_BRIDGE_REFRESH, 1m)."
        ),
    ] = None,
    validity: Annotated[
        str | None,
        typer.Option(
            help="endsAt of a firing alert lies this far ahead of each post; must exceed the "
            "refresh (env VIGIL_ALERT_BRIDGE_VALIDITY, 5m)."
        ),
    ] = None,
    event_ttl: Annotated[
        str | None,
        typer.Option(
            help="How long FORBIDDEN_RETRY and ANOMALY alerts written before vigil ended them "
            "(no ends_with_resolved: no RESOLVED record will come) stay active; every other "
            "alert lasts until its RESOLVED record (env VIGIL_ALERT_BRIDGE_EVENT_TTL, 1h)."
        ),
    ] = None,
    retry_max: Annotated[
        str | None,
        typer.Option(
            help="Longest pause between posts while Alertmanager is down "
            "(env VIGIL_ALERT_BRIDGE_RETRY_MAX, 30s)."
        ),
    ] = None,
    health_host: Annotated[
        str | None,
        typer.Option(
            help="Bind address of /metrics and /healthz (env VIGIL_ALERT_BRIDGE_HOST, 127.0.0.1)."
        ),
    ] = None,
    health_port: Annotated[
        int | None,
        typer.Option(
            help="Port of /metrics and /healthz (env VIGIL_ALERT_BRIDGE_PORT, 6069; 0: none)."
        ),
    ] = None,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Post the alerts topic to Alertmanager (v2 API), one Alertmanager alert per vigil alert.

    Labels: alertname (VigilApprovalVerdict, VigilOperationUnknown, ...), kind, verdict,
    severity (critical, warning), owner (RUNTIME_OWNER, CONNECTOR_OWNER, ...), subject,
    execution, alert_id; annotations: summary, next_step, evidence, console link. A RESOLVED
    alert ends the alert it names (same labels, endsAt). Offsets of the consumer group
    <app_id>-alert-bridge are committed only after Alertmanager accepted the post; while it is
    down the post is retried (nothing is lost; a repeated post is harmless). Firing alerts are
    posted again every --refresh with endsAt --validity ahead, so Alertmanager keeps them
    (and gets them back after a restart) while the bridge runs. Serves its metrics and a
    health check (503 when the consumer holds no assignment, or Alertmanager has accepted no
    post for 2 minutes while posts failed).
    """
    from streams.alert_bridge import BridgeSettings, run_alert_bridge, status_address

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    s = settings_from_flags(bootstrap, registry)
    b = BridgeSettings.from_env(
        alertmanager_url=alertmanager,
        console_url=console_url,
        refresh=_duration(refresh),
        validity=_duration(validity),
        event_ttl=_duration(event_ttl),
        retry_max=_duration(retry_max),
    )
    run_alert_bridge(s, b, codec_for(s), status_address(health_host, health_port))
