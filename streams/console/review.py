"""Manual review: a person records what the source says about an operation.

The console never changes an operation itself. A review publishes one ``OperationEvent``
from a human source (``evidence_source`` HUMAN) onto the operation-events input topic, and
the pipeline applies it like any other fact: it is in the log, replayable and auditable, and
the page shows the result once the pipeline publishes the new ``OperationState``.

Three actions, each one operation event kind:

- ``take``: into MANUAL_REVIEW (the person responsible has it);
- ``verified`` / ``failed``: settle the attempt on the evidence the person found.

Why it is shaped like this:

- **Refused before anything is published.** An action the pipeline would refuse (settling a
  VERIFIED operation, taking one already under review, a FAILED after VERIFIED) would only
  become an anomaly on the pipeline's side, silently for the person who clicked. So
  ``decide`` asks the pure core itself (``streams.core.operations.apply_event``) what it would
  do with the event, on an attempt rebuilt from what the view knows of it: the status of the
  attempt is all the core's rule reads for these three kinds, so the console refuses exactly
  what the pipeline would, and says why, and no second copy of the rule can drift.
- **A double click is one event.** The event id is derived from the action: settling is
  once per attempt, so ``verified`` and ``failed`` ids come from (operation, attempt,
  action) alone; ``take`` may legitimately happen again on one attempt (a reviewer hands
  back to the reconciler, who hands it back again), so its id also names the operation
  state it was taken from. Two clicks on the same page state publish the same id; the
  shell publishes an id once (``review_log``) and the core ignores a repeated id anyway.
- **Event time is the moment the person spoke** (the request's arrival), in UTC
  milliseconds: the pipeline holds the event for its watermark like any other.

``register_review`` is the thin shell: the HTTP route, the write token, the cross-site
check, the log and the producer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from streams.core import operations as ops
from streams.core.ids import deterministic_id
from streams.models.base import construct, to_millis
from streams.models.enums import (
    AnomalyKind,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
)
from streams.models.events import OperationEvent
from streams.models.outputs import OperationState

log = logging.getLogger("vigil.console.review")

K = OperationEventKind
S = OperationStatus

#: Bounds on what a person types, so a log line and an event stay small.
MAX_NOTE = 2000
MAX_REVIEWER = 200


class ReviewAction(StrEnum):
    TAKE = "take"
    VERIFIED = "verified"
    FAILED = "failed"


#: The operation event kind each action publishes.
KIND: Mapping[ReviewAction, OperationEventKind] = {
    ReviewAction.TAKE: K.MANUAL_REVIEW,
    ReviewAction.VERIFIED: K.VERIFIED,
    ReviewAction.FAILED: K.FAILED,
}


@dataclass(frozen=True, slots=True)
class ReviewRequest:
    """A validated request body."""

    action: ReviewAction
    note: str
    reviewer: str
    #: the attempt to review; None: the operation's latest attempt
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a review is not published: an HTTP status and a message for the person."""

    status: int
    message: str
    allowed: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message, "status": self.status}
        if self.allowed:
            out["allowed"] = dict(self.allowed)
        return out


def parse_request(body: object) -> ReviewRequest | Refusal:
    """The JSON body ``{"action", "note", "reviewer", "attempt"}``, or a 400 naming what is
    wrong and what is allowed."""
    allowed = {
        "action": [a.value for a in ReviewAction],
        "note": f"non-empty text, at most {MAX_NOTE} characters",
        "reviewer": f"non-empty text, at most {MAX_REVIEWER} characters",
        "attempt": "an integer >= 1, or null for the latest attempt",
    }
    if not isinstance(body, Mapping):
        return Refusal(400, "the body must be a JSON object", allowed)
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        return Refusal(400, f"unknown field(s): {', '.join(map(str, unknown))}", allowed)
    try:
        action = ReviewAction(body.get("action"))
    except ValueError:
        return Refusal(400, f"action must be one of {allowed['action']}", allowed)
    texts: dict[str, str] = {}
    for name, limit in (("note", MAX_NOTE), ("reviewer", MAX_REVIEWER)):
        value = body.get(name)
        if not isinstance(value, str) or not value.strip():
            return Refusal(400, f"{name} is required: {allowed[name]}", allowed)
        if len(value) > limit:
            return Refusal(400, f"{name} is longer than {limit} characters", allowed)
        texts[name] = value.strip()
    attempt = body.get("attempt")
    # bool is an int in Python; true is not an attempt number
    if attempt is not None and (
        not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt < 2**31
    ):
        return Refusal(400, f"attempt must be {allowed['attempt']}", allowed)
    return ReviewRequest(action, texts["note"], texts["reviewer"], attempt)


def review_event_id(state: OperationState, attempt: int, action: ReviewAction) -> str:
    """The id of the event a review publishes: the same for the same action on the same
    attempt (a double click, a retried request, another console replica), so it is one event.
    ``take`` also names the operation state it was taken from: an attempt may enter review
    again after a hand-back to the reconciler, and that is a new event."""
    if action is ReviewAction.TAKE:
        return deterministic_id("review", state.operation_id, attempt, action, state.state_id)
    return deterministic_id("review", state.operation_id, attempt, action)


def attempt_status(state: OperationState, attempt: int | None) -> tuple[int, S] | Refusal:
    """The attempt a review is about and its status, as far as the view knows it: the
    operation's state describes its latest attempt, and names the older attempt that holds
    its retry verdict (``held_by_*``). Another older attempt's status is not in the view."""
    if attempt is None or attempt == state.attempt:
        return state.attempt, state.status
    if (
        state.held_by_operation_id == state.operation_id
        and state.held_by_attempt == attempt
        and state.held_by_status is not None
    ):
        return attempt, state.held_by_status
    return Refusal(
        409,
        f"attempt {attempt} of {state.operation_id} is not known to the console: it shows the "
        f"latest attempt ({state.attempt}) and the attempt holding the retry verdict "
        f"({state.held_by_attempt if state.held_by_operation_id == state.operation_id else '-'})",
    )


def _attempt_record(attempt: int, status: S, connector: str) -> ops.AttemptRecord:
    """An attempt with ``status`` as the core would hold it, for the rule that judges the
    three review kinds. That rule reads the status, whether the attempt was sent (every
    status but PREPARED), and the kinds already applied, which for these kinds come down to
    the status itself: VERIFIED and FAILED are only ever entered by their own event and
    end the attempt, and a repeated MANUAL_REVIEW is judged on the status alone."""
    own_kind = (K(status.value),) if status.value in K.__members__ else ()
    return construct(
        ops.AttemptRecord,
        {
            "attempt": attempt,
            "connector": connector,
            "idempotency_key": None,
            "status": status,
            "reason": None,
            "since": datetime(1970, 1, 1, tzinfo=UTC),
            "sent": status is not S.PREPARED,
            "reply_due_at": None,
            "verify_due_at": None,
            "effect_ref": None,
            "work_item_id": None,
            "work_item_kind": None,
            "alert_id": None,
            "kinds": own_kind,
            "event_ids": (),
        },
    )


def core_refusal(attempt: int, status: S, event: OperationEvent) -> tuple[AnomalyKind, str] | None:
    """What the pipeline's core would say to ``event`` on an attempt in ``status``: None when
    it applies it, else the anomaly kind and its reason."""
    book = construct(
        ops.OperationBook,
        {
            "execution_id": event.execution_id,
            "operations": {
                event.operation_id: ops.OperationRecord(
                    operation_id=event.operation_id,
                    attempts={attempt: _attempt_record(attempt, status, event.connector)},
                )
            },
            "by_idempotency_key": {},
        },
    )
    step = ops.apply_event(book, event, ops.OperationConfig())
    if step.anomalies:
        finding = step.anomalies[0]
        return finding.kind, finding.reason
    return None


def decide(
    state: OperationState | None, operation_id: str, request: ReviewRequest, now: datetime
) -> OperationEvent | Refusal:
    """The event to publish for ``request`` on the operation the view shows as ``state``
    (None: the view has never seen it), or why not."""
    if state is None:
        return Refusal(404, f"no operation {operation_id!r} in the console's view")
    target = attempt_status(state, request.attempt)
    if isinstance(target, Refusal):
        return target
    attempt, status = target
    if status is S.UNRECOGNIZED:
        return Refusal(
            409,
            f"attempt {attempt} of {operation_id} has a status this console cannot read; "
            "review it with a newer console",
        )
    kind = KIND[request.action]
    event = OperationEvent(
        event_id=review_event_id(state, attempt, request.action),
        execution_id=state.execution_id,
        operation_id=operation_id,
        attempt=attempt,
        idempotency_key=None,
        connector=state.connector,
        kind=kind,
        occurred_at=to_millis(now),
        evidence_source=EvidenceSource.HUMAN,
        detail=f"{request.action} by {request.reviewer}: {request.note}",
    )
    refused = core_refusal(attempt, status, event)
    if refused is not None:
        anomaly, reason = refused
        return Refusal(
            409,
            f"{request.action} refused: attempt {attempt} of {operation_id} is {status}, and "
            f"the pipeline would not apply {kind} ({anomaly}: {reason})",
        )
    return event


__all__ = [
    "KIND",
    "Refusal",
    "ReviewAction",
    "ReviewRequest",
    "attempt_status",
    "core_refusal",
    "decide",
    "parse_request",
    "review_event_id",
]
