"""``vigil reconcile`` (mounted by ``streams.cli.main``)."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

from streams.cli.options import BootstrapOpt, RegistryOpt, codec_for, settings_from_flags


def reconcile(
    reconcilers: Annotated[
        str | None,
        typer.Option(
            "--reconcilers",
            envvar="VIGIL_RECONCILERS_FILE",
            help="TOML file of the checkers per connector (env VIGIL_RECONCILERS_FILE; "
            "streams/reconcilers.py describes it). Without one, no work item is checked.",
        ),
    ] = None,
    health_host: Annotated[
        str | None,
        typer.Option(
            help="Bind address of /metrics and /healthz (env VIGIL_RECONCILER_HOST, 127.0.0.1)."
        ),
    ] = None,
    health_port: Annotated[
        int | None,
        typer.Option(
            help="Port of /metrics and /healthz (env VIGIL_RECONCILER_PORT, 6070; 0: none)."
        ),
    ] = None,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Check every open reconciliation work item against its source of truth.

    Consumer group <app_id>-reconciler on <p>.reconciliation-work (replicas share its
    partitions). For each work item the checker of its connector reads the source; what it
    finds is published as an OperationEvent from the RECONCILER source on
    <p>.operation-events: VERIFIED with the source's effect reference, FAILED only where the
    connector's lookup is authoritative and its settle delay has passed, MANUAL_REVIEW once
    the checks run out. Otherwise it checks again later (exponential backoff with jitter).
    Never sends anything to a source but reads. Its progress per item is on
    <p>.reconciliation-checks (compacted), so a restart resumes where it stopped. Serves its
    metrics and a health check (503 while the consumer holds no assignment).
    """
    from streams.reconcile import run_reconcile, status_address
    from streams.reconcilers import ReconcilersFile, load

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # one line per check would drown the log, and a URL may carry a looked-up reference
    logging.getLogger("httpx").setLevel(logging.WARNING)
    path = reconcilers or os.environ.get("VIGIL_RECONCILERS_FILE") or None
    conf = load(path) if path else ReconcilersFile()
    s = settings_from_flags(bootstrap, registry)
    run_reconcile(s, codec_for(s), conf, status_address(health_host, health_port))
