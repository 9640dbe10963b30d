"""One execution as one aggregate: its lifecycle, its operation book and its approval book.

Why one object: everything an input changes about an execution lives in one table entry (see
``streams.engine.state``), and the three parts depend on each other. The published execution state
lists the operations and approvals still open, so a change to either book may publish a new
state. Kept apart, every input loaded the slot and the two books field by field, several times,
to find out. Here the shell loads the aggregate once per input, calls one method, and stores
what it holds, in the style of a keyed stateful operator:

- ``apply(event)``: one input (a status, an operation event or an approval fact);
- ``advance(horizon)``: stream time has passed ``horizon``: deadlines and change points up
  to it are judged;
- ``next_due()``: when stream time must reach for ``advance`` to have anything to do;
- ``snapshot()``: the parts as stored.

Each call returns a ``Step``: what to publish, in order, and the instants at which the shell
must call ``advance`` again. The outputs are the core's records, ``Refusal``s (an input the
core refused: the shell reports it as an anomaly with the input's coordinates), ``Verdict``s
(a verdict and the id of the one it replaces, for the alerts the shell makes once the verdict
carries its trace context) and ``Orphan``s (facts whose request never came).

Times are integer epoch milliseconds: ``advance`` takes one, ``next_due`` and ``Step.due``
give them. The rules are those of ``executions``, ``operations`` and ``approvals``; this
module only decides which of them an input or a time reaches, and in what order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.outputs import ApprovalVerdict
from streams.core import approvals as ap
from streams.core import executions as ex
from streams.core import operations as ops
from streams.core import trace
from streams.core.executions import from_ms, to_ms
from streams.core.findings import AnomalyFinding

ONE_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Rules:
    """The configuration an aggregate decides with (the same for every execution)."""

    operations: ops.OperationConfig = field(default_factory=ops.OperationConfig)
    thresholds_for: Callable[[ap.ApprovalFacts], ap.ThresholdSet] = field(
        default_factory=ap.threshold_resolver
    )
    #: how long a finished execution is remembered (late events for it are anomalies)
    closed_retention: timedelta = timedelta(hours=24)
    #: how long facts may wait for their request before they are reported as orphans
    orphan_after: timedelta = timedelta(hours=1)
    #: ``closed_retention`` in milliseconds
    closed_retention_ms: int = field(init=False)
    #: ``orphan_after`` in milliseconds
    orphan_after_ms: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "closed_retention_ms", self.closed_retention // ONE_MS)
        object.__setattr__(self, "orphan_after_ms", self.orphan_after // ONE_MS)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An input the core refused, and why: the shell reports it as an anomaly."""

    finding: AnomalyFinding


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict to publish, and the id of the verdict record it follows (None: the first)."""

    record: ApprovalVerdict
    previous_id: str | None


@dataclass(frozen=True, slots=True)
class Orphan:
    """Facts about a request that never came, the latest of them at ``last_fact``."""

    request_id: str
    last_fact: datetime


Output = Record | Refusal | Verdict | Orphan


class Step:
    """What one call did: what to publish, in order; the instants at which ``advance`` must
    run (epoch ms, as the shell's due-time index takes them; a stale one is harmless); and,
    for an input that changed something, the key its trace context is remembered under and
    the first output it applies to (those before it are about deadlines that fell before the
    input). A plain slotted class: one is made per call."""

    __slots__ = ("due", "outputs", "trace_key", "traced_from")

    def __init__(self) -> None:
        self.outputs: list[Output] = []
        self.due: list[int] = []
        self.trace_key: str | None = None
        self.traced_from = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The parts of an aggregate as the entry stores them (each None when absent)."""

    inflight: ex.InFlight | None
    closed: ex.Closed | None
    operations: ops.OperationBook | None
    approvals: ap.Ledger | None


#: A book not decoded yet (``Execution``'s ``load`` decodes it when first needed).
UNLOADED = object()

#: What ``Execution.quiet_until`` answers for an execution that nothing will fall due for
#: (later than any epoch millisecond a record can carry).
NOTHING_DUE = 1 << 62

#: Which part of the aggregate each name in ``Execution.changed`` is.
PARTS = ("inflight", "closed", "operations", "approvals")


class Execution:
    """One execution's state and the steps on it. Mutable, unlike its parts: it is the
    operator's state for one key, loaded once per input and stored once; ``changed`` names
    the parts a call replaced, so that only those are written again."""

    __slots__ = (
        "_approvals",
        "_load",
        "_operations",
        "changed",
        "closed",
        "execution_id",
        "inflight",
        "rules",
    )

    def __init__(
        self,
        execution_id: str,
        rules: Rules,
        inflight: ex.InFlight | None = None,
        closed: ex.Closed | None = None,
        operations: ops.OperationBook | object | None = None,
        approvals: ap.Ledger | object | None = None,
        load: Callable[[str], Any] | None = None,
    ) -> None:
        """``operations`` and ``approvals`` may be ``UNLOADED``: ``load(name)`` then gives
        the book when it is first needed. Most inputs are statuses, which need neither, and
        decoding a book costs more than applying a status."""
        self.execution_id = execution_id
        self.rules = rules
        self.inflight = inflight
        self.closed = closed
        self._operations = operations
        self._approvals = approvals
        self._load = load
        self.changed: set[str] = set()

    @property
    def operations(self) -> ops.OperationBook | None:
        book = self._operations
        if book is UNLOADED:
            book = self._operations = self._load("operations")  # type: ignore[misc]
        return book  # type: ignore[return-value]

    @operations.setter
    def operations(self, book: ops.OperationBook | None) -> None:
        self._operations = book

    @property
    def approvals(self) -> ap.Ledger | None:
        book = self._approvals
        if book is UNLOADED:
            book = self._approvals = self._load("approvals")  # type: ignore[misc]
        return book  # type: ignore[return-value]

    @approvals.setter
    def approvals(self, book: ap.Ledger | None) -> None:
        self._approvals = book

    def snapshot(self) -> Snapshot:
        return Snapshot(self.inflight, self.closed, self.operations, self.approvals)

    # -- inputs ---------------------------------------------------------------------------
    def apply(self, event: Record) -> Step:
        """One input of this execution, already checked by the shell (key, time, domain)."""
        step = Step()
        cls = type(event)
        if cls is ev.ExecutionStatusChanged:
            self._on_status(event, step)  # type: ignore[arg-type]
        elif cls is ev.OperationEvent:
            self._on_operation(event, step)
        else:
            self._on_approval_fact(event, step)  # type: ignore[arg-type]
        return step

    def _on_status(self, event: ev.ExecutionStatusChanged, step: Step) -> None:
        # Two thirds of all inputs come here: the step's fields are read by unpacking and the
        # slot set in place, rather than through ``_set_slot``'s type tests.
        inflight = self.inflight
        slot = inflight if inflight is not None else self.closed
        status = ex.StatusEvent(
            event.event_id,
            event.execution_id,
            event.sequence,
            event.status,
            (event.occurred_at - ex.EPOCH) // ONE_MS,
        )
        new, published, anomaly, closed = ex.apply_status(slot, status)
        if anomaly is not None:
            step.outputs.append(Refusal(anomaly))
            return
        step.trace_key = trace.EXECUTION
        if closed:
            self._set_slot(new, step)
        else:
            self.inflight = new
            self.changed.add("inflight")
        if published is not None:
            step.outputs.append(published)
        if slot is None and not closed:
            # operations or approvals may have been seen before the first status
            self._sync_open_items(status.at, step)

    def _set_slot(self, slot: ex.Slot, step: Step) -> None:
        if isinstance(slot, ex.Closed):
            self.closed = slot
            self.inflight = None
            self.changed.update(("closed", "inflight"))
            step.due.append(slot.closed_at + self.rules.closed_retention_ms)
        elif isinstance(slot, ex.InFlight):
            self.inflight = slot
            self.changed.add("inflight")

    def _sync_open_items(self, at: int, step: Step) -> None:
        """A new state when the operations or approvals open changed (``at``: the time of
        what changed them, epoch ms)."""
        slot = self.inflight
        if slot is None:
            return
        book = self.approvals
        result = ex.set_open_items(
            slot,
            ops.open_operation_ids(self.operations),
            book.open_request_ids() if book is not None else (),
            at,
        )
        if result.published is not None:
            self._set_slot(result.slot, step)
            step.outputs.append(result.published)

    def _on_operation(self, event: ev.OperationEvent, step: Step) -> None:
        config = self.rules.operations
        book = self.operations
        at = (event.occurred_at - ex.EPOCH) // ONE_MS
        if book is not None and book.due is not None and book.due < at:
            # Deadlines before this event, judged on this topic's own order: a reply stamped
            # after its deadline finds the attempt already UNKNOWN, live and in a replay.
            before = ops.advance(book, at - 1)
            step.outputs.extend(before.outputs)
            book = before.book
        result = ops.apply_event(book, event, config)
        if result.outputs or not result.anomalies:
            step.trace_key = trace.operation_key(event.operation_id)
            step.traced_from = len(step.outputs)
        step.outputs.extend(result.outputs)
        step.outputs.extend(Refusal(f) for f in result.anomalies)
        if result.book is not None:
            self._set_operations(result.book, step)
        self._sync_open_items(at, step)

    def _set_operations(self, book: ops.OperationBook, step: Step) -> None:
        self.operations = book
        self.changed.add("operations")
        due = ops.next_deadline(book)
        if due is not None:
            step.due.append(due)

    def _on_approval_fact(self, event: ap.ApprovalEvent, step: Step) -> None:
        """Facts are kept at once and judged when stream time passes them, so a decision and
        its receipt meet whichever topic delivers first, and a fact that comes before its
        request waits for it in the book."""
        book = self.approvals
        if book is None:
            book = self.approvals = ap.Ledger(self.execution_id)
        conflict = book.conflict(event)
        if conflict is not None:
            step.outputs.append(Refusal(conflict))
        book.add(event)
        self.changed.add("approvals")
        step.trace_key = trace.key_of_input(event)
        step.due.append(to_ms(event.occurred_at))

    # -- time -----------------------------------------------------------------------------
    def advance(self, horizon: int) -> Step:
        """Stream time has passed ``horizon`` (epoch ms): forget a long-closed execution, fire
        the operations' deadlines and judge the approvals' change points up to it."""
        step = Step()
        closed = self.closed
        if closed is not None and closed.closed_at + self.rules.closed_retention_ms <= horizon:
            self.closed = None
            self.changed.add("closed")
        changed_at: int | None = None
        book = self.operations
        if book is not None:
            result = ops.advance(book, horizon)
            if result.outputs:
                step.outputs.extend(result.outputs)
                self._set_operations(result.book, step)
                changed_at = max(_stamp(r) for r in result.outputs)
        approvals_at = self._advance_approvals(horizon, step)
        if approvals_at is not None:
            changed_at = approvals_at if changed_at is None else max(changed_at, approvals_at)
        if changed_at is not None:
            self._sync_open_items(changed_at, step)
        return step

    def _advance_approvals(self, horizon: int, step: Step) -> int | None:
        book = self.approvals
        if book is None:
            return None
        rules = self.rules
        book.touched = False
        verdicts, orphans, change, orphaned = book.settle(
            horizon, rules.thresholds_for, rules.orphan_after_ms, rules.closed_retention_ms
        )
        if book.touched:
            self.changed.add("approvals")
        due = step.due
        if change is not None:
            due.append(change)
        if orphaned is not None:  # take_orphans needs the horizon strictly past it
            due.append(orphaned + 1)
        if not verdicts and not orphans:
            return None  # most steps: the book only moved its evaluated_until
        outputs = step.outputs
        for record, previous_id in verdicts:
            outputs.append(Verdict(record, previous_id))
        for rid, last_fact in orphans:
            outputs.append(Orphan(rid, from_ms(last_fact)))
        return max((to_ms(v.evaluated_at) for v, _ in verdicts), default=None)

    def next_due(self) -> list[int]:
        """Every instant at which ``advance`` has something to do, as stored (after a restart
        or a rebalance the shell's due-time index is rebuilt from these): the operations' next
        deadline, the approvals' next change point and orphan deadline, the end of a closed
        execution's retention. Facts stored but not judged yet (the worker stopped in
        between) are due at their own times; if none is after ``evaluated_until`` (a late
        fact), ``pending_dirty`` says the book must be judged at the next instant."""
        due: list[int] = []
        if self.operations is not None:
            deadline = ops.next_deadline(self.operations)
            if deadline is not None:
                due.append(deadline)
        book = self.approvals
        if book is not None:
            change = book.next_change(self.rules.thresholds_for)
            if change is not None:
                due.append(change)
            if book.dirty:
                due.extend(book.times_after(book.evaluated_until))
        if self.closed is not None:
            due.append(self.closed.closed_at + self.rules.closed_retention_ms)
        return due

    def quiet_until(self) -> int | None:
        """The earliest instant at which ``advance`` has something to do, when the parts in
        hand tell it exactly (``NOTHING_DUE``: never), else None.

        Why: most due times the shell indexed are stale by the time they come (an attempt
        answered before its reply deadline), and advancing to one of those changes nothing.
        Knowing this instant, the shell passes them over without decoding the execution.
        It is told only without an approval book, whose change points depend on the
        thresholds and on facts judged late, and only when the operation book is decoded or
        known to be absent: the book keeps its earliest armed deadline (``due``)."""
        book = self._operations
        if self._approvals is not None or book is UNLOADED:
            return None
        due = NOTHING_DUE
        if book is not None and book.due is not None:  # type: ignore[union-attr]
            due = book.due  # type: ignore[union-attr]
        closed = self.closed
        if closed is not None:
            forgotten = closed.closed_at + self.rules.closed_retention_ms
            if forgotten < due:
                due = forgotten
        return due

    def pending_dirty(self) -> bool:
        """Facts stored but not judged, none of them after ``evaluated_until``."""
        book = self.approvals
        return book is not None and bool(book.dirty) and not book.times_after(book.evaluated_until)


def _stamp(record: Record) -> int:
    """An output's time as its Kafka timestamp gives it (epoch ms, through the float of
    ``timestamp()``, as the shell stamps records)."""
    value = getattr(record, record.time_field)  # type: ignore[arg-type]
    return int(value.timestamp() * 1000)
