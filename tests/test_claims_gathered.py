"""The claims of one (connector, key) a batch made leave as one ``IdempotencyClaims`` record
(``vigil_worker.checkpoint.gathered``), with the superseded progress left out as before.

Safe because the join reads a claims partition in order and keeps a book per key: what it
decides depends on the order of each key's claims and on every claim preceding the progress
that covers it. Gathering keeps each key's claims in order and only ever moves a claim
earlier, never past a progress, so the join decides the same links from what is sent as from
the records one by one.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.contracts.models.enums import OperationStatus
from streams.contracts.models.outputs import ClaimsProgress, IdempotencyClaim, IdempotencyClaims
from streams.core import claims as cl
from streams.core.claims import GATHER_MAX, Claim
from streams.engine.emission import Emission
from streams.local_join import LocalJoin
from vigil_worker.checkpoint import gathered, superseded

TOPIC = "vigil.idempotency-claims"
PARTITIONS = 3
S = OperationStatus
#: the statuses an attempt takes, in an order the operation book allows
PATHS = [
    (S.SENT, S.ACKNOWLEDGED, S.VERIFIED),
    (S.SENT, S.UNKNOWN, S.RECONCILING, S.VERIFIED),
    (S.SENT, S.FAILED),
    (S.PREPARED, S.SENT, S.UNKNOWN),
]


def progress(source: int, to: int, watermark: int) -> Emission:
    return Emission(TOPIC, None, cl.progress_record(source, PARTITIONS, watermark), (), to)


def claim_emission(c: Claim) -> Emission:
    return Emission(TOPIC, cl.claims_key(c.connector, c.key), cl.claim_record(c))


@st.composite
def batches(draw: st.DrawFn) -> list[Emission]:
    """A batch as the processor orders it: attempts of a few executions under a few keys
    (so that some send the same key: blind retries), each taking its statuses in order at
    growing times, interleaved; per input partition, watermarks that only grow, each move
    told to every claims partition, never past a claim still to come."""
    attempts = draw(
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, len(PATHS) - 1), st.integers(0, 4_000)),
            min_size=1,
            max_size=8,
        )
    )
    queues = [
        [
            Claim("pay", f"k{key}", f"ex-{n}", "op", 1, status, start + 100 * step)
            for step, status in enumerate(PATHS[path])
        ]
        for n, (key, path, start) in enumerate(attempts)
    ]
    marks = dict.fromkeys(range(PARTITIONS), 0)
    out: list[Emission] = []
    while any(queues):
        left = [q for q in queues if q]
        out.append(claim_emission(left[draw(st.integers(0, len(left) - 1))].pop(0)))
        if draw(st.booleans()):
            source = draw(st.integers(0, PARTITIONS - 1))
            waiting = [q[0].at for q in queues if q]
            marks[source] = max(marks[source], min(waiting) if waiting else 10_000)
            out.extend(progress(source, p, marks[source]) for p in range(PARTITIONS))
    for source in range(PARTITIONS):
        out.extend(progress(source, p, 10_000) for p in range(PARTITIONS))
    return out


def sent(emissions: list[Emission]) -> list[tuple[int, Emission]]:
    """What the checkpoint sends of a batch, with the index it sends it at."""
    instead, skip = gathered(emissions)
    skip |= superseded(emissions)
    return [(i, instead.get(i, em)) for i, em in enumerate(emissions) if i not in skip]


def claims_per_key(pairs: list[tuple[int, Emission]]) -> dict[str | None, list[Claim]]:
    out: dict[str | None, list[Claim]] = {}
    for _, em in pairs:
        if type(em.record) is IdempotencyClaim:
            out.setdefault(em.key, []).append(cl.claim_of(em.record))
        elif type(em.record) is IdempotencyClaims:
            out.setdefault(em.key, []).extend(cl.claims_in(em.record))
    return out


@given(batches())
def test_every_claim_leaves_once_in_its_keys_order(emissions: list[Emission]) -> None:
    original = list(enumerate(emissions))
    assert claims_per_key(sent(emissions)) == claims_per_key(original)


@given(batches())
def test_no_claim_leaves_after_a_progress_it_preceded(emissions: list[Emission]) -> None:
    """For every progress sent, the claims before it in the batch are all sent before it."""
    out = sent(emissions)
    for j, (at, em) in enumerate(out):
        if type(em.record) is not ClaimsProgress:
            continue
        before = claims_per_key([(i, e) for i, e in enumerate(emissions) if i < at])
        sent_before = claims_per_key(out[:j])
        for key, claims in before.items():
            assert sent_before.get(key, [])[: len(claims)] == claims


@given(batches())
def test_the_join_decides_the_same_links_from_what_is_sent(emissions: list[Emission]) -> None:
    one_by_one, gathered_join = LocalJoin(PARTITIONS), LocalJoin(PARTITIONS)
    links = [link for em in emissions for link in one_by_one.take(em)]
    again = [link for _, em in sent(emissions) for link in gathered_join.take(em)]
    assert sorted(again) == sorted(links)
    assert gathered_join.books == one_by_one.books
    assert gathered_join.late == one_by_one.late == 0


def test_a_key_many_executions_share_is_split_into_records_of_at_most_the_maximum() -> None:
    claims = [
        Claim("pay", "shared", f"ex-{n}", "op", 1, S.SENT, 1_000 + n)
        for n in range(2 * GATHER_MAX + 3)
    ]
    emissions = [claim_emission(c) for c in claims]
    out = [em for _, em in sent(emissions)]
    assert [len(em.record.claims) for em in out] == [GATHER_MAX, GATHER_MAX, 3]
    assert [c for em in out for c in cl.claims_in(em.record)] == claims
    assert all(em.key == emissions[0].key for em in out)


def test_a_keys_only_claim_leaves_as_it_is() -> None:
    a = claim_emission(Claim("pay", "a", "ex-1", "op", 1, S.SENT, 1_000))
    b = claim_emission(Claim("pay", "b", "ex-2", "op", 1, S.SENT, 1_000))
    assert [em for _, em in sent([a, b])] == [a, b]
