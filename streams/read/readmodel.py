"""The read side: one execution as a person wants to see it, from the worker's tables.

Pure functions over the stored JSON of the tables, so the HTTP API, ``vigil status`` and the
tests agree on one shape.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from streams.core import approvals as ap
from streams.core import cross
from streams.core import executions as ex
from streams.core import operations as ops


def approval_view(
    book: ap.ApprovalBook,
    request_id: str,
    thresholds_for: Callable[[ap.ApprovalFacts], ap.ThresholdSet],
) -> dict[str, Any] | None:
    facts = book.requests.get(request_id)
    if facts is None or facts.request is None:
        return None
    last = book.last_verdicts.get(request_id)
    view: dict[str, Any] = {
        "request_id": request_id,
        "execution_id": book.execution_id,
        "action": facts.request.action,
        "approver_ref": facts.request.approver_ref,
        "requested_at": _iso(facts.request.requested_at),
        "verdict": str(last.verdict) if last else None,
        "verdict_since": _iso(last.since) if last else None,
    }
    if last is not None:
        ev = ap.evaluate(ap.facts_for(book, request_id), last.since, thresholds_for(facts))
        view |= {
            "owner": str(ev.owner),
            "next_step": ev.next_step,
            "failed_proofs": [f.model_dump(mode="json") for f in ev.failed_proofs],
            "thresholds": ev.thresholds.model_dump(mode="json"),
        }
    return view


def execution_view(
    inflight: Any,
    closed: Any,
    operations: Any,
    approvals: Any,
    thresholds_for: Callable[[ap.ApprovalFacts], ap.ThresholdSet],
    links: Any = None,
) -> dict[str, Any] | None:
    """None when vigil knows nothing of the execution.

    ``in_flight`` is true while the execution is not closed and something of it is open: its
    status slot is in flight, or (no status event seen: ``status`` None, ``status_known``
    false) an approval wait or an operation of it is still open. An execution known only by
    an open approval is in flight with its status unknown, never shown as closed.

    ``links``: what the claims join told it of other executions' attempts
    (``streams.core.cross``), in its operations' verdicts as in the published states."""
    slot = ex.load_slot(inflight) if inflight is not None else None
    if slot is None and closed is not None:
        slot = ex.load_slot(closed)
    book = ops.load_book(operations) if operations else None
    other = cross.load_links(links) if links else None
    abook = ap.ApprovalBook.model_validate_json(approvals) if approvals else None
    if slot is None and book is None and abook is None:
        return None
    view: dict[str, Any] = {
        "execution_id": None,
        "status": None,
        "status_known": slot is not None,
        "in_flight": False,
        "open_operation_ids": [],
        "open_approval_ids": [],
    }
    if slot is None:
        opened = ops.open_operation_ids(book)
        waiting = ap.open_request_ids(abook) if abook else ()
        view |= {
            "in_flight": bool(opened or waiting),
            "open_operation_ids": list(opened),
            "open_approval_ids": list(waiting),
        }
    if isinstance(slot, ex.InFlight):
        view |= {
            "execution_id": slot.execution_id,
            "status": str(slot.status),
            "in_flight": True,
            "since": _iso(slot.since),
            "first_seen_at": _iso(slot.first_seen_at),
            "last_event_at": _iso(slot.last_event_at),
            "last_sequence": slot.last_sequence,
            "open_operation_ids": list(slot.open_operation_ids),
            "open_approval_ids": list(slot.open_approval_ids),
        }
    elif isinstance(slot, ex.Closed):
        view |= {
            "execution_id": slot.execution_id,
            "status": str(slot.status),
            "since": _iso(slot.closed_at),
            "last_sequence": slot.last_sequence,
        }
    view["operations"] = [
        s.model_dump(mode="json", exclude={"state_id", "execution_id"})
        for s in map(partial(cross.overlay, links=other), ops.current_states(book))
    ]
    view["approvals"] = (
        [
            v
            for rid in sorted(abook.requests)
            if abook
            if (v := approval_view(abook, rid, thresholds_for)) is not None
        ]
        if abook
        else []
    )
    view["execution_id"] = (
        view["execution_id"]
        or (book.execution_id if book else None)
        or (abook.execution_id if abook else None)
    )
    return view


def _iso(value: Any) -> str | None:
    if type(value) is int:  # the core's epoch milliseconds
        value = ex.from_ms(value)
    return value.isoformat().replace("+00:00", "Z") if value is not None else None
