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
  execution that made the later send, naming both executions.

Pure: no Kafka, no clock.
"""

from __future__ import annotations

import json
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
from streams.core.ids import deterministic_id, scoped_key
from streams.core.operations import (
    BLOCKS_RETRY,
    NEXT_STEP_FORBIDDEN,
    restriction,
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
    other = Other(
        link.conflict_id,
        link.role,
        link.other_execution_id,
        link.other_operation_id,
        link.other_attempt,
        link.other_status,
        at,
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
    )


# -- storage ------------------------------------------------------------------------------
_STATUS = {s.value: s for s in OperationStatus}


def dump_links(links: Links) -> str:
    return json.dumps(
        [
            {
                op: [[*o[:5], o.status.value, o.at] for o in sorted(conflicts.values())]
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
                c[0]: Other(c[0], c[1], c[2], c[3], int(c[4]), _STATUS[c[5]], int(c[6]))
                for c in conflicts
            }
            for op, conflicts in ops.items()
        },
        tuple(ids),
    )
