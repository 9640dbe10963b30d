"""``vigil demo``: the whole pipeline on the bundled scenario, live in the terminal.

It starts (unless a cluster is configured) the local broker and registry, creates a fresh set
of topics, starts a worker process, and plays the scenario — the reference audit of six
approval requests, an SMS whose connector never answers and is later reconciled, a refund
retried while its first attempt is unanswered, and an ordinary execution to completion —
with the scenario's own clock ticks, paced so the outputs arrive as they would live, each
line of the feed in the order the outputs took effect (``Feed``). The scenario is moved in time
so that it ends now. It also starts ``vigil console`` on the same
topics; once the scenario is played and the console has caught up, the demo prints the
console's address and keeps worker, console and a wall-clock ticker running (time goes on, and
a review made on the page is applied within a second) until Ctrl-C, which stops everything it
started (``--no-serve``: stop at once instead). ``vigil reconcile`` runs too, once the scenario
is played (its facts carry the wall clock's time, which would make the rest of the scenario
late), against a bundled payments provider (``streams/local/provider.py``) that holds the
refund the scenario leaves UNKNOWN: the demo shows it settled VERIFIED by the reconciler,
with no person involved.

``--agent FRAMEWORK`` plays, instead of the scenario, a real agent of that framework (scripted
and offline, ``streams.local.agents``) recording through its vigil adapter, so the verdicts
shown are vigil judging a LangGraph, OpenAI Agents SDK or MCP run.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streams.contracts.codec import AvroCodec, RegistryConfig
from streams.contracts.models.base import Record
from streams.contracts.models.enums import WorkItemKind
from streams.contracts.models.outputs import (
    Alert,
    Anomaly,
    ApprovalVerdict,
    DeadLetter,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.kafka.admin import create_topics, prepare_registry
from streams.kafka.clients import RecordProducer, consume
from streams.kafka.topics import Topics
from streams.local import stack as localstack
from streams.local.provider import Provider, reconcilers_toml
from streams.local.scenario import REFERENCE_AT, Tick, demo_scenario, shifted
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def describe(
    record: Record,
    work_items: Mapping[str, ReconciliationWorkItem] | None = None,
    alerts: Mapping[str, Alert] | None = None,
) -> tuple[str, str, str, str] | None:
    """(time, what, subject, detail) for a terminal line; None for records not shown live.

    ``work_items`` (the work items seen so far, by id) lets a resolution name what it ends:
    the attempt's UNKNOWN (a reply timeout) or overdue verification, not only the outcome
    that settled it; ``alerts`` (the FIRING alerts seen so far, by id) lets a RESOLVED alert
    name the alert it ends (its kind, the verdict that fired it, when), then what it moved to
    and why."""
    match record:
        case ApprovalVerdict():
            detail = f"{record.verdict} → {record.owner}: {record.next_step}"
            return _t(record.evaluated_at), "verdict", record.request_id, detail
        case ReconciliationWorkItem():
            return (
                _t(record.created_at),
                "work item",
                record.operation_id,
                f"{record.kind}: reconcile against the source, never retry blindly",
            )
        case WorkItemResolution():
            item = (work_items or {}).get(record.work_item_id)
            ended = (
                f"{_ENDS.get(item.kind, str(item.kind))} ({item.kind} work item)"
                if item is not None
                else f"work item {record.work_item_id}"
            )
            return (
                _t(record.resolved_at),
                "resolved",
                record.operation_id,
                f"ends attempt {record.attempt}'s {ended}: settled {record.outcome} "
                f"by {record.evidence_source}",
            )
        case Alert() if record.status == "RESOLVED":
            fired = (alerts or {}).get(record.resolves_alert_id or "")
            ended = (
                f"{fired.severity} {fired.kind} {fired.verdict or ''} fired {_t(fired.occurred_at)}"
                if fired is not None
                else f"{record.kind} alert {record.resolves_alert_id}"
            )
            return (
                _t(record.occurred_at),
                "alert resolved",
                record.subject_id,
                f"ends the {ended} → {record.verdict or '-'}: {record.next_step}",
            )
        case Alert():
            return (
                _t(record.occurred_at),
                f"alert {record.status.lower()}",
                record.subject_id,
                f"{record.severity} {record.kind} {record.verdict or ''} → {record.owner}",
            )
        case OperationState():
            return (
                _t(record.since),
                "operation",
                record.operation_id,
                f"{record.status} (retry: {record.retry})"
                + (f" [{record.reason}]" if record.reason else ""),
            )
        case ExecutionState() if record.terminal:
            return _t(record.last_event_at), "execution", record.execution_id, str(record.status)
        case ExecutionState():
            return (
                _t(record.last_event_at),
                "execution",
                record.execution_id,
                f"{record.status} since {_t(record.since)}; open: "
                + _open(record.open_operation_ids, record.open_approval_ids),
            )
        case Anomaly():
            return _t(record.detected_at), "anomaly", record.execution_id or "-", record.reason
        case DeadLetter():
            return "-", "dead letter", record.source_topic, record.reason
    return None


def _t(value: datetime) -> str:
    return value.strftime("%H:%M:%S")


class Feed:
    """The live feed: records taken as they are read, lines given back in event-time order.

    The outputs are read from several topics and partitions at once, so they come out of
    time order (an operation's state after a later execution state, a work item after the
    state its deadline made). ``add`` keeps each new record (once: a record read again is
    skipped) and ``lines`` gives the lines of those added since, sorted by the time each took
    effect (then in the order read): the demo calls it after each read of the topics, once
    nothing new came for a moment. Work items and FIRING alerts are remembered, so a
    resolution says what it ends even when both came in one read."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.work_items: dict[str, ReconciliationWorkItem] = {}
        self.alerts: dict[str, Alert] = {}
        self.pending: list[Record] = []

    def add(self, record: Record) -> bool:
        """Keep ``record`` for the next ``lines``; False if it was added before."""
        key = record.model_dump_json()
        if key in self.ids:
            return False
        self.ids.add(key)
        if isinstance(record, ReconciliationWorkItem):
            self.work_items[record.work_item_id] = record
        elif isinstance(record, Alert) and record.status == "FIRING":
            self.alerts[record.alert_id] = record
        self.pending.append(record)
        return True

    def lines(self) -> list[tuple[str, str, str, str]]:
        """The lines of the records added since the last call, in event-time order."""
        pending, self.pending = self.pending, []
        ordered = sorted(enumerate(pending), key=lambda p: (_when(p[1]), p[0]))
        out = []
        for _, record in ordered:
            line = describe(record, self.work_items, self.alerts)
            if line is not None:
                out.append(line)
        return out


def _when(record: Record) -> datetime:
    """When a record took effect (its Kafka timestamp's field); a dead letter that has none
    goes first."""
    value = getattr(record, record.time_field, None) if record.time_field else None
    return value if isinstance(value, datetime) else datetime.min.replace(tzinfo=UTC)


#: what the attempt of a work item of each kind was until its resolution
_ENDS = {
    WorkItemKind.REPLY_TIMEOUT: "UNKNOWN",
    WorkItemKind.VERIFICATION_TIMEOUT: "overdue verification",
}


def _open(operations: tuple[str, ...], approvals: tuple[str, ...]) -> str:
    """An execution's open operations and approvals, named (the first few of each)."""

    def named(ids: tuple[str, ...], noun: str) -> str:
        shown = ", ".join(ids[:3]) + (f", +{len(ids) - 3} more" if len(ids) > 3 else "")
        return f"{len(ids)} {noun}{'' if len(ids) == 1 else 's'}" + (f" ({shown})" if ids else "")

    if not operations and not approvals:
        return "nothing"
    return "; ".join(
        named(ids, noun)
        for ids, noun in ((operations, "operation"), (approvals, "approval"))
        if ids
    )


def feed_line(line: tuple[str, str, str, str]) -> str:
    """A ``describe`` line as rich markup: ids and details printed as written (a reason in
    brackets is text, not a style)."""
    at, what, subject, detail = line
    style = STYLE.get(what, "white")
    return (
        f"[dim]{at}[/dim] [{style}]{what:<14}[/{style}] "
        f"[bold]{escape(subject):<20}[/bold] {escape(detail)}"
    )


STYLE = {
    "verdict": "cyan",
    "work item": "yellow",
    "resolved": "green",
    "alert firing": "red",
    "alert resolved": "green",
    "operation": "white",
    "execution": "blue",
    "anomaly": "magenta",
    "dead letter": "magenta",
}


def run_demo(
    pace: float = 0.15,
    keep: bool = False,
    console: Console | None = None,
    serve: bool = True,
    agent: str | None = None,
) -> int:
    console = console or Console()
    started_cluster = False
    cluster = localstack.cluster_from_env()
    if cluster is None:
        console.print("[bold]Starting the local Kafka broker and schema registry…[/bold]")
        was_running = all(localstack.is_running().values())
        cluster = localstack.up()
        started_cluster = not was_running
    stamp = time.strftime("%Y%m%d%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix="vigil-demo-"))
    settings = replace(
        Settings.from_env(),
        bootstrap_servers=cluster.bootstrap_servers,
        schema_registry_url=cluster.schema_registry_url,
        topic_prefix=f"vigil-demo-{stamp}",
        app_id=f"vigil-demo-{stamp}",
        partitions=3,
        data_dir=str(workdir / "data"),
    )
    topics = Topics.from_settings(settings)
    codec = AvroCodec.connect(RegistryConfig(settings.schema_registry_url))
    create_topics(settings)
    prepare_registry(settings, codec)
    console.print(f"Topics [bold]{settings.topic_prefix}.*[/bold] created.")
    api_port = _free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    worker = _start_worker(settings, workdir, api_port)
    write_token = secrets.token_urlsafe(16)
    ui_port = _free_port()
    ui = _start_console(settings, workdir, ui_port, write_token)
    provider: Provider | None = None
    reconciler: subprocess.Popen[bytes] | None = None
    # the scenario moved so that it ends now: then wall-clock ticks carry its time on
    delta = datetime.now(UTC).replace(microsecond=0) - (REFERENCE_AT + timedelta(seconds=1))
    steps = shifted(demo_scenario(), delta)
    stop = threading.Event()
    seen: list[Record] = []
    reader = threading.Thread(
        target=_show, args=(settings, codec, topics, console, stop, seen), daemon=True
    )
    producer: RecordProducer | None = None
    try:
        _wait_ready(worker, workdir / "worker.log", console)
        console.print(f"[bold]Worker API:[/bold] {api_url}  (vigil status ID --url {api_url})")
        reader.start()
        producer = RecordProducer(settings, codec)
        if agent is not None:
            _play_agent(agent, settings, codec, topics, producer, workdir, seen, console)
            steps = []
        else:
            console.print(
                f"[bold]Playing the scenario[/bold] (scenario clock, {len(steps)} steps, "
                "ending now)…\n"
            )
        with _ctrl_c_between_steps() as interrupted:
            for step in steps:
                if isinstance(step, Tick):
                    for spec in topics.inputs():
                        producer.tick(spec.name, spec.partitions, step.at, "demo-scenario-clock")
                    producer.flush()
                    interrupted.wait(pace)
                else:
                    spec = next(t for t in topics.inputs() if type(step) in t.value_types)
                    producer.send(spec.name, step)
                if interrupted.is_set():
                    raise KeyboardInterrupt
            producer.flush()
        if agent is None:
            _wait_quiet(seen, console)
            # Only now: the reconciler's facts are stamped with the wall clock, and one written
            # while the (earlier) scenario still plays would make every later scenario event
            # of its partition late (docs/rules.md#time), applied at the reconciler's time and
            # shown out of order.
            provider, reconciler = _start_reconciler(settings, workdir)
            _wait_reconciled(seen, producer, topics, console)
            _summary(seen, console, REFERENCE_AT + delta)
        url = f"http://127.0.0.1:{ui_port}/"
        caught_up = _wait_console(url, ui, console)
        console.print(
            f"\n[bold]Console:[/bold] {url}"
            + ("" if caught_up else " (still catching up)")
            + f"\n  write token for manual review: {write_token}"
            + f"\n[bold]Worker API:[/bold] {api_url}  (vigil status ID --url {api_url}, "
            f"vigil watch ID --url {api_url})"
        )
        if not serve:
            return 0
        console.print(
            "Worker, console and a wall-clock ticker keep running: time goes on as it would "
            "live. Ctrl-C stops everything."
        )
        with _ctrl_c_between_steps() as interrupted:
            while not interrupted.is_set():
                for spec in topics.inputs():
                    producer.tick(spec.name, spec.partitions, datetime.now(UTC), "demo-ticker")
                producer.flush()
                interrupted.wait(1.0)
        console.print("\nStopping what the demo started…")
        return 0
    except KeyboardInterrupt:
        console.print("\n[yellow]Interrupted: stopping what the demo started…[/yellow]")
        return 130
    finally:
        stop.set()
        _stop(ui)
        if reconciler is not None:
            _stop(reconciler)
        if provider is not None:
            provider.stop()
        _stop(worker)
        if reader.is_alive():
            reader.join(10)
        producer = None  # release the Kafka client before its broker goes away
        gc.collect()
        if started_cluster and not keep:
            localstack.down()
            console.print("Local broker and registry stopped (keep them with --keep).")
        elif started_cluster:
            console.print("Local broker and registry left running: `vigil dev down` stops them.")


@contextlib.contextmanager
def _ctrl_c_between_steps() -> Iterator[threading.Event]:
    """Ctrl-C while playing sets a flag that the loop acts on between steps. Why: a
    KeyboardInterrupt raised inside confluent-kafka's ``flush`` comes out as ``SystemError``
    ("returned NULL without setting an exception"), and the demo would exit 1 without saying
    it was interrupted."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _play_agent(
    agent: str,
    settings: Settings,
    codec: AvroCodec,
    topics: Topics,
    producer: RecordProducer,
    workdir: Path,
    seen: list[Record],
    console: Console,
) -> None:
    """``--agent``: a real agent of that framework (scripted, offline) recording through its
    adapter (``streams.local.agents``), then a tick at now, and the verdicts as they come."""
    from streams.local.agents import play_live

    console.print(f"[bold]Playing a {agent} agent[/bold] through its vigil adapter…\n")
    cases = play_live(agent, settings, codec, workdir / "agent")
    for case in cases:
        console.print(f"  {case.execution_id:<34} {case.what}: vigil should say {case.expect}")
    now = datetime.now(UTC)
    for spec in topics.inputs():
        producer.tick(spec.name, spec.partitions, now, "demo-agent-clock")
    producer.flush()
    waits = {c.execution_id: c.expect for c in cases if c.expect != "FORBIDDEN_RETRY"}

    def done() -> bool:
        latest: dict[str, str] = {}
        for r in seen:
            if isinstance(r, ApprovalVerdict):
                latest[r.execution_id] = str(r.verdict)
        return all(latest.get(ex) == want for ex, want in waits.items())

    _wait_quiet(seen, console, done=done)
    _summary(seen, console, now)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_console(
    settings: Settings, workdir: Path, port: int, write_token: str
) -> subprocess.Popen[bytes]:
    """``vigil console`` on the demo's topics, its view under the demo's work dir."""
    env = _child_env(
        settings,
        VIGIL_CONSOLE_PORT=str(port),
        VIGIL_CONSOLE_DB=str(workdir / "console.sqlite3"),
        VIGIL_CONSOLE_WRITE_TOKEN=write_token,
        VIGIL_CONSOLE_ALERTS_SINCE="all",
    )
    env.pop("VIGIL_CONSOLE_TOKEN", None)
    return _spawn(["console", "--data-dir", str(workdir / "data")], env, workdir / "console.log")


def _child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a process the demo starts: its cluster, topics and app id."""
    env = dict(os.environ)
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        SCHEMA_REGISTRY_URL=settings.schema_registry_url,
        VIGIL_TOPIC_PREFIX=settings.topic_prefix,
        VIGIL_APP_ID=settings.app_id,
        VIGIL_PARTITIONS=str(settings.partitions),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        **extra,
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``vigil ARGS`` in a session of its own (stopped with its children), logging to a file."""
    log = log_path.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streams.cli", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=log_path.parent,
        start_new_session=True,
    )


def _wait_console(url: str, ui: subprocess.Popen[bytes], console: Console) -> bool:
    """Until the console has applied everything on the output topics (at most a minute)."""
    with console.status("Waiting for the console to catch up…"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ui.poll() is None:
            with contextlib.suppress(Exception):
                with urllib.request.urlopen(url + "api/lag", timeout=3) as r:
                    body = json.loads(r.read())
                if body.get("caught_up") and body.get("as_of", {}).get("event_time"):
                    return True
            time.sleep(0.5)
    return False


#: what the demo's bundled payments provider holds: the refund was made, under its key
DEMO_PAYMENT = ("idem-op-refund-1", "pay-refund-4711")


def _start_reconciler(
    settings: Settings, workdir: Path
) -> tuple[Provider, subprocess.Popen[bytes]]:
    """The bundled payments provider, holding the refund the scenario leaves UNKNOWN, and
    ``vigil reconcile`` checking the ``payments`` connector against it."""
    token = secrets.token_urlsafe(12)
    provider = Provider(token=token).start()
    provider.pay(*DEMO_PAYMENT)
    conf = workdir / "reconcilers.toml"
    conf.write_text(reconcilers_toml(provider.url, "payments"))
    env = _child_env(settings, VIGIL_RECONCILERS_FILE=str(conf), VIGIL_DEMO_PROVIDER_TOKEN=token)
    proc = _spawn(["reconcile", "--health-port", "0"], env, workdir / "reconcile.log")
    return provider, proc


def _wait_reconciled(
    seen: list[Record], producer: RecordProducer, topics: Topics, console: Console
) -> None:
    """Time goes on (wall-clock ticks) until the pipeline has applied what the reconciler
    found for the refund at the bundled provider (at most a minute)."""
    key, ref = DEMO_PAYMENT
    with console.status("Waiting for the reconciler to settle the refund…"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(
                isinstance(r, WorkItemResolution)
                and r.operation_id == "op-refund-1"
                and r.evidence_source == "RECONCILER"
                for r in seen
            ):
                console.print(
                    f"[bold]op-refund-1[/bold] settled by [bold]vigil reconcile[/bold]: the "
                    f"bundled payments provider holds {ref} under {key}, so VERIFIED, no person "
                    "involved."
                )
                return
            for spec in topics.inputs():
                producer.tick(spec.name, spec.partitions, datetime.now(UTC), "demo-ticker")
            producer.flush()
            time.sleep(0.5)
    console.print(
        "[yellow]The reconciler has not settled op-refund-1 yet (reconcile.log).[/yellow]"
    )


def _start_worker(settings: Settings, workdir: Path, port: int) -> subprocess.Popen[bytes]:
    """``vigil worker`` on the demo's topics, its HTTP API on ``port``."""
    args = ["worker", "--web-port", str(port), "--data-dir", str(workdir / "data")]
    return _spawn(args, _child_env(settings), workdir / "worker.log")


def _wait_ready(worker: subprocess.Popen[bytes], log: Path, console: Console) -> None:
    with console.status("Starting a worker…"):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            if "[^Worker]" in text and "Ready" in text:
                console.print("Worker ready.")
                return
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited ({worker.returncode}):\n{text[-3000:]}")
            time.sleep(0.3)
    raise RuntimeError(f"the worker did not become ready; see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _show(
    settings: Settings,
    codec: AvroCodec,
    topics: Topics,
    console: Console,
    stop: threading.Event,
    seen: list[Record],
) -> None:
    names = [t.name for t in topics.outputs()]
    feed = Feed()
    while not stop.is_set():
        for r in consume(settings, codec, names, from_beginning=True, idle_timeout=0.5):
            if r.record is not None and feed.add(r.record):
                seen.append(r.record)
        for line in feed.lines():  # each read's new lines in event-time order
            console.print(feed_line(line), highlight=False)
        time.sleep(0.2)


def _wait_quiet(
    seen: list[Record],
    console: Console,
    quiet: float = 4.0,
    limit: float = 120.0,
    done: Callable[[], bool] | None = None,
) -> None:
    """Until the last verdict at the reference time is out (``done``, by default the
    scenario's last) and nothing new came for ``quiet`` seconds (a fresh broker may take a
    while to accept the first records), at most ``limit``."""
    began = time.monotonic()

    def scenario_done() -> bool:
        return any(
            isinstance(r, ApprovalVerdict)
            and r.request_id == "req-export"
            and r.verdict == "WAITING"
            for r in seen
        )

    done = done or scenario_done
    with console.status("Waiting for the last outputs…"):
        last, n = time.monotonic(), -1
        while time.monotonic() - began < limit:
            if len(seen) != n:
                n, last = len(seen), time.monotonic()
            if done() and time.monotonic() - last >= quiet:
                return
            time.sleep(0.3)


def _summary(seen: list[Record], console: Console, at: datetime = REFERENCE_AT) -> None:
    counts = Counter(type(r).__name__ for r in seen)
    console.print()
    table = Table(title=f"Approval waits at {at.isoformat()}")
    for col in ("request", "verdict", "owner", "failed proofs", "next safe step"):
        table.add_column(col)
    final: dict[str, ApprovalVerdict] = {}
    for r in seen:
        if isinstance(r, ApprovalVerdict) and r.evaluated_at <= at:
            cur = final.get(r.request_id)
            if cur is None or r.evaluated_at >= cur.evaluated_at:
                final[r.request_id] = r
    for rid, v in sorted(final.items()):
        proofs = ", ".join(f"{f.proof}:{f.reason}" for f in v.failed_proofs) or "-"
        table.add_row(rid, str(v.verdict), str(v.owner), proofs, v.next_step)
    console.print(table)
    totals = Table(title="Outputs")
    totals.add_column("record")
    totals.add_column("count", justify="right")
    for name, n in sorted(counts.items()):
        totals.add_row(name, str(n))
    console.print(totals)
