"""The per-execution approval book as stored and read: every approval fact of one execution,
the verdict last published per request, and the steps on it (add a fact, advance to a stream
time, take orphans, purge closed requests, the next change point).

Why two forms: this one is the entry's JSON (what the read model, the HTTP API and the gauges
read) and the reference the stream's form, ``ledger.Ledger``, is held to by the property
tests; it recomputes every request's thresholds and change points on each call, plainly."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, field_validator, model_validator

from streams.contracts.models.base import construct, replace, to_millis
from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    DecisionCode,
)
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ApproverAcknowledgement,
    CurrentActionDigest,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.contracts.models.outputs import ApprovalVerdict
from streams.core.approvals.evaluation import change_points, evaluate, to_verdict
from streams.core.approvals.facts import (
    ApprovalFacts,
    DecisionFact,
    DeliveryFact,
    DigestFact,
    RequestPart,
    _canonical,
    _fact_key,
    _sort_key,
    _TimedModel,
    threshold_resolver,
)
from streams.core.approvals.thresholds import ThresholdSet, request_overrides
from streams.core.approvals.vocabulary import _EARLIEST, _TIME_FINAL, CLOSED_VERDICTS


class LastVerdict(_TimedModel):
    """The verdict last published for a request and the change point it was stamped with."""

    verdict: ApprovalVerdictCode
    since: AwareDatetime


class ApprovalBook(_TimedModel):
    """All approval facts of one execution, as one table value (JSON-storable).

    ``requests`` holds per request its own facts (its ``digests``/``heartbeats`` stay empty:
    those are the execution's and live here once, shared by all its requests). A request
    whose ``request`` is None holds facts that came before it. ``dirty`` lists the requests
    whose facts changed since the last ``advance``; ``evaluated_until`` is the stream time
    every change point up to which has been evaluated.
    """

    execution_id: str | None = None
    requests: dict[str, ApprovalFacts] = {}
    digests: tuple[DigestFact, ...] = ()
    heartbeats: tuple[AwareDatetime, ...] = ()
    last_verdicts: dict[str, LastVerdict] = {}
    evaluated_until: AwareDatetime | None = None
    dirty: tuple[str, ...] = ()
    #: The requests whose last verdict was published with the id of before ids were scoped by
    #: the execution (``evaluation.unscoped_verdict_id``): the RESOLVED alert that ends its
    #: alert must name the id that alert fired with. A book stored before has no such list:
    #: every last verdict of it is one (None, read as all of them).
    unscoped_verdicts: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _stored_before_scoping(self) -> ApprovalBook:
        if self.unscoped_verdicts is None:
            self.__dict__["unscoped_verdicts"] = tuple(sorted(self.last_verdicts))
        return self

    @field_validator("digests")
    @classmethod
    def _canonical_digests(cls, value: tuple[DigestFact, ...]) -> tuple[DigestFact, ...]:
        return _canonical(value, _fact_key)

    @field_validator("heartbeats")
    @classmethod
    def _canonical_heartbeats(cls, value: tuple[datetime, ...]) -> tuple[datetime, ...]:
        return tuple(sorted(set(value)))

    @field_validator("dirty")
    @classmethod
    def _canonical_dirty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(value)))


ApprovalEvent = (
    ApprovalRequested
    | ApprovalDelivery
    | ApproverAcknowledgement
    | ApprovalDecision
    | ResumeReceipt
    | CurrentActionDigest
    | RequesterHeartbeat
)


def request_part(event: ApprovalRequested) -> RequestPart:
    """The minimum kept of a request event."""
    return RequestPart(
        action=event.action,
        action_digest=event.action_digest,
        requested_at=event.occurred_at,
        expires_at=event.expires_at,
        approver_ref=event.approver_ref,
        resume_handle=event.resume_handle,
        risk=event.risk,
        policy=event.policy,
        overrides=request_overrides(
            event.grace_seconds, event.heartbeat_fresh_seconds, event.delivery_deadline_seconds
        ),
    )


def _merge_request(old: RequestPart | None, new: RequestPart) -> RequestPart:
    """A request id names one request. Should two different request events share it, the
    earliest (then the smaller by content) is kept, so the outcome does not depend on order."""
    if old is None:
        return new
    return min(old, new, key=lambda r: (*_sort_key(r.requested_at), r.model_dump_json()))


def add_fact(book: ApprovalBook, event: ApprovalEvent) -> ApprovalBook:
    """The book with one more fact. Idempotent: a redelivered event gives an equal book.

    Facts for a request not seen yet are held under its id until the request arrives.
    Raises ValueError for an event of another execution (the shell keys books by execution).
    """
    if book.execution_id is not None and event.execution_id != book.execution_id:
        raise ValueError(
            f"event of execution {event.execution_id} added to the book of {book.execution_id}"
        )
    execution_id = event.execution_id
    if isinstance(event, CurrentActionDigest | RequesterHeartbeat):
        update: dict[str, Any] = {"execution_id": execution_id}
        if isinstance(event, CurrentActionDigest):
            fact = DigestFact(at=event.occurred_at, digest=event.action_digest)
            if fact in book.digests:
                return book
            update["digests"] = ApprovalBook._canonical_digests((*book.digests, fact))
        else:
            at = to_millis(event.occurred_at)
            # a heartbeat no newer than one already judged with can never be the latest again
            if book.heartbeats and at <= book.heartbeats[0] <= (book.evaluated_until or at):
                return book
            if at in book.heartbeats:
                return book
            update["heartbeats"] = tuple(sorted({*book.heartbeats, at}))
        update["dirty"] = tuple(sorted({*book.dirty, *book.requests}))
        return replace(book, **update)

    rid = event.request_id
    facts = book.requests.get(rid) or ApprovalFacts(request_id=rid, execution_id=execution_id)
    # Only the field the fact goes to changes, put in canonical form by its own validator:
    # the rest of ``facts`` is valid already, so it is not validated again.
    data = dict(facts.__dict__)
    if isinstance(event, ApprovalRequested):
        merged = _merge_request(facts.request, request_part(event))
        data["request"] = merged
    elif isinstance(event, ApprovalDelivery):
        data["deliveries"] = ApprovalFacts._canonical_facts(
            (*facts.deliveries, DeliveryFact(at=event.occurred_at, outcome=event.outcome))
        )
    elif isinstance(event, ApproverAcknowledgement):
        data["acknowledgements"] = ApprovalFacts._canonical_times(
            (*facts.acknowledgements, event.occurred_at)
        )
    elif isinstance(event, ApprovalDecision):
        decision = DecisionFact(
            at=event.occurred_at, code=event.decision, action_digest=event.action_digest
        )
        data["decisions"] = ApprovalFacts._canonical_facts((*facts.decisions, decision))
    elif isinstance(event, ResumeReceipt):
        data["receipts"] = ApprovalFacts._canonical_times((*facts.receipts, event.occurred_at))
    else:  # pragma: no cover - the union above is exhaustive
        raise TypeError(f"not an approval fact: {type(event).__name__}")
    new_facts = construct(ApprovalFacts, data)
    if new_facts == facts and rid in book.requests:
        return book
    return replace(
        book,
        execution_id=execution_id,
        requests={**book.requests, rid: new_facts},
        dirty=tuple(sorted({*book.dirty, rid})),
    )


def facts_for(book: ApprovalBook, request_id: str) -> ApprovalFacts:
    """One request's facts joined with its execution's digests and heartbeats."""
    facts = book.requests[request_id]
    return replace(facts, digests=book.digests, heartbeats=book.heartbeats)


def advance(
    book: ApprovalBook,
    to: datetime,
    thresholds_for: Callable[[ApprovalFacts], ThresholdSet],
) -> tuple[ApprovalBook, tuple[ApprovalVerdict, ...]]:
    """Bring every request's verdict up to stream time ``to``.

    Each request is evaluated at every change point in ``(evaluated_until, to]`` and, if its
    facts changed since the last call, at ``to`` itself. A record is emitted only when the
    verdict differs from the last one, stamped with the change point, so the output does not
    depend on how often or where in between the shell calls this: stepping through ``to`` in
    several calls emits the same records as one call. Records come sorted by
    (evaluated_at, request_id).

    Contract: call it with ``to`` only once every fact with a time ``<= to`` is in the book
    (the partition watermark; minus 1 ms if more events at exactly the watermark may follow).
    A fact older than ``evaluated_until`` is late: the past already published is not rewritten,
    its effect appears from the first instant evaluated after it was added. A ``to`` behind
    ``evaluated_until`` (stream time never goes back) is treated as ``evaluated_until``.

    This is the reference form, over the stored book; the stream judges through
    ``ledger.Ledger``, which the property tests hold to the same answers.
    """
    to = to_millis(to)
    start = book.evaluated_until
    if start is not None and to < start:
        to = start
    dirty = set(book.dirty)
    last = dict(book.last_verdicts)
    emitted: list[ApprovalVerdict] = []
    republished: set[str] = set()
    for rid in sorted(book.requests):
        req = book.requests[rid].request
        if req is None:
            continue
        previous = last.get(rid)
        if rid not in dirty and previous is not None and previous.verdict in _TIME_FINAL:
            continue
        facts = facts_for(book, rid)
        thresholds = thresholds_for(facts)
        all_points = change_points(facts, thresholds)
        points = {p for p in all_points if (start is None or p > start) and p <= to}
        if rid in dirty or previous is None:
            points.add(to)
        for point in sorted(points):
            if req.requested_at is not None and point < req.requested_at:
                continue
            evaluation = evaluate(facts, point, thresholds)
            if previous is None or previous.verdict is not evaluation.verdict:
                emitted.append(to_verdict(evaluation, previous.verdict if previous else None, req))
                republished.add(rid)
                previous = construct(
                    LastVerdict, {"verdict": evaluation.verdict, "since": to_millis(point)}
                )
                last[rid] = previous
    unscoped = tuple(r for r in book.unscoped_verdicts or () if r not in republished)
    new_book = replace(
        book, last_verdicts=last, evaluated_until=to, dirty=(), unscoped_verdicts=unscoped
    )
    emitted.sort(key=lambda v: (v.evaluated_at, v.request_id))
    return _prune(new_book), tuple(emitted)


def _prune(book: ApprovalBook) -> ApprovalBook:
    """Drop execution facts that can no longer change any verdict once ``evaluated_until``
    has passed, so a long wait with a heartbeat every few seconds stays small.

    Every later evaluation is at or after ``evaluated_until`` (U). Heartbeats: it uses the
    latest heartbeat up to its instant, so only the latest one up to U and later ones matter.
    Digests: a request looks at the latest digest change in (its request time, B], B being its
    first decision's time if that is at or before U, else the evaluation time; so per request
    only the latest digests in (request time, min(B, U)] matter, plus every change after U.
    The price: a fact that arrives late (time before U, which the shell reports as late) is
    judged without the history dropped here.
    """
    until = book.evaluated_until
    if until is None or (not book.digests and len(book.heartbeats) <= 1):
        return book  # nothing that could be dropped (the common case: called on every advance)
    past = [t for t in book.heartbeats if t <= until]
    heartbeats = tuple(t for t in book.heartbeats if t > until or (past and t == past[-1]))
    keep_times: set[datetime] = set()
    for facts in book.requests.values():
        req = facts.request
        if req is None:
            continue
        decided = [
            d.at
            for d in facts.decisions
            if d.at is not None and d.at <= until and d.code is not DecisionCode.UNRECOGNIZED
        ]
        bound = min(decided, default=until)
        since = req.requested_at or _EARLIEST
        inside = [d.at for d in book.digests if d.at is not None and since < d.at <= bound]
        if inside:
            keep_times.add(max(inside))
    digests = tuple(d for d in book.digests if d.at is None or d.at > until or d.at in keep_times)
    if heartbeats == book.heartbeats and digests == book.digests:
        return book
    return replace(book, heartbeats=heartbeats, digests=digests)


def _held_times(facts: ApprovalFacts) -> list[datetime]:
    """Known times of a request's own facts (not its request, not execution facts)."""
    times = (
        *(d.at for d in facts.deliveries),
        *(d.at for d in facts.decisions),
        *facts.acknowledgements,
        *facts.receipts,
    )
    return [t for t in times if t is not None]


def _closed(book: ApprovalBook, request_id: str) -> bool:
    last = book.last_verdicts.get(request_id)
    return last is not None and last.verdict in CLOSED_VERDICTS


def open_request_ids(book: ApprovalBook) -> tuple[str, ...]:
    """Requests seen whose wait is not over (for ``ExecutionState.open_approval_ids``)."""
    return tuple(
        rid
        for rid in sorted(book.requests)
        if book.requests[rid].request is not None and not _closed(book, rid)
    )


def next_change(
    book: ApprovalBook,
    thresholds_for: Callable[[ApprovalFacts], ThresholdSet] | None = None,
) -> datetime | None:
    """The earliest change point after ``evaluated_until`` of any request not yet closed:
    when stream time must reach for a verdict to (possibly) change. None if there is none.
    ``thresholds_for`` must be the one given to ``advance`` (default: the built-in defaults)."""
    thresholds_for = thresholds_for or threshold_resolver()
    best: datetime | None = None
    for rid, own in book.requests.items():
        if own.request is None:
            continue
        last = book.last_verdicts.get(rid)
        if last is not None and last.verdict in _TIME_FINAL and rid not in book.dirty:
            continue
        facts = facts_for(book, rid)
        points = change_points(facts, thresholds_for(facts))
        for point in points:
            if book.evaluated_until is None or point > book.evaluated_until:
                if best is None or point < best:
                    best = point
                break
    return best


def purge_closed(book: ApprovalBook, before: datetime) -> ApprovalBook:
    """Drop requests closed (CLOSED_BY_DECLINE, CLOSED_BY_CANCEL, RESUMED) before ``before``,
    and facts held for a request that never came whose latest fact is before ``before``.

    The shell passes ``stream time - retention``. Stale, orphaned, unroutable and stuck
    requests stay: someone still has to act on them (they go with the execution's book).
    """
    keep: dict[str, ApprovalFacts] = {}
    for rid, facts in book.requests.items():
        last = book.last_verdicts.get(rid)
        if facts.request is not None:
            if last is not None and last.verdict in CLOSED_VERDICTS and last.since < before:
                continue
        else:
            times = _held_times(facts)
            if times and max(times) < before:
                continue
        keep[rid] = facts
    if len(keep) == len(book.requests):
        return book
    return _prune(
        replace(
            book,
            requests=keep,
            last_verdicts={r: v for r, v in book.last_verdicts.items() if r in keep},
            dirty=tuple(r for r in book.dirty if r in keep),
            unscoped_verdicts=tuple(r for r in book.unscoped_verdicts or () if r in keep),
        )
    )


def take_orphans(
    book: ApprovalBook, before: datetime
) -> tuple[ApprovalBook, tuple[tuple[str, datetime], ...]]:
    """Facts held for a request that has not come by ``before`` (their latest fact is older):
    removed from the book and returned as ``(request_id, latest fact time)``, so the shell can
    report them as ORPHAN_FACT anomalies instead of keeping them, or dropping them, silently.
    """
    orphans: list[tuple[str, datetime]] = []
    for rid, facts in sorted(book.requests.items()):
        if facts.request is None:
            times = [t for t in _held_times(facts) if t is not None]
            if times and max(times) < before:
                orphans.append((rid, max(times)))
    if not orphans:
        return book, ()
    gone = {rid for rid, _ in orphans}
    kept = replace(
        book,
        requests={r: f for r, f in book.requests.items() if r not in gone},
        last_verdicts={r: v for r, v in book.last_verdicts.items() if r not in gone},
        dirty=tuple(r for r in book.dirty if r not in gone),
        unscoped_verdicts=tuple(r for r in book.unscoped_verdicts or () if r not in gone),
    )
    return _prune(kept), tuple(orphans)


def orphan_deadline(book: ApprovalBook, window: timedelta) -> datetime | None:
    """When the earliest held fact without its request becomes an orphan."""
    times = [
        max(t for t in _held_times(f) if t is not None) + window
        for f in book.requests.values()
        if f.request is None and any(t is not None for t in _held_times(f))
    ]
    return min(times, default=None)
