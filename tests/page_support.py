"""The console's page over a view built directly, without Kafka: the console's own aiohttp
application served from a thread around a ``ConsoleView``, records applied to that view as the
consumer would (each applied batch's changes published to the page's SSE), a producer that
keeps what a review publishes, and a fleet of 100,000 executions written into a view in
seconds. The Kafka side of the console (catch-up, review publishing) is tested against the
real broker elsewhere (test_console_kafka, test_console_browser, test_console_review_kafka)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from streams.console.service import ChangeHub, ConsoleContext, ConsumerStatus
from streams.console.view import ConsoleView, Incoming
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    ExecutionStatus,
    OperationStatus,
    Owner,
    Proof,
    ProofState,
    RetryVerdict,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    ExecutionState,
    OperationState,
    ProofFinding,
    ReconciliationWorkItem,
    Thresholds,
)
from streams.settings import Settings
from tests.support import free_port

CHROMIUM = "/usr/bin/chromium"

#: the output topic each record type is read from (names as a default deployment's)
TOPIC = {
    "ExecutionState": "vigil.execution-state",
    "OperationState": "vigil.operation-state",
    "ApprovalVerdict": "vigil.approval-verdicts",
    "ReconciliationWorkItem": "vigil.reconciliation-work",
    "WorkItemResolution": "vigil.reconciliation-work",
    "Alert": "vigil.alerts",
}


class KeptProducer:
    """Stands in for the console's Kafka producer: keeps every event a review publishes, so a
    test can see what the page asked for (publishing is test_console_review_kafka's)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Record, str | None]] = []

    def send(self, topic: str, record: Record, key: str | None = None) -> None:
        self.sent.append((topic, record, key))

    def flush(self, timeout: float = 0) -> int:
        return 0


@dataclass
class Served:
    """A console page served over ``view`` at ``base``."""

    base: str
    view: ConsoleView
    ctx: ConsoleContext
    producer: KeptProducer
    offsets: dict[str, int] = field(default_factory=dict)

    def apply(self, records: Sequence[Record]) -> None:
        """Apply records as the console's consumer does, and tell the page what changed."""
        batch = []
        for r in records:
            topic = TOPIC[type(r).__name__]
            n = self.offsets.get(topic, 0)
            self.offsets[topic] = n + 1
            batch.append(Incoming(topic, 0, n, r))
        changes = self.view.apply(batch)
        self.ctx.hub.publish(changes)
        self.mark_fresh()

    def mark_fresh(self) -> None:
        """The view holds every record "the topics" hold, as of now (``as_of.fresh_at``)."""
        status = self.ctx.status
        status.log_end = {tp: n for tp, n in self.view.positions().items()}
        status.note_ends(time.time())


@contextmanager
def serve(
    view: ConsoleView,
    read_token: str | None = None,
    write_token: str | None = None,
) -> Iterator[Served]:
    """The console's application (``create_app``: API, page, review) on a free port, in a
    thread with its own event loop, until the block ends."""
    from aiohttp import web

    from streams.console.api import create_app

    producer = KeptProducer()
    started = threading.Event()
    stop: list[Any] = []
    port = free_port()
    ctx = ConsoleContext(
        view=view,
        settings=Settings(),
        hub=ChangeHub(),
        read_token=read_token,
        write_token=write_token,
        producer_factory=lambda: producer,
        status=ConsumerStatus(),
    )

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ctx.hub.bind(loop)
        # an open page's event stream is cut at once when the block ends
        runner = web.AppRunner(create_app(ctx), access_log=None, shutdown_timeout=0.5)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        done = asyncio.Event()
        stop.append((loop, done))
        started.set()
        loop.run_until_complete(done.wait())
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="console-page", daemon=True)
    thread.start()
    assert started.wait(20), "the console did not start"
    offsets = {t: n for (t, _p), n in view.positions().items()}
    served = Served(f"http://127.0.0.1:{port}", view, ctx, producer, offsets)
    served.mark_fresh()
    try:
        yield served
    finally:
        loop, done = stop[0]
        loop.call_soon_threadsafe(done.set)
        thread.join(20)


@contextmanager
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: scripts/test.sh installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_tab(b: Any, base: str, *, width: int = 1280, tokens: dict[str, str] | None = None) -> Any:
    """A new tab on the console (tokens put in its sessionStorage before the page loads, as
    the Tokens form would have) that records the page's errors in ``tab.errors``."""
    context = b.new_context(viewport={"width": width, "height": 900})
    if tokens:
        script = "".join(
            f"sessionStorage.setItem({k!r}, {v!r});"
            for k, v in {
                "vigil.readToken": tokens.get("read", ""),
                "vigil.writeToken": tokens.get("write", ""),
                "vigil.reviewer": tokens.get("reviewer", ""),
            }.items()
        )
        context.add_init_script(script)
    tab = context.new_page()
    tab.errors = []  # type: ignore[attr-defined]
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    return tab


# ----------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class Fleet:
    """What ``fill_fleet`` put in the view."""

    executions: int
    unknown: int  # UNKNOWN operations, each with an overdue work item and a firing alert
    stuck: int  # STUCK_AFTER_DECISION approvals (CRITICAL), each with its alert
    stale: int  # STALE_REQUEST approvals (WARNING), each with its alert
    start: datetime

    @property
    def attention(self) -> int:
        return 2 * self.unknown + self.stuck + self.stale


def _thresholds(at: datetime) -> Thresholds:
    return Thresholds(
        grace_ms=60_000, heartbeat_fresh_ms=120_000, delivery_deadline_ms=300_000, evaluated_at=at
    )


def fleet_records(i: int, t: datetime, kind: str) -> list[Record]:
    """The output records of execution ``ex-<i>``: an UNKNOWN operation (work item, alert),
    a stuck or a stale approval (alert)."""
    ex = f"ex-{i:06d}"
    if kind == "unknown":
        op = f"{ex}-op1"
        common: dict[str, Any] = dict(
            operation_id=op,
            execution_id=ex,
            attempt=1,
            idempotency_key=f"idem-{op}",
            connector=("payments", "mail", "crm")[i % 3],
        )
        wi = f"{op}-wi"
        return [
            OperationState(
                status=OperationStatus.UNKNOWN,
                retry=RetryVerdict.FORBIDDEN,
                since=t,
                open_work_item_id=wi,
                state_id=f"{op}-unknown",
                reason="reply_timeout",
                **common,
            ),
            ReconciliationWorkItem(
                work_item_id=wi,
                kind=WorkItemKind.REPLY_TIMEOUT,
                deadline=t + timedelta(hours=1),
                created_at=t,
                **common,
            ),
            Alert(
                alert_id=f"{op}-alert",
                kind=AlertKind.OPERATION_UNKNOWN,
                status=AlertStatus.FIRING,
                severity=Severity.WARNING,
                execution_id=ex,
                subject_id=op,
                verdict="UNKNOWN",
                owner=Owner.CONNECTOR_OWNER,
                next_step="reconcile against the source; do not retry",
                evidence=(f"attempt={op}#1", f"connector={common['connector']}"),
                occurred_at=t,
            ),
        ]
    rid = f"{ex}-req1"
    stuck = kind == "stuck"
    verdict = (
        ApprovalVerdictCode.STUCK_AFTER_DECISION if stuck else ApprovalVerdictCode.STALE_REQUEST
    )
    owner = Owner.RUNTIME_OWNER if stuck else Owner.POLICY_OWNER
    proofs = (
        ProofFinding(
            proof=Proof.LIVE_RESUME, state=ProofState.FAILED, reason=f"no resume after decision {i}"
        ),
    )
    return [
        ApprovalVerdict(
            verdict_id=f"{rid}-v1",
            request_id=rid,
            execution_id=ex,
            verdict=verdict,
            owner=owner,
            next_step="investigate the continuation" if stuck else "withdraw the old request",
            thresholds=_thresholds(t),
            failed_proofs=proofs if stuck else (),
            evaluated_at=t,
            action=("refund", "deploy", "delete")[i % 3],
            requested_at=t - timedelta(minutes=5),
        ),
        Alert(
            alert_id=f"{rid}-alert",
            kind=AlertKind.APPROVAL_VERDICT,
            status=AlertStatus.FIRING,
            severity=Severity.CRITICAL if stuck else Severity.WARNING,
            execution_id=ex,
            subject_id=rid,
            verdict=verdict.value,
            owner=owner,
            next_step="escalate",
            evidence=tuple(f"{p.proof}:{p.state}:{p.reason}" for p in proofs) if stuck else (),
            occurred_at=t,
        ),
    ]


def fill_fleet(
    view: ConsoleView,
    executions: int = 100_000,
    *,
    start: datetime = datetime(2026, 7, 26, 8, 0, tzinfo=UTC),
    unknown_every: int = 40,
    stuck_every: int = 80,
    stale_every: int = 80,
) -> Fleet:
    """``executions`` executions in flight, one every 10 ms from ``start``: their execution
    rows written straight into the view's table (the bulk, from one real record's JSON), and
    the records of every ``unknown_every``-th (an UNKNOWN operation), ``stuck_every``-th and
    ``stale_every``-th (approvals) applied through the view as the consumer would, so what
    the attention list, the alerts and the counts hold is the view's own doing."""
    template = ExecutionState(
        execution_id="@EX@",
        status=ExecutionStatus.RUNNING,
        since=start,
        first_seen_at=start,
        last_event_at=start,
        last_sequence=1,
        terminal=False,
        state_id="@EX@-s1",
    ).model_dump_json()
    stamp = start.isoformat().replace("+00:00", "Z")
    assert stamp in template, template
    statuses = [ExecutionStatus.RUNNING, ExecutionStatus.WAITING_FOR_TOOL,
                ExecutionStatus.WAITING_FOR_APPROVAL, ExecutionStatus.PLANNING]  # fmt: skip
    rows = []
    base_ms = int(start.timestamp() * 1000)
    for i in range(executions):
        ex = f"ex-{i:06d}"
        ms = base_ms + 10 * i
        at = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
        status = statuses[i % len(statuses)].value
        body = (
            template.replace("@EX@", ex)
            .replace(stamp, at.replace("+00:00", "Z"))
            .replace('"RUNNING"', f'"{status}"')
        )
        rows.append((ex, status, ms, 0, 1, body))
    with view._write_lock:  # one transaction for the bulk, on the writer's connection
        db = view._db
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT OR REPLACE INTO executions VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
    batch: list[Incoming] = []
    counts = {"unknown": 0, "stuck": 0, "stale": 0}
    for i in range(executions):
        t = start + timedelta(milliseconds=10 * i)
        kinds = []
        if i % unknown_every == 0:
            kinds.append("unknown")
        if i % stuck_every == 1:
            kinds.append("stuck")
        if i % stale_every == 2:
            kinds.append("stale")
        for kind in kinds:
            counts[kind] += 1
            for r in fleet_records(i, t, kind):
                batch.append(Incoming(TOPIC[type(r).__name__], 0, len(batch), r))
    for k in range(0, len(batch), 2000):
        view.apply(batch[k : k + 2000])
    return Fleet(executions, counts["unknown"], counts["stuck"], counts["stale"], start)


# ----------------------------------------------------------------------------- the demo


class Pipeline:
    """The pure Processor (the worker's core, no Kafka) turning input records and ``Tick``s
    (as ``demo_scenario`` gives them) into the output records the console reads."""

    def __init__(self) -> None:
        from streams.engine.processor import Processor, Stores
        from tests.test_processor import TOPICS

        self.topics = TOPICS
        self.proc = Processor(TOPICS, Stores())
        self.kept = {
            TOPICS.execution_state.name,
            TOPICS.operation_state.name,
            TOPICS.approval_verdicts.name,
            TOPICS.reconciliation_work.name,
            TOPICS.alerts.name,
        }

    def run(self, steps: Sequence[Any]) -> list[Record]:
        from streams.contracts.models.events import ClockTick
        from streams.local.scenario import Tick
        from tests.test_processor import env

        out: list[Record] = []
        for s in steps:
            if isinstance(s, Tick):
                emissions = []
                for spec in self.topics.inputs():
                    for p in range(3):
                        tick = ClockTick(ticker_id="t", partition=p, occurred_at=s.at)
                        emissions += self.proc.handle(env(tick, spec.name, key="", partition=p))
            else:
                emissions = self.proc.handle(env(s))
            out += [e.record for e in emissions if e.topic in self.kept]
        return out
