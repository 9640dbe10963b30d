"""The join of attempts across executions by (connector, idempotency key): which sends are
blind retries of another execution's attempt (docs/rules.md#blind-retries-across-executions),
and that the answer does not depend on the order in which the claims partitions deliver the
claims, within the grace (hypothesis)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import OperationStatus as S
from streams.core import claims as cl
from streams.kafka.partitioning import partition_of

T0 = 1_785_000_000_000
KEY = ("pay-gw", "order-42")


def claim(execution: str, status: S, at: int, op: str = "charge-1", attempt: int = 1) -> cl.Claim:
    return cl.Claim(*KEY, execution, op, attempt, status, at)


def feed(claims: list[cl.Claim], end: int | None = None) -> tuple[cl.KeyBook, list[cl.Finding]]:
    """All claims into one book, then the watermark past ``end`` (default: past them all)."""
    book: cl.KeyBook | None = None
    found: list[cl.Finding] = []
    for c in claims:
        book, f = cl.add_claim(book, c, None)
        found += f
    assert book is not None
    book, links = cl.decide(book, (end if end is not None else max(c.at for c in claims)) + 1)
    return book, found + links


def conflicts(found: list[cl.Finding]) -> list[cl.Link]:
    return [f for f in found if isinstance(f, cl.Link) and f.kind == cl.CONFLICT]


def test_a_send_behind_another_executions_unknown_attempt_is_a_blind_retry() -> None:
    book, found = feed(
        [
            claim("exec-a", S.SENT, T0),
            claim("exec-a", S.UNKNOWN, T0 + 30_000),
            claim("exec-b", S.SENT, T0 + 60_000),
        ]
    )
    retry, held = conflicts(found)
    assert retry.role == cl.RETRY and retry.receiver == ("exec-b", "charge-1", 1)
    assert retry.other == ("exec-a", "charge-1", 1) and retry.other_status is S.UNKNOWN
    assert held.role == cl.HELD and held.receiver == ("exec-a", "charge-1", 1)
    assert held.other == ("exec-b", "charge-1", 1) and held.other_status is S.SENT
    assert retry.at == held.at == T0 + 60_000
    assert retry.conflict_id == held.conflict_id and retry.link_id != held.link_id
    assert len(book.pairs) == 1


def test_a_send_while_the_other_is_still_sent_is_a_blind_retry_too() -> None:
    _, found = feed([claim("exec-a", S.SENT, T0), claim("exec-b", S.SENT, T0 + 5_000)])
    assert [link.other_status for link in conflicts(found)] == [S.SENT, S.SENT]


def test_after_a_failed_attempt_a_new_send_is_legitimate() -> None:
    _, found = feed(
        [
            claim("exec-a", S.SENT, T0),
            claim("exec-a", S.FAILED, T0 + 10_000),
            claim("exec-b", S.SENT, T0 + 60_000),
        ]
    )
    assert found == []


def test_a_settlement_at_the_very_instant_of_the_send_does_not_excuse_it() -> None:
    _, found = feed(
        [
            claim("exec-a", S.SENT, T0),
            claim("exec-a", S.FAILED, T0 + 60_000),
            claim("exec-b", S.SENT, T0 + 60_000),
        ]
    )
    assert next(link.other_status for link in conflicts(found)) is S.SENT
    # ...and the FAILED that came at that instant is forwarded to B at once
    updates = [f for f in found if isinstance(f, cl.Link) and f.kind == cl.UPDATE]
    assert [(u.receiver[0], u.other_status) for u in updates] == [("exec-b", S.FAILED)]


def test_a_send_after_a_verified_effect_duplicates_it() -> None:
    _, found = feed(
        [
            claim("exec-a", S.SENT, T0),
            claim("exec-a", S.VERIFIED, T0 + 1_000),
            claim("exec-b", S.SENT, T0 + 60_000),
        ]
    )
    assert conflicts(found)[0].other_status is S.VERIFIED


def test_attempts_of_one_execution_are_left_to_its_operation_book() -> None:
    _, found = feed([claim("exec-a", S.SENT, T0), claim("exec-a", S.SENT, T0 + 1, op="charge-2")])
    assert found == []


def test_only_a_prepared_attempt_holds_nothing_back() -> None:
    _, found = feed([claim("exec-a", S.PREPARED, T0), claim("exec-b", S.SENT, T0 + 1)])
    assert found == []


def test_later_transitions_are_forwarded_to_the_other_execution() -> None:
    _, found = feed(
        [
            claim("exec-a", S.SENT, T0),
            claim("exec-a", S.UNKNOWN, T0 + 30_000),
            claim("exec-b", S.SENT, T0 + 60_000),
            claim("exec-a", S.FAILED, T0 + 90_000),
            claim("exec-b", S.ACKNOWLEDGED, T0 + 95_000),
        ]
    )
    updates = [(f.receiver[0], f.other_status, f.at) for f in found if f.kind == cl.UPDATE]
    assert updates == [
        ("exec-b", S.FAILED, T0 + 90_000),
        ("exec-a", S.ACKNOWLEDGED, T0 + 95_000),
    ]


def test_a_send_waits_for_the_watermark_and_a_repeated_claim_changes_nothing() -> None:
    marks = cl.Watermarks(2)
    books: dict[str, cl.KeyBook] = {}
    key = cl.claims_key(*KEY)
    found: list[cl.Finding] = []
    for c in [claim("exec-a", S.SENT, T0), claim("exec-a", S.UNKNOWN, T0 + 30_000)]:
        marks, books[key], f = cl.receive_claim(marks, books.get(key), c)
        found += f
    marks, books[key], f = cl.receive_claim(marks, books[key], claim("exec-b", S.SENT, T0 + 60_000))
    assert found + f == [] and key in marks.pending
    again = cl.receive_claim(marks, books[key], claim("exec-b", S.SENT, T0 + 60_000))
    assert again[1] == books[key] and again[2] == []
    marks, changed, links = cl.receive_progress(marks, 0, T0 + 70_000, books.__getitem__)
    assert links == [] and marks.watermark is None  # partition 1 has said nothing yet
    marks, changed, links = cl.receive_progress(marks, 1, T0 + 60_000, books.__getitem__)
    assert links == []  # the send at T0+60s is not strictly before the watermark
    marks, changed, links = cl.receive_progress(marks, 1, T0 + 60_001, books.__getitem__)
    assert len(links) == 2 and key in changed and key not in marks.pending
    assert cl.receive_progress(marks, 1, T0 + 60_000, books.__getitem__)[2] == []


def test_a_claim_behind_the_watermark_and_grace_is_late_and_decided_at_once() -> None:
    book, _ = cl.add_claim(None, claim("exec-a", S.SENT, T0), None)
    book, _ = cl.add_claim(book, claim("exec-a", S.UNKNOWN, T0 + 30_000), None)
    book, found = cl.add_claim(book, claim("exec-b", S.SENT, T0 + 60_000), T0 + 70_000, 5_000)
    assert isinstance(found[0], cl.Late) and len(conflicts(found)) == 2
    _, found2 = cl.add_claim(None, claim("exec-a", S.SENT, T0), T0 + 4_000, 5_000)
    assert found2 == []  # within the grace: not late


def test_books_and_watermarks_survive_storage() -> None:
    book, _ = feed(
        [
            claim("exec-a", S.SENT, T0),
            claim("exec-a", S.UNKNOWN, T0 + 30_000),
            claim("exec-b", S.SENT, T0 + 60_000),
        ]
    )
    assert cl.load_book(cl.dump_book(book)) == book
    marks = cl.Watermarks(3, {0: T0, 2: T0 + 5}, {"k/v": T0 - 7, "k/w": T0})
    again = cl.load_watermarks(cl.dump_watermarks(marks))
    assert (again.partitions, again.marks) == (marks.partitions, marks.marks)
    assert dict(again.pending) == {"k/v": cl.UNKNOWN_SEND_TIME, "k/w": cl.UNKNOWN_SEND_TIME}
    # the stored form is the one earlier releases read: the keys, without their times
    assert json.loads(cl.dump_watermarks(marks))[2] == ["k/v", "k/w"]


def test_pending_keys_read_from_storage_are_visited_at_the_next_move() -> None:
    """Stored watermarks list the pending keys without their send times: each is read as
    due at once, visited at the watermark's next move, and then holds its book's time again
    (or leaves, its send decided)."""
    early, _ = cl.add_claim(None, claim("exec-a", S.SENT, T0), None)
    late, _ = cl.add_claim(None, claim("exec-b", S.SENT, T0 + 50_000), None)
    books = {"c/early": early, "c/late": late}
    text = json.dumps([2, [[0, T0 - 1], [1, T0 - 1]], ["c/early", "c/late"]])
    marks = cl.load_watermarks(text)
    assert dict(marks.pending) == {k: cl.UNKNOWN_SEND_TIME for k in books}
    visited: list[str] = []

    def load(key: str) -> cl.KeyBook:
        visited.append(key)
        return books[key]

    marks, _, _ = cl.receive_progress(marks, 0, T0 + 10_000, load)
    marks, _, _ = cl.receive_progress(marks, 1, T0 + 10_000, load)
    assert visited == ["c/early", "c/late"]
    assert dict(marks.pending) == {"c/late": T0 + 50_000}


def test_the_earliest_pending_send_follows_the_keys_settled() -> None:
    """``earliest`` is the earliest time of ``pending`` whatever ``settled`` adds, moves or
    takes out: the key that held it decided, a key sending earlier, a new key."""
    a, _ = cl.add_claim(None, claim("exec-a", S.SENT, T0 + 1_000), None)
    b, _ = cl.add_claim(None, claim("exec-b", S.SENT, T0 + 5_000), None)
    marks = cl.Watermarks(1).settled({"c/a": a, "c/b": b})
    assert (dict(marks.pending), marks.earliest) == (
        {"c/a": T0 + 1_000, "c/b": T0 + 5_000},
        T0 + 1_000,
    )
    a_decided, _ = cl.decide(a, T0 + 2_000)
    marks = marks.settled({"c/a": a_decided})
    assert (dict(marks.pending), marks.earliest) == ({"c/b": T0 + 5_000}, T0 + 5_000)
    c, _ = cl.add_claim(None, claim("exec-c", S.SENT, T0 + 3_000), None)
    marks = marks.settled({"c/c": c})
    assert marks.earliest == T0 + 3_000
    marks = marks.settled({"c/c": cl.decide(c, T0 + 4_000)[0], "c/b": b})
    assert (dict(marks.pending), marks.earliest) == ({"c/b": T0 + 5_000}, T0 + 5_000)
    assert marks.settled({"c/b": cl.decide(b, T0 + 6_000)[0]}).earliest is None


def test_a_watermark_move_visits_only_the_keys_it_passes() -> None:
    """Keys whose earliest send to decide is at or after the new watermark (minus grace) are
    not loaded: a backlog of waiting keys costs nothing at a move that decides none of them."""
    books = {
        f"c/{i}": cl.add_claim(None, claim(f"exec-{i}", S.SENT, T0 + i * 1000), None)[0]
        for i in range(50)
    }
    marks = cl.Watermarks(1).settled(books)
    visited: list[str] = []

    def load(key: str) -> cl.KeyBook:
        visited.append(key)
        return books[key]

    marks, changed, _ = cl.receive_progress(marks, 0, T0 + 3_500, load, grace=1000)
    assert sorted(visited) == ["c/0", "c/1", "c/2"]
    assert set(changed) == {"c/0", "c/1", "c/2"}
    assert set(marks.pending) == {f"c/{i}" for i in range(3, 50)}


# -- order independence ------------------------------------------------------------------
_AFTER_SEND = [S.UNKNOWN, S.ACKNOWLEDGED, S.FAILED, S.VERIFIED, S.RECONCILING, S.CANCELLED]


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[int, list[cl.Claim]]]:
    """2 to 4 executions, each in one of two input partitions, each with one or two attempts
    under the same key: a send and up to three later statuses, at times that may coincide."""
    out: list[tuple[int, list[cl.Claim]]] = []
    for e in range(draw(st.integers(2, 4))):
        execution = f"exec-{e}"
        source = draw(st.integers(0, 1))
        mine: list[cl.Claim] = []
        for a in range(1, draw(st.integers(1, 2)) + 1):
            t = T0 + draw(st.integers(0, 20)) * 1000
            mine.append(claim(execution, S.SENT, t, attempt=a))
            for status in draw(st.lists(st.sampled_from(_AFTER_SEND), max_size=3, unique=True)):
                t += draw(st.integers(0, 10)) * 1000
                mine.append(claim(execution, status, t, attempt=a))
        mine.sort(key=lambda c: c.at)  # a source publishes in event-time order
        out.append((source, mine))
    return out


def _by_source(histories: list[tuple[int, list[cl.Claim]]]) -> dict[int, list[cl.Claim]]:
    sources: dict[int, list[cl.Claim]] = {0: [], 1: []}
    for source, mine in histories:
        sources[source].extend(mine)
    for stream in sources.values():
        stream.sort(key=lambda c: c.at)
    return sources


def _stream(sources: dict[int, list[cl.Claim]]) -> dict[int, list[object]]:
    """Each input partition's records on the claims partition: its claims in time order, each
    time followed by its progress (every claim before it is written)."""
    out: dict[int, list[object]] = {}
    for source, claims_ in sources.items():
        records: list[object] = []
        for i, c in enumerate(claims_):
            records.append(c)
            nxt = claims_[i + 1].at if i + 1 < len(claims_) else c.at + 1
            records.append(("progress", source, nxt))
        records.append(("progress", source, T0 + 10**9))
        out[source] = records
    return out


def _run(records: list[object], grace: int = 0) -> set[cl.Link]:
    marks = cl.Watermarks(2)
    books: dict[str, cl.KeyBook] = {}
    found: set[cl.Link] = set()
    for r in records:
        if isinstance(r, cl.Claim):
            key = cl.claims_key(r.connector, r.key)
            marks, books[key], f = cl.receive_claim(marks, books.get(key), r, grace)
            assert not [x for x in f if isinstance(x, cl.Late)]
            found |= {x for x in f if isinstance(x, cl.Link)}
        else:
            _, source, w = r  # type: ignore[misc]
            marks, changed, links = cl.receive_progress(marks, source, w, books.__getitem__, grace)
            books.update(changed)
            found |= set(links)
    return found


@settings(max_examples=300, deadline=None)
@given(histories(), st.randoms(use_true_random=False))
def test_findings_do_not_depend_on_how_the_partitions_interleave(
    history: list[tuple[int, list[cl.Claim]]], rnd: object
) -> None:
    """Two input partitions write their claims and progress to one claims partition; any
    interleaving of the two gives the same links as having every claim at once."""
    streams = _stream(_by_source(history))
    merged: list[object] = []
    queues = {s: list(r) for s, r in streams.items()}
    while any(queues.values()):
        s = rnd.choice([k for k, q in queues.items() if q])  # type: ignore[attr-defined]
        merged.append(queues[s].pop(0))
    everything = [c for _, mine in history for c in mine]
    _, reference = feed(everything, T0 + 10**9)
    assert _run(merged) == {f for f in reference if isinstance(f, cl.Link)}


def _interleaved(
    history: list[tuple[int, list[cl.Claim]]],
    rnd: object,
    progress: Callable[[list[object], dict[int, list[cl.Claim]]], None],
) -> list[object]:
    """Claims of one execution in order, executions interleaved at random; after each claim
    ``progress`` may add progress records (given the records so far and the claims still to
    come); at the end, every source complete."""
    queues = {i: list(mine) for i, (_, mine) in enumerate(history)}
    records: list[object] = []
    while any(queues.values()):
        i = rnd.choice([k for k, q in queues.items() if q])  # type: ignore[attr-defined]
        records.append(queues[i].pop(0))
        progress(records, queues)
    records += [("progress", 0, T0 + 10**9), ("progress", 1, T0 + 10**9)]
    return records


@settings(max_examples=200, deadline=None)
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 5))
def test_within_the_grace_claims_may_come_in_any_order(
    history: list[tuple[int, list[cl.Claim]]], rnd: object, lag: int
) -> None:
    """Claims of one execution arrive in order, executions in any interleaving, and the
    sources claim to be complete up to ``grace`` further than they are (a claim up to
    ``grace`` behind the watermark is still in time): the links are those of every claim at
    once."""
    grace = lag * 1000

    def progress(records: list[object], queues: dict[int, list[cl.Claim]]) -> None:
        # truly complete below the earliest claim still to come
        lowest = min((q[0].at for q in queues.values() if q), default=T0 + 10**9)
        records += [("progress", 0, lowest + grace), ("progress", 1, lowest + grace)]

    records = _interleaved(history, rnd, progress)
    everything = [c for _, mine in history for c in mine]
    _, reference = feed(everything, T0 + 10**9)
    assert _run(records, grace) == {f for f in reference if isinstance(f, cl.Link)}


def _run_steps(records: list[object], grace: int, settle_late: bool) -> list[object]:
    """Every step's findings and the watermarks at every progress: claim by claim through
    ``receive_claim``, or through ``add_claim`` with the pending keys settled only before
    each progress (``Watermarks.settled``, what the claims stage and the replay's join do)."""
    marks = cl.Watermarks(2)
    books: dict[str, cl.KeyBook] = {}
    unsettled: dict[str, cl.KeyBook] = {}
    steps: list[object] = []
    for r in records:
        if isinstance(r, cl.Claim):
            key = cl.claims_key(r.connector, r.key)
            if settle_late:
                books[key], f = cl.add_claim(books.get(key), r, marks.watermark, grace)
                unsettled[key] = books[key]
            else:
                marks, books[key], f = cl.receive_claim(marks, books.get(key), r, grace)
            steps.append(f)
        else:
            marks = marks.settled(unsettled)
            unsettled = {}
            _, source, w = r  # type: ignore[misc]
            marks, changed, links = cl.receive_progress(marks, source, w, books.__getitem__, grace)
            books.update(changed)
            steps.append((links, marks))
        _assert_ordered(marks)
    return steps


def _assert_ordered(marks: cl.Watermarks) -> None:
    """``order`` is ``pending``'s (time, key) pairs sorted, and ``earliest`` the first time,
    after whatever made the value: the index a move bisects must never drift from the map."""
    assert list(marks.order) == sorted((t, k) for k, t in marks.pending.items())
    assert marks.earliest == min(marks.pending.values(), default=None)


def _random_progress(
    rnd: Any, share: float
) -> Callable[[list[object], dict[int, list[cl.Claim]]], None]:
    """After a claim, with probability ``share``, a progress of either source around its time,
    possibly behind it or ahead of claims still to come (lateness)."""

    def progress(records: list[object], queues: dict[int, list[cl.Claim]]) -> None:
        if rnd.random() < share:
            at = records[-1].at  # type: ignore[attr-defined]
            records.append(
                ("progress", rnd.choice([0, 1]), at + rnd.choice([-2000, 0, 1000, 7000]))
            )

    return progress


def _assert_pending(book: cl.KeyBook) -> None:
    """``pending`` is the earliest ``sent_at`` of the attempts not decided yet."""
    sends = [book.sent_at(ref) for ref in book.attempts if ref not in book.decided]
    assert book.pending() == min((t for t in sends if t is not None), default=None)


def _visit_all(
    marks: cl.Watermarks,
    source: int,
    watermark: int,
    load: Callable[[str], cl.KeyBook],
    grace: int = 0,
) -> tuple[cl.Watermarks, dict[str, cl.KeyBook], list[cl.Link]]:
    """``receive_progress`` as it was: every pending key visited at every move, in order."""
    before = marks.watermark
    marks = marks.note(source, watermark)
    after = marks.watermark
    if after is None or after == before:
        return marks, {}, []
    changed: dict[str, cl.KeyBook] = {}
    found: list[cl.Link] = []
    for key in sorted(marks.pending):
        original = load(key)
        book, links = cl.decide(original, after, grace)
        if book is not original:
            changed[key] = book
        found.extend(links)
        marks = marks.waiting(key, book)
    return marks, changed, found


@settings(max_examples=200, deadline=None)
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 5))
def test_visiting_only_the_keys_a_move_passes_decides_as_visiting_all(
    history: list[tuple[int, list[cl.Claim]]], rnd: object, lag: int
) -> None:
    """``receive_progress`` visits the keys whose earliest send the watermark passes; every
    step's links, changed books, watermarks and pending keys equal those of visiting every
    pending key, whatever the interleaving, the progress and the lateness, and when the
    watermarks are stored and read back (their times unknown) between any two records."""
    grace = lag * 1000

    records = _interleaved(history, rnd, _random_progress(rnd, 0.4))

    def run(receive: Callable[..., Any], stored: bool = False) -> list[object]:
        marks = cl.Watermarks(2)
        books: dict[str, cl.KeyBook] = {}
        steps: list[object] = []
        for r in records:
            if stored and rnd.random() < 0.3:  # type: ignore[attr-defined]
                # read back from the table, as the claims stage does at each batch
                marks = cl.load_watermarks(cl.dump_watermarks(marks))
            if isinstance(r, cl.Claim):
                key = cl.claims_key(r.connector, r.key)
                marks, books[key], f = cl.receive_claim(marks, books.get(key), r, grace)
                steps.append(f)
            else:
                _, source, w = r  # type: ignore[misc]
                marks, changed, links = receive(marks, source, w, books.__getitem__, grace)
                books.update(changed)
                steps.append((links, changed, marks.marks, set(marks.pending)))
            _assert_ordered(marks)
        return steps

    every_key = run(_visit_all)
    assert run(cl.receive_progress) == every_key
    assert run(cl.receive_progress, stored=True) == every_key


@settings(max_examples=200, deadline=None)
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 5))
def test_pending_keys_settled_once_before_a_progress_decide_as_claim_by_claim(
    history: list[tuple[int, list[cl.Claim]]], rnd: object, lag: int
) -> None:
    """Bringing the watermarks' pending keys up to date once before each progress, with the
    books the claims since left, gives the same findings and watermarks as every claim's
    ``receive_claim`` copying them, whatever the interleaving and the lateness."""
    grace = lag * 1000

    def progress(records: list[object], queues: dict[int, list[cl.Claim]]) -> None:
        if rnd.random() < 0.3:  # type: ignore[attr-defined]
            at = records[-1].at  # type: ignore[attr-defined]
            records.append(("progress", rnd.choice([0, 1]), at + rnd.choice([-2000, 0, 1000])))  # type: ignore[attr-defined]

    records = _interleaved(history, rnd, progress)
    assert _run_steps(records, grace, settle_late=True) == _run_steps(records, grace, False)


@settings(max_examples=200, deadline=None)
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 5))
def test_the_replays_join_settles_only_before_a_move_that_can_decide(
    history: list[tuple[int, list[cl.Claim]]], rnd: object, lag: int
) -> None:
    """``LocalJoin`` (the replay's join, streams/local_join.py) brings a claims partition's
    pending keys up to date only before a progress that can pass a send; every progress
    settled first, as the claims stage does, decides the same links in the same order,
    leaves the same books and, settled, the same watermarks."""
    from streams.engine.emission import Emission
    from streams.local_join import LocalJoin

    grace = lag * 1000
    partitions = 2

    records = _interleaved(history, rnd, _random_progress(rnd, 0.5))
    join = LocalJoin(partitions, grace)
    marks = {p: cl.Watermarks(partitions) for p in range(partitions)}
    books: dict[str, cl.KeyBook] = {}
    lazy: list[cl.Link] = []
    eager: list[cl.Link] = []
    for r in records:
        if isinstance(r, cl.Claim):
            key = cl.claims_key(r.connector, r.key)
            p = partition_of(key, partitions)
            lazy += join.take(Emission("claims", key, cl.claim_record(r)))
            marks[p], books[key], found = cl.receive_claim(marks[p], books.get(key), r, grace)
            eager += cl.links_of(found)
            _assert_pending(books[key])
        else:
            _, source, w = r  # type: ignore[misc]
            for p in range(partitions):
                em = Emission("claims", None, cl.progress_record(source, partitions, w), (), p)
                lazy += join.take(em)
                marks[p], changed, links = cl.receive_progress(
                    marks[p], source, w, books.__getitem__, grace
                )
                books.update(changed)
                eager += links
                for book in changed.values():
                    _assert_pending(book)
    assert lazy == eager
    assert join.books == books
    for p in range(partitions):
        settled = join.marks[p].settled(join.unsettled.get(p, {}))
        assert settled == marks[p]
        _assert_ordered(settled)
