"""The claims join keeps its books and watermarks decoded from one batch to the next
(``vigil_worker.claims.ClaimsStage._keep``), within ``VIGIL_STATE_CACHE_MB``, and forgets
them on a rebalance or a failed batch.

Two levels: a real stage (its Faust table, its producers on the test cluster) whose kept state
is read before the table, bounded and dropped; and a worker through the real broker whose
claims of one key come batches apart, then a second worker joining (a rebalance) before a
later transition, with the same alert and final states as a replay of the same inputs (the
join in-process, which keeps no table at all).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import faust
import pytest

from streams.contracts.models.enums import EvidenceSource, OperationStatus
from streams.contracts.models.enums import OperationEventKind as K
from streams.contracts.models.outputs import OperationState
from streams.core import claims as cl
from tests.support import deployment, worker
from tests.test_cross_execution_kafka import (
    PARTITIONS,
    T0,
    _forbidden,
    _last_states,
    _of,
    _on,
    _outcome,
    op,
    replay,
)
from vigil_worker.claims import ClaimsStage
from vigil_worker.claims import _book_weight as _weight

pytestmark = pytest.mark.kafka


def _book(n: int) -> tuple[str, cl.KeyBook, int]:
    """A key's book with one attempt sent, its key and the length of its stored text."""
    claim = cl.Claim("payments", f"order-{n}", f"exec-{n}", "charge-1", 1, OperationStatus.SENT, n)
    book, _ = cl.add_claim(None, claim, None)
    return cl.claims_key(claim.connector, claim.key), book, len(cl.dump_book(book))


@pytest.fixture
def stage(cluster: Any, tmp_path: Path) -> tuple[ClaimsStage, list[int]]:
    """A stage of a deployment of its own; ``generation[0]`` is the worker's generation."""
    dep = deployment(cluster, tmp_path, partitions=PARTITIONS)
    generation = [1]
    app = faust.App(
        f"{dep.settings.app_id}-stage",
        broker=f"kafka://{dep.settings.bootstrap_servers}",
        store="memory://",
        datadir=str(tmp_path / "stage"),
    )
    return ClaimsStage(
        app, dep.settings, dep.codec, timedelta(0), lambda: generation[0]
    ), generation


def test_what_a_batch_left_is_read_before_the_table_until_a_rebalance(
    stage: tuple[ClaimsStage, list[int]],
) -> None:
    st, generation = stage
    assert st.kept_bytes == 8 * 1024 * 1024  # VIGIL_STATE_CACHE_MB's default
    assert asyncio.run(st.handle_batch(1, []))  # an empty batch: the generation noted
    key, book, length = _book(1)
    marks = cl.Watermarks(PARTITIONS).waiting(key, book)
    st._keep(1, {0: marks}, {key: book}, {key: length})
    assert st.table.get(key) is None  # the table has never seen it: the book comes from _keep
    assert st._book(key) is book and st._marks_of(0) is marks
    # the send time of the pending key is known: a progress before it visits no book
    assert dict(st._marks_of(0).pending) == {key: 1}
    assert st.kept_weight == _weight(length)

    # a batch of another generation (a rebalance in between) reads the table again
    generation[0] = 2
    assert asyncio.run(st.handle_batch(2, []))
    assert st._book(key) is None and st.kept_weight == 0
    assert st._marks_of(0) == cl.Watermarks(PARTITIONS)


def test_the_books_kept_stay_within_the_budget_the_latest_written_last_dropped(
    stage: tuple[ClaimsStage, list[int]],
) -> None:
    st, _ = stage
    assert asyncio.run(st.handle_batch(1, []))
    books = [_book(n) for n in range(10, 15)]
    one = _weight(books[0][2])
    assert all(_weight(length) == one for _, _, length in books)
    st.kept_bytes = 3 * one
    for key, book, length in books:
        st._keep(1, {}, {key: book}, {key: length})
    assert list(st._kept_books) == [key for key, _, _ in books[2:]]
    assert st.kept_weight == 3 * one
    # written again, a book moves to the end: the oldest then is the next one dropped
    key, book, length = books[2]
    st._keep(1, {}, {key: book}, {key: length})
    st._keep(1, {}, {books[0][0]: books[0][1]}, {books[0][0]: books[0][2]})
    assert list(st._kept_books) == [books[4][0], books[2][0], books[0][0]]
    # a book the batch only looked up and did not find, or one larger than the budget, is not kept
    st.kept_bytes = one - 1
    st._keep(1, {}, {books[1][0]: books[1][1], "payments/none": None}, {books[1][0]: books[1][2]})
    assert books[1][0] not in st._kept_books and "payments/none" not in st._kept_books
    # none kept at all with a budget of 0 (VIGIL_STATE_CACHE_MB=0)
    st._drop_kept()
    st.kept_bytes = 0
    st._keep(1, {}, {key: book}, {key: length})
    assert st._kept_books == {} and st.kept_weight == 0


def test_a_batch_of_an_older_generation_keeps_nothing(
    stage: tuple[ClaimsStage, list[int]],
) -> None:
    """A batch fetched before a rebalance and handled after it: what it read may be another
    worker's by now."""
    st, generation = stage
    assert asyncio.run(st.handle_batch(1, []))
    generation[0] = 2
    key, book, length = _book(3)
    st._keep(1, {}, {key: book}, {key: length})
    assert st._kept_books == {}


def _states_of(records: list[Any], *executions: str) -> list[OperationState]:
    return [r for r in _of(records, *executions) if isinstance(r, OperationState)]


def test_a_blind_retry_whose_claims_come_batches_apart_and_a_rebalance_before_it_settles(
    cluster: Any, tmp_path: Path
) -> None:
    """A sends (batch 1), its reply deadline passes (its UNKNOWN claim: a later batch), B
    sends with the same key (a later batch): the join decides B's send from the book and the
    watermarks it kept. Then a second worker joins, and A is verified by the reconciler: the
    transition is forwarded from the book as the table holds it, not as the first worker had
    kept it. The same alert and final states as a replay of the inputs."""
    dep = deployment(cluster, tmp_path, partitions=PARTITIONS)
    a, b = _on(0, "exec-kept-a"), _on(1, "exec-kept-b")
    key = "order-kept"
    topics = [dep.topics.alerts.name, dep.topics.operation_state.name]

    def has(check: Any) -> Any:
        return lambda rs: check([r.record for r in rs])

    with worker(dep):
        dep.produce([op(a, 1, K.SENT, timedelta(0), key, reply_due_at=T0 + timedelta(seconds=30))])
        dep.tick(T0 + timedelta(seconds=10))
        dep.read_until(topics, has(lambda rs: _states_of(rs, a)))
        time.sleep(2.0)  # the join's batch of A's first claim
        dep.tick(T0 + timedelta(minutes=1))
        dep.read_until(
            topics,
            has(lambda rs: any(s.status is OperationStatus.UNKNOWN for s in _states_of(rs, a))),
        )
        time.sleep(2.0)
        dep.produce(
            [op(b, 1, K.SENT, timedelta(minutes=4), key, reply_due_at=T0 + timedelta(minutes=9))]
        )
        dep.tick(T0 + timedelta(minutes=5))
        dep.read_until(topics, has(lambda rs: _forbidden(_of(rs, a, b))))
        with worker(dep):
            dep.produce(
                [
                    op(
                        a,
                        2,
                        K.VERIFIED,
                        timedelta(minutes=6),
                        key,
                        evidence_source=EvidenceSource.RECONCILER,
                    )
                ]
            )
            dep.tick(T0 + timedelta(minutes=7))

            def forwarded(rs: list[Any]) -> bool:
                last = _last_states(_of(rs, a, b))
                return (
                    last.get(a) is not None
                    and last[a].status is OperationStatus.VERIFIED
                    and last.get(b) is not None
                    and last[b].held_by_status is OperationStatus.VERIFIED
                )

            dep.read_until(topics, has(forwarded), timeout=120)
            dep.tick(T0 + timedelta(minutes=8))
            live = {"records": [r.record for r in dep.read(topics, idle=3.0)]}

    summary = replay(dep)
    assert summary.joined and summary.dead_letters == 0
    replayed = {"records": [r.record for r in dep.read([t + "-replay" for t in topics], idle=2.0)]}
    (alert,) = {x.alert_id: x for x in _forbidden(_of(live["records"], a, b))}.values()
    assert alert.execution_id == b and f"previous_execution={a}" in alert.evidence
    assert _outcome(live) == _outcome(replayed)
