"""What an execution knows of other executions' attempts under its idempotency keys.

The claims join (``streams.core.claims``) finds a blind retry across executions and tells both
executions (``RetryLink`` records, keyed by execution). This module is the receiving side, kept
in the execution's table entry beside its operation book (docs/rules.md#blind-retries-across-
executions):

- ``apply_link`` keeps, per operation, the other execution's attempt of each conflict and its
  latest status;
- ``overlay`` gives an operation's published state with that attempt in its verdict: while the
  other attempt is in flight or VERIFIED, the retry verdict is the most restrictive of the
  operation's own and the other attempt's, and ``held_by_*`` (with ``held_by_execution_id``)
  name the other attempt, on both sides of the conflict: a duplicate effect across executions
  is the first thing an operator must see;
- ``blind_retry_alert``: the one FORBIDDEN_RETRY alert of a conflict, published by the
  execution that made the later send, naming both executions; ``ended_alerts``: its RESOLVED
  alert, once both attempts are settled (docs/rules.md#alert-lifecycle).

Pure: no Kafka, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import NamedTuple

from streams.contracts.models.base import replace
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    OperationStatus,
    Owner,
    Severity,
)
from streams.contracts.models.outputs import Alert, OperationState, RetryLink
from streams.core.claims import RETRY
from streams.core.executions import from_ms
from streams.core.ids import deterministic_id, scoped_key
from streams.core.operations import (
    BLOCKS_RETRY,
    NEXT_STEP_FORBIDDEN,
    SETTLED,
    OperationBook,
    restriction,
    retry_resolved_id,
    retry_verdict,
)

#: Link ids remembered per execution to tell a redelivered link from a new one. Links of one
#: conflict are few (one per status of the other attempt).
MAX_IDS = 256


class Other(NamedTuple):
    """The other execution's attempt of one conflict, as last told."""

    conflict_id: str
    role: str
    execution_id: str
    operation_id: str
    attempt: int
    status: OperationStatus
    at: int
    #: on the side that made the later send: its FORBIDDEN_RETRY alert while it has not
    #: ended, and the attempt of its own operation that sent (``ended_alerts``)
    alert_id: str | None = None
    own_attempt: int | None = None


class Links(NamedTuple):
    """Per operation id, the conflicts it is part of; and the link ids applied."""

    ops: dict[str, dict[str, Other]]
    ids: tuple[str, ...] = ()


EMPTY = Links({})


def apply_link(links: Links | None, link: RetryLink, at: int) -> tuple[Links, bool]:
    """Keep what ``link`` tells; whether it changed anything (a redelivered link, or one
    older than what is known of the other attempt, does not)."""
    links = links or EMPTY
    if link.link_id in links.ids:
        return links, False
    ids = (*links.ids, link.link_id)[-MAX_IDS:]
    mine = links.ops.get(link.operation_id, {})
    known = mine.get(link.conflict_id)
    if known is not None and known.at > at:
        return Links(links.ops, ids), True
    alert = blind_retry_alert(link)
    other = Other(
        link.conflict_id,
        link.role,
        link.other_execution_id,
        link.other_operation_id,
        link.other_attempt,
        link.other_status,
        at,
        alert.alert_id if alert is not None else known.alert_id if known is not None else None,
        link.attempt if alert is not None else known.own_attempt if known is not None else None,
    )
    return Links({**links.ops, link.operation_id: {**mine, link.conflict_id: other}}, ids), True


def in_force(links: Links | None, operation_id: str) -> list[Other]:
    """The other attempts that hold the operation back now: in flight or VERIFIED."""
    if links is None:
        return []
    return [o for o in links.ops.get(operation_id, {}).values() if o.status in BLOCKS_RETRY]


def overlay(state: OperationState, links: Links | None) -> OperationState:
    """The operation's state with the other executions' attempts in its verdict (see the
    module docstring); the state itself when none is in force. The most restrictive other
    attempt is named (ties: the conflict id, so every run names the same)."""
    others = in_force(links, state.operation_id)
    if not others:
        return state
    best = max(others, key=lambda o: (restriction(retry_verdict(o.status)), o.conflict_id))
    theirs = retry_verdict(best.status)
    retry = theirs if restriction(theirs) > restriction(state.retry) else state.retry
    return replace(
        state,
        retry=retry,
        held_by_operation_id=best.operation_id,
        held_by_attempt=best.attempt,
        held_by_status=best.status,
        held_by_execution_id=best.execution_id,
        state_id=deterministic_id(
            "os",
            state.state_id,
            "across",
            scoped_key(best.execution_id, best.operation_id),
            best.attempt,
            best.status,
            retry,
        ),
    )


def blind_retry_alert(link: RetryLink) -> Alert | None:
    """The FORBIDDEN_RETRY alert of a conflict: from the link that tells the execution of the
    later send that it retried blindly (one per conflict; the other side's link makes none)."""
    if link.kind != "CONFLICT" or link.role != RETRY:
        return None
    return Alert(
        alert_id=deterministic_id("alert", AlertKind.FORBIDDEN_RETRY, link.conflict_id),
        kind=AlertKind.FORBIDDEN_RETRY,
        status=AlertStatus.FIRING,
        severity=Severity.CRITICAL,
        execution_id=link.execution_id,
        subject_id=link.operation_id,
        verdict=link.other_status.value,
        owner=Owner.RUNTIME_OWNER,
        next_step=NEXT_STEP_FORBIDDEN,
        evidence=(
            f"attempt={link.operation_id}#{link.attempt}",
            f"execution={link.execution_id}",
            f"previous={link.other_operation_id}#{link.other_attempt}:{link.other_status}",
            f"previous_execution={link.other_execution_id}",
            f"connector={link.connector}",
            f"idempotency_key={link.idempotency_key}",
            f"conflict={link.conflict_id}",
        ),
        occurred_at=link.occurred_at,
        ends_with_resolved=True,
    )


def ended_alerts(
    links: Links | None, book: OperationBook | None, operation_ids: Iterable[str]
) -> tuple[Links | None, list[Alert]]:
    """The RESOLVED alerts that end the blind-retry alerts of these operations whose two
    attempts are both settled now (docs/rules.md#alert-lifecycle), and the links without them.

    The other attempt's status is as the links last told it, this execution's own from its
    book; the RESOLVED alert is stamped with the later of the two settlings, so it is the same
    record whichever the execution learns last. Both attempts carry the same connector and
    idempotency key (that is what joined them), which makes them one effect even when both are
    VERIFIED: the other side's effect reference is not told across executions. A conflict
    whose own attempt the book does not hold (yet) waits."""
    if links is None or book is None:
        return links, []
    out: list[Alert] = []
    ops = links.ops
    for op_id in sorted(set(operation_ids)):
        conflicts = ops.get(op_id)
        record = book.operations.get(op_id)
        if not conflicts or record is None:
            continue
        for conflict_id, other in sorted(conflicts.items()):
            own = record.attempts.get(other.own_attempt) if other.own_attempt else None
            if other.alert_id is None or own is None:
                continue
            if own.status not in SETTLED or other.status not in SETTLED:
                continue
            at = max(own.since, other.at)
            out.append(
                Alert(
                    alert_id=retry_resolved_id(other.alert_id),
                    kind=AlertKind.FORBIDDEN_RETRY,
                    status=AlertStatus.RESOLVED,
                    severity=Severity.INFO,
                    execution_id=book.execution_id,
                    subject_id=op_id,
                    verdict=own.status.value,
                    owner=Owner.RUNTIME_OWNER,
                    next_step=(
                        f"none: both attempts are settled ({op_id}#{own.attempt} {own.status};"
                        f" {other.operation_id}#{other.attempt} {other.status} of execution"
                        f" {other.execution_id}), one effect under their idempotency key"
                    ),
                    evidence=(
                        f"attempt={op_id}#{own.attempt}:{own.status}",
                        f"execution={book.execution_id}",
                        f"previous={other.operation_id}#{other.attempt}:{other.status}",
                        f"previous_execution={other.execution_id}",
                        f"conflict={conflict_id}",
                    ),
                    occurred_at=from_ms(at),
                    resolves_alert_id=other.alert_id,
                )
            )
            conflicts = {**conflicts, conflict_id: other._replace(alert_id=None, own_attempt=None)}
            ops = {**ops, op_id: conflicts}
    if not out:
        return links, []
    return Links(ops, links.ids), out


# -- storage ------------------------------------------------------------------------------
_STATUS = {s.value: s for s in OperationStatus}


def dump_links(links: Links) -> str:
    """Per operation, each conflict's fields in order (the open alert and the own attempt
    only while the alert is open), and the link ids."""
    return json.dumps(
        [
            {
                op: [
                    [
                        *o[:5],
                        o.status.value,
                        o.at,
                        *((o.alert_id, o.own_attempt) if o.alert_id else ()),
                    ]
                    for o in sorted(conflicts.values())
                ]
                for op, conflicts in sorted(links.ops.items())
            },
            list(links.ids),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )


def load_links(text: str) -> Links:
    ops, ids = json.loads(text)
    return Links(
        {
            op: {
                c[0]: Other(
                    c[0],
                    c[1],
                    c[2],
                    c[3],
                    int(c[4]),
                    _STATUS[c[5]],
                    int(c[6]),
                    c[7] if len(c) > 7 else None,
                    c[8] if len(c) > 8 else None,
                )
                for c in conflicts
            }
            for op, conflicts in ops.items()
        },
        tuple(ids),
    )
