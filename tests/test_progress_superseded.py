"""Of a batch's claims progress, only the last per input and claims partition is sent
(``vigil_worker.checkpoint.superseded``).

Safe because a progress only ever says more than the ones before it: every progress left out
is followed, later in the same ordered output, by one kept for the same input partition and
claims partition whose watermark is at least its own, so every claim the left-out one covered
still precedes a progress that covers it. Claims and every other output are never left out.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.contracts.models.enums import OperationStatus
from streams.contracts.models.outputs import ClaimsProgress
from streams.core import claims as cl
from streams.core.claims import Claim
from streams.engine.emission import Emission
from vigil_worker.checkpoint import superseded

TOPIC = "vigil.idempotency-claims"
PARTITIONS = 3


def progress(source: int, to: int, watermark: int) -> Emission:
    return Emission(TOPIC, None, cl.progress_record(source, PARTITIONS, watermark), (), to)


def claim(n: int) -> Emission:
    c = Claim("pay", f"k{n}", f"ex-{n}", "op", 1, OperationStatus.SENT, 1_000 + n)
    return Emission(TOPIC, cl.claims_key(c.connector, c.key), cl.claim_record(c))


@st.composite
def batches(draw: st.DrawFn) -> list[Emission]:
    """A batch as the processor orders it: per input partition, watermarks that only grow,
    each move told to every claims partition; claims in between."""
    marks = dict.fromkeys(range(PARTITIONS), 0)
    out: list[Emission] = []
    for step in draw(st.lists(st.tuples(st.booleans(), st.integers(0, PARTITIONS - 1)))):
        is_progress, source = step
        if is_progress:
            marks[source] += draw(st.integers(1, 5_000))
            out.extend(progress(source, p, marks[source]) for p in range(PARTITIONS))
        else:
            out.append(claim(len(out)))
    return out


@given(batches())
def test_every_progress_left_out_is_covered_by_a_later_one_kept(emissions: list[Emission]) -> None:
    skip = superseded(emissions)
    for i in skip:
        left = emissions[i].record
        assert type(left) is ClaimsProgress
        assert any(
            j > i
            and j not in skip
            and type(em.record) is ClaimsProgress
            and em.record.source_partition == left.source_partition
            and em.partition == emissions[i].partition
            and em.record.occurred_at >= left.occurred_at
            for j, em in enumerate(emissions)
        )


@given(batches())
def test_claims_are_never_left_out_and_the_last_progress_always_goes(
    emissions: list[Emission],
) -> None:
    skip = superseded(emissions)
    kinds = {type(emissions[i].record).__name__ for i in skip}
    assert kinds <= {"ClaimsProgress"}
    last: dict[tuple[int, int | None], int] = {}
    for i, em in enumerate(emissions):
        if type(em.record).__name__ == "ClaimsProgress":
            last[(em.record.source_partition, em.partition)] = i
    assert not skip & set(last.values())
    assert len(skip) == sum(
        1 for em in emissions if type(em.record).__name__ == "ClaimsProgress"
    ) - len(last)


def test_a_batch_of_many_watermark_moves_sends_one_progress_per_pair() -> None:
    emissions = [claim(0)]
    for w in range(1, 101):
        emissions.extend(progress(0, p, w * 1000) for p in range(PARTITIONS))
        emissions.append(claim(w))
    skip = superseded(emissions)
    kept = [em for i, em in enumerate(emissions) if i not in skip]
    assert [em.partition for em in kept if type(em.record).__name__ == "ClaimsProgress"] == [
        0,
        1,
        2,
    ]
    assert all(
        em.record.occurred_at == cl.progress_record(0, 1, 100_000).occurred_at
        for em in kept
        if type(em.record).__name__ == "ClaimsProgress"
    )
    assert sum(1 for em in kept if type(em.record).__name__ == "IdempotencyClaim") == 101
