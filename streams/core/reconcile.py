"""What a reconciler's check of the source means, when to check again, when to give up.

Pure: no Kafka, no clock, no HTTP. The shell (``streams/reconcile.py``) reads a work item,
asks a checker what the source says (a ``CheckResult``), and hands both to ``decide`` with
the time; it publishes what ``decide`` returns. The rules (docs/rules.md#the-reconciler):

- **VERIFIED** at the source is the effect: published as a VERIFIED ``OperationEvent`` from
  the RECONCILER source, with the effect reference the source returned.
- **Not found is not failed.** A source that has no such effect (ABSENT) proves FAILED only
  when the connector declares its lookup *authoritative*, and only once its *settle delay*
  has passed since the work item's deadline (sources are eventually consistent: a payment
  accepted a moment ago may not be listed yet). Before that, or from a lookup that is not
  authoritative, ABSENT is "not yet".
- **PENDING** (the source has it, still in progress) and **ERROR** (no usable answer:
  unreachable, timed out, 5xx, 401, malformed) are "not yet": checked again after an
  exponential backoff with jitter.
- **Giving up**: when the connector's checks run out (``max_attempts``) or the next one
  would come after its ``give_up_after`` (counted from when the reconciler took the item),
  the operation goes to MANUAL_REVIEW with a summary of what was tried, so a person starts
  from the checks already made.

Event ids are derived from the work item id and the outcome, never from the time or the
replica: a restart, a redelivery or a second replica that decides the same thing publishes
the same event (the pipeline then ignores the copy as a duplicate id).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from streams.contracts.models.enums import (
    CheckFinding,
    EvidenceSource,
    OperationEventKind,
    ReconciliationState,
    WorkItemKind,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import CheckAttempt, ReconciliationCheck
from streams.core.ids import deterministic_id

F = CheckFinding
R = ReconciliationState

#: The longest detail kept per check and in a published event: a short reason, never a body.
MAX_DETAIL = 200
MAX_EVENT_DETAIL = 1000


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What a checker read at the source. ``effect_ref``: the source's reference of the
    effect (VERIFIED). ``detail``: a short machine reason, never a response body or a
    secret."""

    finding: CheckFinding
    effect_ref: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """How one connector is reconciled (the reconcilers file; ``streams/reconcilers.py``)."""

    #: whether "not found" at this source means the effect did not and will not happen
    authoritative: bool = False
    #: how long after the work item's deadline an ABSENT effect may be called FAILED
    settle_delay: timedelta = timedelta(minutes=5)
    #: checks made at most, the first included
    max_attempts: int = 10
    #: no check is made later than this after the reconciler took the item
    give_up_after: timedelta = timedelta(hours=1)
    #: the first pause between checks, its growth per check, its ceiling
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_factor: float = 2.0
    backoff_max: timedelta = timedelta(minutes=5)
    #: the pause is drawn in [pause * (1 - jitter), pause]: replicas and items spread out
    jitter: float = 0.2
    #: one check's time limit
    timeout: timedelta = timedelta(seconds=10)
    #: checks of this connector in flight at once, and started per second at most
    concurrency: int = 4
    rate: float = 10.0


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``event``; the item then stands at ``progress``."""

    event: OperationEvent
    progress: ReconciliationCheck


@dataclass(frozen=True, slots=True)
class Retry:
    """Nothing to publish yet: check again at ``progress.next_check_at``."""

    progress: ReconciliationCheck


Decision = Publish | Retry


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


def _unit(*parts: object) -> float:
    """A number in [0, 1) fixed by ``parts``: the jitter of one pause of one item, the same
    on every replica and after a restart, different between items."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def backoff(policy: Policy, checks_made: int, work_item_id: str) -> timedelta:
    """The pause after the ``checks_made``-th check (1 for the first): ``backoff_initial``
    times ``backoff_factor`` to the power ``checks_made - 1``, at most ``backoff_max``, less a
    jitter of up to ``jitter`` of it."""
    n = max(checks_made, 1) - 1
    ceiling = policy.backoff_max.total_seconds()
    base = policy.backoff_initial.total_seconds()
    # the exponent is capped so that the power never overflows a float
    pause = min(ceiling, base * policy.backoff_factor ** min(n, 200)) if base > 0 else 0.0
    pause *= 1.0 - policy.jitter * _unit(work_item_id, checks_made)
    return timedelta(milliseconds=int(pause * 1000))


def settled_at(item: ReconciliationCheck, policy: Policy) -> datetime:
    """When an ABSENT effect may be called FAILED: the work item's deadline (the reply or
    verification was due then, so the attempt was sent before) plus the settle delay."""
    return item.deadline + policy.settle_delay


def give_up_at(item: ReconciliationCheck, policy: Policy) -> datetime:
    return item.first_seen_at + policy.give_up_after


def outcome_event_id(work_item_id: str, kind: OperationEventKind) -> str:
    """The id of the event the reconciler publishes about a work item: one per outcome."""
    return deterministic_id("reconcile", work_item_id, kind.value)


def check_id(progress: ReconciliationCheck) -> str:
    """The id of a progress record: its item, how many checks it holds, its state."""
    return deterministic_id(
        "rcheck", progress.work_item_id, len(progress.checks), progress.state.value
    )


def taken(
    *,
    work_item_id: str,
    operation_id: str,
    execution_id: str,
    attempt: int,
    connector: str,
    idempotency_key: str | None,
    effect_ref: str | None,
    kind: WorkItemKind,
    deadline: datetime,
    created_at: datetime,
    traceparent: str | None,
    now: datetime,
    configured: bool = True,
) -> ReconciliationCheck:
    """The progress of a work item just read: its first check due now, or, for a connector
    with no checker, UNCONFIGURED (left to a person, as before the reconciler existed)."""
    state = R.CHECKING if configured else R.UNCONFIGURED
    return _with_id(
        ReconciliationCheck(
            check_id="",
            work_item_id=work_item_id,
            operation_id=operation_id,
            execution_id=execution_id,
            attempt=attempt,
            connector=connector,
            idempotency_key=idempotency_key,
            item_effect_ref=effect_ref,
            work_item_kind=kind,
            deadline=deadline,
            item_created_at=created_at,
            state=state,
            first_seen_at=now,
            updated_at=now,
            next_check_at=now if configured else None,
            note=None if configured else f"no checker configured for connector {connector!r}",
            traceparent=traceparent,
        )
    )


def _with_id(progress: ReconciliationCheck) -> ReconciliationCheck:
    return progress.model_copy(update={"check_id": check_id(progress)})


def _clip(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary(checks: tuple[CheckAttempt, ...]) -> str:
    """What was tried, for the person who takes over: how many checks of each finding and
    the last one's detail, e.g. ``8 checks: 5 ERROR, 3 ABSENT; last ABSENT (http_404)``."""
    counts = Counter(c.finding.value for c in checks)
    parts = ", ".join(f"{n} {finding}" for finding, n in sorted(counts.items()))
    last = checks[-1] if checks else None
    tail = f"; last {last.finding}" + (f" ({last.detail})" if last and last.detail else "")
    return f"{len(checks)} checks: {parts}{tail if last else ''}"


def _event(
    progress: ReconciliationCheck,
    kind: OperationEventKind,
    now: datetime,
    effect_ref: str | None,
    detail: str,
) -> OperationEvent:
    return OperationEvent(
        event_id=outcome_event_id(progress.work_item_id, kind),
        execution_id=progress.execution_id,
        operation_id=progress.operation_id,
        attempt=progress.attempt,
        idempotency_key=progress.idempotency_key,
        connector=progress.connector,
        kind=kind,
        occurred_at=now,
        effect_ref=effect_ref,
        evidence_source=EvidenceSource.RECONCILER,
        detail=_clip(detail, MAX_EVENT_DETAIL),
        traceparent=progress.traceparent,
    )


def decide(
    progress: ReconciliationCheck,
    result: CheckResult,
    policy: Policy,
    started: datetime,
    now: datetime,
) -> Decision:
    """What the check that started at ``started`` and ended at ``now`` with ``result`` means
    for an item in CHECKING: publish VERIFIED, FAILED or (checks exhausted) MANUAL_REVIEW, or
    check again later."""
    made = CheckAttempt(
        number=len(progress.checks) + 1,
        at=started,
        finding=result.finding,
        detail=_clip(result.detail, MAX_DETAIL),
        effect_ref=_clip(result.effect_ref, MAX_DETAIL),
        latency_ms=max(0, _ms(now - started)),
    )
    checks = (*progress.checks, made)
    base = progress.model_copy(update={"checks": checks, "updated_at": now})

    def finish(
        state: ReconciliationState,
        kind: OperationEventKind,
        detail: str,
        effect_ref: str | None = None,
        note: str | None = None,
    ) -> Publish:
        event = _event(base, kind, now, effect_ref, detail)
        done = base.model_copy(
            update={
                "state": state,
                "next_check_at": None,
                "outcome_event_id": event.event_id,
                "effect_ref": effect_ref,
                "note": note or detail,
            }
        )
        return Publish(event, _with_id(done))

    if result.finding is F.VERIFIED:
        ref = result.effect_ref or progress.item_effect_ref
        return finish(
            R.VERIFIED,
            OperationEventKind.VERIFIED,
            f"reconciler: effect found at the source on check {made.number}"
            + (f" ({made.detail})" if made.detail else ""),
            effect_ref=ref,
        )
    if result.finding is F.ABSENT and policy.authoritative and now >= settled_at(base, policy):
        return finish(
            R.FAILED,
            OperationEventKind.FAILED,
            f"reconciler: no effect at the authoritative source {policy.settle_delay} after "
            f"the deadline, check {made.number}" + (f" ({made.detail})" if made.detail else ""),
        )
    next_at = now + backoff(policy, made.number, progress.work_item_id)
    if result.finding is F.ABSENT and policy.authoritative:
        # the next look that can settle it is the first after the settle delay
        next_at = max(next_at, settled_at(base, policy))
    if made.number >= policy.max_attempts or next_at > give_up_at(base, policy):
        why = (
            f"{policy.max_attempts} checks made"
            if made.number >= policy.max_attempts
            else f"no check left within {policy.give_up_after}"
        )
        return finish(
            R.MANUAL_REVIEW,
            OperationEventKind.MANUAL_REVIEW,
            f"reconciler gave up ({why}); {summary(checks)}",
            note=f"gave up: {why}; {summary(checks)}",
        )
    waiting = base.model_copy(update={"next_check_at": next_at, "note": None})
    return Retry(_with_id(waiting))


def resolved(progress: ReconciliationCheck, now: datetime, note: str) -> ReconciliationCheck:
    """The item was settled by other evidence (a person, a late connector reply): no check is
    made again."""
    return _with_id(
        progress.model_copy(
            update={"state": R.RESOLVED, "next_check_at": None, "updated_at": now, "note": note}
        )
    )


def is_open(progress: ReconciliationCheck) -> bool:
    """Whether the reconciler still has checks to make on the item."""
    return progress.state is R.CHECKING


__all__ = [
    "CheckResult",
    "Decision",
    "Policy",
    "Publish",
    "Retry",
    "backoff",
    "check_id",
    "decide",
    "give_up_at",
    "is_open",
    "outcome_event_id",
    "resolved",
    "settled_at",
    "summary",
    "taken",
]
