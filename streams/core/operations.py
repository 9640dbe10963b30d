"""Operation effect tracking: did an effect happen in the outside world?

The execution aggregate (``streams.core.execution``) holds one ``OperationBook`` per execution
(stored with ``dump_book`` in the execution's entry; all of an execution's operations share its
partition) and calls:

- ``apply_event`` for every ``OperationEvent``;
- ``advance`` whenever stream time moves (event time or a clock tick from the log), so a
  timeout fires even when the partition has gone quiet;
- ``next_deadline`` to index the book in its timer index.

The book is made of plain immutable records (named tuples, a slotted dataclass), its times
integer epoch milliseconds; the published records carry them as times.

Why it is shaped like this:

- **No answer is not "did not happen".** A reply timeout makes an attempt UNKNOWN, never
  FAILED, and opens a reconciliation work item. Only evidence closes it: a VERIFIED or FAILED
  event from someone who can know (connector, reconciler or a human), never elapsed time and
  never the agent runtime, which is exactly the party that cannot tell a lost reply from a
  rejection.
- **Attempts are kept.** A forbidden-retry alert names both attempts, and an earlier attempt's
  open work item stays open (and is resolved) on its own, whatever the newer attempt does.
- **One published state per operation, with the operation's verdict.** ``OperationState``
  is compacted by the operation's scoped key (execution and operation id,
  ``streams.contracts.keys``), so it describes the latest attempt (its status, reason,
  deadlines) and carries the retry verdict of the whole operation: the most restrictive of the
  latest attempt's own and those of every attempt that would make a new send a forbidden
  retry (another attempt of the operation, or one of an operation sharing an idempotency key,
  in flight or verified), naming that attempt (``held_by_*``) and its open work item. An agent
  that trusts a SAFE verdict must not get a FORBIDDEN_RETRY alert for acting on it. When an
  attempt changes, every operation whose verdict it bears on is published again if its state
  changed, so the compacted topic always shows the verdict in force.
- **An idempotency key is one effect.** A source's VERIFIED of one attempt settles the other
  UNKNOWN or RECONCILING attempts of the execution under the same key, saying so in their
  resolutions (``_shared_key_siblings``); attempts without that key may be a second effect
  and stay open.
- **Ids are scoped by the execution.** Operation ids repeat across runs (``call_1``), so every
  id made here hashes ``scoped_key(execution_id, operation_id)`` (``work_item_id`` and its
  siblings below).
- **Deadlines are frozen when armed** (from the event or the connector's default), and fired
  outputs are stamped with the deadline, not with the tick that noticed it: the outputs do not
  depend on when ticks arrive, and a replay yields the same records with the same ids.
- **Refused events are findings, not exceptions**: the shell reports them as anomalies.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NamedTuple

from pydantic import AwareDatetime, BaseModel, ConfigDict

from streams.contracts.models.base import Record, construct
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    AnomalyKind,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    Owner,
    RetryVerdict,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core.executions import from_ms, id_ms, to_ms
from streams.core.findings import AnomalyFinding
from streams.core.ids import deterministic_id, scoped_key

S = OperationStatus
K = OperationEventKind

#: Settled: nothing more can happen to this attempt, and its work item (if any) is resolved.
SETTLED: frozenset[OperationStatus] = frozenset({S.VERIFIED, S.FAILED, S.CANCELLED})
#: Under reconciliation: only source evidence (VERIFIED / FAILED) may close these.
RECONCILIATION: frozenset[OperationStatus] = frozenset({S.UNKNOWN, S.RECONCILING, S.MANUAL_REVIEW})
#: The request was handed to the connector and the outcome is not settled.
IN_FLIGHT: frozenset[OperationStatus] = frozenset({S.SENT, S.ACKNOWLEDGED}) | RECONCILIATION
#: A new send while another attempt is in one of these risks a duplicate effect
#: (docs/rules.md#forbidden-retry): the in-flight ones, and VERIFIED, because a resend after a
#: confirmed effect *is* a duplicate effect (unless the connector honours the idempotency key,
#: which we cannot see).
BLOCKS_RETRY: frozenset[OperationStatus] = IN_FLIGHT | {S.VERIFIED}
#: Statuses an attempt may enter more than once (a reviewer hands back to the reconciler).
_REPEATABLE: frozenset[OperationStatus] = frozenset({S.RECONCILING, S.MANUAL_REVIEW})
#: Who can know whether an effect happened. The runtime only knows what it sent.
SOURCE_EVIDENCE: frozenset[EvidenceSource] = frozenset(
    {EvidenceSource.CONNECTOR, EvidenceSource.RECONCILER, EvidenceSource.HUMAN}
)

_RETRY: Mapping[OperationStatus, RetryVerdict] = {
    S.PREPARED: RetryVerdict.NOTHING_SENT,
    S.SENT: RetryVerdict.WAIT,
    S.ACKNOWLEDGED: RetryVerdict.WAIT,
    S.RECONCILING: RetryVerdict.WAIT,
    S.VERIFIED: RetryVerdict.NOT_NEEDED,
    S.UNKNOWN: RetryVerdict.FORBIDDEN,
    S.FAILED: RetryVerdict.SAFE,
    S.CANCELLED: RetryVerdict.SAFE,
    S.MANUAL_REVIEW: RetryVerdict.OWNER_DECIDES,
}

REPLY_TIMEOUT = "reply_timeout"
VERIFICATION_TIMEOUT = "verification_timeout"
LATE_ACK = "late_acknowledgement_ignored"

NEXT_STEP_UNKNOWN = "reconcile against the source; do not retry"
NEXT_STEP_OVERDUE = "verify the effect at the source; do not retry"
NEXT_STEP_FORBIDDEN = "stop the duplicate; reconcile the first attempt before any further send"


#: How far a verdict holds an agent back, to take the most restrictive over several attempts.
#: An outcome still open (unknown, with a human, in flight) outranks an effect that is done:
#: it can still turn into anything. Every verdict that forbids a send outranks the two that
#: allow one.
_RESTRICTION: Mapping[RetryVerdict, int] = {
    RetryVerdict.SAFE: 0,
    RetryVerdict.NOTHING_SENT: 1,
    RetryVerdict.NOT_NEEDED: 2,
    RetryVerdict.WAIT: 3,
    RetryVerdict.OWNER_DECIDES: 4,
    RetryVerdict.FORBIDDEN: 5,
}


def work_item_id(execution_id: str, operation_id: str, attempt: int, kind: WorkItemKind) -> str:
    """The id of the work item a deadline of an attempt opens (docs/rules.md#ids-and-keys):
    scoped by the execution, since operation ids repeat across executions."""
    return deterministic_id("wi", scoped_key(execution_id, operation_id), attempt, kind)


def resolution_id(
    execution_id: str, operation_id: str, item_id: str, outcome: OperationStatus
) -> str:
    """The id of the resolution of work item ``item_id`` (scoped too: an item opened before
    ids were scoped may share its id with another execution's)."""
    return deterministic_id("wr", scoped_key(execution_id, operation_id), item_id, outcome)


def operation_alert_id(
    execution_id: str, operation_id: str, attempt: int, kind: AlertKind, reason: str
) -> str:
    """The id of an OPERATION_UNKNOWN or VERIFICATION_OVERDUE alert of an attempt: ``reason``
    is the reason that fired it (``reply_timeout``, ``verification_timeout``), or
    ``settled_<status>`` for the RESOLVED alert that ends it."""
    return deterministic_id("alert", kind, scoped_key(execution_id, operation_id), attempt, reason)


def retry_verdict(status: OperationStatus) -> RetryVerdict:
    """The retry column of the operation status table
    (docs/rules.md#statuses-and-the-retry-verdict). A status this build cannot read
    (UNRECOGNIZED) answers FORBIDDEN: when in doubt, the safe answer is not to send again."""
    return _RETRY.get(status, RetryVerdict.FORBIDDEN)


def restriction(verdict: RetryVerdict) -> int:
    """The rank of a verdict in ``_RESTRICTION``; one this build cannot read ranks as
    FORBIDDEN."""
    return _RESTRICTION.get(verdict, _RESTRICTION[RetryVerdict.FORBIDDEN])


@dataclass(frozen=True)
class OperationConfig:
    """Default deadlines, used when a SENT / ACKNOWLEDGED event carries none.

    ``overrides`` maps a connector to its own ``(reply_timeout, verify_timeout)``: an SMS
    gateway answers in seconds, a bank transfer is verified in hours.
    """

    reply_timeout: timedelta = timedelta(seconds=30)
    verify_timeout: timedelta = timedelta(minutes=5)
    overrides: Mapping[str, tuple[timedelta, timedelta]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for reply, verify in [(self.reply_timeout, self.verify_timeout), *self.overrides.values()]:
            if reply <= timedelta(0) or verify <= timedelta(0):
                raise ValueError("operation timeouts must be positive")

    def timeouts(self, connector: str) -> tuple[timedelta, timedelta]:
        return self.overrides.get(connector, (self.reply_timeout, self.verify_timeout))

    def timeouts_ms(self, connector: str) -> tuple[int, int]:
        """``timeouts`` in whole milliseconds (a deadline is kept to the millisecond)."""
        reply, verify = self.timeouts(connector)
        return reply // _ONE_MS, verify // _ONE_MS


_ONE_MS = timedelta(milliseconds=1)
_SENT, _ACKNOWLEDGED = S.SENT, S.ACKNOWLEDGED


class AttemptRecord(NamedTuple):
    """What is known about one attempt (one send) of an operation; times in epoch ms."""

    attempt: int
    connector: str
    idempotency_key: str | None
    status: OperationStatus
    reason: str | None
    since: int
    #: Sent evidence was seen (SENT, ACKNOWLEDGED or VERIFIED): the forbidden-retry check runs
    #: once per attempt, when this turns true.
    sent: bool = False
    reply_due_at: int | None = None
    verify_due_at: int | None = None
    effect_ref: str | None = None
    #: The open reconciliation work item and the FIRING alert that announced it.
    work_item_id: str | None = None
    work_item_kind: WorkItemKind | None = None
    alert_id: str | None = None
    #: Applied event kinds and ids: a redelivery is a DUPLICATE, not a second transition.
    kinds: tuple[OperationEventKind, ...] = ()
    event_ids: tuple[str, ...] = ()
    #: The FORBIDDEN_RETRY alert this attempt's send raised, while it has not ended, and the
    #: attempts it named as (operation id, attempt): it ends once they and this one are
    #: settled with no duplicate effect among them (``_ended_retry_alerts``).
    retry_alert_id: str | None = None
    retry_of: tuple[tuple[str, int], ...] = ()

    def armed_deadline(self) -> int | None:
        """The deadline still to fire: the reply while SENT, the verification while
        ACKNOWLEDGED and not yet overdue. Other statuses have an owner already."""
        status = self.status
        if status is _SENT:
            return self.reply_due_at
        if status is _ACKNOWLEDGED and self.work_item_id is None:
            return self.verify_due_at
        return None


class OperationRecord(NamedTuple):
    operation_id: str
    attempts: dict[int, AttemptRecord]

    @property
    def current(self) -> AttemptRecord:
        """The latest attempt: the one the published ``OperationState`` describes."""
        return self.attempts[max(self.attempts)]


@dataclass(frozen=True, slots=True)
class OperationBook:
    """All operations of one execution, and idempotency key → operation ids using it (a key
    reused by a different operation id is the same effect sent twice). A value: every change
    makes a new book (the dicts are never changed in place).

    ``open_ids`` are the operations not settled (``open_operation_ids``) and ``due`` the
    earliest armed deadline (``next_deadline``), kept with the book rather than found again
    for every input (``_derived``: a book is made by ``apply_event``, ``advance`` or
    ``load_book``, which keep them)."""

    execution_id: str
    operations: dict[str, OperationRecord] = field(default_factory=dict)
    by_idempotency_key: dict[str, tuple[str, ...]] = field(default_factory=dict)
    open_ids: tuple[str, ...] = ()
    due: int | None = None


def _derived(
    execution_id: str,
    operations: dict[str, OperationRecord],
    by_idempotency_key: dict[str, tuple[str, ...]],
) -> OperationBook:
    """The book with what it keeps derived from its operations. Open: the latest attempt is
    not VERIFIED / FAILED / CANCELLED, or an older attempt that was sent is still unsettled
    (its work item is still open); an older attempt that was only PREPARED and then
    superseded does not keep the operation open."""
    open_ids: list[str] = []
    due: int | None = None
    for op_id, op in operations.items():
        attempts = op.attempts
        if attempts[max(attempts)].status not in SETTLED or any(
            rec.status in IN_FLIGHT for rec in attempts.values()
        ):
            open_ids.append(op_id)
        for rec in attempts.values():
            deadline = rec.armed_deadline()
            if deadline is not None and (due is None or deadline < due):
                due = deadline
    open_ids.sort()
    return OperationBook(execution_id, operations, by_idempotency_key, tuple(open_ids), due)


class OperationStep(NamedTuple):
    """The new book, the records to publish in this order, and the refused inputs."""

    book: OperationBook
    outputs: tuple[Record, ...] = ()
    anomalies: tuple[AnomalyFinding, ...] = ()


def _put(book: OperationBook, operation_id: str, rec: AttemptRecord) -> OperationBook:
    old = book.operations.get(operation_id)
    attempts = {**old.attempts, rec.attempt: rec} if old else {rec.attempt: rec}
    ops = {**book.operations, operation_id: OperationRecord(operation_id, attempts)}
    index = book.by_idempotency_key
    key = rec.idempotency_key
    if key and operation_id not in index.get(key, ()):
        index = {**index, key: (*index.get(key, ()), operation_id)}
    return _derived(book.execution_id, ops, index)


def _is_current(book: OperationBook, operation_id: str, rec: AttemptRecord) -> bool:
    return book.operations[operation_id].current.attempt == rec.attempt


def _holding(
    book: OperationBook, operation_id: str, latest: int
) -> list[tuple[str, AttemptRecord]]:
    """The attempts other than the latest that hold a new send of the operation back: those a
    send would be a forbidden retry of (``_blocking``) whatever attempt number it takes and
    whichever of the operation's idempotency keys it carries. Own attempts first by number,
    then other operations' by id and number: the order in which ties are given the hold."""
    attempts = book.operations[operation_id].attempts
    index = book.by_idempotency_key
    if len(attempts) == 1:  # the common case, once per published state: a single attempt
        key = attempts[latest].idempotency_key
        if key is None or index.get(key) == (operation_id,):
            return []
    found = [
        (operation_id, rec)
        for a, rec in sorted(attempts.items())
        if a != latest and rec.status in BLOCKS_RETRY
    ]
    keys = {rec.idempotency_key for rec in attempts.values() if rec.idempotency_key}
    others = {o for k in keys for o in index.get(k, ())} - {operation_id}
    for other in sorted(others):
        for _, rec in sorted(book.operations[other].attempts.items()):
            if rec.idempotency_key in keys and rec.status in BLOCKS_RETRY:
                found.append((other, rec))
    return found


def _verdict(
    book: OperationBook, operation_id: str, latest: AttemptRecord
) -> tuple[RetryVerdict, tuple[str, AttemptRecord] | None, str | None]:
    """The operation's retry verdict, the attempt holding it back (None: the latest attempt
    gives it) and the open work item to name.

    The holder is the most restrictive attempt; among equals one with an open work item (it
    says what to reconcile), then the latest attempt, then the first in ``_holding``'s order.
    The work item is the holder's (or the latest attempt's); if it has none, the one of the
    most restrictive attempt that has one, so an open item is never hidden.
    """
    holding = _holding(book, operation_id, latest.attempt)
    verdict = retry_verdict(latest.status)
    if not holding:
        return verdict, None, latest.work_item_id
    best: tuple[str, AttemptRecord] | None = None
    rank = (restriction(verdict), latest.work_item_id is not None)
    item, item_rank = latest.work_item_id, restriction(verdict)
    for op_id, rec in holding:
        rec_verdict = retry_verdict(rec.status)
        r = (restriction(rec_verdict), rec.work_item_id is not None)
        if r > rank:
            best, rank, verdict = (op_id, rec), r, rec_verdict
        if rec.work_item_id is not None and (item is None or r[0] > item_rank):
            item, item_rank = rec.work_item_id, r[0]
    if best is not None and best[1].work_item_id is not None:
        item = best[1].work_item_id
    return verdict, best, item


def _state(book: OperationBook, operation_id: str, cause: str | None = None) -> OperationState:
    """The published state of an operation: its latest attempt, with the operation's verdict.

    A deadline is shown while it is in force, and in the state its expiry caused (UNKNOWN
    shows the reply deadline that passed). The id is that of the latest attempt's transition,
    plus the verdict's holder and work item when they do not come from the latest attempt
    alone, plus ``cause`` (the change of another attempt that made this state) for a state
    published again: a state can come back to an earlier content (attempt 1 times out, then
    fails) and must not come back with an id a consumer has already seen.
    """
    op = book.operations[operation_id]
    rec = op.current
    retry, holder, work_item = _verdict(book, operation_id, rec)
    reply_due = rec.reply_due_at if rec.status in (S.SENT, S.UNKNOWN) else None
    verify_due = rec.verify_due_at if rec.status is S.ACKNOWLEDGED else None
    # The reason is part of the id: ACKNOWLEDGED and ACKNOWLEDGED-but-overdue are two
    # different records with the same status and ``since``. RECONCILING and MANUAL_REVIEW may
    # alternate, at one instant too: the times the status was entered tell them apart.
    key = scoped_key(book.execution_id, operation_id)
    parts: list[object] = [key, rec.attempt, rec.status, id_ms(rec.since), rec.reason]
    if rec.status in _REPEATABLE:
        entered = sum(1 for k in rec.kinds if k.value == rec.status.value)
        if entered > 1:
            parts += ["entered", entered]
    if holder is not None or work_item != rec.work_item_id:
        held = (holder[0], holder[1].attempt, holder[1].status) if holder else (None, None, None)
        parts += ["held", retry, *held, work_item]
    if cause is not None:
        parts += ["after", cause]
    # Built without re-validation (once per published state): every value comes from a valid
    # attempt, its times whole milliseconds in UTC as validation would give them.
    return construct(
        OperationState,
        {
            "operation_id": operation_id,
            "execution_id": book.execution_id,
            "attempt": rec.attempt,
            "idempotency_key": rec.idempotency_key,
            "connector": rec.connector,
            "status": rec.status,
            "retry": retry,
            "reason": rec.reason,
            "since": from_ms(rec.since),
            "reply_due_at": None if reply_due is None else from_ms(reply_due),
            "verify_due_at": None if verify_due is None else from_ms(verify_due),
            "effect_ref": rec.effect_ref,
            "open_work_item_id": work_item,
            "state_id": deterministic_id("os", *parts),
            "held_by_operation_id": holder[0] if holder else None,
            "held_by_attempt": holder[1].attempt if holder else None,
            "held_by_status": holder[1].status if holder else None,
            "held_by_execution_id": None,  # another execution's holder: streams.core.cross
            "traceparent": None,  # trace context is the shell's to stamp
        },
    )


def _states(
    before: OperationBook,
    after: OperationBook,
    operation_id: str,
    changed: AttemptRecord,
    old_key: str | None,
    cause: str,
) -> list[OperationState]:
    """The states to publish after attempt ``changed`` of ``operation_id`` changed.

    The operation's own state always when ``changed`` is its latest attempt: every transition
    of the latest attempt is a record of its own. Then every operation whose verdict the
    attempt bears on (this one, when an older attempt changed, and those sharing the attempt's
    idempotency key) whose state differs from the one before, by operation id.
    """
    current = _is_current(after, operation_id, changed)
    out = [_state(after, operation_id)] if current else []
    affected: set[str] = set()
    for key in (old_key, changed.idempotency_key):
        if key:
            affected.update(after.by_idempotency_key.get(key, ()))
    if current:
        affected.discard(operation_id)
    else:
        affected.add(operation_id)
    for op_id in sorted(affected):
        new = _state(after, op_id, cause)
        if op_id not in before.operations or _state(before, op_id, cause) != new:
            out.append(new)
    return out


def _judge(
    rec: AttemptRecord | None, event: OperationEvent
) -> tuple[OperationStatus, str | None] | AnomalyFinding:
    """The transition ``event`` causes on attempt ``rec`` (None: first event of the attempt),
    as (new status, derived reason), or why it is refused. Duplicates are filtered before."""
    kind, status = event.kind, (rec.status if rec else None)
    never_sent = rec is None or (not rec.sent and status is S.PREPARED)
    if status in SETTLED:
        if {status, kind} == {S.VERIFIED, K.FAILED} or {status, kind} == {S.FAILED, K.VERIFIED}:
            return AnomalyFinding(
                AnomalyKind.ILLEGAL_TRANSITION, f"contradicting evidence: {kind} after {status}"
            )
        return AnomalyFinding(AnomalyKind.AFTER_TERMINAL, f"{kind} after settled {status}")
    if kind is K.PREPARED:
        if rec is None:
            return S.PREPARED, None
        return AnomalyFinding(AnomalyKind.OUT_OF_ORDER, f"PREPARED after {status}")
    if kind is K.SENT:
        if never_sent:
            return S.SENT, None
        # Only reachable when a reply overtook its own SENT (ACKNOWLEDGED before SENT).
        return AnomalyFinding(AnomalyKind.OUT_OF_ORDER, f"SENT after {status} of the same attempt")
    if kind is K.ACKNOWLEDGED:
        if status in RECONCILIATION:
            # Transport only: after a timeout it proves nothing about the effect.
            return status, LATE_ACK
        return S.ACKNOWLEDGED, None  # from SENT, or a reply that overtook its SENT
    if kind in (K.VERIFIED, K.FAILED):
        if status in RECONCILIATION and event.evidence_source not in SOURCE_EVIDENCE:
            return AnomalyFinding(
                AnomalyKind.ILLEGAL_TRANSITION,
                f"{kind} from {event.evidence_source} cannot settle {status}: "
                "only the connector, the reconciler or a human can know the effect",
            )
        return S(kind.value), None
    if kind is K.CANCELLED:
        if never_sent:
            return S.CANCELLED, None
        if status in RECONCILIATION:
            return AnomalyFinding(
                AnomalyKind.ILLEGAL_TRANSITION,
                f"CANCELLED cannot settle {status}: only VERIFIED or FAILED evidence can",
            )
        if event.evidence_source not in SOURCE_EVIDENCE:
            return AnomalyFinding(
                AnomalyKind.ILLEGAL_TRANSITION,
                f"CANCELLED from {event.evidence_source} after {status}: "
                "the effect may already have happened",
            )
        return S.CANCELLED, None
    if kind in (K.RECONCILING, K.MANUAL_REVIEW):
        if never_sent:
            return AnomalyFinding(
                AnomalyKind.ILLEGAL_TRANSITION, f"{kind} of an attempt that was never sent"
            )
        return S(kind.value), None
    return AnomalyFinding(AnomalyKind.UNRECOGNIZED_SYMBOL, f"operation event kind {kind}")


def _is_duplicate(rec: AttemptRecord | None, event: OperationEvent) -> bool:
    """Same event id, or the same kind already applied to this attempt. RECONCILING and
    MANUAL_REVIEW may alternate (a reviewer hands back to the reconciler), so they repeat
    legitimately unless the attempt is already in that status."""
    if rec is None:
        return False
    if event.event_id in rec.event_ids:
        return True
    if event.kind in (K.RECONCILING, K.MANUAL_REVIEW):
        return rec.status.value == event.kind.value
    return event.kind in rec.kinds


def _blocking(
    book: OperationBook, operation_id: str, attempt: int, key: str | None
) -> list[tuple[str, AttemptRecord]]:
    """Other attempts a new send of (operation_id, attempt) would duplicate: every other
    attempt of the same operation, and every attempt of another operation under the same
    idempotency key, that is in flight or verified. All of them, not only the last one: an
    UNKNOWN attempt 1 is still a risk after a (forbidden) attempt 2 was rejected."""
    same_key = book.by_idempotency_key.get(key, ()) if key else ()
    if not same_key or same_key == (operation_id,):
        # the common case, once per send: no other operation under the key, and this attempt
        # the operation's only one (or its first)
        op = book.operations.get(operation_id)
        if op is None or op.attempts.keys() <= {attempt}:
            return []
    found: list[tuple[str, AttemptRecord]] = []
    for op_id in sorted({operation_id, *same_key} & book.operations.keys()):
        for a, rec in sorted(book.operations[op_id].attempts.items()):
            related = a != attempt if op_id == operation_id else rec.idempotency_key == key
            if related and rec.status in BLOCKS_RETRY:
                found.append((op_id, rec))
    return found


def _forbidden_retry(
    book: OperationBook, event: OperationEvent, key: str | None
) -> tuple[Alert | None, tuple[tuple[str, int], ...]]:
    """The FORBIDDEN_RETRY alert of a send (None: it is not one), and the attempts it names
    as (operation id, attempt): those the send would duplicate."""
    blocking = _blocking(book, event.operation_id, event.attempt, key)
    if not blocking:
        return None, ()
    refs = tuple(f"previous={op}#{rec.attempt}:{rec.status}" for op, rec in blocking)
    alert = Alert(
        alert_id=deterministic_id(
            "alert",
            AlertKind.FORBIDDEN_RETRY,
            scoped_key(book.execution_id, event.operation_id),
            event.attempt,
            *refs,
        ),
        kind=AlertKind.FORBIDDEN_RETRY,
        status=AlertStatus.FIRING,
        severity=Severity.CRITICAL,
        execution_id=book.execution_id,
        subject_id=event.operation_id,
        verdict=blocking[-1][1].status.value,
        owner=Owner.RUNTIME_OWNER,
        next_step=NEXT_STEP_FORBIDDEN,
        evidence=(
            f"attempt={event.operation_id}#{event.attempt}",
            *refs,
            *((f"idempotency_key={key}",) if key else ()),
            f"event={event.event_id}",
        ),
        occurred_at=event.occurred_at,
        ends_with_resolved=True,
    )
    return alert, tuple((op, rec.attempt) for op, rec in blocking)


def one_effect(a: AttemptRecord, b: AttemptRecord) -> bool:
    """Whether two VERIFIED attempts are one effect (docs/rules.md#alert-lifecycle): they
    carry the same idempotency key, which makes every send carrying it one effect
    (docs/rules.md#shared-idempotency-key-evidence), and do not name two different effect
    references. Without a shared key, two verified sends are two effects."""
    key = a.idempotency_key
    if key is None or key != b.idempotency_key:
        return False
    return not (a.effect_ref and b.effect_ref and a.effect_ref != b.effect_ref)


def duplicate_effect(attempts: Iterable[AttemptRecord]) -> bool:
    """Whether two of the attempts are VERIFIED and not one effect (``one_effect``): a
    duplicate effect happened."""
    verified = [a for a in attempts if a.status is S.VERIFIED]
    return any(not one_effect(a, b) for i, a in enumerate(verified) for b in verified[i + 1 :])


def retry_resolved_id(fired_id: str) -> str:
    """The id of the RESOLVED alert that ends the FORBIDDEN_RETRY alert ``fired_id``: one
    per alert, since an alert ends once."""
    return deterministic_id("alert-resolved", AlertKind.FORBIDDEN_RETRY, fired_id)


def _ended_retry_alerts(
    book: OperationBook, event: OperationEvent
) -> tuple[OperationBook, list[Alert]]:
    """The FORBIDDEN_RETRY alerts of the book that ``event`` (a settling) ends, as RESOLVED
    alerts stamped with its time, and the book without them (docs/rules.md#alert-lifecycle):
    an alert ends when the send that raised it and every attempt it named are settled
    (VERIFIED, FAILED, CANCELLED), with no duplicate effect among them. The duplicate-effect
    risk it raised is then decided: nothing it names can take effect any more, and a new send
    is judged by the operation's retry verdict like any other. Two effects confirmed
    (``duplicate_effect``) do not end it: the duplicate is in the world, and nothing vigil
    reads says it was made good. In the order of operation id and attempt."""
    out: list[Alert] = []
    for op_id in sorted(book.operations):
        for _, rec in sorted(book.operations[op_id].attempts.items()):
            fired = rec.retry_alert_id
            if fired is None or rec.status not in SETTLED:
                continue
            named: list[tuple[str, AttemptRecord]] = [(op_id, rec)]
            for other_op, number in rec.retry_of:
                other = book.operations.get(other_op)
                attempt = other.attempts.get(number) if other is not None else None
                if attempt is not None:
                    named.append((other_op, attempt))
            if any(a.status not in SETTLED for _, a in named) or duplicate_effect(
                a for _, a in named
            ):
                continue
            outcome = ", ".join(f"{o}#{a.attempt} {a.status}" for o, a in named)
            out.append(
                Alert(
                    alert_id=retry_resolved_id(fired),
                    kind=AlertKind.FORBIDDEN_RETRY,
                    status=AlertStatus.RESOLVED,
                    severity=Severity.INFO,
                    execution_id=book.execution_id,
                    subject_id=op_id,
                    verdict=rec.status.value,
                    owner=Owner.RUNTIME_OWNER,
                    next_step=(
                        f"none: every attempt it named is settled ({outcome}), with at most one "
                        "effect; a new send is judged by the operation's retry verdict"
                    ),
                    evidence=(
                        f"attempt={op_id}#{rec.attempt}:{rec.status}",
                        *(f"previous={o}#{a.attempt}:{a.status}" for o, a in named[1:]),
                        f"event={event.event_id}",
                    ),
                    occurred_at=event.occurred_at,
                    resolves_alert_id=fired,
                )
            )
            book = _put(book, op_id, rec._replace(retry_alert_id=None, retry_of=()))
    return book, out


def _settle(
    book: OperationBook,
    operation_id: str,
    rec: AttemptRecord,
    event: OperationEvent,
    verified_by: tuple[str, int] | None = None,
) -> list[Record]:
    """Resolution records for an attempt that just settled with an open work item: the
    ``WorkItemResolution`` (whoever works the item can stop) and the RESOLVED alert.
    ``verified_by`` names the attempt whose VERIFIED settled this one by their shared
    idempotency key (``_shared_key_siblings``); both records then say so in their evidence."""
    if rec.work_item_id is None:
        return []
    shared: tuple[str, ...] = ()
    because = ""
    if verified_by is not None:
        shared = (
            f"verified_by={verified_by[0]}#{verified_by[1]}",
            f"idempotency_key={rec.idempotency_key}",
        )
        because = f" (attempt {verified_by[0]}#{verified_by[1]} under the same idempotency key)"
    out: list[Record] = [
        WorkItemResolution(
            resolution_id=resolution_id(
                book.execution_id, operation_id, rec.work_item_id, rec.status
            ),
            work_item_id=rec.work_item_id,
            operation_id=operation_id,
            execution_id=book.execution_id,
            attempt=rec.attempt,
            outcome=rec.status,
            evidence_source=event.evidence_source,
            resolved_at=event.occurred_at,
            evidence=shared,
        )
    ]
    if rec.alert_id is not None:
        kind = (
            AlertKind.OPERATION_UNKNOWN
            if rec.work_item_kind is WorkItemKind.REPLY_TIMEOUT
            else AlertKind.VERIFICATION_OVERDUE
        )
        out.append(
            Alert(
                alert_id=operation_alert_id(
                    book.execution_id, operation_id, rec.attempt, kind, f"settled_{rec.status}"
                ),
                kind=kind,
                status=AlertStatus.RESOLVED,
                severity=Severity.INFO,
                execution_id=book.execution_id,
                subject_id=operation_id,
                verdict=rec.status.value,
                owner=Owner.CONNECTOR_OWNER,
                next_step=(
                    f"none: settled {rec.status} on evidence from {event.evidence_source}{because}"
                ),
                evidence=(
                    f"attempt={operation_id}#{rec.attempt}",
                    f"work_item={rec.work_item_id}",
                    *shared,
                    f"event={event.event_id}",
                ),
                occurred_at=event.occurred_at,
                resolves_alert_id=rec.alert_id,
            )
        )
    return out


def _shared_key_siblings(
    book: OperationBook, operation_id: str, rec: AttemptRecord
) -> list[tuple[str, AttemptRecord]]:
    """The attempts that a source's VERIFIED of ``rec`` settles as well
    (docs/rules.md#shared-idempotency-key-evidence): every other attempt of the execution that
    carries the same idempotency key and is UNKNOWN or RECONCILING. The key makes them one
    effect, and that effect is now verified. By operation id, then attempt number. Attempts
    without that key stay open (they may be a second effect), and MANUAL_REVIEW stays with the
    person who has it."""
    key = rec.idempotency_key
    if not key:
        return []
    found = []
    for op_id in sorted(book.by_idempotency_key.get(key, ())):
        for number, other in sorted(book.operations[op_id].attempts.items()):
            if (op_id, number) == (operation_id, rec.attempt):
                continue
            if other.idempotency_key == key and other.status in _SETTLED_BY_SHARED_KEY:
                found.append((op_id, other))
    return found


#: Statuses an attempt is settled from by a VERIFIED of another attempt with its key.
_SETTLED_BY_SHARED_KEY: frozenset[OperationStatus] = frozenset({S.UNKNOWN, S.RECONCILING})
#: The reason of an attempt so settled.
VERIFIED_BY_SHARED_KEY = "verified_by_shared_idempotency_key"


def apply_event(
    book: OperationBook | None, event: OperationEvent, config: OperationConfig
) -> OperationStep:
    """Apply one operation event: applied and published, or refused as an anomaly.

    Deadlines are not fired here: the shell advances the book to stream time (which includes
    this event's time) before applying, so a reply whose event time is past its deadline is
    judged late, the same way live and in a replay.
    """
    book = book or OperationBook(event.execution_id)

    def refuse(kind: AnomalyKind, reason: str) -> OperationStep:
        return OperationStep(book, (), (AnomalyFinding(kind, reason),))

    if event.execution_id != book.execution_id:
        return refuse(
            AnomalyKind.KEY_MISMATCH,
            f"event of execution {event.execution_id} in the book of {book.execution_id}",
        )
    if event.kind is K.UNRECOGNIZED:
        return refuse(AnomalyKind.UNRECOGNIZED_SYMBOL, "operation event kind UNRECOGNIZED")
    op = book.operations.get(event.operation_id)
    old = op.attempts.get(event.attempt) if op else None
    if _is_duplicate(old, event):
        return refuse(
            AnomalyKind.DUPLICATE,
            f"{event.kind} of {event.operation_id}#{event.attempt} already applied",
        )
    verdict = _judge(old, event)
    if isinstance(verdict, AnomalyFinding):
        return OperationStep(book, (), (verdict,))
    status, reason = verdict

    t = to_ms(event.occurred_at)
    # A deadline before the event itself is nonsense from the producer: it falls due at once.
    reply_due = verify_due = None
    if status is _SENT:
        due = event.reply_due_at
        reply_due = max(t, to_ms(due) if due else t + config.timeouts_ms(event.connector)[0])
    elif status is _ACKNOWLEDGED:
        due = event.verify_due_at
        verify_due = max(t, to_ms(due) if due else t + config.timeouts_ms(event.connector)[1])
    if old is None:
        rec = AttemptRecord(
            event.attempt,
            event.connector or "",
            event.idempotency_key or None,
            status,
            reason,
            t,
            status in BLOCKS_RETRY,
            reply_due,
            verify_due,
            event.effect_ref or None,
            None,
            None,
            None,
            (event.kind,),
            (event.event_id,),
        )
    else:
        rec = AttemptRecord(
            old.attempt,
            event.connector or old.connector,
            event.idempotency_key or old.idempotency_key,
            status,
            reason,
            t if status is not old.status else old.since,
            old.sent or status in BLOCKS_RETRY,
            old.reply_due_at if reply_due is None else reply_due,
            old.verify_due_at if verify_due is None else verify_due,
            event.effect_ref or old.effect_ref,
            old.work_item_id,
            old.work_item_kind,
            old.alert_id,
            (*old.kinds, event.kind),
            (*old.event_ids, event.event_id),
            old.retry_alert_id,
            old.retry_of,
        )

    settled: list[Record] = []
    alert = None
    if rec.sent and not (old is not None and old.sent):
        alert, named = _forbidden_retry(book, event, rec.idempotency_key)
        if alert is not None:
            rec = rec._replace(retry_alert_id=alert.alert_id, retry_of=named)
    if status in SETTLED:
        settled = _settle(book, event.operation_id, rec, event)
        rec = rec._replace(work_item_id=None, work_item_kind=None, alert_id=None)
    before, book = book, _put(book, event.operation_id, rec)
    cause = f"{event.operation_id}#{event.attempt}:{event.event_id}"
    old_key = old.idempotency_key if old else None
    outputs: list[Record] = [*_states(before, book, event.operation_id, rec, old_key, cause)]
    outputs.extend(settled)
    if status is S.VERIFIED and event.evidence_source in SOURCE_EVIDENCE:
        verified_by = (event.operation_id, event.attempt)
        for op_id, sibling in _shared_key_siblings(book, event.operation_id, rec):
            done = sibling._replace(status=S.VERIFIED, reason=VERIFIED_BY_SHARED_KEY, since=t)
            records = _settle(book, op_id, done, event, verified_by)
            done = done._replace(work_item_id=None, work_item_kind=None, alert_id=None)
            before, book = book, _put(book, op_id, done)
            key = done.idempotency_key
            outputs.extend(_states(before, book, op_id, done, key, cause))
            outputs.extend(records)
    if alert is not None:
        outputs.append(alert)
    if status in SETTLED:
        # only a settling can end a FORBIDDEN_RETRY alert (every attempt it names settled)
        book, ended = _ended_retry_alerts(book, event)
        outputs.extend(ended)
    return OperationStep(book, tuple(outputs), ())


def _fire(
    book: OperationBook, operation_id: str, rec: AttemptRecord
) -> tuple[OperationBook, list[Record]]:
    """Fire the armed deadline of one attempt, stamped with the deadline itself."""
    deadline = rec.armed_deadline()
    assert deadline is not None
    if rec.status is S.SENT:
        wi_kind, alert_kind, reason = (
            WorkItemKind.REPLY_TIMEOUT,
            AlertKind.OPERATION_UNKNOWN,
            REPLY_TIMEOUT,
        )
        status, since = S.UNKNOWN, deadline
    else:
        wi_kind, alert_kind, reason = (
            WorkItemKind.VERIFICATION_TIMEOUT,
            AlertKind.VERIFICATION_OVERDUE,
            VERIFICATION_TIMEOUT,
        )
        # Transport was confirmed: that fact stays true. The state says why it needs
        # reconciliation; the retry verdict (WAIT) is already "do not resend".
        status, since = S.ACKNOWLEDGED, rec.since
    wi_id = work_item_id(book.execution_id, operation_id, rec.attempt, wi_kind)
    alert_id = operation_alert_id(book.execution_id, operation_id, rec.attempt, alert_kind, reason)
    rec = rec._replace(
        status=status,
        since=since,
        reason=reason,
        work_item_id=wi_id,
        work_item_kind=wi_kind,
        alert_id=alert_id,
    )
    before, book = book, _put(book, operation_id, rec)
    out: list[Record] = [*_states(before, book, operation_id, rec, rec.idempotency_key, wi_id)]
    out.extend(timeout_records(book.execution_id, operation_id, rec, deadline))
    return book, out


def timeout_records(
    execution_id: str, operation_id: str, rec: AttemptRecord, deadline: int
) -> tuple[ReconciliationWorkItem, Alert]:
    """The work item and the FIRING alert a fired deadline opens, ``rec`` as the firing left
    it (its status, reason, work item and alert set), both stamped with the deadline. Built
    without re-validation: every value comes from a valid attempt."""
    at = from_ms(deadline)
    wi_kind = rec.work_item_kind
    reply = wi_kind is WorkItemKind.REPLY_TIMEOUT
    item = construct(
        ReconciliationWorkItem,
        {
            "work_item_id": rec.work_item_id,
            "operation_id": operation_id,
            "execution_id": execution_id,
            "attempt": rec.attempt,
            "idempotency_key": rec.idempotency_key,
            "connector": rec.connector,
            "kind": wi_kind,
            "deadline": at,
            "created_at": at,
            "effect_ref": rec.effect_ref,
            "traceparent": None,
        },
    )
    alert = construct(
        Alert,
        {
            "alert_id": rec.alert_id,
            "kind": AlertKind.OPERATION_UNKNOWN if reply else AlertKind.VERIFICATION_OVERDUE,
            "status": AlertStatus.FIRING,
            "severity": Severity.WARNING,
            "execution_id": execution_id,
            "subject_id": operation_id,
            "verdict": rec.status.value,
            "owner": Owner.CONNECTOR_OWNER,
            "next_step": NEXT_STEP_UNKNOWN if reply else NEXT_STEP_OVERDUE,
            "evidence": (
                f"attempt={operation_id}#{rec.attempt}",
                f"{rec.reason}={at.isoformat()}",
                f"connector={rec.connector}",
                f"work_item={rec.work_item_id}",
            ),
            "occurred_at": at,
            "resolves_alert_id": None,
            "traceparent": None,
            "ends_with_resolved": True,
        },
    )
    return item, alert


def _armed(book: OperationBook) -> Iterable[tuple[int, str, int]]:
    for op_id, op in book.operations.items():
        for rec in op.attempts.values():
            deadline = rec.armed_deadline()
            if deadline is not None:
                yield deadline, op_id, rec.attempt


def advance(book: OperationBook, stream_time: int) -> OperationStep:
    """Fire every deadline ≤ ``stream_time`` (epoch ms), in (deadline, operation, attempt)
    order.

    Idempotent, and advancing in steps equals one big step: a fired deadline is disarmed, and
    outputs carry the deadline's time, not ``stream_time``. Deadlines were fixed when armed,
    so a configuration change cannot move a deadline that is already running.
    """
    due = book.due
    if due is None or due > stream_time:
        return OperationStep(book)  # the common case: nothing falls due
    outputs: list[Record] = []
    for _, op_id, attempt in sorted(d for d in _armed(book) if d[0] <= stream_time):
        book, out = _fire(book, op_id, book.operations[op_id].attempts[attempt])
        outputs.extend(out)
    return OperationStep(book, tuple(outputs), ())


def next_deadline(book: OperationBook | None) -> int | None:
    """The earliest armed deadline of the book (epoch ms), for the shell's timer index."""
    return None if book is None else book.due


def open_operation_ids(book: OperationBook | None) -> tuple[str, ...]:
    """Operations not settled, sorted (see ``_derived``)."""
    return () if book is None else book.open_ids


def current_states(book: OperationBook | None) -> tuple[OperationState, ...]:
    """The state of every operation of the book (its latest attempt, the operation's
    verdict), by id: what the read side shows for an execution, equal to the last published
    one in every field but ``state_id`` (the id of a state published again names its cause,
    which the book does not keep)."""
    if book is None:
        return ()
    return tuple(_state(book, op_id) for op_id in sorted(book.operations))


# -- storage ------------------------------------------------------------------------------
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_STATUS: dict[str, OperationStatus] = {x.value: x for x in OperationStatus}
_KIND: dict[str, OperationEventKind] = {x.value: x for x in OperationEventKind}
_WORK: dict[str, WorkItemKind] = {x.value: x for x in WorkItemKind}


def dump_book(book: OperationBook) -> str:
    """The stored text of a book (format 2): a JSON array of the execution id, each
    operation as its id and attempts (each attempt's fields in order, times in epoch ms; the
    open FORBIDDEN_RETRY alert and the attempts it names only when there is one), and the
    idempotency-key index. ``open_ids`` and ``due`` are not stored: they follow from the
    operations."""
    return _dumps(
        (
            book.execution_id,
            [
                (op_id, [a if a.retry_alert_id else a[:_STORED] for a in op.attempts.values()])
                for op_id, op in book.operations.items()
            ],
            book.by_idempotency_key,
        )
    )


#: An attempt's fields stored when it has no open FORBIDDEN_RETRY alert (the last two are
#: then their defaults, and left out: a book written so reads alike before and after them).
_STORED = 15


def load_book(text: str | bytes) -> OperationBook:
    """Inverse of ``dump_book``; also reads format 1 (the JSON object entries held before
    format 2, as 6733ee4 wrote them)."""
    if text[:1] not in ("[", b"["):
        return _from_format_1(_StoredBook.model_validate_json(text))
    execution_id, operations, index = json.loads(text)
    ops: dict[str, OperationRecord] = {}
    for op_id, attempts in operations:
        records: dict[int, AttemptRecord] = {}
        for a in attempts:
            work_kind = a[11]
            rec = AttemptRecord(
                a[0],
                a[1],
                a[2],
                _STATUS[a[3]],
                a[4],
                a[5],
                a[6],
                a[7],
                a[8],
                a[9],
                a[10],
                None if work_kind is None else _WORK[work_kind],
                a[12],
                tuple(_KIND[k] for k in a[13]),
                tuple(a[14]),
                a[15] if len(a) > _STORED else None,
                tuple((o, n) for o, n in a[16]) if len(a) > _STORED + 1 else (),
            )
            records[rec.attempt] = rec
        ops[op_id] = OperationRecord(op_id, records)
    keys = {key: tuple(op_ids) for key, op_ids in index.items()}
    return _derived(execution_id, ops, keys)


class _Stored(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _StoredAttempt(_Stored):
    """An attempt as format 1 stored it (ISO times, fields that are None left out)."""

    attempt: int
    connector: str
    idempotency_key: str | None = None
    status: OperationStatus
    reason: str | None = None
    since: AwareDatetime
    sent: bool = False
    reply_due_at: AwareDatetime | None = None
    verify_due_at: AwareDatetime | None = None
    effect_ref: str | None = None
    work_item_id: str | None = None
    work_item_kind: WorkItemKind | None = None
    alert_id: str | None = None
    kinds: tuple[OperationEventKind, ...] = ()
    event_ids: tuple[str, ...] = ()
    #: never written in format 1; read so that any book converts to it and back
    retry_alert_id: str | None = None
    retry_of: tuple[tuple[str, int], ...] = ()


class _StoredOperation(_Stored):
    operation_id: str
    attempts: dict[int, _StoredAttempt]


class _StoredBook(_Stored):
    execution_id: str
    operations: dict[str, _StoredOperation] = {}
    by_idempotency_key: dict[str, tuple[str, ...]] = {}


def _from_format_1(stored: _StoredBook) -> OperationBook:
    ops: dict[str, OperationRecord] = {}
    for op_id, op in stored.operations.items():
        attempts: dict[int, AttemptRecord] = {}
        for number, a in op.attempts.items():
            fields = dict(a.__dict__)
            for name in ("since", "reply_due_at", "verify_due_at"):
                if fields[name] is not None:
                    fields[name] = to_ms(fields[name])
            attempts[number] = AttemptRecord(**fields)
        ops[op_id] = OperationRecord(op.operation_id, attempts)
    return _derived(stored.execution_id, ops, dict(stored.by_idempotency_key))
