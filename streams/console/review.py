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
  what the pipeline would, and says why, and no second copy of the rule can drift (the rule:
  docs/rules.md#what-each-event-does).
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

import asyncio
import hmac
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from streams.contracts.models.base import to_millis
from streams.contracts.models.enums import (
    AnomalyKind,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import OperationState
from streams.core import operations as ops
from streams.core.ids import deterministic_id, scoped_key

if TYPE_CHECKING:
    from aiohttp import web

    from streams.console.service import ConsoleContext

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
    again after a hand-back to the reconciler, and that is a new event. Scoped by the
    execution, like every id derived from an operation (docs/rules.md#ids-and-keys)."""
    key = scoped_key(state.execution_id, state.operation_id)
    if action is ReviewAction.TAKE:
        return deterministic_id("review", key, attempt, action, state.state_id)
    return deterministic_id("review", key, attempt, action)


def attempt_status(
    state: OperationState, attempt: int | None, known: Mapping[int, S] | None = None
) -> tuple[int, S] | Refusal:
    """The attempt a review is about and its status, as far as the view knows it: the
    operation's state describes its latest attempt and names the older attempt that holds its
    retry verdict (``held_by_*``); ``known`` is every attempt the view knows of, from the
    state, the work items and the reconciler (``streams/console/attempts.py``). An attempt
    the view knows nothing of (an older one still within its reply deadline) is refused."""
    if attempt is None or attempt == state.attempt:
        return state.attempt, state.status
    if known and attempt in known:
        return attempt, known[attempt]
    if (
        state.held_by_operation_id == state.operation_id
        and state.held_by_attempt == attempt
        and state.held_by_status is not None
    ):
        return attempt, state.held_by_status
    listed = sorted({state.attempt, *(known or ())})
    return Refusal(
        409,
        f"attempt {attempt} of {state.operation_id} is not known to the console: it knows "
        f"attempts {', '.join(map(str, listed))} (the latest, and those with a work item or "
        "holding the retry verdict)",
    )


def _attempt_record(attempt: int, status: S, connector: str) -> ops.AttemptRecord:
    """An attempt with ``status`` as the core would hold it, for the rule that judges the
    three review kinds. That rule reads the status, whether the attempt was sent (every
    status but PREPARED), and the kinds already applied, which for these kinds come down to
    the status itself: VERIFIED and FAILED are only ever entered by their own event and
    end the attempt, and a repeated MANUAL_REVIEW is judged on the status alone."""
    own_kind = (K(status.value),) if status.value in K.__members__ else ()
    return ops.AttemptRecord(
        attempt, connector, None, status, None, 0, status is not S.PREPARED, kinds=own_kind
    )


def core_refusal(attempt: int, status: S, event: OperationEvent) -> tuple[AnomalyKind, str] | None:
    """What the pipeline's core would say to ``event`` on an attempt in ``status``: None when
    it applies it, else the anomaly kind and its reason."""
    book = ops.OperationBook(
        event.execution_id,
        {
            event.operation_id: ops.OperationRecord(
                event.operation_id, {attempt: _attempt_record(attempt, status, event.connector)}
            )
        },
    )
    step = ops.apply_event(book, event, ops.OperationConfig())
    if step.anomalies:
        finding = step.anomalies[0]
        return finding.kind, finding.reason
    return None


def decide(
    state: OperationState | None,
    operation_id: str,
    request: ReviewRequest,
    now: datetime,
    known: Mapping[int, S] | None = None,
) -> OperationEvent | Refusal:
    """The event to publish for ``request`` on the operation the view shows as ``state``
    (None: the view has never seen it), whose attempts it knows as ``known``, or why not."""
    if state is None:
        return Refusal(404, f"no operation {operation_id!r} in the console's view")
    target = attempt_status(state, request.attempt, known)
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


# ---------------------------------------------------------------------------------------------
# The shell: HTTP route, write token, cross-site check, review log, producer
# ---------------------------------------------------------------------------------------------

REVIEW_LOG = """
CREATE TABLE IF NOT EXISTS review_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, reviewer TEXT, remote TEXT,
    operation_id TEXT NOT NULL, execution_id TEXT, attempt INTEGER, action TEXT, note TEXT,
    outcome TEXT NOT NULL, status INTEGER NOT NULL, message TEXT, event_id TEXT)
"""
REVIEW_LOG_INDEX = "CREATE INDEX IF NOT EXISTS review_log_event ON review_log (event_id, outcome)"


def cross_site(headers: Mapping[str, str], host: str) -> str | None:
    """Why a request looks cross-site, or None. A browser sends ``Origin`` with every POST
    and ``Sec-Fetch-Site`` with every request; a page on another site can make a browser
    send a request (with its cookies), never one whose ``Origin`` is this console's. A
    client that is not a browser sends neither and is judged by its token alone."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {site}"
    origin = headers.get("Origin")
    if origin is not None:
        netloc = urlsplit(origin).netloc if "://" in origin else ""
        if not netloc or netloc.lower() != host.lower():
            return f"Origin {origin[:100]!r} is not this console ({host[:100]})"
    return None


def write_allowed(authorization: str, write_token: str | None) -> bool:
    """The write token, and only from the ``Authorization`` header: a cookie is sent by the
    browser on its own, a header only by code of this origin (or a non-browser client)."""
    if not write_token:
        return False
    return hmac.compare_digest(
        authorization.encode("utf-8", "surrogateescape"),
        f"Bearer {write_token}".encode("utf-8", "surrogateescape"),
    )


def register_review(app: web.Application, ctx: ConsoleContext) -> None:
    """``POST /api/executions/{execution_id}/operations/{operation_id}/review`` (and
    ``/api/operations/{operation_id}/review``, while one execution uses that operation id;
    409 otherwise), with the attempt in the body (any attempt the view knows of; the latest
    when none is named); and ``POST /api/executions/{execution_id}/work-items/{work_item_id}/
    review`` (and ``/api/work-items/{work_item_id}/review``, while one execution has a work
    item of that id), the attempt of that open work item. Checks, in this order, that the
    request is not cross-site (403), carries the write token (401; 403 when this console has
    none: writes are off), is JSON with a valid body (415, 400), names an operation (or an open
    work item) the view knows (404; a resolved work item 409) and an action the pipeline would
    apply (409); then publishes the event (202), or answers 200 without publishing when that
    very event was published already (a double click). Every authenticated request is a row of
    ``review_log`` and a log line; the token is never logged."""
    from aiohttp import web

    from streams.kafka.topics import Topics

    ctx.view.execute_write(REVIEW_LOG)
    ctx.view.execute_write(REVIEW_LOG_INDEX)
    topics = ctx.topics or Topics.from_settings(ctx.settings)
    topic = topics.operation_events.name
    lock = asyncio.Lock()

    def reply(status: int, body: dict[str, Any]) -> web.Response:
        return web.json_response(body, status=status)

    async def record(
        request: web.Request,
        execution_id: str | None,
        operation_id: str,
        req: ReviewRequest | None,
        outcome: str,
        status: int,
        message: str,
        event: OperationEvent | None = None,
    ) -> None:
        at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        remote = request.remote or ""
        row = (
            at,
            req.reviewer if req else None,
            remote,
            operation_id,
            event.execution_id if event else execution_id,
            event.attempt if event else (req.attempt if req else None),
            str(req.action) if req else None,
            req.note if req else None,
            outcome,
            status,
            message,
            event.event_id if event else None,
        )
        await asyncio.to_thread(
            ctx.view.execute_write,
            "INSERT INTO review_log (at, reviewer, remote, operation_id, execution_id, attempt,"
            " action, note, outcome, status, message, event_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            row,
        )
        log.info(
            "review %s: %s of %s attempt %s by %r from %s: %d %s%s",
            outcome,
            req.action if req else "-",
            operation_id,
            row[5],
            req.reviewer if req else None,
            remote,
            status,
            message,
            f" (event {event.event_id})" if event else "",
        )

    def load_state(execution_id: str | None, operation_id: str) -> OperationState | Refusal | None:
        """The operation's state in the view; by its id alone (the unscoped path) only while
        one execution has an operation of that id."""
        if execution_id is not None:
            rows = ctx.view.execute_read(
                "SELECT record FROM operations WHERE row_key = ?",
                (scoped_key(execution_id, operation_id),),
            )
        else:
            rows = ctx.view.execute_read(
                "SELECT record FROM operations WHERE operation_id = ? LIMIT 2", (operation_id,)
            )
            if len(rows) > 1:
                return Refusal(
                    409,
                    f"operation id {operation_id!r} is used by more than one execution: "
                    "POST /api/executions/{execution_id}/operations/{operation_id}/review",
                )
        return OperationState.model_validate_json(rows[0]["record"]) if rows else None

    def load_work_item(
        execution_id: str | None, work_item_id: str, req: ReviewRequest
    ) -> tuple[str, str, ReviewRequest] | Refusal:
        """The execution and operation of an open work item, and the request about its
        attempt; by its id alone only while one execution has a work item of that id."""
        if execution_id is not None:
            rows = ctx.view.execute_read(
                "SELECT execution_id, operation_id, record, open, resolution FROM work_items"
                " WHERE row_key = ?",
                (scoped_key(execution_id, work_item_id),),
            )
        else:
            rows = ctx.view.execute_read(
                "SELECT execution_id, operation_id, record, open, resolution FROM work_items"
                " WHERE work_item_id = ? LIMIT 2",
                (work_item_id,),
            )
            if len(rows) > 1:
                return Refusal(
                    409,
                    f"work item id {work_item_id!r} is used by more than one execution: "
                    "POST /api/executions/{execution_id}/work-items/{work_item_id}/review",
                )
        if not rows:
            return Refusal(404, f"no work item {work_item_id!r} in the console's view")
        row = rows[0]
        attempt = int(json.loads(row["record"])["attempt"])
        if not row["open"]:
            outcome = json.loads(row["resolution"])["outcome"] if row["resolution"] else "-"
            return Refusal(
                409,
                f"work item {work_item_id} is resolved already (attempt {attempt} of "
                f"{row['operation_id']} settled {outcome}): nothing to review",
            )
        if req.attempt is not None and req.attempt != attempt:
            return Refusal(
                400,
                f"work item {work_item_id} is about attempt {attempt}, not {req.attempt}: "
                "leave the attempt out, or name that one",
            )
        return (
            row["execution_id"],
            row["operation_id"],
            ReviewRequest(req.action, req.note, req.reviewer, attempt),
        )

    def load_target(
        execution_id: str | None, operation_id: str
    ) -> tuple[OperationState | Refusal | None, dict[int, S]]:
        """The operation's state (``load_state``) and the attempts the view knows of it."""
        state = load_state(execution_id, operation_id)
        known = (
            ctx.view.attempts(state.execution_id, operation_id)
            if isinstance(state, OperationState)
            else {}
        )
        return state, known

    def published_before(event_id: str) -> dict[str, Any] | None:
        rows = ctx.view.execute_read(
            "SELECT at, reviewer FROM review_log WHERE event_id = ? AND outcome = 'published'"
            " ORDER BY id LIMIT 1",
            (event_id,),
        )
        return rows[0] if rows else None

    def publish(event: OperationEvent) -> None:
        producer = ctx.producer_factory()
        producer.send(topic, event, key=event.execution_id)
        producer.flush(15)

    async def review(request: web.Request) -> web.Response:
        work_item_id = request.match_info.get("work_item_id")
        # a work item's review names its operation once the item is found
        operation_id = request.match_info.get("operation_id") or f"work-item:{work_item_id}"
        execution_id = request.match_info.get("execution_id")
        why = cross_site(request.headers, request.host)
        if why is not None:
            log.warning("review refused (cross-site: %s) from %s", why, request.remote)
            return reply(403, {"error": f"cross-site request refused: {why}", "status": 403})
        if not ctx.write_token:
            log.warning("review refused (writes are off) from %s", request.remote)
            return reply(
                403,
                {
                    "error": "writes are off on this console (VIGIL_CONSOLE_WRITE_TOKEN not set)",
                    "status": 403,
                },
            )
        authorization = request.headers.get("Authorization", "")
        if not write_allowed(authorization, ctx.write_token):
            given = authorization.startswith("Bearer ") and authorization[7:].strip()
            log.warning(
                "review refused (%s write token) from %s",
                "wrong" if given else "no",
                request.remote,
            )
            error = (
                "the write token is wrong: it is not this console's VIGIL_CONSOLE_WRITE_TOKEN"
                if given
                else "a write token is required (Authorization: Bearer <token>)"
            )
            return reply(401, {"error": error, "status": 401})
        if request.content_type != "application/json":
            return reply(415, {"error": "the body must be application/json", "status": 415})
        try:
            body = await request.json(loads=json.loads)
        except ValueError:
            body = None
        parsed = parse_request(body) if body is not None else Refusal(400, "the body is not JSON")
        if isinstance(parsed, Refusal):
            await record(
                request, execution_id, operation_id, None, "refused", parsed.status, parsed.message
            )
            return reply(parsed.status, parsed.body())
        if work_item_id is not None:
            located = await asyncio.to_thread(load_work_item, execution_id, work_item_id, parsed)
            if isinstance(located, Refusal):
                await record(
                    request,
                    execution_id,
                    operation_id,
                    parsed,
                    "refused",
                    located.status,
                    located.message,
                )
                return reply(located.status, located.body())
            execution_id, operation_id, parsed = located
        async with lock:
            state, known = await asyncio.to_thread(load_target, execution_id, operation_id)
            decided = (
                state
                if isinstance(state, Refusal)
                else decide(state, operation_id, parsed, datetime.now(UTC), known)
            )
            if isinstance(decided, Refusal):
                await record(
                    request,
                    execution_id,
                    operation_id,
                    parsed,
                    "refused",
                    decided.status,
                    decided.message,
                )
                return reply(decided.status, decided.body())
            event = decided
            before = await asyncio.to_thread(published_before, event.event_id)
            answer = {
                "event_id": event.event_id,
                "operation_id": operation_id,
                "execution_id": event.execution_id,
                "attempt": event.attempt,
                "kind": str(event.kind),
                "occurred_at": event.occurred_at.isoformat().replace("+00:00", "Z"),
            }
            if before is not None:
                message = (
                    f"already published at {before['at']} by {before['reviewer']}; "
                    "the operation changes when the pipeline applies it"
                )
                await record(
                    request, execution_id, operation_id, parsed, "duplicate", 200, message, event
                )
                return reply(200, {**answer, "published": False, "message": message})
            try:
                await asyncio.to_thread(publish, event)
            except Exception as exc:
                message = f"could not publish the event: {str(exc)[:300]}"
                await record(
                    request, execution_id, operation_id, parsed, "failed", 503, message, event
                )
                return reply(503, {"error": message, "status": 503})
            message = f"{event.kind} published; the operation changes when the pipeline applies it"
            await record(
                request, execution_id, operation_id, parsed, "published", 202, message, event
            )
            return reply(202, {**answer, "published": True, "message": message})

    app.router.add_post("/api/executions/{execution_id}/operations/{operation_id}/review", review)
    # By the operation id alone: answered while one execution uses that id, else 409.
    app.router.add_post("/api/operations/{operation_id}/review", review)
    # The attempt of an open work item, by the item.
    app.router.add_post("/api/executions/{execution_id}/work-items/{work_item_id}/review", review)
    app.router.add_post("/api/work-items/{work_item_id}/review", review)


__all__ = [
    "KIND",
    "Refusal",
    "ReviewAction",
    "ReviewRequest",
    "attempt_status",
    "core_refusal",
    "cross_site",
    "decide",
    "parse_request",
    "register_review",
    "review_event_id",
    "write_allowed",
]
