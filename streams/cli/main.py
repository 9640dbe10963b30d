"""The ``vigil`` command line.

Every command reads its connection settings from the environment (see ``vigil config``) and
accepts flags that override them. Without ``KAFKA_BOOTSTRAP_SERVERS``, commands that need a
cluster use the local one that ``vigil dev up`` starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from streams.cli.errors import (
    EXIT_CODES_HELP,
    BadArgument,
    BadInput,
    KafkaUnreachable,
    ServiceUnreachable,
    UnknownTopic,
    explain,
    one_line,
)
from streams.cli.options import BootstrapOpt, RegistryOpt, codec_for, settings_from_flags
from streams.settings import Settings

#: seconds the CLI waits for the broker's metadata before it says the broker is unreachable
CONNECT_TIMEOUT = 10.0


class _ErrorBoundary(TyperGroup):
    """The CLI's one error boundary: any exception a command lets through becomes one line on
    stderr and the exit code of its kind (``streams.cli.errors.explain``); the traceback only
    with ``vigil --debug``. Usage errors, exits and Ctrl-C keep click's own handling."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.TyperException, typer.Abort):
            raise
        except BrokenPipeError:
            # the reader went away (vigil consume … | head): not an error of vigil's
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except (Exception, KeyboardInterrupt) as exc:
            explained = explain(exc)
            if _debug():
                traceback.print_exception(exc)
            typer.echo(f"error: {one_line(explained.message)}", err=True)
            raise typer.Exit(int(explained.code)) from None


app = typer.Typer(
    name="vigil",
    help=(
        "vigil watches the event streams of AI-agent executions and publishes what is really "
        "going on: execution states, operation effects (UNKNOWN is never FAILED), approval-wait "
        "verdicts, reconciliation work and alerts."
    ),
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    cls=_ErrorBoundary,
    # Help texts are plain text: rich markup would eat "[default: …]" and any other brackets.
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


@app.callback()
def _global_options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="On an error, also print the traceback and the Kafka client's own logs.",
        ),
    ] = False,
) -> None:
    """Options of every command: run before each (the error boundary reads them too)."""
    _options["debug"] = debug


#: the global options of the current invocation
_options: dict[str, bool] = {"debug": False}


def _debug() -> bool:
    return _options["debug"]


def _quiet() -> dict[str, Any]:
    """librdkafka settings of CLI clients: its own logs only with --debug (the CLI says what
    went wrong in one line)."""
    return {} if _debug() else {"log_level": 0}


def _duration_option(option: str, text: str | None) -> timedelta | None:
    from streams.durations import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise BadArgument(f"{option}: {exc}") from None


def _catalogue_topic(settings: Settings, name: str):  # type: ignore[no-untyped-def]
    """The catalogue's spec of topic ``name``, or ``UnknownTopic`` listing the catalogue."""
    from streams.kafka.topics import Topics

    specs = Topics.from_settings(settings).all()
    for spec in specs:
        if spec.name == name:
            return spec
    raise UnknownTopic(name, [t.name for t in specs], "not in vigil's catalogue")


def _require_cluster(settings: Settings, *, inputs: bool = False) -> None:
    """One metadata request before any work: an unreachable broker, or (``inputs``) an input
    topic not created, is said in one line at once, where the Kafka client would retry and
    log for its whole timeout."""
    from streams.cli.consume import cluster_topics, require_topics
    from streams.kafka.topics import Topics

    existing = cluster_topics(settings, timeout=CONNECT_TIMEOUT, debug=_debug())
    if inputs:
        names = [t.name for t in Topics.from_settings(settings).inputs()]
        require_topics(settings, names, existing)


topics_app = typer.Typer(help="Create and inspect the topic catalogue.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")

console = Console(stderr=True, soft_wrap=True)
out = Console()

_mounted = False


def _mount_optional() -> None:
    """Sub-commands that live in their own modules (mounted once, lazily: importing the CLI
    stays cheap)."""
    global _mounted
    if _mounted:
        return
    _mounted = True
    from streams.audit import audit
    from streams.cli.dev import dev_app

    app.add_typer(dev_app, name="dev")
    app.command("audit")(audit)  # its help: the docstring (the --at boundary included)
    from streams.cli.api import status, watch

    app.command("status")(status)
    app.command("watch")(watch)
    from streams.cli.alert_bridge import alert_bridge

    app.command("alert-bridge")(alert_bridge)
    from streams.cli.reconcile import reconcile

    app.command("reconcile")(reconcile)
    from streams.cli.schemas import schemas_app

    app.add_typer(schemas_app, name="schemas")
    from streams.cli.asyncapi import asyncapi

    app.command("asyncapi")(asyncapi)


@app.command("config")
def config_cmd(bootstrap: BootstrapOpt = None, registry: RegistryOpt = None) -> None:
    """Print the effective settings (secrets masked), durations as they are written (24h)."""
    s = settings_from_flags(bootstrap, registry)
    shown = s.public()
    retention_ms = shown.pop("retention_ms", None)
    if retention_ms is not None:
        # Shown under the variable's name, as it is written: forever or a duration.
        shown["retention"] = "forever" if retention_ms < 0 else timedelta(milliseconds=retention_ms)
    out.print_json(json.dumps(shown, default=_json_value))


def _json_value(value: Any) -> Any:
    from streams.durations import format_duration

    return format_duration(value) if isinstance(value, timedelta) else str(value)


@topics_app.command("create")
def topics_create(
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
    output_suffix: Annotated[
        str, typer.Option(help="Suffix for output topic names (a replay's own set).")
    ] = "",
    partitions: Annotated[
        int | None, typer.Option(help="Partitions (env VIGIL_PARTITIONS, 6).")
    ] = None,
) -> None:
    """Create every topic of the catalogue (idempotent) and register vigil's schemas under
    their subjects, each set to BACKWARD_TRANSITIVE (as `vigil schemas register`; the
    registry's global config is left alone)."""
    from streams.cli.schemas import print_subjects
    from streams.kafka.admin import create_topics, prepare_registry

    s = settings_from_flags(
        bootstrap, registry, output_suffix=output_suffix or None, partitions=partitions
    )
    _require_cluster(s)
    outcomes = create_topics(s)
    subjects = prepare_registry(s, codec_for(s))
    t = Table("topic", "outcome")
    for o in outcomes:
        t.add_row(o.name, o.detail)
    out.print(t)
    print_subjects(subjects)


@topics_app.command("rekey")
def topics_rekey(
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be written; write nothing.")
    ] = False,
) -> None:
    """Carry the compacted operation-state topic over to scoped keys (execution_id/operation_id),
    once, when upgrading from a version that keyed it by operation id: each operation's last
    state under an old key is written again under its scoped key (unless one is there), then
    each old key gets a tombstone. Run it with the old workers stopped, before the new ones
    start; running it again finds nothing to do (topology.md, "Moving to scoped keys")."""
    from streams.kafka.rekey import rekey

    s = settings_from_flags(bootstrap, registry)
    _require_cluster(s)
    done = rekey(s, codec_for(s), dry_run=dry_run)
    out.print_json(json.dumps(done.summary() | {"dry_run": dry_run}))


@topics_app.command("list")
def topics_list(
    output_suffix: Annotated[
        str, typer.Option(help="Suffix of the output topic names (a replay's set: -replay).")
    ] = "",
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print a JSON array (name, role, key, records, partitions, cleanup, "
            "retention, retention_ms, doc) instead of a table.",
        ),
    ] = False,
) -> None:
    """Print the catalogue: name, key, record types, partitions, cleanup, retention.

    Retention is "forever" for VIGIL_RETENTION_MS=-1 (the default) and "-" for compacted
    topics, which keep the latest record of every key."""
    from streams.durations import format_duration
    from streams.kafka.topics import Topics

    s = settings_from_flags(output_suffix=output_suffix or None)
    rows = []
    for spec in Topics.from_settings(s).all():
        compact = spec.cleanup_policy == "compact"
        rows.append(
            {
                "name": spec.name,
                "role": str(spec.role),
                "key": spec.key,
                "records": [m.avro_name for m in spec.value_types],
                "partitions": spec.partitions,
                "cleanup": spec.cleanup_policy,
                "retention": None
                if compact
                else "forever"
                if spec.retention_ms < 0
                else format_duration(timedelta(milliseconds=spec.retention_ms)),
                "retention_ms": None if compact else spec.retention_ms,
                "doc": spec.doc,
            }
        )
    if json_output:
        print(json.dumps(rows, indent=2))
        return
    t = Table("topic", "role", "key", "records", "partitions", "cleanup", "retention")
    for row in rows:
        t.add_row(
            row["name"],
            row["role"],
            row["key"],
            ", ".join(row["records"]),
            str(row["partitions"]),
            row["cleanup"],
            row["retention"] or "-",
        )
    out.print(t)


@app.command("produce")
def produce(
    topic: Annotated[str, typer.Argument(help="Topic name, e.g. vigil.execution-status.")],
    file: Annotated[Path, typer.Argument(help="JSON Lines; '-' for stdin.", allow_dash=True)],
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad", help="Publish the valid lines even if some are bad (each reported)."
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check the file only: publish nothing, need no cluster."),
    ] = False,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Produce JSON lines as Avro records: all of them, or none.

    Each line is one record; "type" names the record type (it may be left out when the topic
    carries one type besides clock ticks). The key is the record's execution id; the
    timestamp its event time. A ClockTick line goes to the partition its "partition" field
    names (it has no key).

    The whole file is checked before anything is sent: each bad line is reported with its
    number and field, and then nothing is published (exit 4) unless --skip-bad. Samples for
    every input topic: streams/samples/<topic>.jsonl.
    """
    from streams.cli.consume import cluster_topics, require_topics
    from streams.cli.produce import check_lines, read_lines
    from streams.kafka.clients import DeliveryFailed, RecordProducer

    s = settings_from_flags(bootstrap, registry)
    spec = _catalogue_topic(s, topic)
    checked = check_lines(read_lines(file), spec)
    shown = 100
    for problem in checked.problems[:shown]:
        typer.echo(f"{file}: {problem}", err=True)
    if len(checked.problems) > shown:
        typer.echo(f"{file}: … {len(checked.problems) - shown} more bad lines", err=True)
    good, bad = len(checked.records), len(checked.problems)
    if bad and not skip_bad:
        raise BadInput(
            f"{bad} bad line{'s' if bad > 1 else ''} in {file}: nothing published "
            f"(--skip-bad publishes the {good} valid ones)"
        )
    skipped = f", {bad} bad lines skipped" if bad else ""
    if dry_run:
        typer.echo(f"{good} valid records for {topic}{skipped}; dry run: nothing published")
        return
    require_topics(s, [topic], cluster_topics(s, timeout=CONNECT_TIMEOUT, debug=_debug()))
    producer = RecordProducer(s, codec_for(s), **_quiet())
    for _, record in checked.records:
        producer.send(topic, record)
    try:
        producer.flush()
    except DeliveryFailed as exc:
        raise KafkaUnreachable(f"the broker refused {len(exc.failed)} records: {exc}") from None
    except RuntimeError as exc:
        raise KafkaUnreachable(f"{exc} (broker {s.bootstrap_servers})") from None
    typer.echo(f"produced {good} records to {topic}{skipped}", err=True)


@app.command("consume")
def consume_cmd(
    topic: Annotated[list[str], typer.Argument(help="One or more topic names.")],
    from_beginning: Annotated[
        bool,
        typer.Option("--from-beginning", help="Start at the earliest offset instead of the end."),
    ] = False,
    offset: Annotated[
        str | None,
        typer.Option(
            "--offset",
            "-o",
            metavar="OFFSET",
            help="Where each partition starts: beginning, end, N (that offset) or -N (its last "
            "N records).",
        ),
    ] = None,
    from_time: Annotated[
        str | None,
        typer.Option(
            "--from-time",
            metavar="TIME",
            help="Start at the first record at or after TIME: ISO-8601 with a timezone, or a "
            "duration ago (10m). Record timestamps are event times.",
        ),
    ] = None,
    partition: Annotated[
        list[int] | None,
        typer.Option("--partition", "-p", help="Read only this partition (repeatable)."),
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only records with this key.")] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            "-H",
            metavar="NAME=VALUE",
            help="Only records with this header value, e.g. owner=RUNTIME_OWNER (repeatable: "
            "all must match).",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep reading until Ctrl-C, however long it is idle."),
    ] = False,
    max_records: Annotated[
        int | None, typer.Option("--max", help="Stop after N records (that pass the filters).")
    ] = None,
    idle: Annotated[
        float, typer.Option(help="Stop after this many seconds without records.")
    ] = 5.0,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Read Avro records and print them as JSON lines (with topic, partition, offset, key).

    Starts at the end of each partition (only new records) unless --from-beginning, --offset
    or --from-time says otherwise; stops after --idle seconds without records, or never with
    --follow. Reads without a consumer group: nobody's offsets move.
    """
    from streams.cli.consume import parse_header_filters, read, start_from

    when = None
    if from_time is not None:
        # an ISO time has "-" and ":" in it; a duration ago has neither
        if "-" in from_time or ":" in from_time:
            when = _parse_time(from_time)
        else:
            when = datetime.now(UTC) - (_duration_option("--from-time", from_time) or timedelta())
    start = start_from(from_beginning=from_beginning, offset=offset, from_time=when)
    filters = parse_header_filters(header or [])
    s = settings_from_flags(bootstrap, registry)
    records = read(
        s,
        codec_for(s),
        topic,
        start=start,
        partitions=partition or [],
        follow=follow,
        max_records=max_records,
        idle_timeout=idle,
        key_filter=key,
        header_filters=filters,
        connect_timeout=CONNECT_TIMEOUT,
        debug=_debug(),
    )
    try:
        _print_records(records)
    except KeyboardInterrupt:
        if not follow:
            raise


def _print_records(records: Any) -> None:
    for r in records:
        line: dict[str, Any] = {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "key": r.key,
            "timestamp": datetime.fromtimestamp(r.timestamp_ms / 1000, UTC).isoformat(),
        }
        if r.headers:
            line["headers"] = r.headers
        if r.record is not None:
            line["type"] = r.record.avro_name
            line["value"] = r.record.model_dump(mode="json")
        else:
            line["error"] = r.error
        print(json.dumps(line), flush=True)


@app.command("worker")
def worker(
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
    web_port: Annotated[
        int | None, typer.Option(help="HTTP port (env VIGIL_WEB_PORT, 6066).")
    ] = None,
    web_host: Annotated[
        str | None, typer.Option(help="Bind address (env VIGIL_WEB_HOST, 127.0.0.1).")
    ] = None,
    store: Annotated[
        str | None, typer.Option(help="Table store: memory:// or rocksdb:// (env VIGIL_STORE).")
    ] = None,
    data_dir: Annotated[
        str | None, typer.Option(help="Worker data dir (env VIGIL_DATA_DIR).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(help="Input records per batch at most (env VIGIL_BATCH_SIZE, 1000)."),
    ] = None,
    batch_wait: Annotated[
        str | None,
        typer.Option(help="Longest wait to fill a batch (env VIGIL_BATCH_WAIT, 20ms)."),
    ] = None,
    fetch_min_bytes: Annotated[
        int | None,
        typer.Option(
            help="Caught up, a fetch waits for this many bytes (env VIGIL_FETCH_MIN_BYTES, "
            "16384; 1: always answer at once). Under a backlog fetches ask for one byte."
        ),
    ] = None,
    fetch_max_wait: Annotated[
        str | None,
        typer.Option(help="...or for this long (env VIGIL_FETCH_MAX_WAIT, 25ms)."),
    ] = None,
    state_cache_mb: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="MiB of execution entries kept decoded between batches, estimated, and as "
            "much again of the claims join's books (env VIGIL_STATE_CACHE_MB, 8; 0: none). "
            "Fixed, whatever the executions in flight.",
        ),
    ] = None,
    loglevel: Annotated[
        str,
        typer.Option(
            help="Log level (debug also shows mode's timer-drift lines: under a backlog, one"
            " a second or more)."
        ),
    ] = "info",
) -> None:
    """Run a stream-processing worker (Faust). Stop with Ctrl-C or SIGTERM."""
    from streams.app import run_worker

    s = settings_from_flags(
        bootstrap,
        registry,
        web_port=web_port,
        web_host=web_host,
        store=store,
        data_dir=data_dir,
        batch_size=batch_size,
        batch_wait=_duration_option("--batch-wait", batch_wait),
        fetch_min_bytes=fetch_min_bytes,
        fetch_max_wait=_duration_option("--fetch-max-wait", fetch_max_wait),
        state_cache_mb=state_cache_mb,
    )
    run_worker(s, loglevel=loglevel)


@app.command("ticker")
def ticker(
    interval: Annotated[
        str | None, typer.Option(help="Tick interval (env VIGIL_TICK_INTERVAL, 1s).")
    ] = None,
    count: Annotated[
        int | None, typer.Option(help="Stop after N rounds (default: forever).")
    ] = None,
    health_host: Annotated[
        str | None,
        typer.Option(
            help="Bind address of /metrics and /healthz (env VIGIL_TICKER_HOST, 127.0.0.1)."
        ),
    ] = None,
    health_port: Annotated[
        int | None,
        typer.Option(help="Port of /metrics and /healthz (env VIGIL_TICKER_PORT, 6068; 0: none)."),
    ] = None,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Write clock ticks into every partition of every input topic.

    Wall-clock time enters the log as data, so quiet partitions still time out and replays
    see the same time. Serves its metrics and a health check (503 when no round of ticks was
    delivered for 5 intervals).
    """
    from streams.ticker import health_address, run_ticker

    s = settings_from_flags(
        bootstrap, registry, tick_interval=_duration_option("--interval", interval)
    )
    _require_cluster(s, inputs=True)
    run_ticker(s, codec_for(s), count=count, health=health_address(health_host, health_port))


@app.command("tick")
def tick(
    at: Annotated[
        str,
        typer.Argument(
            metavar="TIME", help="Event time of the ticks, ISO-8601 with a timezone (UTC: Z)."
        ),
    ],
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Write one clock tick at TIME into every partition of every input topic.

    The record `vigil ticker` writes, at the time given instead of now: it closes a backfill
    of historical events without the wall-clock ticker. Once every input of a partition has
    reached TIME, every event and every decision due before TIME is taken; one stamped
    exactly TIME waits for time to pass it (a later tick or event), as live.
    Example: vigil tick 2026-07-26T16:30:00Z
    """
    from streams.ticker import tick_once

    when = _parse_time(at)
    s = settings_from_flags(bootstrap, registry)
    _require_cluster(s, inputs=True)
    written = tick_once(s, codec_for(s), when)
    console.print(f"wrote {written} ticks at {when.isoformat()}")


def _parse_time(value: str) -> datetime:
    """An ISO-8601 time with a timezone, or a usage error (exit code 2)."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO-8601 time: {value!r}") from exc
    if parsed.tzinfo is None:
        raise typer.BadParameter("give a timezone, e.g. 2026-07-26T16:30:00Z")
    return parsed


@app.command("replay")
def replay(
    start: Annotated[
        str, typer.Option("--from", help="Replay input records from this time (ISO-8601, UTC).")
    ],
    end: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Replay up to and including this time: records stamped at it are read and "
            "every decision due at or before it is taken (events first at equal times), so "
            "the last verdicts are those of `vigil audit --at` this time. With "
            "VIGIL_ALLOWED_LATENESS, records up to that much later are read too (an event "
            "stamped before the end may be written that late and still count).",
        ),
    ] = None,
    output_suffix: Annotated[
        str, typer.Option(help="Suffix of the output topics written.")
    ] = "-replay",
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="VIGIL_REPLAY_PROCESSES",
            help="Processes sharing the partitions (at most one per partition). Only one "
            "process joins blind retries across executions, so more give a faster replay "
            "without that join.",
        ),
    ] = None,
) -> None:
    """Re-process the input topics from a time, with fresh state, into separate output topics.

    The same processor as the worker, so the outputs equal the live run's: same ids, same
    contents, same order per key. One process by default, which also joins blind retries
    across executions; --processes N shares the partitions among N processes, faster but
    without that join. Ends with a summary.

    With --to T the range is [--from, T]: an answer stamped T counts and a deadline due at T
    (an expiry, a grace period) is reached, the answer first, as `vigil audit --at T` judges.
    Nothing after T is read or stamped.
    """
    from datetime import datetime as dt

    from streams.replay import default_processes, run_replay

    s = settings_from_flags(bootstrap, registry)
    try:
        t0 = dt.fromisoformat(start.replace("Z", "+00:00"))
        t1 = dt.fromisoformat(end.replace("Z", "+00:00")) if end else None
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO-8601 time: {exc}") from exc
    if t0.tzinfo is None or (t1 is not None and t1.tzinfo is None):
        raise typer.BadParameter("times need a timezone, e.g. 2026-07-26T16:00:00Z")
    from streams.app import tune_gc

    _require_cluster(s, inputs=True)
    tune_gc()
    summary = run_replay(
        s,
        codec_for(s),
        t0,
        t1,
        output_suffix=output_suffix,
        show_progress=progress,
        processes=processes or default_processes(s),
    )
    t = Table("replay", "")
    t.add_row("records read", str(summary.records_read))
    t.add_row("outputs written", str(summary.outputs_written))
    for topic, n in sorted(summary.outputs_by_topic.items()):
        t.add_row(f"  {topic}", str(n))
    t.add_row("anomalies", str(summary.anomalies))
    t.add_row("dead letters", str(summary.dead_letters))
    t.add_row("held past the last watermark", str(summary.held))
    t.add_row(
        "blind retries across executions",
        f"joined: {summary.retry_links} retry links"
        if summary.joined
        else "not joined (the join needs every partition in one process: --processes 1)",
    )
    t.add_row("processes", str(summary.processes))
    t.add_row("time taken", f"{summary.seconds:.1f} s")
    rate = summary.records_read / summary.seconds if summary.seconds else 0.0
    t.add_row("rate", f"{rate:,.0f} records/s")
    out.print(t)


@app.command("console")
def console_cmd(
    host: Annotated[
        str | None, typer.Option(help="Bind address (env VIGIL_CONSOLE_HOST, 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="HTTP port (env VIGIL_CONSOLE_PORT, 6080).")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            help="SQLite file of the view (env VIGIL_CONSOLE_DB, <data dir>/console.sqlite3);"
            " a cache: delete it and the console rebuilds it from the topics."
        ),
    ] = None,
    data_dir: Annotated[str | None, typer.Option(help="Data dir (env VIGIL_DATA_DIR).")] = None,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Run the operator console: reads vigil's output topics into its own SQLite view and
    serves fleet-wide queries as JSON (and the page, when installed). Each replica reads
    every partition and keeps its own view. Stop with Ctrl-C or SIGTERM."""
    from streams.console.server import run
    from streams.console.settings import ConsoleSettings

    s = settings_from_flags(bootstrap, registry, data_dir=data_dir)
    run(s, ConsoleSettings.from_env(s, host=host, port=port, db=db))


@app.command("review")
def review_cmd(
    operation_id: Annotated[str, typer.Argument(help="Operation id.")],
    execution: Annotated[
        str | None,
        typer.Option(
            "--execution",
            help="The operation's execution id. Operation ids repeat across executions: "
            "without it the console answers only while one execution uses that id.",
        ),
    ] = None,
    take: Annotated[bool, typer.Option("--take", help="Take it into MANUAL_REVIEW.")] = False,
    verified: Annotated[
        bool, typer.Option("--verified", help="Settle it VERIFIED: the effect happened.")
    ] = False,
    failed: Annotated[
        bool, typer.Option("--failed", help="Settle it FAILED: the effect did not happen.")
    ] = False,
    note: Annotated[str, typer.Option(help="What the source says (required).")] = "",
    reviewer: Annotated[str, typer.Option(help="Who you are (required).")] = "",
    attempt: Annotated[
        int | None, typer.Option(help="The attempt to review (default: the latest).")
    ] = None,
    console_url: Annotated[
        str, typer.Option("--console", envvar="VIGIL_CONSOLE_URL", help="The console's address.")
    ] = "http://127.0.0.1:6080",
) -> None:
    """Record what the source says about an operation, through the console: publishes one
    OperationEvent from a human source, which the pipeline applies like any other fact.
    Needs the console's write token in VIGIL_CONSOLE_WRITE_TOKEN (exit 3 when it is not set).
    Refused (exit 1) when the token is wrong, the operation is not known or the pipeline would
    not apply it, e.g. settling an operation already VERIFIED; exit 2 for a bad argument
    (an --console that is not an http(s) address), 8 when the console cannot be reached."""
    import os
    from urllib.parse import quote

    import httpx

    from streams.cli.api import required_id, service_url
    from streams.cli.errors import BadSetting, refused_by

    actions = [a for a, on in (("take", take), ("verified", verified), ("failed", failed)) if on]
    if len(actions) != 1:
        raise BadArgument("give exactly one of --take, --verified, --failed")
    if not note.strip() or not reviewer.strip():
        raise BadArgument("--note and --reviewer are required")
    base = service_url("--console", console_url)
    op = quote(required_id("operation id", operation_id), safe="")
    token = os.environ.get("VIGIL_CONSOLE_WRITE_TOKEN")
    if not token:
        raise BadSetting(
            "VIGIL_CONSOLE_WRITE_TOKEN is not set: reviews need the console's write token"
        )
    if execution is not None:
        scoped = quote(required_id("--execution", execution), safe="")
        url = f"{base}/api/executions/{scoped}/operations/{op}/review"
    else:
        url = f"{base}/api/operations/{op}/review"
    body = {"action": actions[0], "note": note, "reviewer": reviewer, "attempt": attempt}
    try:
        resp = httpx.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except httpx.HTTPError as exc:
        raise ServiceUnreachable(f"cannot reach the console at {console_url}: {exc}") from None
    try:
        answer = resp.json()
    except ValueError:
        answer = {"error": resp.text[:300]}
    if resp.status_code >= 400 or not isinstance(answer, dict):
        message = answer.get("error", resp.text[:300]) if isinstance(answer, dict) else answer
        raise refused_by(f"the console at {console_url}", resp.status_code, str(message))
    out.print(
        f"{answer.get('kind')} of {operation_id} attempt {answer.get('attempt')}: "
        f"{answer.get('message')} (event {answer.get('event_id')})",
        highlight=False,
    )


@app.command("demo")
def demo(
    pace: Annotated[float, typer.Option(help="Seconds of real time per scenario minute.")] = 0.15,
    keep: Annotated[
        bool, typer.Option(help="Leave the local broker and registry running.")
    ] = False,
    serve: Annotated[
        bool,
        typer.Option(
            help="After the scenario, keep worker, console and a wall-clock ticker running "
            "until Ctrl-C (--no-serve: stop at once)."
        ),
    ] = True,
    agent: Annotated[
        str | None,
        typer.Option(
            help="Instead of the scenario, play a real agent of this framework (scripted, "
            "offline) through its vigil adapter: langgraph, openai-agents or mcp (needs "
            "pip install 'vigil[FRAMEWORK]')."
        ),
    ] = None,
) -> None:
    """Run the main job on the bundled scenario, live.

    Starts the local broker and registry (unless KAFKA_BOOTSTRAP_SERVERS is set), creates
    topics, runs a worker and the operator console, plays the reference audit, a connector
    timeout reconciled later, a forbidden retry and a normal execution (moved in time to end
    now), and shows verdicts, work items and alerts as they arrive, in the order they took
    effect (a resolution names what it ends). Prints the worker API's
    address once the worker is ready; ends by printing the console's address (and a write
    token for manual review) and the worker API's again; Ctrl-C stops all it started.
    With --agent, a LangGraph graph, an OpenAI Agents SDK agent or an MCP client session runs
    instead and vigil judges its waits and tool calls.
    """
    from streams.local.agents import FRAMEWORKS
    from streams.local.demo import run_demo

    if agent is not None and agent not in FRAMEWORKS:
        raise typer.BadParameter(f"{agent!r}: one of {', '.join(FRAMEWORKS)}", param_hint="--agent")
    raise typer.Exit(run_demo(pace=pace, keep=keep, console=out, serve=serve, agent=agent))


def main() -> None:
    """The ``vigil`` entry point. Every command runs inside ``_ErrorBoundary``: what it raises
    leaves as one line and an exit code (``streams.cli.errors``), never as a traceback unless
    ``--debug``."""
    _mount_optional()
    app()


if __name__ == "__main__":
    main()
