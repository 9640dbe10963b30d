"""Blind retries across executions: the join of every attempt that carries one idempotency key.

Inside one execution the operation book sees a second send behind an unsettled attempt
(``operations._blocking``). Across executions it cannot: each execution lives in its own
partition. The classic double payment is exactly that case (a run dies, a new execution sends
the same payment again), so the attempts are joined by their (connector, idempotency key),
the Kafka way (docs/rules.md#blind-retries-across-executions, topology.md):

- each worker publishes a **claim** for every status an attempt with an idempotency key takes
  (``Claim``), keyed by connector and key, so all claims of one key meet in one partition of
  the claims topic, whichever executions made them;
- each worker also publishes, per input partition it owns, how far its outputs are complete
  (``Progress``: every claim stamped before ``watermark`` has been written before it), to
  every claims partition. The claims partition's watermark is the minimum over the input
  partitions (``Watermarks``), as a Flink operator combines its input channels;
- the book of one key (``KeyBook``) keeps every attempt's transitions, and decides a send
  stamped t2 once the watermark is past t2 + grace: then every claim stamped up to t2 is in,
  whatever order the partitions delivered them in. B's send at t2 is a **blind retry** of A's
  attempt (another execution, same connector and key) when A was sent at or before t2 and was
  in flight or VERIFIED just before t2 (no settling transition of A stamped before t2);
- a conflict is told to **both** executions (``Link``, keyed by the receiving execution), and
  after it every later transition of either attempt is forwarded to the other, so each
  execution's aggregate keeps the other's attempt in its verdict until it settles.

A claim that arrives with the watermark already past its time + grace is **late**: it is
recorded (later decisions see it) and a send it carries is decided at once against what is
known; conflicts already decided are not revisited. Only late claims make the findings
depend on arrival order; ``Late`` says which.

Pure: no Kafka, no clock. Times are integer epoch milliseconds. Everything here is a value;
each function returns a new book.
"""

from __future__ import annotations

import json
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from streams.contracts.models.base import constructor
from streams.contracts.models.enums import OperationStatus
from streams.contracts.models.outputs import ClaimsProgress, IdempotencyClaim, RetryLink
from streams.core.executions import from_ms, to_ms
from streams.core.ids import deterministic_id, scoped_key
from streams.core.operations import BLOCKS_RETRY, OperationBook

S = OperationStatus

#: An attempt anywhere: (execution id, operation id, attempt number).
Ref = tuple[str, str, int]

#: The roles of the two attempts of a conflict, as the receiving execution sees them.
RETRY = "RETRY"  # the receiver's attempt is the later send: a blind retry of the other
HELD = "HELD"  # the receiver's attempt is the earlier one; the other duplicates it

#: The link that opens a conflict, and those that forward a later transition of the other.
CONFLICT = "CONFLICT"
UPDATE = "UPDATE"


class Claim(NamedTuple):
    """One status of one attempt that carries an idempotency key, at its event time."""

    connector: str
    key: str
    execution_id: str
    operation_id: str
    attempt: int
    status: OperationStatus
    at: int

    @property
    def ref(self) -> Ref:
        return (self.execution_id, self.operation_id, self.attempt)

    @property
    def claim_id(self) -> str:
        """The same transition gives the same id, live, after a restart and in a replay."""
        return deterministic_id(
            "claim", *claim_key_parts(self.connector, self.key), *self.ref, self.status, self.at
        )


def claim_key_parts(connector: str, key: str) -> tuple[str, str]:
    return (connector, key)


def claims_key(connector: str, key: str) -> str:
    """The Kafka key of a (connector, idempotency key): ``scoped_key(connector, key)``, each
    part percent-encoded and joined by ``/`` (``streams.contracts.keys``), so that it splits
    back into exactly its two parts whatever characters they hold. Murmur2 on it puts every
    claim of the key in one partition."""
    return scoped_key(connector, key)


class Link(NamedTuple):
    """What one execution learns about a conflict: its attempt ``receiver`` and the attempt
    ``other`` of another execution share a connector and key; ``other_status`` is the other's
    status at ``at``. ``role`` says which of the two is the blind retry (``RETRY``: the
    receiver's); ``kind`` whether this opens the conflict or forwards a later transition."""

    link_id: str
    conflict_id: str
    kind: str
    role: str
    receiver: Ref
    other: Ref
    other_status: OperationStatus
    at: int
    connector: str
    key: str


class Late(NamedTuple):
    """A claim that came after the watermark had passed its time + grace (see module doc)."""

    claim: Claim
    watermark: int


Finding = Link | Late


class Pair(NamedTuple):
    """A decided conflict: ``held`` was sent first, ``retry`` at ``at``; ``forwarded``: the
    transitions (side, time, status) already told to the other side."""

    held: Ref
    retry: Ref
    at: int
    forwarded: frozenset[tuple[int, int, str]]


@dataclass(frozen=True, slots=True)
class KeyBook:
    """Every attempt of every execution that claimed one (connector, key).

    ``attempts``: each attempt's transitions in time order (time, status); ``decided``: the
    sends already decided (they are decided once); ``pairs``: the conflicts, by id."""

    connector: str
    key: str
    attempts: dict[Ref, tuple[tuple[int, OperationStatus], ...]] = field(default_factory=dict)
    decided: frozenset[Ref] = frozenset()
    pairs: dict[str, Pair] = field(default_factory=dict)

    def sent_at(self, ref: Ref) -> int | None:
        """The first evidence that the attempt was sent: its first status that holds a new
        send back (SENT, ACKNOWLEDGED, VERIFIED, or one under reconciliation)."""
        for at, status in self.attempts.get(ref, ()):
            if status in BLOCKS_RETRY:
                return at
        return None

    def pending(self) -> int | None:
        """The earliest send not decided yet: the watermark must pass it (plus grace).
        (Asked once per claim taken: no list built.)"""
        first: int | None = None
        decided = self.decided
        for ref in self.attempts:
            if ref not in decided:
                t = self.sent_at(ref)
                if t is not None and (first is None or t < first):
                    first = t
        return first


def _order(book: KeyBook, ref: Ref) -> tuple[int, str, str, int]:
    """Sends in a total order: by time, then by attempt (equal instants need a tie-break that
    every run takes alike)."""
    at = book.sent_at(ref)
    assert at is not None
    return (at, *ref)


def status_before(book: KeyBook, ref: Ref, t: int) -> OperationStatus | None:
    """The attempt's status just before ``t``: its last transition stamped before ``t``, or,
    sent exactly at ``t``, that first status. A transition at ``t`` itself does not count
    (a settlement at the instant of the other send does not excuse it: in doubt, forbidden)."""
    last: OperationStatus | None = None
    for at, status in book.attempts.get(ref, ()):
        if at < t:
            last = status
        elif last is None and at == t:
            return status
        else:
            break
    return last


def holds(book: KeyBook, earlier: Ref, later: Ref) -> bool:
    """Whether ``earlier`` holds the send of ``later`` back: another execution's attempt, sent
    before it (in ``_order``), in flight or VERIFIED just before ``later``'s send."""
    if earlier[0] == later[0]:
        return False  # within one execution the operation book decides
    if book.sent_at(earlier) is None or _order(book, earlier) >= _order(book, later):
        return False
    t = book.sent_at(later)
    assert t is not None
    status = status_before(book, earlier, t)
    return status is not None and status in BLOCKS_RETRY


def _conflict_id(book: KeyBook, held: Ref, retry: Ref) -> str:
    return deterministic_id("xretry", book.connector, book.key, *held, *retry)


def _link(
    book: KeyBook,
    conflict_id: str,
    kind: str,
    role: str,
    receiver: Ref,
    other: Ref,
    status: OperationStatus,
    at: int,
) -> Link:
    link_id = deterministic_id("link", conflict_id, kind, *receiver, status, at)
    return Link(
        link_id, conflict_id, kind, role, receiver, other, status, at, book.connector, book.key
    )


def _decide(book: KeyBook, retry: Ref) -> tuple[KeyBook, list[Link]]:
    """Decide one send: a conflict with every earlier attempt of another execution that held
    it back, each told to both sides, then the transitions known after it forwarded."""
    found: list[Link] = []
    pairs = dict(book.pairs)
    at = book.sent_at(retry)
    assert at is not None
    retry_status = next(s for t, s in book.attempts[retry] if t == at and s in BLOCKS_RETRY)
    for held in sorted(book.attempts):
        if not holds(book, held, retry):
            continue
        cid = _conflict_id(book, held, retry)
        if cid in pairs:
            continue
        held_status = status_before(book, held, at)
        assert held_status is not None
        found.append(_link(book, cid, CONFLICT, RETRY, retry, held, held_status, at))
        found.append(_link(book, cid, CONFLICT, HELD, held, retry, retry_status, at))
        # What the two CONFLICT links told: the held attempt's transitions up to its status
        # before ``at``, and the retry's send. Everything else is forwarded as it comes.
        told = {(0, t, s.value) for t, s in book.attempts[held] if t < at}
        held_first = book.attempts[held][0]
        if held_first[0] == at:
            told.add((0, at, held_first[1].value))
        told |= {(1, t, s.value) for t, s in book.attempts[retry] if t < at}
        told.add((1, at, retry_status.value))
        pairs[cid] = Pair(held, retry, at, frozenset(told))
    book = KeyBook(book.connector, book.key, book.attempts, book.decided | {retry}, pairs)
    book, forwarded = _forward(book)
    return book, found + forwarded


def _forward(book: KeyBook) -> tuple[KeyBook, list[Link]]:
    """Every transition of either attempt of a conflict not told to the other side yet, as an
    UPDATE link, in time order."""
    if not book.pairs:  # no conflict under this key: nothing to forward
        return book, []
    out: list[Link] = []
    pairs = dict(book.pairs)
    changed = False
    for cid, pair in sorted(book.pairs.items()):
        forwarded = set(pair.forwarded)
        sides = ((pair.held, pair.retry, RETRY), (pair.retry, pair.held, HELD))
        for side, (mine, other, role) in enumerate(sides):
            # side 0: transitions of the held attempt, told to the retry's execution (whose
            # role is RETRY); side 1: the retry's, told to the held attempt's execution
            for at, status in book.attempts.get(mine, ()):
                mark = (side, at, status.value)
                if mark in forwarded:
                    continue
                forwarded.add(mark)
                out.append(_link(book, cid, UPDATE, role, other, mine, status, at))
        if len(forwarded) != len(pair.forwarded):
            pairs[cid] = pair._replace(forwarded=frozenset(forwarded))
            changed = True
    if not changed:
        return book, []
    out.sort(key=lambda link: (link.at, link.conflict_id, link.receiver))
    return KeyBook(book.connector, book.key, book.attempts, book.decided, pairs), out


def add_claim(
    book: KeyBook | None, claim: Claim, watermark: int | None, grace: int = 0
) -> tuple[KeyBook, list[Finding]]:
    """Record one claim. A repeated claim (the same transition again: a redelivery, a replay)
    changes nothing. Within the grace it only waits for the watermark; a late one (the
    watermark is past its time + grace) is ``Late``, and a send it carries is decided now."""
    if book is None:
        book = KeyBook(claim.connector, claim.key)
    ref = claim.ref
    transitions = book.attempts.get(ref, ())
    mark = (claim.at, claim.status)
    if mark in transitions:
        return book, []
    new = tuple(sorted((*transitions, mark), key=lambda x: x[0]))
    book = KeyBook(book.connector, book.key, {**book.attempts, ref: new}, book.decided, book.pairs)
    findings: list[Finding] = []
    late = watermark is not None and claim.at + grace < watermark
    if late:
        findings.append(Late(claim, watermark))
        if ref not in book.decided and book.sent_at(ref) is not None:
            book, links = _decide(book, ref)
            findings.extend(links)
    book, forwarded = _forward(book)
    findings.extend(forwarded)
    return book, findings


def decide(book: KeyBook, watermark: int | None, grace: int = 0) -> tuple[KeyBook, list[Link]]:
    """Decide every send stamped before ``watermark`` - grace that is not decided yet, in
    send order (``_order``): every claim stamped up to it is in."""
    if watermark is None:
        return book, []
    ready = sorted(
        (
            ref
            for ref in book.attempts
            if ref not in book.decided
            and (t := book.sent_at(ref)) is not None
            and t + grace < watermark
        ),
        key=lambda r: _order(book, r),
    )
    found: list[Link] = []
    for ref in ready:
        book, links = _decide(book, ref)
        found.extend(links)
    return book, found


@dataclass(frozen=True, slots=True)
class Watermarks:
    """How far each input partition's claims are complete, as one claims partition has read
    them, and the keys of that partition with a send still to decide.

    The claims partition's watermark is the minimum over all ``partitions`` input partitions,
    and none until each has said how far it is.

    ``pending`` maps each key with a send still to decide to that send's time (its book's
    ``KeyBook.pending``), and ``order`` holds the same (time, key) pairs sorted, so the keys a
    move of the watermark passes are a prefix of it, found by bisection: under load thousands
    of keys wait within the grace, and a move (one per progress record) that scanned them all
    in Python made the join's cost grow with its backlog. A new value copies the two (C-speed
    copies of references) and changes only the keys concerned. The times are not stored
    (``dump_watermarks``): watermarks read back have every key due at once
    (``UNKNOWN_SEND_TIME``), and their next move visits each key once and finds its time.
    The stored form stays the one earlier releases read and write."""

    partitions: int
    marks: dict[int, int] = field(default_factory=dict)
    pending: Mapping[str, int] = field(default_factory=dict)
    #: ``pending``'s (time, key) pairs in order; derived from it when not given (None). Never
    #: changed in place once the value is made.
    order: Sequence[tuple[int, str]] = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.order is None:
            object.__setattr__(self, "order", sorted((t, k) for k, t in self.pending.items()))

    @property
    def earliest(self) -> int | None:
        """The earliest time of ``pending`` (None: no key waits)."""
        order = self.order
        return order[0][0] if order else None

    def note(self, source: int, watermark: int) -> Watermarks:
        """An input partition's progress; it never goes back (a redelivered older one is
        ignored)."""
        if self.marks.get(source, -1) >= watermark:
            return self
        return Watermarks(
            self.partitions, {**self.marks, source: watermark}, self.pending, self.order
        )

    @property
    def watermark(self) -> int | None:
        if len(self.marks) < self.partitions:
            return None
        return min(self.marks.values())

    def waiting(self, key: str, book: KeyBook) -> Watermarks:
        """``pending`` with ``key`` in, at its book's earliest send to decide, or out."""
        t = book.pending()
        if self.pending.get(key) == t:
            return self
        pending, order = dict(self.pending), list(self.order)
        _put(pending, order, key, t)
        return Watermarks(self.partitions, self.marks, pending, order)

    def settled(self, books: Mapping[str, KeyBook]) -> Watermarks:
        """``waiting`` for every key of ``books`` (their latest books) at once: a join that
        adds many claims between two progress records brings ``pending`` up to date once,
        with the books the claims left (``add_claim``), rather than copying it at every
        claim."""
        pending: dict[str, int] | None = None
        order: list[tuple[int, str]] = []
        for key, book in books.items():
            t = book.pending()
            if self.pending.get(key) != t:
                if pending is None:
                    pending, order = dict(self.pending), list(self.order)
                _put(pending, order, key, t)
        if pending is None:
            return self
        return Watermarks(self.partitions, self.marks, pending, order)


def _put(pending: dict[str, int], order: list[tuple[int, str]], key: str, t: int | None) -> None:
    """``key`` in ``pending`` (and ``order``) at send time ``t``, or out of them when ``t`` is
    None."""
    old = pending.get(key)
    if old == t:
        return
    if old is not None:
        del order[bisect_left(order, (old, key))]
    if t is None:
        del pending[key]
    else:
        pending[key] = t
        insort(order, (t, key))


def receive_claim(
    marks: Watermarks, book: KeyBook | None, claim: Claim, grace: int = 0
) -> tuple[Watermarks, KeyBook, list[Finding]]:
    """A claim read on a claims partition: recorded in its key's book (``add_claim``)."""
    book, findings = add_claim(book, claim, marks.watermark, grace)
    return marks.waiting(claims_key(claim.connector, claim.key), book), book, findings


def receive_progress(
    marks: Watermarks,
    source: int,
    watermark: int,
    load: Callable[[str], KeyBook],
    grace: int = 0,
) -> tuple[Watermarks, dict[str, KeyBook], list[Link]]:
    """An input partition's progress read on a claims partition: when the partition's
    watermark moves, every key whose earliest send to decide it passes (plus grace) decides
    what it now can, keys in order; a key it does not pass could decide nothing (``decide``).
    Returns the books that changed."""
    before = marks.watermark
    marks = marks.note(source, watermark)
    after = marks.watermark
    if after is None or after == before:
        return marks, {}, []
    if marks.earliest is None or marks.earliest + grace >= after:
        return marks, {}, []
    # the pairs (t, key) with t + grace < after: those before (after - grace, "")
    passed = bisect_left(marks.order, (after - grace, ""))
    due = sorted(key for _, key in marks.order[:passed])
    pending = dict(marks.pending)
    waiting: list[tuple[int, str]] = []
    changed: dict[str, KeyBook] = {}
    found: list[Link] = []
    for key in due:
        original = load(key)
        book, links = decide(original, after, grace)
        if book is not original:
            changed[key] = book
        found.extend(links)
        t = book.pending()
        if t is None:
            del pending[key]
        else:  # still waiting, at its next send to decide
            pending[key] = t
            waiting.append((t, key))
    order = list(marks.order[passed:])
    if waiting:
        # two sorted runs: one merge (the watermarks read back from the table pass every key)
        waiting.sort()
        order += waiting
        order.sort()
    return Watermarks(marks.partitions, marks.marks, pending, order), changed, found


# -- storage ------------------------------------------------------------------------------
_STATUS = {s.value: s for s in OperationStatus}


def dump_book(book: KeyBook) -> str:
    """A book as JSON text (the claims table's value)."""
    return json.dumps(
        [
            book.connector,
            book.key,
            [[list(ref), [[at, s.value] for at, s in ts]] for ref, ts in book.attempts.items()],
            sorted(list(r) for r in book.decided),
            [
                [cid, list(p.held), list(p.retry), p.at, sorted(list(m) for m in p.forwarded)]
                for cid, p in sorted(book.pairs.items())
            ],
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )


def load_book(text: str) -> KeyBook:
    connector, key, attempts, decided, pairs = json.loads(text)

    def ref(x: list[object]) -> Ref:
        return (str(x[0]), str(x[1]), int(x[2]))  # type: ignore[call-overload]

    return KeyBook(
        connector,
        key,
        {ref(r): tuple((int(at), _STATUS[s]) for at, s in ts) for r, ts in attempts},
        frozenset(ref(r) for r in decided),
        {
            cid: Pair(
                ref(h), ref(r), int(at), frozenset((int(a), int(b), str(c)) for a, b, c in fw)
            )
            for cid, h, r, at, fw in pairs
        },
    )


def dump_watermarks(marks: Watermarks) -> str:
    return json.dumps(
        [marks.partitions, sorted(marks.marks.items()), sorted(marks.pending)],
        separators=(",", ":"),
        ensure_ascii=False,
    )


#: the send time of a pending key read from storage, which keeps the keys and not their times:
#: before every watermark, so the key is visited at the next move and its time found again
UNKNOWN_SEND_TIME = -(2**63)


def load_watermarks(text: str) -> Watermarks:
    """Inverse of ``dump_watermarks``, the pending keys' times unknown (``Watermarks``)."""
    partitions, marks, pending = json.loads(text)
    return Watermarks(
        int(partitions),
        {int(p): int(w) for p, w in marks},
        dict.fromkeys(map(str, pending), UNKNOWN_SEND_TIME),
    )


def links_of(findings: Iterable[Finding]) -> list[Link]:
    return [f for f in findings if isinstance(f, Link)]


# -- the records ----------------------------------------------------------------------------
def claims_of(book: OperationBook, operation_ids: Iterable[str]) -> list[Claim]:
    """The claim of every attempt with an idempotency key of these operations: its status
    and since (the worker publishes them after each step that published the operation's
    state; a claim repeated unchanged is ignored by the join)."""
    out: list[Claim] = []
    for op_id in operation_ids:
        op = book.operations.get(op_id)
        if op is None:
            continue
        for number in sorted(op.attempts):
            rec = op.attempts[number]
            if rec.idempotency_key:
                out.append(
                    Claim(
                        rec.connector,
                        rec.idempotency_key,
                        book.execution_id,
                        op_id,
                        number,
                        rec.status,
                        rec.since,
                    )
                )
    return out


#: A claim is made for every transition of every attempt with an idempotency key, from values
#: the core already holds valid: built without validation (``constructor``).
_new_claim = constructor(IdempotencyClaim)
_new_progress = constructor(ClaimsProgress)


def claim_record(claim: Claim) -> IdempotencyClaim:
    return _new_claim(
        {
            "claim_id": claim.claim_id,
            "connector": claim.connector,
            "idempotency_key": claim.key,
            "execution_id": claim.execution_id,
            "operation_id": claim.operation_id,
            "attempt": claim.attempt,
            "status": claim.status,
            "occurred_at": from_ms(claim.at),
        }
    )


def claim_of(record: IdempotencyClaim) -> Claim:
    return Claim(
        record.connector,
        record.idempotency_key,
        record.execution_id,
        record.operation_id,
        record.attempt,
        record.status,
        to_ms(record.occurred_at),
    )


def progress_record(source: int, partitions: int, watermark: int) -> ClaimsProgress:
    return _new_progress(
        {"source_partition": source, "partitions": partitions, "occurred_at": from_ms(watermark)}
    )


def link_record(link: Link) -> RetryLink:
    return RetryLink(
        link_id=link.link_id,
        conflict_id=link.conflict_id,
        kind=link.kind,
        role=link.role,
        execution_id=link.receiver[0],
        operation_id=link.receiver[1],
        attempt=link.receiver[2],
        other_execution_id=link.other[0],
        other_operation_id=link.other[1],
        other_attempt=link.other[2],
        other_status=link.other_status,
        connector=link.connector,
        idempotency_key=link.key,
        occurred_at=from_ms(link.at),
    )
