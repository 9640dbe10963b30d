"""Every attempt of an operation the console knows of, and which of them still block a retry.

An ``OperationState`` describes the operation's latest attempt and names one other attempt,
the one that holds its retry verdict back (``held_by_*``). An operator needs more: attempt 1
UNKNOWN under a VERIFIED attempt 2 is still an effect nobody has settled, and it must be
counted, found by a filter and reviewed like any other. The console learns of each attempt
from three of the records it reads:

- the operation's state: its latest attempt's status, and the holder's status (when the
  holder is an attempt of the same operation and execution);
- the work items (``reconciliation-work``): an attempt whose reply or verification deadline
  passed has one, open (UNKNOWN, or ACKNOWLEDGED and overdue) until its resolution names the
  status it settled in;
- the reconciler's progress on a work item (``reconciliation-checks``): MANUAL_REVIEW once it
  handed the attempt to a person.

``derive`` folds what the view holds of one operation into its attempts. It is a function
of those rows, not of the order the topics were read in: a settled status is final (nothing
more can happen to a settled attempt, docs/rules.md#statuses-and-the-retry-verdict), so it
wins over any open status, whichever record was read last; among open statuses the latest
attempt's own state says most, then the holder named by the state, then the reconciler, then
the work item's kind. An attempt the view has none of these for (an older attempt still SENT
within its deadline, and not the holder) is not listed: it becomes known when its deadline
passes (a work item) or it settles.

Pure: no SQLite, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streams.contracts.models.enums import (
    OperationStatus,
    ReconciliationState,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    OperationState,
    ReconciliationCheck,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core.operations import SETTLED

S = OperationStatus

#: How much each source says about an open attempt (the higher, the later and surer).
_STATE, _HOLDER, _RECONCILER, _WORK_ITEM = 4, 3, 2, 1


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt as the console knows it."""

    attempt: int
    status: OperationStatus
    #: still blocks a new send: sent and not settled (SENT, ACKNOWLEDGED, UNKNOWN,
    #: RECONCILING, MANUAL_REVIEW; a status this version cannot read counts, in doubt)
    blocks_retry: bool
    #: its work item while that is open (reviewed through it, or through the attempt)
    open_work_item_id: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "status": self.status.value,
            "blocks_retry": self.blocks_retry,
            "open_work_item_id": self.open_work_item_id,
        }


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A work item of the operation as the view keeps it: the item, its resolution once read,
    and the reconciler's latest progress on it."""

    item: ReconciliationWorkItem
    resolution: WorkItemResolution | None = None
    check: ReconciliationCheck | None = None


def blocks_retry(status: OperationStatus) -> bool:
    """Whether an attempt in ``status`` still blocks a new send: sent and not settled (a
    status this version cannot read does: in doubt, do not send again)."""
    return status not in SETTLED and status is not S.PREPARED


def derive(state: OperationState | None, items: Iterable[WorkItem]) -> list[Attempt]:
    """The operation's attempts known to the view, by attempt number (see the module)."""
    settled: dict[int, OperationStatus] = {}
    open_: dict[int, tuple[int, OperationStatus]] = {}
    work: dict[int, str] = {}

    def saw(attempt: int, status: OperationStatus, weight: int) -> None:
        if status in SETTLED:
            settled.setdefault(attempt, status)
        elif attempt not in open_ or open_[attempt][0] < weight:
            open_[attempt] = (weight, status)

    for w in sorted(items, key=lambda w: (w.item.created_at, w.item.work_item_id)):
        n = w.item.attempt
        if w.resolution is not None:
            saw(n, w.resolution.outcome, _WORK_ITEM)
            continue
        work[n] = w.item.work_item_id
        if w.check is not None and w.check.state is ReconciliationState.MANUAL_REVIEW:
            saw(n, S.MANUAL_REVIEW, _RECONCILER)
        kind = w.item.kind
        overdue = S.ACKNOWLEDGED if kind is WorkItemKind.VERIFICATION_TIMEOUT else S.UNKNOWN
        saw(n, overdue, _WORK_ITEM)
    if state is not None:
        if (
            state.held_by_attempt is not None
            and state.held_by_status is not None
            and state.held_by_operation_id == state.operation_id
            and state.held_by_execution_id is None
        ):
            saw(state.held_by_attempt, state.held_by_status, _HOLDER)
        saw(state.attempt, state.status, _STATE)
    out: list[Attempt] = []
    for n in sorted(settled.keys() | open_.keys()):
        status = settled[n] if n in settled else open_[n][1]
        blocking = blocks_retry(status)
        out.append(Attempt(n, status, blocking, work.get(n) if blocking else None))
    return out
