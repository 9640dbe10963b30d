"""The approval book the stream keeps for one execution, in the representation it is judged in:
slotted records, times in integer epoch milliseconds, and per request what its verdict
depends on (its thresholds and its sorted change points) kept between calls.

Why a second form of the book: ``book.ApprovalBook`` is the stored and readable form
(JSON, pydantic, ``datetime``), and the reference the rules are checked against. Judging
through it cost a quarter of the core's time: every advance re-joined each request's facts,
re-resolved its thresholds, recomputed its change points and evaluated all four proofs at
each point through pydantic models. Here a ``Ledger`` is decoded from the stored book once
(``Ledger.of_book``), judged in place, and encoded back (``to_book``) only when the entry is
written. ``advance`` visits only the requests whose facts changed or whose next change point
has come; the four proofs are computed in one pass over facts already in time order, and
the published record is built once, only for a verdict that changed.

Every rule is the one ``evaluation`` states; this module repeats it over integers. The
property tests in ``tests/test_core_approvals.py`` hold the two forms equal (records, books,
change points, orphans) on generated streams. Facts in a stream book always have a time:
they come from events (only an offline snapshot has facts of unknown time, and those are
judged by ``evaluation.evaluate``).
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, NamedTuple

from streams.contracts.models.base import construct
from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    DecisionCode,
    DeliveryOutcome,
    Proof,
    ProofState,
    Risk,
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
from streams.contracts.models.outputs import ApprovalVerdict, ProofFinding, Thresholds
from streams.core.approvals.book import (
    ApprovalBook,
    ApprovalEvent,
    LastVerdict,
    _merge_request,
)
from streams.core.approvals.evaluation import (
    REASON_SEPARATOR,
    unscoped_verdict_id,
    verdict_id,
)
from streams.core.approvals.facts import (
    ApprovalFacts,
    DecisionFact,
    DeliveryFact,
    DigestFact,
    RequestPart,
)
from streams.core.approvals.thresholds import ThresholdOverrides, ThresholdSet
from streams.core.approvals.vocabulary import (
    ACK_MISSING,
    ACK_PENDING,
    ACTION_DIGEST_CHANGED,
    ACTION_DIGEST_UNKNOWN,
    CLOSED_VERDICTS,
    CONTRADICTING_DECISION,
    DECIDED_AFTER_DIGEST_CHANGE,
    DECIDED_AFTER_EXPIRY,
    DECISION_FOR_OTHER_DIGEST,
    DECISION_UNRECOGNIZED,
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    DELIVERY_UNCONFIRMED,
    HEARTBEAT_NEVER_SEEN,
    HEARTBEAT_NOT_YET_SEEN,
    HEARTBEAT_STALE,
    NO_APPROVER,
    NO_RESUME_HANDLE,
    NO_RESUME_RECEIPT,
    REQUEST_EXPIRED,
    RESUME_RECEIPT_PENDING,
    VERDICT_GUIDANCE,
    V,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)


def to_ms(t: datetime) -> int:
    """Epoch milliseconds of an aware time, sub-millisecond digits dropped (as ``to_millis``)."""
    return (t - EPOCH) // ONE_MS


def from_ms(ms: int) -> datetime:
    """The UTC time of epoch milliseconds, as the contract records carry it."""
    return EPOCH + timedelta(milliseconds=ms)


def id_ms(ms: int) -> int:
    """The milliseconds ``deterministic_id`` hashes for a time (``int(t.timestamp() * 1000)``,
    through the float), so that verdict ids stay what the ``datetime`` form made."""
    return int(ms / 1000 * 1000)


# -- records ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Request:
    """What an ``ApprovalRequested`` event said, as ``RequestPart`` keeps it (times in ms;
    ``overrides``: grace, heartbeat freshness, delivery deadline in ms, None = not said)."""

    action: str | None
    action_digest: str | None
    requested_at: int
    expires_at: int | None
    approver_ref: str | None
    resume_handle: str | None
    risk: Risk | None
    policy: str | None
    overrides: tuple[int | None, int | None, int | None]

    @property
    def needs_acknowledgement(self) -> bool:
        return self.risk is not Risk.LOW


#: A JSON string as pydantic writes it (only quotes, backslashes and controls escaped).
_json: Callable[[str], str] = encode_basestring


# Facts are plain tuples whose order is the stored book's canonical order: time, then the
# rest of the fact as its JSON text (what ``facts._fact_key`` sorts by, after the time).
#: (at, key, outcome)
Delivery = tuple[int, str, DeliveryOutcome]
#: (at, key, code, action digest)
Decision = tuple[int, str, DecisionCode, str | None]
#: (at, key, digest)
Digest = tuple[int, str, str]


def _delivery(at: int, outcome: DeliveryOutcome) -> Delivery:
    return (at, f'"{outcome.value}"}}', outcome)


def _decision(at: int, code: DecisionCode, digest: str | None) -> Decision:
    tail = "null" if digest is None else _json(digest)
    return (at, f'"{code.value}","action_digest":{tail}}}', code, digest)


def _digest(at: int, digest: str) -> Digest:
    return (at, _json(digest) + "}", digest)


def _added(items: tuple[Any, ...], item: Any) -> tuple[Any, ...] | None:
    """``items`` (sorted, unique) with ``item``; None when it is there already."""
    i = bisect_left(items, item)
    if i < len(items) and items[i] == item:
        return None
    return (*items[:i], item, *items[i:])


class Req:
    """One request's facts and what is derived from them (``thresholds``, ``points``: the
    sorted change points), derived again when its facts or its execution's change."""

    __slots__ = (
        "acks",
        "decisions",
        "deliveries",
        "execution_id",
        "points",
        "receipts",
        "request",
        "request_id",
        "text",
        "thresholds",
        "version",
    )

    def __init__(self, request_id: str, execution_id: str | None) -> None:
        self.request_id = request_id
        self.execution_id = execution_id
        self.request: Request | None = None
        self.deliveries: tuple[Delivery, ...] = ()
        self.acks: tuple[int, ...] = ()
        self.decisions: tuple[Decision, ...] = ()
        self.receipts: tuple[int, ...] = ()
        #: (grace, heartbeat freshness, delivery deadline) in ms; None: not resolved yet
        self.thresholds: tuple[int, int, int] | None = None
        self.points: list[int] = []
        #: the ledger's ``version`` the points were computed at (-1: never)
        self.version = -1
        #: its part of the stored JSON, written when first needed after its facts changed
        self.text: str | None = None

    def held_times(self) -> list[int]:
        """Times of its own facts (not the request, not the execution's facts)."""
        return [
            *(d[0] for d in self.deliveries),
            *(d[0] for d in self.decisions),
            *self.acks,
            *self.receipts,
        ]


#: Resolves a request's thresholds in ms: ``ThresholdResolver.millis`` or, for any other
#: ``thresholds_for``, a call through the facts it takes.
Resolve = Callable[[Request], tuple[int, int, int]]


def _millis_of(thresholds_for: Callable[[ApprovalFacts], ThresholdSet]) -> Resolve:
    own = getattr(thresholds_for, "millis", None)
    if own is not None:
        return own  # type: ignore[no-any-return]

    def resolve(request: Request) -> tuple[int, int, int]:
        th = thresholds_for(ApprovalFacts(request_id="", request=_request_part(request)))
        return (
            th.grace // ONE_MS,
            th.heartbeat_fresh // ONE_MS,
            th.delivery_deadline // ONE_MS,
        )

    return resolve


class Settled(NamedTuple):
    """What ``Ledger.settle`` did: the verdicts to publish (each with the id of the record
    it follows), the orphans taken (request id, latest fact), and when the book is due next
    (its next change point, its next orphan deadline; None: never)."""

    verdicts: Sequence[tuple[ApprovalVerdict, str | None]]
    orphans: Sequence[tuple[str, int]]
    change: int | None
    orphaned: int | None


# -- the ledger ------------------------------------------------------------------------------
class Ledger:
    """One execution's approval facts and last verdicts, judged in place.

    Mutable, like the aggregate that owns it (``streams.core.execution``): the shell loads
    it once, calls it, and stores it; ``touched`` says whether the stored book changed.
    ``version`` counts changes to the execution's own facts (digests, heartbeats), on which
    every request's change points depend."""

    __slots__ = (
        "_quiet",
        "_resolve",
        "_thresholds_for",
        "digests",
        "dirty",
        "evaluated_until",
        "execution_id",
        "heartbeats",
        "last",
        "requests",
        "touched",
        "unscoped",
        "version",
    )

    def __init__(self, execution_id: str | None = None) -> None:
        self.execution_id = execution_id
        self.requests: dict[str, Req] = {}
        self.digests: tuple[Digest, ...] = ()
        self.heartbeats: tuple[int, ...] = ()
        #: request id -> (verdict, the change point it was stamped with), in the order first set
        self.last: dict[str, tuple[ApprovalVerdictCode, int]] = {}
        #: requests whose last verdict has the id of before ids were scoped (``ApprovalBook``)
        self.unscoped: set[str] = set()
        self.evaluated_until: int | None = None
        self.dirty: set[str] = set()
        self.version = 0
        self.touched = False
        self._thresholds_for: Any = None
        self._resolve: Resolve | None = None
        #: (the last horizon ``settle`` can move to without judging anything, its settings,
        #: what it answers then); None: unknown
        self._quiet: tuple[int, tuple[Any, ...], Settled] | None = None

    # -- facts ---------------------------------------------------------------------------
    def add(self, event: ApprovalEvent) -> bool:
        """One more fact; False when it changes nothing (a redelivery, or a heartbeat older
        than one already judged with). Facts for a request not seen yet are held under its
        id. Raises ValueError for an event of another execution."""
        execution_id = event.execution_id
        if self.execution_id is not None and execution_id != self.execution_id:
            raise ValueError(
                f"event of execution {execution_id} added to the book of {self.execution_id}"
            )
        cls = type(event)
        at = to_ms(event.occurred_at)
        if cls is RequesterHeartbeat or cls is CurrentActionDigest:
            if cls is CurrentActionDigest:
                digests = _added(self.digests, _digest(at, event.action_digest))  # type: ignore[union-attr]
                if digests is None:
                    return False
                self.digests = digests
            else:
                hb = self.heartbeats
                until = self.evaluated_until
                if hb and at <= hb[0] <= (at if until is None else until):
                    return False
                heartbeats = _added(hb, at)
                if heartbeats is None:
                    return False
                self.heartbeats = heartbeats
            self.execution_id = execution_id
            self.version += 1
            self.dirty.update(self.requests)
            self.touched = True
            self._quiet = None
            return True

        rid = event.request_id  # type: ignore[union-attr]
        r = self.requests.get(rid)
        new = r is None
        if r is None:
            r = Req(rid, execution_id)
        if cls is ApprovalRequested:
            changed = self._set_request(r, event)  # type: ignore[arg-type]
        elif cls is ApprovalDelivery:
            changed = _set(r, "deliveries", _delivery(at, event.outcome))  # type: ignore[union-attr]
        elif cls is ApproverAcknowledgement:
            changed = _set(r, "acks", at)
        elif cls is ApprovalDecision:
            fact = _decision(at, event.decision, event.action_digest)  # type: ignore[union-attr]
            changed = _set(r, "decisions", fact)
        elif cls is ResumeReceipt:
            changed = _set(r, "receipts", at)
        else:  # pragma: no cover - the union is exhaustive
            raise TypeError(f"not an approval fact: {cls.__name__}")
        if not changed and not new:
            return False
        self.execution_id = execution_id
        if new:
            self.requests[rid] = r
        r.version = -1
        r.text = None
        self.dirty.add(rid)
        self.touched = True
        self._quiet = None
        return True

    @staticmethod
    def _set_request(r: Req, event: ApprovalRequested) -> bool:
        def seconds(value: int | None) -> int | None:
            return None if value is None else value * 1000

        request = Request(
            event.action,
            event.action_digest,
            to_ms(event.occurred_at),
            None if event.expires_at is None else to_ms(event.expires_at),
            event.approver_ref,
            event.resume_handle,
            event.risk,
            event.policy,
            (
                seconds(event.grace_seconds),
                seconds(event.heartbeat_fresh_seconds),
                seconds(event.delivery_deadline_seconds),
            ),
        )
        old = r.request
        if old is not None and old != request:
            # Two request events under one id: the earliest, then the smaller by content,
            # is kept (the stored form's rule, so the outcome does not depend on order).
            kept = _merge_request(_request_part(old), _request_part(request))
            request = old if kept == _request_part(old) else request
        if old == request:
            return False
        r.request = request
        r.thresholds = None
        return True

    # -- judging -------------------------------------------------------------------------
    def settle(
        self,
        horizon: int,
        thresholds_for: Callable[[ApprovalFacts], ThresholdSet],
        orphan_after: int,
        retention: int,
    ) -> Settled:
        """The shell's step at stream time ``horizon`` (ms): ``advance``, then
        ``take_orphans(horizon - orphan_after)`` and ``purge_closed(horizon - retention)``,
        and what is due next (``next_change``, ``orphan_deadline``).

        While no fact has come and ``horizon`` is before everything that could change the
        book (a change point of an open request, an orphan, a purge, a heartbeat or digest
        that would be pruned), the step only moves ``evaluated_until``: that bound is kept
        from the last step, so most steps judge nothing and visit no request."""
        settings = (thresholds_for, orphan_after, retention)
        quiet = self._quiet
        if not self.dirty and quiet is not None and horizon <= quiet[0] and quiet[1] == settings:
            until = self.evaluated_until
            if until is None or horizon > until:
                self.evaluated_until = horizon
                self.touched = True
            return quiet[2]
        verdicts = self.advance(horizon, thresholds_for)
        orphans = self.take_orphans(horizon - orphan_after)
        self.purge_closed(horizon - retention)
        change = self.next_change(thresholds_for)
        orphaned = self.orphan_deadline(orphan_after)
        self._quiet = (
            self._quiet_until(change, orphaned, retention),
            settings,
            Settled((), (), change, orphaned),
        )
        return Settled(tuple(verdicts), tuple(orphans), change, orphaned)

    def _quiet_until(self, change: int | None, orphaned: int | None, retention: int) -> int:
        """The last horizon at which ``settle`` would change nothing but ``evaluated_until``."""
        bound = self.evaluated_until
        if bound is None:
            return -(2**63)
        limits = []
        if change is not None:
            limits.append(change - 1)  # a change point is judged once the horizon reaches it
        if orphaned is not None:
            limits.append(orphaned)  # an orphan once the horizon is past it
        last = self.last
        for rid, r in self.requests.items():
            if r.request is None:
                times = r.held_times()
                if times:
                    limits.append(max(times) + retention)
            else:
                lv = last.get(rid)
                if lv is not None and lv[0] in CLOSED_VERDICTS:
                    limits.append(lv[1] + retention)  # purged once the horizon is past it
        hb = self.heartbeats
        if len(hb) >= 2:
            limits.append(hb[1] - 1)  # pruned once two heartbeats are judged
        for g in self.digests:
            if g[0] > bound:
                limits.append(g[0] - 1)  # the digests kept may change once one is judged
                break
        return min(limits) if limits else 2**63

    def _use(self, thresholds_for: Callable[[ApprovalFacts], ThresholdSet]) -> None:
        if thresholds_for is not self._thresholds_for:
            self._quiet = None
            self._thresholds_for = thresholds_for
            self._resolve = _millis_of(thresholds_for)
            for r in self.requests.values():
                r.thresholds = None
                r.version = -1

    def _derive(self, r: Req) -> None:
        """The request's thresholds and change points, for the facts it and its execution
        hold now: every instant where its verdict can change, at or after its request."""
        req = r.request
        assert req is not None
        th = r.thresholds
        if th is None:
            th = r.thresholds = self._resolve(req)  # type: ignore[misc]
        grace, fresh, deadline = th
        start = req.requested_at
        points = {start, start + deadline, start + fresh}
        if req.expires_at is not None:
            points.add(req.expires_at)
        for d in r.deliveries:
            points.add(d[0])
        for d in r.decisions:
            points.add(d[0])
            points.add(d[0] + grace)
        for g in self.digests:
            points.add(g[0])
        points.update(r.acks)
        points.update(r.receipts)
        for t in self.heartbeats:
            points.add(t)
            points.add(t + fresh)
        r.points = sorted(p for p in points if p >= start)
        r.version = self.version

    def advance(
        self, to: int, thresholds_for: Callable[[ApprovalFacts], ThresholdSet]
    ) -> list[tuple[ApprovalVerdict, str | None]]:
        """Every request's verdict brought up to stream time ``to`` (ms): ``book.advance``'s
        contract. Returns the records to publish, each with the id of the verdict record it
        follows (None: the request's first), sorted by (evaluated_at, request_id).

        Only requests whose facts changed (evaluated at ``to`` too) or with a change point in
        ``(evaluated_until, to]`` are evaluated; a request whose verdict time alone cannot
        change, and whose facts did not, is not visited."""
        self._use(thresholds_for)
        self._quiet = None
        start = self.evaluated_until
        if start is not None and to < start:
            to = start
        dirty = self.dirty
        last = self.last
        emitted: list[tuple[int, str, ApprovalVerdict, str | None]] = []
        version = self.version
        for rid in sorted(self.requests):
            r = self.requests[rid]
            req = r.request
            if req is None:
                continue
            previous = last.get(rid)
            is_dirty = rid in dirty
            if not is_dirty and previous is not None and previous[0] in CLOSED_VERDICTS:
                continue
            if r.version != version:
                self._derive(r)
            points = r.points
            i = 0 if start is None else bisect_right(points, start)
            j = bisect_right(points, to, i)
            if is_dirty or previous is None:
                due = points[i:j]
                if not due or due[-1] != to:
                    due.append(to)
            elif i == j:
                continue
            else:
                due = points[i:j]
            previous_id: str | None = None
            for point in due:
                if point < req.requested_at:
                    continue
                verdict, findings = _judge(self, r, req, point)
                if previous is None or previous[0] is not verdict:
                    if previous is not None and previous_id is None:
                        if rid in self.unscoped:
                            previous_id = unscoped_verdict_id(rid, previous[0], id_ms(previous[1]))
                        else:
                            previous_id = verdict_id(
                                r.execution_id, rid, previous[0], id_ms(previous[1])
                            )
                    record = _record(r, req, point, verdict, findings, previous)
                    emitted.append((point, rid, record, previous_id))
                    previous_id = record.verdict_id
                    previous = (verdict, point)
                    last[rid] = previous
                    self.unscoped.discard(rid)
        if start != to or dirty or emitted:
            self.touched = True
        self.evaluated_until = to
        dirty.clear()
        emitted.sort(key=_by_time_and_request)
        self._prune()
        return [(e[2], e[3]) for e in emitted]

    def next_change(self, thresholds_for: Callable[[ApprovalFacts], ThresholdSet]) -> int | None:
        """The earliest change point after ``evaluated_until`` of any request not yet closed
        (``book.next_change``); ``thresholds_for`` must be the one ``advance`` is given."""
        self._use(thresholds_for)
        best: int | None = None
        until = self.evaluated_until
        version = self.version
        for rid, r in self.requests.items():
            if r.request is None:
                continue
            lv = self.last.get(rid)
            if lv is not None and lv[0] in CLOSED_VERDICTS and rid not in self.dirty:
                continue
            if r.version != version:
                self._derive(r)
            points = r.points
            i = 0 if until is None else bisect_right(points, until)
            if i < len(points) and (best is None or points[i] < best):
                best = points[i]
        return best

    def _prune(self) -> None:
        """``book._prune``: the digests and heartbeats that can no longer change a verdict,
        dropped once ``evaluated_until`` has passed them."""
        until = self.evaluated_until
        if until is None or (not self.digests and len(self.heartbeats) <= 1):
            return
        hb = self.heartbeats
        k = bisect_right(hb, until)
        heartbeats = hb[k - 1 :] if k else hb
        keep_times: set[int] = set()
        digests = self.digests
        if digests:
            for r in self.requests.values():
                req = r.request
                if req is None:
                    continue
                bound = until
                for d in r.decisions:
                    if d[0] <= until and d[2] is not DecisionCode.UNRECOGNIZED:
                        bound = min(bound, d[0])
                since = req.requested_at
                inside = [g[0] for g in digests if since < g[0] <= bound]
                if inside:
                    keep_times.add(max(inside))
            digests = tuple(g for g in digests if g[0] > until or g[0] in keep_times)
        if heartbeats == self.heartbeats and digests == self.digests:
            return
        self.heartbeats, self.digests = heartbeats, digests
        self.version += 1
        self.touched = True

    # -- requests that end -----------------------------------------------------------------
    def _drop(self, gone: Iterable[str]) -> None:
        self._quiet = None
        for rid in gone:
            del self.requests[rid]
            self.last.pop(rid, None)
            self.unscoped.discard(rid)
            self.dirty.discard(rid)
        self.touched = True
        self._prune()

    def take_orphans(self, before: int) -> list[tuple[str, int]]:
        """``book.take_orphans``: facts held for a request that has not come by ``before``,
        removed and returned as ``(request_id, latest fact time)``, by request id."""
        orphans: list[tuple[str, int]] = []
        for rid in sorted(self.requests):
            r = self.requests[rid]
            if r.request is None:
                times = r.held_times()
                if times and max(times) < before:
                    orphans.append((rid, max(times)))
        if orphans:
            self._drop(rid for rid, _ in orphans)
        return orphans

    def purge_closed(self, before: int) -> None:
        """``book.purge_closed``: requests closed before ``before``, and held facts whose
        latest is before it, dropped."""
        gone = []
        for rid, r in self.requests.items():
            if r.request is not None:
                lv = self.last.get(rid)
                if lv is not None and lv[0] in CLOSED_VERDICTS and lv[1] < before:
                    gone.append(rid)
            else:
                times = r.held_times()
                if times and max(times) < before:
                    gone.append(rid)
        if gone:
            self._drop(gone)

    def orphan_deadline(self, window: int) -> int | None:
        """When the earliest held fact without its request becomes an orphan."""
        times = [
            max(r.held_times()) + window
            for r in self.requests.values()
            if r.request is None and r.held_times()
        ]
        return min(times, default=None)

    def open_request_ids(self) -> tuple[str, ...]:
        """Requests seen whose wait is not over (``book.open_request_ids``)."""
        last = self.last
        return tuple(
            rid
            for rid in sorted(self.requests)
            if self.requests[rid].request is not None
            and (rid not in last or last[rid][0] not in CLOSED_VERDICTS)
        )

    def times_after(self, after: int | None) -> set[int]:
        """Every time the book holds that is later than ``after`` (ms)."""
        times: set[int] = set()
        for r in self.requests.values():
            req = r.request
            if req is not None:
                times.add(req.requested_at)
                if req.expires_at is not None:
                    times.add(req.expires_at)
            times.update(r.held_times())
        times.update(g[0] for g in self.digests)
        times.update(self.heartbeats)
        times.update(lv[1] for lv in self.last.values())
        if self.evaluated_until is not None:
            times.add(self.evaluated_until)
        return times if after is None else {t for t in times if t > after}

    # -- the stored form -------------------------------------------------------------------
    @classmethod
    def of_book(cls, book: ApprovalBook) -> Ledger:
        """The ledger of a stored book (any book the stream wrote, 6733ee4's included)."""
        ledger = cls(book.execution_id)
        for rid, facts in book.requests.items():
            r = Req(rid, facts.execution_id)
            part = facts.request
            if part is not None:
                r.request = _request_of(part)
            r.deliveries = tuple(_delivery(to_ms(d.at), d.outcome) for d in facts.deliveries)  # type: ignore[arg-type]
            r.acks = tuple(to_ms(t) for t in facts.acknowledgements)  # type: ignore[arg-type]
            r.decisions = tuple(
                _decision(to_ms(d.at), d.code, d.action_digest)  # type: ignore[arg-type]
                for d in facts.decisions
            )
            r.receipts = tuple(to_ms(t) for t in facts.receipts)  # type: ignore[arg-type]
            ledger.requests[rid] = r
        ledger.digests = tuple(_digest(to_ms(d.at), d.digest) for d in book.digests)  # type: ignore[arg-type]
        ledger.heartbeats = tuple(to_ms(t) for t in book.heartbeats)
        ledger.last = {rid: (lv.verdict, to_ms(lv.since)) for rid, lv in book.last_verdicts.items()}
        ledger.unscoped = set(book.unscoped_verdicts or ())
        if book.evaluated_until is not None:
            ledger.evaluated_until = to_ms(book.evaluated_until)
        ledger.dirty = set(book.dirty)
        return ledger

    def to_book(self) -> ApprovalBook:
        """The stored form: equal to the ``ApprovalBook`` the reference steps make of the
        same inputs."""
        requests = {}
        for rid, r in self.requests.items():
            requests[rid] = construct(
                ApprovalFacts,
                {
                    "request_id": rid,
                    "execution_id": r.execution_id,
                    "request": None if r.request is None else _request_part(r.request),
                    "deliveries": tuple(
                        construct(DeliveryFact, {"at": from_ms(d[0]), "outcome": d[2]})
                        for d in r.deliveries
                    ),
                    "acknowledgements": tuple(from_ms(t) for t in r.acks),
                    "decisions": tuple(
                        construct(
                            DecisionFact,
                            {"at": from_ms(d[0]), "code": d[2], "action_digest": d[3]},
                        )
                        for d in r.decisions
                    ),
                    "receipts": tuple(from_ms(t) for t in r.receipts),
                    "digests": (),
                    "heartbeats": (),
                },
            )
        until = self.evaluated_until
        return construct(
            ApprovalBook,
            {
                "execution_id": self.execution_id,
                "requests": requests,
                "digests": tuple(
                    construct(DigestFact, {"at": from_ms(g[0]), "digest": g[2]})
                    for g in self.digests
                ),
                "heartbeats": tuple(from_ms(t) for t in self.heartbeats),
                "last_verdicts": {
                    rid: construct(LastVerdict, {"verdict": v, "since": from_ms(s)})
                    for rid, (v, s) in self.last.items()
                },
                "evaluated_until": None if until is None else from_ms(until),
                "dirty": tuple(sorted(self.dirty)),
                "unscoped_verdicts": tuple(sorted(self.unscoped)),
            },
        )

    @classmethod
    def loads(cls, text: str) -> Ledger:
        """The ledger of a stored entry's JSON (``ApprovalBook``'s, as every version wrote
        it), read straight into records; a book the stream cannot have written (a fact of
        unknown time, say) is read through ``ApprovalBook`` and refused there or here."""
        try:
            return _decode(json.loads(text))
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls.of_book(ApprovalBook.model_validate_json(text))

    def dumps(self) -> str:
        """The stored entry's JSON: exactly what ``to_book().model_dump_json()`` gives,
        written straight from the records."""
        return _encode(self)


def _set(r: Req, name: str, fact: Any) -> bool:
    items = _added(getattr(r, name), fact)
    if items is None:
        return False
    setattr(r, name, items)
    return True


def _by_time_and_request(e: tuple[Any, ...]) -> tuple[int, str]:
    return (e[0], e[1])


def _seconds_ms(value: timedelta | None) -> int | None:
    return None if value is None else value // ONE_MS


def _request_of(part: RequestPart) -> Request:
    o = part.overrides
    if part.requested_at is None:
        raise ValueError("a stream book's request has a time")
    return Request(
        part.action,
        part.action_digest,
        to_ms(part.requested_at),
        None if part.expires_at is None else to_ms(part.expires_at),
        part.approver_ref,
        part.resume_handle,
        part.risk,
        part.policy,
        (
            _seconds_ms(o.grace),
            _seconds_ms(o.heartbeat_fresh),
            _seconds_ms(o.delivery_deadline),
        ),
    )


def _request_part(req: Request) -> RequestPart:
    def td(ms: int | None) -> timedelta | None:
        return None if ms is None else timedelta(milliseconds=ms)

    grace, fresh, deadline = req.overrides
    return construct(
        RequestPart,
        {
            "action": req.action,
            "action_digest": req.action_digest,
            "requested_at": from_ms(req.requested_at),
            "expires_at": None if req.expires_at is None else from_ms(req.expires_at),
            "approver_ref": req.approver_ref,
            "resume_handle": req.resume_handle,
            "risk": req.risk,
            "policy": req.policy,
            "overrides": construct(
                ThresholdOverrides,
                {
                    "grace": td(grace),
                    "heartbeat_fresh": td(fresh),
                    "delivery_deadline": td(deadline),
                },
            ),
        },
    )


# -- the four proofs, over integers ------------------------------------------------------------
_CA, _VR, _LR, _CD = 0, 1, 2, 3
_PROOFS = (Proof.CURRENT_ACTION, Proof.VERIFIED_ROUTE, Proof.LIVE_RESUME, Proof.CONSUMED_DECISION)
#: Tie-break between decisions at the same instant: the more cautious answer counts.
_CAUTION = {
    DecisionCode.DECLINE: 0,
    DecisionCode.CANCEL: 1,
    DecisionCode.ACCEPT: 2,
    DecisionCode.UNRECOGNIZED: 3,
}

#: A finding: (proof index, failed, reason code).
Finding = tuple[int, bool, str]


def _digest_changed(digests: tuple[Digest, ...], req: Request, at: int) -> bool | None:
    """``evaluation._digest_changed`` with every time known: the latest digest change in
    (requested_at, at], a tie counting as a change if any tied digest differs."""
    mine = req.action_digest
    if mine is None:
        return None
    since = req.requested_at
    latest: int | None = None
    changed = False
    for i in range(len(digests) - 1, -1, -1):
        g = digests[i]
        t = g[0]
        if t > at:
            continue
        if t <= since or (latest is not None and t != latest):
            break
        latest = t
        if g[2] != mine:
            changed = True
    return changed


def _judge(
    ledger: Ledger, r: Req, req: Request, at: int
) -> tuple[ApprovalVerdictCode, list[Finding]]:
    """The verdict at ``at`` and the findings that are not holding (``evaluation.evaluate``'s
    precedence), counting only facts up to ``at``."""
    grace, fresh, deadline = r.thresholds  # type: ignore[misc]
    findings: list[Finding] = []
    add = findings.append
    receipts = r.receipts
    receipt = bool(receipts) and receipts[0] <= at
    decisions = r.decisions
    first: Decision | None = None
    unrecognized = False
    for d in decisions:
        if d[0] > at:
            break
        if d[2] is DecisionCode.UNRECOGNIZED:
            unrecognized = True
        elif first is None or (d[0] == first[0] and _CAUTION[d[2]] < _CAUTION[first[2]]):
            first = d
    if first is not None:
        # Proof 1 as it stood when the decision was made
        when = first[0]
        stale = False
        if req.expires_at is not None and when >= req.expires_at:
            add((_CA, True, DECIDED_AFTER_EXPIRY))
            stale = True
        changed = _digest_changed(ledger.digests, req, when)
        if changed is None:
            add((_CA, False, ACTION_DIGEST_UNKNOWN))
        elif changed:
            add((_CA, True, DECIDED_AFTER_DIGEST_CHANGE))
            stale = True
        if first[3] is not None and req.action_digest is not None and first[3] != req.action_digest:
            add((_CA, True, DECISION_FOR_OTHER_DIGEST))
            stale = True
        code = first[2]
        if code is DecisionCode.ACCEPT:
            if not receipt:
                _live_resume(ledger, req, at, fresh, add)
            if stale:
                verdict = V.STALE_REQUEST
            elif receipt:
                verdict = V.RESUMED
            elif at < when + grace:
                add((_CD, False, RESUME_RECEIPT_PENDING))
                verdict = V.RESUMING
            else:
                add((_CD, True, NO_RESUME_RECEIPT))
                verdict = V.STUCK_AFTER_DECISION
        else:
            if not receipt:
                if at < when + grace:
                    add((_CD, False, RESUME_RECEIPT_PENDING))
                else:
                    add((_CD, True, NO_RESUME_RECEIPT))
            verdict = V.CLOSED_BY_DECLINE if code is DecisionCode.DECLINE else V.CLOSED_BY_CANCEL
        for d in decisions:
            if d[0] > at:
                break
            if d[2] is not code:
                add((_CD, False, CONTRADICTING_DECISION))
                break
        return verdict, findings

    # no decision: proofs 1, 2 and 3 as of ``at``
    failed_current = failed_route = False
    if req.expires_at is not None and at >= req.expires_at:
        add((_CA, True, REQUEST_EXPIRED))
        failed_current = True
    changed = _digest_changed(ledger.digests, req, at)
    if changed is None:
        add((_CA, False, ACTION_DIGEST_UNKNOWN))
    elif changed:
        add((_CA, True, ACTION_DIGEST_CHANGED))
        failed_current = True
    if not req.approver_ref:
        add((_VR, True, NO_APPROVER))
        failed_route = True
    overdue = at >= req.requested_at + deadline
    acks = r.acks
    acked = bool(acks) and acks[0] <= at
    if not acked:
        delivered = failed_delivery = False
        for d in r.deliveries:
            if d[0] > at:
                break
            if d[2] is DeliveryOutcome.DELIVERED:
                delivered = True
            elif d[2] is DeliveryOutcome.FAILED:
                failed_delivery = True
        if not delivered:
            if failed_delivery:
                add((_VR, True, DELIVERY_FAILED))
                failed_route = True
            elif overdue:
                add((_VR, True, DELIVERY_UNCONFIRMED))
                failed_route = True
            else:
                add((_VR, False, DELIVERY_PENDING))
        if req.risk is not Risk.LOW:
            if overdue:
                add((_VR, True, ACK_MISSING))
                failed_route = True
            else:
                add((_VR, False, ACK_PENDING))
    failed_live = _live_resume(ledger, req, at, fresh, add)
    if unrecognized:
        add((_CD, False, DECISION_UNRECOGNIZED))
    if failed_current:
        return V.STALE_REQUEST, findings
    if failed_live:
        return V.ORPHANED_WAIT, findings
    if failed_route:
        return V.UNROUTABLE_WAIT, findings
    return (V.UNCERTAIN if findings else V.WAITING), findings


def _live_resume(
    ledger: Ledger, req: Request, at: int, fresh: int, add: Callable[[Finding], None]
) -> bool:
    """Proof 3 (``evaluation._live_resume``); True when it failed."""
    failed = False
    if not req.resume_handle:
        add((_LR, True, NO_RESUME_HANDLE))
        failed = True
    hb = ledger.heartbeats
    k = bisect_right(hb, at)
    if k and at < hb[k - 1] + fresh:
        return failed
    if at < req.requested_at + fresh:
        add((_LR, False, HEARTBEAT_NOT_YET_SEEN))
        return failed
    add((_LR, True, HEARTBEAT_STALE if k else HEARTBEAT_NEVER_SEEN))
    return True


def _finding(proof: int, failed: bool, reason: str) -> ProofFinding:
    return construct(
        ProofFinding,
        {
            "proof": _PROOFS[proof],
            "state": ProofState.FAILED if failed else ProofState.UNKNOWN,
            "reason": reason,
        },
    )


def _one_per_proof(findings: list[Finding]) -> tuple[ProofFinding, ...]:
    """``evaluation._one_per_proof``: one finding per proof, in proof order, FAILED if any of
    its checks failed, its reasons the failed ones first, each once."""
    out = []
    for proof in range(4):
        failed: list[str] = []
        unknown: list[str] = []
        for p, f, reason in findings:
            if p == proof:
                reasons = failed if f else unknown
                if reason not in reasons:
                    reasons.append(reason)
        if failed or unknown:
            out.append(_finding(proof, bool(failed), REASON_SEPARATOR.join(failed + unknown)))
    return tuple(out)


def _record(
    r: Req,
    req: Request,
    at: int,
    verdict: ApprovalVerdictCode,
    findings: list[Finding],
    previous: tuple[ApprovalVerdictCode, int] | None,
) -> ApprovalVerdict:
    """The published record, built once (``evaluation.to_verdict`` of the evaluation)."""
    grace, fresh, deadline = r.thresholds  # type: ignore[misc]
    when = from_ms(at)
    owner, next_step = VERDICT_GUIDANCE[verdict]
    return construct(
        ApprovalVerdict,
        {
            "verdict_id": verdict_id(r.execution_id, r.request_id, verdict, id_ms(at)),
            "request_id": r.request_id,
            "execution_id": r.execution_id or "",
            "verdict": verdict,
            "previous_verdict": None if previous is None else previous[0],
            "failed_proofs": _one_per_proof(findings),
            "owner": owner,
            "next_step": next_step,
            "thresholds": construct(
                Thresholds,
                {
                    "grace_ms": grace,
                    "heartbeat_fresh_ms": fresh,
                    "delivery_deadline_ms": deadline,
                    "evaluated_at": when,
                },
            ),
            "evaluated_at": when,
            "action": req.action,
            "requested_at": from_ms(req.requested_at),
            "traceparent": None,
        },
    )


# -- the stored JSON, read and written directly ------------------------------------------------
_NAIVE_EPOCH = datetime(1970, 1, 1)


def _iso(ms: int) -> str:
    """A time as pydantic writes a UTC ``datetime`` in JSON (``...T16:00:00Z``, or with
    ``.123000`` when it has milliseconds)."""
    return '"' + (_NAIVE_EPOCH + timedelta(milliseconds=ms)).isoformat() + 'Z"'


def _str(value: str | None) -> str:
    return "null" if value is None else _json(value)


_NO_OVERRIDES = '{"grace":null,"heartbeat_fresh":null,"delivery_deadline":null}'


def _encode_request(req: Request) -> str:
    if req.overrides == (None, None, None):
        overrides = _NO_OVERRIDES
    else:
        overrides = _request_part(req).overrides.model_dump_json()
    return (
        f'{{"action":{_str(req.action)},"action_digest":{_str(req.action_digest)},'
        f'"requested_at":{_iso(req.requested_at)},'
        f'"expires_at":{"null" if req.expires_at is None else _iso(req.expires_at)},'
        f'"approver_ref":{_str(req.approver_ref)},"resume_handle":{_str(req.resume_handle)},'
        f'"risk":{"null" if req.risk is None else _json(req.risk.value)},'
        f'"policy":{_str(req.policy)},"overrides":{overrides}}}'
    )


def _times(times: Iterable[int]) -> str:
    return "[" + ",".join(_iso(t) for t in times) + "]"


def _encode_facts(r: Req) -> str:
    """A request's entry in the stored JSON's ``requests``."""
    request = "null" if r.request is None else _encode_request(r.request)
    deliveries = ",".join(f'{{"at":{_iso(d[0])},"outcome":{d[1]}' for d in r.deliveries)
    decisions = ",".join(f'{{"at":{_iso(d[0])},"code":{d[1]}' for d in r.decisions)
    rid = _json(r.request_id)
    return (
        f'{rid}:{{"request_id":{rid},"execution_id":{_str(r.execution_id)},'
        f'"request":{request},"deliveries":[{deliveries}],'
        f'"acknowledgements":{_times(r.acks)},"decisions":[{decisions}],'
        f'"receipts":{_times(r.receipts)},"digests":[],"heartbeats":[]}}'
    )


def _encode(ledger: Ledger) -> str:
    requests = []
    for r in ledger.requests.values():
        if r.text is None:
            r.text = _encode_facts(r)
        requests.append(r.text)
    digests = ",".join(f'{{"at":{_iso(g[0])},"digest":{g[1]}' for g in ledger.digests)
    last = ",".join(
        f'{_json(rid)}:{{"verdict":"{v.value}","since":{_iso(since)}}}'
        for rid, (v, since) in ledger.last.items()
    )
    until = ledger.evaluated_until
    return (
        f'{{"execution_id":{_str(ledger.execution_id)},"requests":{{{",".join(requests)}}},'
        f'"digests":[{digests}],"heartbeats":{_times(ledger.heartbeats)},'
        f'"last_verdicts":{{{last}}},'
        f'"evaluated_until":{"null" if until is None else _iso(until)},'
        f'"dirty":[{",".join(_json(rid) for rid in sorted(ledger.dirty))}],'
        f'"unscoped_verdicts":[{",".join(_json(rid) for rid in sorted(ledger.unscoped))}]}}'
    )


def _ms_of(text: str) -> int:
    return to_ms(datetime.fromisoformat(text))


def _overrides_ms(value: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    if value == {"grace": None, "heartbeat_fresh": None, "delivery_deadline": None}:
        return (None, None, None)
    o = ThresholdOverrides.model_validate(value)
    return (_seconds_ms(o.grace), _seconds_ms(o.heartbeat_fresh), _seconds_ms(o.delivery_deadline))


def _decode(data: dict[str, Any]) -> Ledger:
    """``Ledger.of_book(ApprovalBook.model_validate_json(text))`` for a book the stream
    wrote: every time known, every collection canonical (sorted again here all the same)."""
    ledger = Ledger(data["execution_id"])
    for rid, f in data["requests"].items():
        if f["request_id"] != rid or f["digests"] or f["heartbeats"]:
            raise ValueError("not a stream book")
        r = Req(rid, f["execution_id"])
        q = f["request"]
        if q is not None:
            risk = q["risk"]
            r.request = Request(
                q["action"],
                q["action_digest"],
                _ms_of(q["requested_at"]),
                None if q["expires_at"] is None else _ms_of(q["expires_at"]),
                q["approver_ref"],
                q["resume_handle"],
                None if risk is None else Risk(risk),
                q["policy"],
                _overrides_ms(q["overrides"]),
            )
        r.deliveries = tuple(
            sorted(
                {_delivery(_ms_of(d["at"]), DeliveryOutcome(d["outcome"])) for d in f["deliveries"]}
            )
        )
        r.acks = tuple(sorted({_ms_of(t) for t in f["acknowledgements"]}))
        r.decisions = tuple(
            sorted(
                {
                    _decision(_ms_of(d["at"]), DecisionCode(d["code"]), d["action_digest"])
                    for d in f["decisions"]
                }
            )
        )
        r.receipts = tuple(sorted({_ms_of(t) for t in f["receipts"]}))
        ledger.requests[rid] = r
    ledger.digests = tuple(sorted({_digest(_ms_of(g["at"]), g["digest"]) for g in data["digests"]}))
    ledger.heartbeats = tuple(sorted({_ms_of(t) for t in data["heartbeats"]}))
    ledger.last = {
        rid: (ApprovalVerdictCode(lv["verdict"]), _ms_of(lv["since"]))
        for rid, lv in data["last_verdicts"].items()
    }
    until = data["evaluated_until"]
    ledger.evaluated_until = None if until is None else _ms_of(until)
    ledger.dirty = set(data["dirty"])
    unscoped = data.get("unscoped_verdicts")  # absent: stored before ids were scoped
    ledger.unscoped = set(ledger.last if unscoped is None else unscoped)
    return ledger
