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
same log publishes the very same records, with the very same ``state_id``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from itertools import pairwise
from json.encoder import encode_basestring_ascii
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from streams.core.findings import AnomalyFinding
from streams.models.base import construct, replace, to_millis
from streams.models.enums import AnomalyKind, ExecutionStatus
from streams.models.events import ExecutionStatusChanged
from streams.models.outputs import ExecutionState

_sha256 = hashlib.sha256

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

#: Every legal (from, to) pair, spelled out once so that it can be printed in topology.md.
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


class _Slot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InFlight(_Slot):
    """An execution between its first accepted event and its terminal status.

    The status is validated to be non-terminal, so the table cannot hold a finished execution
    even by mistake. Open ids are kept sorted and unique: equal sets compare equal, and the
    ``state_id`` digest does not depend on the order in which they were reported.
    """

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

    @field_validator("status")
    @classmethod
    def _in_flight(cls, value: ExecutionStatus) -> ExecutionStatus:
        if value not in NON_TERMINAL:
            raise ValueError(f"an in-flight execution cannot be {value}")
        return value

    @field_validator("open_operation_ids", "open_approval_ids")
    @classmethod
    def _canonical(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _sorted_ids(value)


class Closed(_Slot):
    """Tombstone of a finished execution: enough to refuse late events with a clear reason.

    ``last_event_id`` and ``last_sequence`` let a redelivery of the terminal event itself be
    told apart (a DUPLICATE) from a genuinely new event after the end (AFTER_TERMINAL).
    """

    kind: Literal["closed"] = "closed"
    execution_id: str
    status: ExecutionStatus
    closed_at: AwareDatetime
    last_sequence: int
    last_event_id: str

    @field_validator("status")
    @classmethod
    def _terminal(cls, value: ExecutionStatus) -> ExecutionStatus:
        if value not in TERMINAL:
            raise ValueError(f"a closed execution must be terminal, not {value}")
        return value


Slot = InFlight | Closed | None

_SLOT_ADAPTER: TypeAdapter[InFlight | Closed] = TypeAdapter(
    Annotated[InFlight | Closed, Field(discriminator="kind")]
)


def dump_slot(slot: InFlight | Closed) -> str:
    """JSON for the shell's table (the ``kind`` field tells the two shapes apart)."""
    return slot.model_dump_json(exclude_none=True)  # every nullable field defaults to None


def load_slot(text: str | bytes | None) -> Slot:
    """Inverse of ``dump_slot``; ``None`` (no table entry) stays ``None``."""
    return None if text is None else _SLOT_ADAPTER.validate_json(text)


@dataclass(frozen=True, slots=True)
class ExecutionStep:
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


def state_id(
    execution_id: str, last_sequence: int, open_digest: str, last_event_at: datetime
) -> str:
    """``deterministic_id("exec", execution_id, last_sequence, open_digest, last_event_at)``,
    spelled out: one is made for every published state, most inputs publish one, and the
    generic function's per-part dispatch cost a tenth of applying a status event. The text
    hashed is the same (a property test holds the two equal)."""
    millis = int(last_event_at.timestamp() * 1000)
    text = f"exec\x1f{execution_id}\x1f{last_sequence}\x1f{open_digest}\x1f{millis}"
    return "exec-" + _sha256(text.encode()).hexdigest()[:24]


def _state(slot: InFlight, status: ExecutionStatus) -> ExecutionState:
    # ``last_event_at`` is part of the id so that open ids going A → B → A on the same status
    # sequence give a new id when the return to A comes later (a consumer deduplicating by id
    # must not drop it), while a redelivery of the same input gives the same id. Equal ids
    # always mean equal records; the id says nothing about order (the topic offset does).
    # Built without re-validation (once per published state): every value comes from a valid
    # slot, times are put in the contract's UTC milliseconds as validation would.
    return construct(
        ExecutionState,
        {
            "execution_id": slot.execution_id,
            "status": status,
            "since": to_millis(slot.since),
            "first_seen_at": to_millis(slot.first_seen_at),
            "last_event_at": to_millis(slot.last_event_at),
            "last_sequence": slot.last_sequence,
            "open_operation_ids": slot.open_operation_ids,
            "open_approval_ids": slot.open_approval_ids,
            "terminal": status in TERMINAL,
            "state_id": state_id(
                slot.execution_id,
                slot.last_sequence,
                _open_digest(slot.open_operation_ids, slot.open_approval_ids),
                slot.last_event_at,
            ),
            "traceparent": None,  # trace context is the shell's to stamp
        },
    )


def to_state(inflight: InFlight) -> ExecutionState:
    """The published record of an in-flight execution (``terminal`` is always False here)."""
    return _state(inflight, inflight.status)


def _refuse(slot: Slot, kind: AnomalyKind, reason: str) -> ExecutionStep:
    return ExecutionStep(slot=slot, anomaly=AnomalyFinding(kind=kind, reason=reason))


def _advance(slot: InFlight | None, event: ExecutionStatusChanged) -> ExecutionStep:
    """Apply an event already known to be acceptable."""
    at = event.occurred_at
    # The status changes, so ``since`` is this event's time. ``last_event_at`` never goes
    # back: producers' clocks may disagree with the sequence; the sequence decides the order,
    # the newest time seen says how recently the execution was heard from.
    fields = {
        "kind": "in_flight",
        "execution_id": event.execution_id,
        "status": event.status,
        "since": at,
        "first_seen_at": at if slot is None else slot.first_seen_at,
        "last_event_at": at if slot is None else max(slot.last_event_at, at),
        "last_sequence": event.sequence,
        "last_event_id": event.event_id,
        "open_operation_ids": () if slot is None else slot.open_operation_ids,
        "open_approval_ids": () if slot is None else slot.open_approval_ids,
    }
    # Built without re-validation: the event is a valid record, the status was checked
    # non-terminal by the caller, and the open ids come canonical from the slot.
    would_be = construct(InFlight, fields)
    if event.status not in TERMINAL:
        return ExecutionStep(slot=would_be, published=to_state(would_be))
    # The final state is published from the would-be slot; the table keeps only the tombstone.
    final = _state(would_be, event.status)
    closed = construct(  # terminal, as checked above
        Closed,
        {
            "kind": "closed",
            "execution_id": event.execution_id,
            "status": event.status,
            "closed_at": at,
            "last_sequence": event.sequence,
            "last_event_id": event.event_id,
        },
    )
    return ExecutionStep(slot=closed, published=final, closed=True)


def apply_status(slot: Slot, event: ExecutionStatusChanged) -> ExecutionStep:
    """Validate one status event against the stored slot and apply it if it is acceptable.

    Checks, first match wins: unrecognized symbol; execution already closed (a redelivery of
    the terminal event is a DUPLICATE, anything else AFTER_TERMINAL); same sequence or event id
    as the last applied (DUPLICATE); lower sequence (OUT_OF_ORDER); same status again
    (DUPLICATE); transition not in ``LEGAL_TRANSITIONS`` (ILLEGAL_TRANSITION). A refused event
    leaves the slot exactly as it was.

    The first event of an unknown execution is accepted whatever its status: vigil may start
    watching in the middle of a run. Sequence gaps are accepted (an event may never arrive);
    if a skipped sequence arrives later it is OUT_OF_ORDER.
    """
    seq, status, eid = event.sequence, event.status, event.event_id
    if status not in TERMINAL and status not in NON_TERMINAL:
        return _refuse(
            slot, AnomalyKind.UNRECOGNIZED_SYMBOL, f"unrecognized execution status (seq {seq})"
        )
    if isinstance(slot, Closed):
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
    if slot is None:
        return _advance(None, event)
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
    if not is_legal(slot.status, status):
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
    at: datetime,
) -> ExecutionStep:
    """Record what is open for an execution, as the operations/approvals processors report it.

    ``at`` is the event time of the input that changed it. A new state is published only when
    the sets changed; otherwise the slot is returned untouched (so the table always equals the
    last published state). Closed or unknown executions are not tracked: nothing happens.
    """
    if not isinstance(slot, InFlight):
        return ExecutionStep(slot=slot)
    ops, approvals = _sorted_ids(open_operation_ids), _sorted_ids(open_approval_ids)
    if ops == slot.open_operation_ids and approvals == slot.open_approval_ids:
        return ExecutionStep(slot=slot)
    if at.tzinfo is None:
        raise ValueError("set_open_items needs an aware event time")
    new = replace(
        slot,
        open_operation_ids=ops,
        open_approval_ids=approvals,
        last_event_at=max(slot.last_event_at, to_millis(at)),
    )
    return ExecutionStep(slot=new, published=to_state(new))


def rebuild(events: Iterable[ExecutionStatusChanged]) -> Slot:
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
            closed_at=last.occurred_at,
            last_sequence=last.sequence,
            last_event_id=last.event_id,
        )
    return InFlight(
        execution_id=last.execution_id,
        status=last.status,
        since=last.occurred_at,
        first_seen_at=first.occurred_at,
        last_event_at=max(e.occurred_at for e in accepted),
        last_sequence=last.sequence,
        last_event_id=last.event_id,
    )
