"""The ``vigil`` command line.

Every command reads its connection settings from the environment (see ``vigil config``) and
accepts flags that override them. Without ``KAFKA_BOOTSTRAP_SERVERS``, commands that need a
cluster use the local one that ``vigil dev up`` starts.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from streams.settings import Settings

app = typer.Typer(
    name="vigil",
    help=(
        "vigil watches the event streams of AI-agent executions and publishes what is really "
        "going on: execution states, operation effects (UNKNOWN is never FAILED), approval-wait "
        "verdicts, reconciliation work and alerts."
    ),
    no_args_is_help=True,
    add_completion=False,
)
topics_app = typer.Typer(help="Create and inspect the topic catalogue.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")

console = Console(stderr=True)
out = Console()

BootstrapOpt = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap servers [default: 127.0.0.1:19092, the dev broker].",
    ),
]
RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry",
        envvar="SCHEMA_REGISTRY_URL",
        help="Schema registry URL (Confluent API) [default: the dev registry].",
    ),
]


def _settings(bootstrap: str | None = None, registry: str | None = None, **kw: Any) -> Settings:
    return Settings.from_env(bootstrap_servers=bootstrap, schema_registry_url=registry, **kw)


def _codec(settings: Settings):  # type: ignore[no-untyped-def]
    from streams.codec import AvroCodec, RegistryConfig

    return AvroCodec.connect(
        RegistryConfig(settings.schema_registry_url, settings.registry_basic_auth),
        auto_register=settings.auto_register,
    )


_mounted = False


def _mount_optional() -> None:
    """Sub-commands that live in their own modules (mounted once, lazily: importing the CLI
    stays cheap)."""
    global _mounted
    if _mounted:
        return
    _mounted = True
    from streams.audit import audit
    from streams.cli_dev import dev_app

    app.add_typer(dev_app, name="dev", help="Start, stop and inspect the local Kafka + registry.")
    app.command("audit")(audit)  # its help: the docstring (the --at boundary included)
    from streams.cli_api import status, watch

    app.command("status")(status)
    app.command("watch")(watch)
    from streams.cli_alert_bridge import alert_bridge

    app.command("alert-bridge")(alert_bridge)
    from streams.cli_schemas import schemas_app

    app.add_typer(schemas_app, name="schemas")


@app.command("config")
def config_cmd(bootstrap: BootstrapOpt = None, registry: RegistryOpt = None) -> None:
    """Print the effective settings (secrets masked)."""
    s = _settings(bootstrap, registry)
    out.print_json(json.dumps(s.public(), default=str))


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
    from streams.admin import create_topics, prepare_registry
    from streams.cli_schemas import print_subjects

    s = _settings(bootstrap, registry, output_suffix=output_suffix or None, partitions=partitions)
    outcomes = create_topics(s)
    subjects = prepare_registry(s, _codec(s))
    t = Table("topic", "outcome")
    for o in outcomes:
        t.add_row(o.name, o.detail)
    out.print(t)
    print_subjects(subjects)


@topics_app.command("list")
def topics_list(output_suffix: Annotated[str, typer.Option()] = "") -> None:
    """Print the catalogue: name, key, record types, partitions, cleanup, retention."""
    from streams.topics import Topics

    s = Settings.from_env(output_suffix=output_suffix or None)
    t = Table("topic", "role", "key", "records", "partitions", "cleanup", "retention")
    for spec in Topics.from_settings(s).all():
        ret = "-" if spec.cleanup_policy == "compact" else f"{spec.retention_ms // 86400000}d"
        t.add_row(
            spec.name,
            spec.role,
            spec.key,
            ", ".join(m.avro_name for m in spec.value_types),
            str(spec.partitions),
            spec.cleanup_policy,
            ret,
        )
    out.print(t)


@app.command("produce")
def produce(
    topic: Annotated[str, typer.Argument(help="Topic name, e.g. vigil.execution-status.")],
    file: Annotated[Path, typer.Argument(help="JSON Lines; '-' for stdin.", allow_dash=True)],
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Produce JSON lines as Avro records.

    Each line is one record; "type" names the record type when the topic carries several (it
    always may). The key is the record's execution id; the timestamp its event time. A
    ClockTick line goes to the partition its "partition" field names (it has no key).
    """
    from pydantic import ValidationError

    from streams.clients import RecordProducer
    from streams.models.events import ClockTick
    from streams.topics import Topics

    s = _settings(bootstrap, registry)
    spec = Topics.from_settings(s).by_name(topic)
    types = {m.avro_name: m for m in spec.value_types}
    default = [m for m in spec.value_types if m.avro_name != "ClockTick"]
    producer = RecordProducer(s, _codec(s))
    stream = sys.stdin if str(file) == "-" else file.open()
    sent = bad = 0
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            name = obj.pop("type", None) or (default[0].avro_name if len(default) == 1 else None)
            if name not in types:
                raise ValueError(f"type {name!r} does not belong on {topic}; one of {list(types)}")
            record = types[name].model_validate(obj)
            if isinstance(record, ClockTick) and not 0 <= record.partition < spec.partitions:
                raise ValueError(
                    f"ClockTick partition {record.partition} is out of range: {topic} has "
                    f"partitions 0..{spec.partitions - 1}"
                )
            producer.send(topic, record)
            sent += 1
        except (ValueError, ValidationError) as exc:
            bad += 1
            console.print(f"[red]line {n}:[/red] {exc}")
    producer.flush()
    console.print(f"produced {sent} records to {topic}" + (f", {bad} bad lines" if bad else ""))
    if bad:
        raise typer.Exit(2)


@app.command("consume")
def consume_cmd(
    topic: Annotated[list[str], typer.Argument(help="One or more topic names.")],
    from_beginning: Annotated[
        bool,
        typer.Option("--from-beginning", help="Start at the earliest offset instead of the end."),
    ] = False,
    max_records: Annotated[int | None, typer.Option("--max", help="Stop after N records.")] = None,
    idle: Annotated[
        float, typer.Option(help="Stop after this many seconds without records.")
    ] = 5.0,
    bootstrap: BootstrapOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Read Avro records and print them as JSON lines (with topic, partition, offset, key)."""
    from streams.clients import consume

    s = _settings(bootstrap, registry)
    for r in consume(
        s,
        _codec(s),
        topic,
        from_beginning=from_beginning,
        max_records=max_records,
        idle_timeout=idle,
    ):
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
        typer.Option(help="Input records per batch at most (env VIGIL_BATCH_SIZE, 5000)."),
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
    from streams.durations import parse_duration

    s = _settings(
        bootstrap,
        registry,
        web_port=web_port,
        web_host=web_host,
        store=store,
        data_dir=data_dir,
        batch_size=batch_size,
        batch_wait=parse_duration(batch_wait) if batch_wait else None,
        fetch_min_bytes=fetch_min_bytes,
        fetch_max_wait=parse_duration(fetch_max_wait) if fetch_max_wait else None,
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
    from streams.durations import parse_duration
    from streams.ticker import health_address, run_ticker

    s = _settings(bootstrap, registry, tick_interval=parse_duration(interval) if interval else None)
    run_ticker(s, _codec(s), count=count, health=health_address(health_host, health_port))


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
    s = _settings(bootstrap, registry)
    written = tick_once(s, _codec(s), when)
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
            "the last verdicts are those of `vigil audit --at` this time.",
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
            help="Processes sharing the partitions (default: one per core, at most one per "
            "partition).",
        ),
    ] = None,
) -> None:
    """Re-process the input topics from a time, with fresh state, into separate output topics.

    The same processor as the worker, so the outputs equal the live run's: same ids, same
    contents, same order per key. The partitions are shared among processes (one per core by
    default). Ends with a summary.

    With --to T the range is [--from, T]: an answer stamped T counts and a deadline due at T
    (an expiry, a grace period) is reached, the answer first, as `vigil audit --at T` judges.
    Nothing after T is read or stamped.
    """
    from datetime import datetime as dt

    from streams.replay import default_processes, run_replay

    s = _settings(bootstrap, registry)
    try:
        t0 = dt.fromisoformat(start.replace("Z", "+00:00"))
        t1 = dt.fromisoformat(end.replace("Z", "+00:00")) if end else None
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO-8601 time: {exc}") from exc
    if t0.tzinfo is None or (t1 is not None and t1.tzinfo is None):
        raise typer.BadParameter("times need a timezone, e.g. 2026-07-26T16:00:00Z")
    from streams.app import tune_gc

    tune_gc()
    summary = run_replay(
        s,
        _codec(s),
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
    from streams.console.service import run
    from streams.console.settings import ConsoleSettings

    s = _settings(bootstrap, registry, data_dir=data_dir)
    run(s, ConsoleSettings.from_env(s, host=host, port=port, db=db))


@app.command("review")
def review_cmd(
    operation_id: Annotated[str, typer.Argument(help="Operation id.")],
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
    Needs the console's write token in VIGIL_CONSOLE_WRITE_TOKEN. Refused (exit 1) when the
    pipeline would not apply it, e.g. settling an operation already VERIFIED."""
    import os

    import httpx

    actions = [a for a, on in (("take", take), ("verified", verified), ("failed", failed)) if on]
    if len(actions) != 1:
        console.print("[red]error:[/red] give exactly one of --take, --verified, --failed")
        raise typer.Exit(2)
    if not note.strip() or not reviewer.strip():
        console.print("[red]error:[/red] --note and --reviewer are required")
        raise typer.Exit(2)
    token = os.environ.get("VIGIL_CONSOLE_WRITE_TOKEN")
    if not token:
        console.print("[red]error:[/red] VIGIL_CONSOLE_WRITE_TOKEN is not set")
        raise typer.Exit(2)
    from urllib.parse import quote

    url = f"{console_url.rstrip('/')}/api/operations/{quote(operation_id, safe='')}/review"
    body = {"action": actions[0], "note": note, "reviewer": reviewer, "attempt": attempt}
    try:
        resp = httpx.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except httpx.HTTPError as exc:
        console.print(f"[red]error:[/red] cannot reach the console at {console_url}: {exc}")
        raise typer.Exit(2) from None
    try:
        answer = resp.json()
    except ValueError:
        answer = {"error": resp.text[:300]}
    if resp.status_code >= 400 or not isinstance(answer, dict):
        message = answer.get("error", resp.text[:300]) if isinstance(answer, dict) else answer
        console.print(f"[red]{resp.status_code}[/red] {message}")
        raise typer.Exit(1 if resp.status_code in (404, 409) else 2)
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
) -> None:
    """Run the main job on the bundled scenario, live.

    Starts the local broker and registry (unless KAFKA_BOOTSTRAP_SERVERS is set), creates
    topics, runs a worker and the operator console, plays the reference audit, a connector
    timeout reconciled later, a forbidden retry and a normal execution (moved in time to end
    now), and shows verdicts, work items and alerts as they arrive. Ends by printing the
    console's address (and a write token for manual review); Ctrl-C stops all it started.
    """
    from streams.demo import run_demo

    raise typer.Exit(run_demo(pace=pace, keep=keep, console=out, serve=serve))


def main() -> None:
    _mount_optional()
    app()


if __name__ == "__main__":
    main()
