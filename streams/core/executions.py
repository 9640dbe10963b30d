"""The in-flight execution state machine.

The shell keeps one ``Slot`` per execution id in a table and hands every
``ExecutionStatusChanged`` to ``apply_status``. The core answers with the new slot, the state to
publish (if the execution changed) and the anomaly to report (if the event was refused). An
event is either applied and published, or refused and reported: never applied silently, never
dropped silently, never a crash.

A terminal status does not simply delete the entry: it leaves a ``Closed`` tombstone (kept for a
retention the shell enforces) so that a late event for a finished execution is reported as an
anomaly instead of resurrecting it as a new in-flight execution.

Times in the published states come from the events only (never a clock), so a replay of the
same log publishes the very same records, with the very same ``state_id``. Inside the core
they are integer epoch milliseconds (the contract's resolution); the published records carry
them as times.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import pairwise
from json.encoder import encode_basestring_ascii
from typing import Annotated, Literal, NamedTuple

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from streams.contracts.models.base import constructor
from streams.contracts.models.enums import AnomalyKind, ExecutionStatus
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import ExecutionState
from streams.core.findings import AnomalyFinding

_sha256 = hashlib.sha256
_construct_state = constructor(ExecutionState)

S = ExecutionStatus

TERMINAL: frozenset[ExecutionStatus] = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.EXPIRED})
#: Statuses an execution can be in while in flight (UNRECOGNIZED is not a status, only a symbol).
NON_TERMINAL: frozenset[ExecutionStatus] = frozenset(S) - TERMINAL - {S.UNRECOGNIZED}

_HAPPY_PATH = (
    S.CREATED,
    S.VALIDATING,
    S.RESOLVING_CONTEXT,
    S.PLANNING,
    S.RUNNING,
    S.WAITING_FOR_TOOL,
    S.WAITING_FOR_APPROVAL,
    S.VALIDATING_OUTPUT,
    S.COMPLETED,
)
_LOOPS = (
    (S.RUNNING, S.WAITING_FOR_TOOL),
    (S.WAITING_FOR_TOOL, S.RUNNING),
    (S.RUNNING, S.WAITING_FOR_APPROVAL),
    (S.WAITING_FOR_APPROVAL, S.RUNNING),
    (S.RUNNING, S.PLANNING),  # re-plan
    (S.VALIDATING_OUTPUT, S.RUNNING),  # output rejected
    (S.RUNNING, S.VALIDATING_OUTPUT),  # a run that needed neither a tool nor an approval
)
_ABORTS = frozenset({S.FAILED, S.CANCELLED, S.EXPIRED})

#: Every legal (from, to) pair (docs/rules.md#legal-transitions), spelled out once so that it
#: can be printed in topology.md.
LEGAL_TRANSITIONS: frozenset[tuple[ExecutionStatus, ExecutionStatus]] = frozenset(
    {*pairwise(_HAPPY_PATH), *_LOOPS} | {(f, t) for f in NON_TERMINAL for t in _ABORTS}
)


def is_legal(from_status: ExecutionStatus, to_status: ExecutionStatus) -> bool:
    """Whether the execution lifecycle allows ``from_status → to_status``.

    Loops are legal, nothing leaves a terminal state, and the same status again is not a
    transition at all (``apply_status`` reports it as a duplicate).
    """
    return (from_status, to_status) in LEGAL_TRANSITIONS


def _sorted_ids(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(value)))


#: The epoch, for the published records' times (the core keeps integer epoch milliseconds).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)


def to_ms(t: datetime) -> int:
    """Epoch milliseconds of an aware time, exactly (no float on the way)."""
    return (t - EPOCH) // ONE_MS


def from_ms(ms: int) -> datetime:
    """The UTC time of epoch milliseconds, as the contract records carry it."""
    return EPOCH + ONE_MS * ms


def id_ms(ms: int) -> int:
    """The milliseconds an id hashes for a time: ``int(t.timestamp() * 1000)``, through the
    float, as ``deterministic_id`` reads a ``datetime``; ids already published stay the same."""
    return int(ms / 1000 * 1000)


class StatusEvent(NamedTuple):
    """What the state machine reads of an ``ExecutionStatusChanged``, its time in epoch ms."""

    event_id: str
    execution_id: str
    sequence: int
    status: ExecutionStatus
    at: int


def status_event(event: ExecutionStatusChanged) -> StatusEvent:
    """The core's record of a decoded status event (made once, where the event comes in)."""
    return StatusEvent(
        event.event_id, event.execution_id, event.sequence, event.status, to_ms(event.occurred_at)
    )


class InFlight(NamedTuple):
    """An execution between its first accepted event and its terminal status; times in epoch
    milliseconds.

    Its status is never terminal: ``apply_status`` builds none that is, and ``load_slot``
    refuses one, so the table cannot hold a finished execution even by mistake. Open ids are
    kept sorted and unique: equal sets compare equal, and the ``state_id`` digest does not
    depend on the order in which they were reported.
    """

    execution_id: str
    status: ExecutionStatus
    since: int
    first_seen_at: int
    last_event_at: int
    last_sequence: int
    last_event_id: str
    open_operation_ids: tuple[str, ...] = ()
    open_approval_ids: tuple[str, ...] = ()


class Closed(NamedTuple):
    """Tombstone of a finished execution: enough to refuse late events with a clear reason.

    ``last_event_id`` and ``last_sequence`` let a redelivery of the terminal event itself be
    told apart (a DUPLICATE) from a genuinely new event after the end (AFTER_TERMINAL). Its
    status is always terminal (``load_slot`` refuses another).
    """

    execution_id: str
    status: ExecutionStatus
    closed_at: int
    last_sequence: int
    last_event_id: str


Slot = InFlight | Closed | None


class _StoredSlot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _StoredInFlight(_StoredSlot):
    """An in-flight slot as format 1 stored it (JSON object, ISO times)."""

    kind: Literal["in_flight"] = "in_flight"
    execution_id: str
    status: ExecutionStatus
    since: AwareDatetime
    first_seen_at: AwareDatetime
    last_event_at: AwareDatetime
    last_sequence: int
    last_event_id: str
    open_operation_ids: tuple[str, ...] = ()
    open_approval_ids: tuple[str, ...] = ()


class _StoredClosed(_StoredSlot):
    """A closed slot as format 1 stored it."""

    kind: Literal["closed"] = "closed"
    execution_id: str
    status: ExecutionStatus
    closed_at: AwareDatetime
    last_sequence: int
    last_event_id: str


_FORMAT1: TypeAdapter[_StoredInFlight | _StoredClosed] = TypeAdapter(
    Annotated[_StoredInFlight | _StoredClosed, Field(discriminator="kind")]
)
_STATUS: dict[str, ExecutionStatus] = {s.value: s for s in S}
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dump_slot(slot: InFlight | Closed) -> str:
    """The stored text of a slot (format 2): a JSON array, ``"i"`` or ``"c"`` then the
    fields in order, times as epoch milliseconds."""
    return _dumps(("i" if type(slot) is InFlight else "c", *slot))


def _checked(slot: InFlight | Closed) -> InFlight | Closed:
    if isinstance(slot, InFlight):
        if slot.status not in NON_TERMINAL:
            raise ValueError(f"an in-flight execution cannot be {slot.status}")
        if list(slot.open_operation_ids) != sorted(set(slot.open_operation_ids)) or list(
            slot.open_approval_ids
        ) != sorted(set(slot.open_approval_ids)):
            raise ValueError("open ids must be sorted and unique")
    elif slot.status not in TERMINAL:
        raise ValueError(f"a closed execution must be terminal, not {slot.status}")
    return slot


def load_slot(text: str | bytes | None) -> Slot:
    """Inverse of ``dump_slot``; also reads format 1 (a JSON object with ISO times, as
    entries written before format 2 hold it). ``None`` (no entry) stays ``None``. Raises
    ``ValueError`` for a slot the state machine could not have made."""
    if text is None:
        return None
    first = text[:1]
    if first in ("[", b"["):
        kind, execution_id, status, *rest = json.loads(text)
        status = _STATUS[status]
        if kind == "i":
            since, first_seen, last_at, seq, event_id, operations, approvals = rest
            slot: InFlight | Closed = InFlight(
                execution_id,
                status,
                since,
                first_seen,
                last_at,
                seq,
                event_id,
                tuple(operations),
                tuple(approvals),
            )
        elif kind == "c":
            slot = Closed(execution_id, status, *rest)
        else:
            raise ValueError(f"no slot of kind {kind!r}")
        return _checked(slot)
    old = _FORMAT1.validate_json(text)
    if isinstance(old, _StoredInFlight):
        slot = InFlight(
            old.execution_id,
            old.status,
            to_ms(old.since),
            to_ms(old.first_seen_at),
            to_ms(old.last_event_at),
            old.last_sequence,
            old.last_event_id,
            _sorted_ids(old.open_operation_ids),
            _sorted_ids(old.open_approval_ids),
        )
    else:
        slot = Closed(
            old.execution_id, old.status, to_ms(old.closed_at), old.last_sequence, old.last_event_id
        )
    return _checked(slot)


class ExecutionStep(NamedTuple):
    """What one input did: the slot to store (``None``: no entry), what to publish or report.

    ``closed`` is True exactly when this step moved the execution to a terminal status; the
    shell then stores the ``Closed`` tombstone and starts its retention clock.
    """

    slot: Slot
    published: ExecutionState | None = None
    anomaly: AnomalyFinding | None = None
    closed: bool = False


@lru_cache(maxsize=4096)
def _open_digest(operation_ids: tuple[str, ...], approval_ids: tuple[str, ...]) -> str:
    """16 hex digits of SHA-256 over ``json.dumps([ops, approvals], separators=(",", ":"))``.

    Written out by hand (the same bytes: ``encode_basestring_ascii`` is what ``json.dumps``
    uses for a string) and cached: one is needed per published state, and most executions
    share the few common sets (above all, nothing open)."""
    ops = ",".join(map(encode_basestring_ascii, operation_ids))
    approvals = ",".join(map(encode_basestring_ascii, approval_ids))
    return hashlib.sha256(f"[[{ops}],[{approvals}]]".encode()).hexdigest()[:16]


def state_id(execution_id: str, last_sequence: int, open_digest: str, last_event_at: int) -> str:
    """``deterministic_id("exec", execution_id, last_sequence, open_digest, last_event_at)``
    for ``last_event_at`` as a time, spelled out: one is made for every published state, and
    the generic function's per-part dispatch cost a tenth of applying a status event. The
    text hashed is the same (a property test holds the two equal)."""
    text = f"exec\x1f{execution_id}\x1f{last_sequence}\x1f{open_digest}\x1f{id_ms(last_event_at)}"
    return "exec-" + _sha256(text.encode()).hexdigest()[:24]


def _state(slot: InFlight, status: ExecutionStatus) -> ExecutionState:
    # ``last_event_at`` is part of the id so that open ids going A → B → A on the same status
    # sequence give a new id when the return to A comes later (a consumer deduplicating by id
    # must not drop it), while a redelivery of the same input gives the same id. Equal ids
    # always mean equal records; the id says nothing about order (the topic offset does).
    # Built without re-validation (once per published state): every value comes from a valid
    # slot, its times whole milliseconds in UTC as validation would give them. ``state_id`` is
    # written inline here (the same text), and equal times share one ``datetime``.
    (execution_id, _, since, first_seen_at, last_event_at, seq, _, operations, approvals) = slot
    since_t = EPOCH + ONE_MS * since
    last_t = since_t if last_event_at == since else EPOCH + ONE_MS * last_event_at
    first_t = since_t if first_seen_at == since else EPOCH + ONE_MS * first_seen_at
    digest = _open_digest(operations, approvals)
    text = f"exec\x1f{execution_id}\x1f{seq}\x1f{digest}\x1f{int(last_event_at / 1000 * 1000)}"
    return _construct_state(
        {
            "execution_id": execution_id,
            "status": status,
            "since": since_t,
            "first_seen_at": first_t,
            "last_event_at": last_t,
            "last_sequence": seq,
            "open_operation_ids": operations,
            "open_approval_ids": approvals,
            "terminal": status in TERMINAL,
            "state_id": "exec-" + _sha256(text.encode()).hexdigest()[:24],
            "traceparent": None,  # trace context is the shell's to stamp
        },
    )


def to_state(inflight: InFlight) -> ExecutionState:
    """The published record of an in-flight execution (``terminal`` is always False here)."""
    return _state(inflight, inflight.status)


def _refuse(slot: Slot, kind: AnomalyKind, reason: str) -> ExecutionStep:
    return ExecutionStep(slot, None, AnomalyFinding(kind, reason))


def _advance(slot: InFlight | None, event: StatusEvent) -> ExecutionStep:
    """Apply an event already known to be acceptable."""
    event_id, execution_id, seq, status, at = event
    # The status changes, so ``since`` is this event's time. ``last_event_at`` never goes
    # back: producers' clocks may disagree with the sequence; the sequence decides the order,
    # the newest time seen says how recently the execution was heard from.
    if slot is None:
        would_be = InFlight(execution_id, status, at, at, at, seq, event_id)
    else:
        last = slot.last_event_at
        would_be = InFlight(
            execution_id,
            status,
            at,
            slot.first_seen_at,
            last if last > at else at,
            seq,
            event_id,
            slot.open_operation_ids,
            slot.open_approval_ids,
        )
    if status not in TERMINAL:
        return ExecutionStep(would_be, _state(would_be, status))
    # The final state is published from the would-be slot; the table keeps only the tombstone.
    return ExecutionStep(
        Closed(execution_id, status, at, seq, event_id), _state(would_be, status), None, True
    )


def apply_status(slot: Slot, event: StatusEvent) -> ExecutionStep:
    """Validate one status event against the stored slot and apply it if it is acceptable
    (docs/rules.md#applying-a-status-event).

    Checks, first match wins: unrecognized symbol; execution already closed (a redelivery of
    the terminal event is a DUPLICATE, anything else AFTER_TERMINAL); same sequence or event id
    as the last applied (DUPLICATE); lower sequence (OUT_OF_ORDER); same status again
    (DUPLICATE); transition not in ``LEGAL_TRANSITIONS`` (ILLEGAL_TRANSITION). A refused event
    leaves the slot exactly as it was.

    The first event of an unknown execution is accepted whatever its status: vigil may start
    watching in the middle of a run. Sequence gaps are accepted (an event may never arrive);
    if a skipped sequence arrives later it is OUT_OF_ORDER.
    """
    eid, _, seq, status, _ = event
    if status not in TERMINAL and status not in NON_TERMINAL:
        return _refuse(
            slot, AnomalyKind.UNRECOGNIZED_SYMBOL, f"unrecognized execution status (seq {seq})"
        )
    if slot is None:
        return _advance(None, event)
    if type(slot) is Closed:
        if seq == slot.last_sequence or eid == slot.last_event_id:
            return _refuse(
                slot,
                AnomalyKind.DUPLICATE,
                f"duplicate of the terminal event (seq {slot.last_sequence}, {slot.status})",
            )
        return _refuse(
            slot,
            AnomalyKind.AFTER_TERMINAL,
            f"{status} (seq {seq}) after the execution ended {slot.status} "
            f"(seq {slot.last_sequence}); not applied",
        )
    if seq == slot.last_sequence or eid == slot.last_event_id:
        return _refuse(
            slot,
            AnomalyKind.DUPLICATE,
            f"duplicate: seq {seq} / event {eid} already applied "
            f"(last seq {slot.last_sequence}, event {slot.last_event_id})",
        )
    if seq < slot.last_sequence:
        return _refuse(
            slot,
            AnomalyKind.OUT_OF_ORDER,
            f"out of order: {status} (seq {seq}) is older than the last applied "
            f"seq {slot.last_sequence} ({slot.status})",
        )
    if status == slot.status:
        return _refuse(
            slot,
            AnomalyKind.DUPLICATE,
            f"duplicate status: {status} (seq {seq}) does not change the status "
            f"(already {slot.status} since seq {slot.last_sequence})",
        )
    if (slot.status, status) not in LEGAL_TRANSITIONS:
        return _refuse(
            slot,
            AnomalyKind.ILLEGAL_TRANSITION,
            f"illegal transition {slot.status} → {status} (seq {seq})",
        )
    return _advance(slot, event)


def set_open_items(
    slot: Slot,
    open_operation_ids: Iterable[str],
    open_approval_ids: Iterable[str],
    at: int,
) -> ExecutionStep:
    """Record what is open for an execution, as its operation and approval books hold it.

    ``at`` is the event time (epoch ms) of the input that changed it. A new state is
    published only when the sets changed; otherwise the slot is returned untouched (so the
    table always equals the last published state). Closed or unknown executions are not
    tracked: nothing happens.
    """
    if type(slot) is not InFlight:
        return ExecutionStep(slot)
    ops = open_operation_ids if type(open_operation_ids) is tuple else None
    approvals = open_approval_ids if type(open_approval_ids) is tuple else None
    if ops == slot.open_operation_ids and approvals == slot.open_approval_ids:
        return ExecutionStep(slot)  # the common case: the same sorted tuples as before
    ops, approvals = _sorted_ids(open_operation_ids), _sorted_ids(open_approval_ids)
    if ops == slot.open_operation_ids and approvals == slot.open_approval_ids:
        return ExecutionStep(slot)
    new = slot._replace(
        open_operation_ids=ops,
        open_approval_ids=approvals,
        last_event_at=max(slot.last_event_at, at),
    )
    return ExecutionStep(new, to_state(new))


def rebuild(events: Iterable[StatusEvent]) -> Slot:
    """The slot that the *accepted* status events of one execution describe.

    Written as a direct fold, independent of ``apply_status``, and trusting its input (no
    validation): it is the plain definition of what "applying" means, against which the
    property tests check ``apply_status``. Status events carry no open ids, so those stay empty.
    """
    accepted = list(events)
    if not accepted:
        return None
    first, last = accepted[0], accepted[-1]
    if last.status in TERMINAL:
        return Closed(
            execution_id=last.execution_id,
            status=last.status,
            closed_at=last.at,
            last_sequence=last.sequence,
            last_event_id=last.event_id,
        )
    return InFlight(
        execution_id=last.execution_id,
        status=last.status,
        since=last.at,
        first_seen_at=first.at,
        last_event_at=max(e.at for e in accepted),
        last_sequence=last.sequence,
        last_event_id=last.event_id,
    )
