"""A probe, not the product: what the operations part of vigil's per-record work costs in
CPython when written as one imperative loop over mutable dicts, against the real Processor on
the same records (issue 30, BENCHMARKS.md step 10).

Why: after nine steps the Processor's profile is flat (no function above 5 %), and the
question left is whether any Python could do the same work at the rate issue 30 asks, or
whether the functional core's shape (immutable values rebuilt per event, one small function
per rule) is what costs. The probe does, per OperationEvent of the benchmark's
operations-only log (``bench.core``'s workload, the other topics' ticks kept): the key check,
the hold until the partition's watermark passes the event, the transition (the core's own
``operations._judge``), deadlines in a heap, the published ``OperationState`` with its
deterministic id, a claim for every attempt with an idempotency key, and at a reply deadline
the UNKNOWN state, its work item and its alert (``operations.timeout_records``); at a
settlement of an UNKNOWN attempt the resolution and the resolved alert
(``operations._settle``); each changed execution packed (JSON, DEFLATE) at every flush. It
does not do what the log does not need (approvals, execution status, verdicts, anomalies,
alerts' ends, retries across attempts or executions, redelivery detection), so its figure is
a floor for that work, not a replacement: its outputs are compared with the Processor's by id
(record, topic, key and headers), and it says how many it matched.

    python -m bench.lean --executions 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
import zlib
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.core import workload
from streams.app import tune_gc
from streams.contracts.keys import scoped_key
from streams.contracts.models.base import construct
from streams.contracts.models.enums import (
    AlertKind,
    OperationStatus,
    WorkItemKind,
)
from streams.contracts.models.events import ClockTick, OperationEvent
from streams.contracts.models.outputs import (
    OperationState,
)
from streams.core import claims as cl
from streams.core import operations as ops
from streams.core.executions import EPOCH, from_ms, id_ms
from streams.core.findings import AnomalyFinding
from streams.core.ids import deterministic_id
from streams.engine.emission import Emission
from streams.engine.emitter import alert_headers
from streams.engine.processor import Processor, Stores
from streams.kafka.topics import Topics
from streams.replay import REPLAY_FLUSH_EVERY
from streams.settings import Settings

S = OperationStatus
EPOCH_MS = timedelta(milliseconds=1)


class Lean:
    """The probe's whole state: per execution its attempts (mutable lists), per partition its
    topics' clocks, held events and deadlines."""

    # an attempt: [status, since, reply_due, verify_due, key, connector, work_item, alert,
    #              kinds, event_ids, reason, effect_ref]

    def __init__(self, settings: Settings, topics: Topics) -> None:
        self.inputs = [t.name for t in topics.inputs()]
        self.state_topic = topics.operation_state.name
        self.work_topic = topics.reconciliation_work.name
        self.alert_topic = topics.alerts.name
        self.claims_topic = topics.idempotency_claims.name
        self.config = ops.OperationConfig()
        self.executions: dict[str, dict[tuple[str, int], list[Any]]] = {}
        self.dirty: set[str] = set()
        self.clocks: dict[int, dict[str, int]] = {}
        self.held: dict[int, list[tuple[int, int, Any]]] = {}
        self.due: dict[int, list[tuple[int, str, str, int]]] = {}
        self.seq = 0
        self.stored: dict[str, bytes] = {}
        self.outputs: Counter[str] = Counter()

    def _emit(
        self, topic: str, ex: str, op: str, record: Any, headers: tuple[Any, ...] = ()
    ) -> Emission:
        """As the Emitter: keyed by the operation's scoped key, counted, alerts with headers."""
        self.outputs[record.avro_name] += 1
        return Emission(topic, scoped_key(ex, op), record, headers)

    def handle(self, env: Any) -> list[Emission]:
        out: list[Emission] = []
        record = env.record
        p = env.partition
        t = (record.occurred_at - EPOCH) // EPOCH_MS
        if type(record) is OperationEvent:
            if env.key != record.execution_id.encode():
                return out
            self.seq += 1
            heapq.heappush(self.held.setdefault(p, []), (t, self.seq, record))
        clocks = self.clocks.setdefault(p, {})
        before = min(clocks.values()) if len(clocks) == len(self.inputs) else None
        if t > clocks.get(env.topic, -1):
            clocks[env.topic] = t
        if len(clocks) == len(self.inputs):
            watermark = min(clocks.values())
            if before is None or watermark > before:
                self._release(p, watermark, out)
        return out

    def _release(self, p: int, watermark: int, out: list[Emission]) -> None:
        held = self.held.get(p) or []
        due = self.due.get(p) or []
        while True:
            next_event = held[0][0] if held else None
            next_due = due[0][0] if due else None
            if (
                next_due is not None
                and next_due < watermark
                and (next_event is None or next_due <= next_event)
            ):
                at, ex, op, n = heapq.heappop(due)
                self._fire(ex, op, n, at, out)
            elif next_event is not None and next_event < watermark:
                _, _, event = heapq.heappop(held)
                self._apply(p, event, out)
            else:
                return

    def _apply(self, p: int, event: OperationEvent, out: list[Emission]) -> None:
        ex = event.execution_id
        attempts = self.executions.get(ex)
        if attempts is None:
            attempts = self.executions[ex] = {}
        k = (event.operation_id, event.attempt)
        a = attempts.get(k)
        if a is not None and (event.event_id in a[9] or event.kind in a[8]):
            return
        old = None
        if a is not None:
            old = ops.AttemptRecord(
                event.attempt, a[5], a[4], a[0], a[10], a[1], True, a[2], a[3], None, a[6]
            )
        verdict = ops._judge(old, event)
        if isinstance(verdict, AnomalyFinding):
            return
        status, reason = verdict
        t = (event.occurred_at - EPOCH) // EPOCH_MS
        if a is None:
            a = attempts[k] = [
                status,
                t,
                None,
                None,
                event.idempotency_key or None,
                event.connector or "",
                None,
                None,
                (event.kind,),
                (event.event_id,),
                reason,
                event.effect_ref,
            ]
        else:
            if status is not a[0]:
                a[1] = t
            a[0], a[10] = status, reason
            a[4] = event.idempotency_key or a[4]
            a[5] = event.connector or a[5]
            a[11] = event.effect_ref or a[11]
            a[8] += (event.kind,)
            a[9] += (event.event_id,)
        if status is S.SENT:
            due = event.reply_due_at
            a[2] = max(t, (due - EPOCH) // EPOCH_MS if due else t + 30_000)
            heapq.heappush(self.due.setdefault(p, []), (a[2], ex, k[0], k[1]))
        elif status is S.ACKNOWLEDGED:
            due = event.verify_due_at
            a[3] = max(t, (due - EPOCH) // EPOCH_MS if due else t + 300_000)
            heapq.heappush(self.due.setdefault(p, []), (a[3], ex, k[0], k[1]))
        opened = list(a) if status in ops.SETTLED and a[6] is not None else None
        if opened is not None:
            a[6] = a[7] = None
        self._state(ex, k, a, out)
        if opened is not None:
            self._settle(ex, k, opened, event, out)
        self.dirty.add(ex)

    def _state(self, ex: str, k: tuple[str, int], a: list[Any], out: list[Emission]) -> None:
        status, since = a[0], a[1]
        parts = [scoped_key(ex, k[0]), k[1], status, id_ms(since), a[10]]
        reply = a[2] if status in (S.SENT, S.UNKNOWN) else None
        verify = a[3] if status is S.ACKNOWLEDGED else None
        record = construct(
            OperationState,
            {
                "operation_id": k[0],
                "execution_id": ex,
                "attempt": k[1],
                "idempotency_key": a[4],
                "connector": a[5],
                "status": status,
                "retry": ops.retry_verdict(status),
                "reason": a[10],
                "since": from_ms(since),
                "reply_due_at": None if reply is None else from_ms(reply),
                "verify_due_at": None if verify is None else from_ms(verify),
                "effect_ref": a[11],
                "open_work_item_id": a[6],
                "state_id": deterministic_id("os", *parts),
                "held_by_operation_id": None,
                "held_by_attempt": None,
                "held_by_status": None,
                "held_by_execution_id": None,
                "traceparent": None,
            },
        )
        out.append(self._emit(self.state_topic, ex, k[0], record))
        if a[4]:
            claim = cl.Claim(a[5], a[4], ex, k[0], k[1], status, since)
            claimed = cl.claim_record(claim)
            self.outputs[claimed.avro_name] += 1
            out.append(Emission(self.claims_topic, cl.claims_key(a[5], a[4]), claimed))

    def _attempt(self, ex: str, k: tuple[str, int], a: list[Any]) -> ops.AttemptRecord:
        """The core's record of an attempt, for the core's functions that build records."""
        return ops.AttemptRecord(
            k[1], a[5], a[4], a[0], a[10], a[1], True, a[2], a[3], a[11],
            a[6], None if a[6] is None else WorkItemKind.REPLY_TIMEOUT, a[7], a[8], a[9],
        )  # fmt: skip

    def _fire(self, ex: str, op: str, n: int, at: int, out: list[Emission]) -> None:
        a = self.executions[ex][(op, n)]
        if a[0] is not S.SENT or a[2] != at:
            return  # answered in time: a stale deadline
        wi = ops.work_item_id(ex, op, n, WorkItemKind.REPLY_TIMEOUT)
        alert = ops.operation_alert_id(ex, op, n, AlertKind.OPERATION_UNKNOWN, ops.REPLY_TIMEOUT)
        a[0], a[1], a[10], a[6], a[7] = S.UNKNOWN, at, ops.REPLY_TIMEOUT, wi, alert
        self._state(ex, (op, n), a, out)
        item, fired = ops.timeout_records(ex, op, self._attempt(ex, (op, n), a), at)
        out.append(self._emit(self.work_topic, ex, op, item))
        out.append(self._emit(self.alert_topic, ex, op, fired, alert_headers(fired)))
        self.dirty.add(ex)

    def _settle(
        self,
        ex: str,
        k: tuple[str, int],
        opened: list[Any],
        event: OperationEvent,
        out: list[Emission],
    ) -> None:
        """The resolution of the attempt's work item and the resolved alert, as the core
        builds them (``opened``: the attempt as it was, its work item still open)."""
        resolution, resolved = ops._settle(
            ops.OperationBook(ex), k[0], self._attempt(ex, k, opened), event
        )
        out.append(self._emit(self.work_topic, ex, k[0], resolution))
        out.append(self._emit(self.alert_topic, ex, k[0], resolved, alert_headers(resolved)))

    def flush(self) -> None:
        """Every changed execution packed, as the real store writes an entry per flush."""
        stored = self.stored
        for ex in self.dirty:
            text = json.dumps(
                [
                    [op, n, a[0].value, *a[1:8], a[9], a[10], a[11]]
                    for (op, n), a in self.executions[ex].items()
                ],
                separators=(",", ":"),
            )
            stored[ex] = zlib.compress(text.encode(), 1)
        self.dirty.clear()


#: The id field of each record type the probe publishes.
_ID = {
    "OperationState": "state_id",
    "ReconciliationWorkItem": "work_item_id",
    "WorkItemResolution": "resolution_id",
    "Alert": "alert_id",
    "IdempotencyClaim": "claim_id",
}


def _records(emissions: list[Emission]) -> dict[tuple[str, str], str]:
    """The records of the types the probe publishes, by type and id, each as its JSON with its
    topic and key: two runs that agree here published the same records to the same places."""
    out: dict[tuple[str, str], str] = {}
    for em in emissions:
        r = em.record
        name = type(r).__name__
        field = _ID.get(name)
        if field is None or (name == "Alert" and r.kind is not AlertKind.OPERATION_UNKNOWN):
            continue
        out[(name, getattr(r, field))] = (
            f"{em.topic}\x1f{em.key}\x1f{em.headers!r}\x1f{r.model_dump_json()}"
        )
    return out


def run(executions: int, which: str) -> dict[str, Any]:
    settings = Settings.from_env()
    topics = Topics.from_settings(settings)
    ops_topic = topics.operation_events.name
    envs = [e for e in workload(executions) if e.topic == ops_topic or type(e.record) is ClockTick]
    events = sum(1 for e in envs if type(e.record) is OperationEvent)
    if which == "lean":
        probe = Lean(settings, topics)
        handle, flush = probe.handle, probe.flush
    else:
        proc = Processor.from_settings(
            settings, topics, Stores(), write_behind=True, cross_execution=True
        )
        handle = proc.handle

        def flush() -> None:
            proc.flush()
            proc.flush_clocks()

    tune_gc()
    published: list[Emission] = []
    keep = published.extend
    cpu0 = time.process_time()
    for i, env in enumerate(envs, 1):
        keep(handle(env))
        if i % REPLAY_FLUSH_EVERY == 0:
            flush()
    flush()
    cpu = time.process_time() - cpu0
    return {
        "which": which,
        "events": events,
        "records": len(envs),
        "cpu_us_per_event": cpu / events * 1e6,
        "records_by_id": _records(published),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executions", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, alternating")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"processor": [], "lean": []}
    for _ in range(args.repeat):
        for which in ("processor", "lean"):
            runs[which].append(run(args.executions, which))
            r = runs[which][-1]
            cost = r["cpu_us_per_event"]
            print(f"{which:9} {r['events']:,} OperationEvents: {cost:.1f} CPU-µs per event")
    real, lean = runs["processor"][0]["records_by_id"], runs["lean"][0]["records_by_id"]
    same = sum(1 for k, v in lean.items() if real.get(k) == v)
    print(
        f"records by id: the Processor {len(real):,}, the probe {len(lean):,}, "
        f"the same record, topic and key in both {same:,}"
    )
    summary: dict[str, Any] = {
        "executions": args.executions,
        "operation_events": runs["lean"][0]["events"],
        "records_compared": len(real),
        "records_the_same": same,
    }
    for which, rs in runs.items():
        figures = [r["cpu_us_per_event"] for r in rs]
        median = sorted(figures)[len(figures) // 2]
        summary[which] = {"cpu_us_per_event": figures, "median": median}
        print(f"{which} median {median:.1f} CPU-µs per OperationEvent")
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
