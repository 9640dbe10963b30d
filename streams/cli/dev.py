"""``vigil dev``: run a local Kafka broker and schema registry without Docker.

Mounted by ``streams/cli/main.py`` as the ``dev`` sub-command. The work is done by
``streams.local.stack``; this module only turns it into commands with readable output.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from streams.local import stack as localstack

dev_app = typer.Typer(
    name="dev",
    help=(
        "Run a local Apache Kafka broker and Apicurio schema registry for development and "
        "tests, without Docker. The jars are fetched once from Maven Central (needs mvn and "
        "Java 17+) into $VIGIL_CACHE_DIR (default ~/.cache/vigil); data, logs and pid files "
        "live in $VIGIL_DEV_STATE_DIR (default <cache>/dev). Ports: $VIGIL_DEV_KAFKA_PORT "
        "(default 19092, controller on the next port; with --brokers 3, brokers on 19092, "
        "19094 and 19096) and $VIGIL_DEV_REGISTRY_PORT (default 18081)."
    ),
    no_args_is_help=True,
)

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _show_progress() -> None:
    """Print localstack's progress (downloads, starts) on stderr; a cold start takes a while."""
    logger = logging.getLogger("vigil.localstack")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=err_console, show_path=False, show_time=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


@dev_app.command()
def up(
    reset: Annotated[
        bool,
        typer.Option(
            "--reset",
            help="Stop both services and delete all their data (topics, offsets, schemas) "
            "before starting: a clean cluster.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to wait for each service to answer (downloads not counted); for a "
            "broker, seconds without a line logged: one recovering its data after a crash "
            "keeps logging and is waited for up to 30 minutes."
        ),
    ] = 120.0,
    brokers: Annotated[
        int | None,
        typer.Option(
            help="Brokers of the cluster: 1, or 3 (or 5) KRaft nodes, each broker and "
            "controller, in JVMs of 384 MiB; topics then get 3 replicas and "
            "min.insync.replicas 2. A state dir keeps the size it was made with (changing it "
            "needs --reset). [default: what the state dir holds, 1 when fresh]"
        ),
    ] = None,
) -> None:
    """Start the broker(s) and the registry, or do nothing if they already run and answer.

    Prints the environment variables that point vigil (and the tests) at this cluster.
    """
    _show_progress()
    try:
        settings = replace(localstack.Settings.from_env(), brokers=brokers)
        cluster = localstack.up(reset=reset, timeout=timeout, settings=settings)
    except localstack.LocalStackError as exc:
        _fail("up", exc)
    console.print(f"export KAFKA_BOOTSTRAP_SERVERS={cluster.bootstrap_servers}", highlight=False)
    console.print(f"export SCHEMA_REGISTRY_URL={cluster.schema_registry_url}", highlight=False)


@dev_app.command()
def down(
    wipe: Annotated[
        bool,
        typer.Option(
            "--wipe",
            help="Also delete all data (topics, offsets, schemas). Downloads are kept.",
        ),
    ] = False,
) -> None:
    """Stop the broker and the registry (SIGTERM, then SIGKILL after 30 s). Data is kept."""
    _show_progress()
    try:
        if wipe:
            localstack.wipe()
        else:
            localstack.down()
    except localstack.LocalStackError as exc:
        _fail("down", exc)


@dev_app.command()
def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")
    ] = False,
) -> None:
    """Show pid, running, answering and address of each service (of each broker of a
    cluster).

    Exits 0 when both services answer, 1 otherwise, so scripts can test it.
    """
    report = localstack.status()
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        table = Table(title="vigil dev cluster")
        for column in ("service", "pid", "running", "answering", "address"):
            table.add_column(column, overflow="fold")
        for service, info in report.items():
            table.add_row(
                service,
                str(info["pid"] or "-"),
                _yes_no(info["running"]),
                _yes_no(info["answering"]),
                info["address"],
            )
        console.print(table)
        for service, info in report.items():
            console.print(f"[dim]{service} log: {info['log']}[/dim]", highlight=False)
    if not all(info["answering"] for info in report.values()):
        raise typer.Exit(1)


def _fail(command: str, exc: Exception) -> NoReturn:
    # The message carries log and Maven output with brackets: print it without markup.
    err_console.print(f"[red]vigil dev {command} failed:[/red]")
    err_console.print(str(exc), markup=False, highlight=False)
    raise typer.Exit(1)


def _yes_no(value: bool) -> str:
    return "[green]yes[/green]" if value else "[red]no[/red]"
