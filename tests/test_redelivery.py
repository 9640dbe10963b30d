"""At-least-once without Kafka: a worker crashes at any point of a batch and a new one takes
over from the committed offsets, with the tables as the crash left them. What was published,
the first time and the second, is exactly what one uninterrupted run publishes: every record
there, a repeated id only ever the identical record, and no anomaly about an input processed
twice.

The simulated worker does what ``vigil_worker/pipeline.py`` does, in the same order: handle a batch
(write-behind), publish its outputs, flush the state (per partition, so a crash can fall
between partitions), flush the clocks, acknowledge; the committed offset of a partition is
the end of its acknowledged prefix.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.contracts.envelope import Envelope
from streams.contracts.models.events import ClockTick
from streams.engine.processor import Processor, Stores
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.local.scenario import Tick
from streams.settings import Settings
from tests.test_faults_kafka import ID_FIELDS, steady_stream

PARTITIONS = 3
SETTINGS = Settings(partitions=PARTITIONS)
TOPICS = Topics.from_settings(SETTINGS)
PHASES = ("handled", "published", "state-partly", "state", "clocks")


def build_log() -> list[Envelope]:
    """The input log in production order, with the offsets the broker would give."""
    offsets: dict[tuple[str, int], int] = defaultdict(int)
    log: list[Envelope] = []

    def add(topic: str, p: int, key: str | None, record: Any) -> None:
        o = offsets[(topic, p)]
        offsets[(topic, p)] += 1
        log.append(Envelope(topic, p, o, None, key.encode() if key else None, b"", record, None))

    extra = []
    for s in steady_stream(10, every=2.0, extra=extra):
        if isinstance(s, Tick):
            for spec in TOPICS.inputs():
                for p in range(PARTITIONS):
                    add(spec.name, p, None, ClockTick(ticker_id="t", partition=p, occurred_at=s.at))
        else:
            spec = next(t for t in TOPICS.inputs() if type(s) in t.value_types)
            add(spec.name, partition_of(s.execution_id, PARTITIONS), s.execution_id, s)
    return log


LOG = build_log()


def rid(record: Any) -> str:
    return next(getattr(record, f) for f in ID_FIELDS if hasattr(record, f))


def uninterrupted() -> dict[str, str]:
    proc = Processor(TOPICS, Stores())
    out: dict[str, str] = {}
    for e in LOG:
        for em in proc.handle(e):
            out[rid(em.record)] = em.record.model_dump_json()
    return out


EXPECTED = uninterrupted()


class Crash(Exception):
    pass


@dataclass
class Broker:
    stores: Stores = field(default_factory=Stores)
    #: per partition, the end of the acknowledged prefix: what Faust commits next
    acked_through: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    #: per partition, the committed offset the broker confirmed (what a worker starts from,
    #: and below which entries forget positions and the offset guard skips records)
    committed: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    acked: dict[tuple[str, int], set[int]] = field(default_factory=lambda: defaultdict(set))
    published: list[Any] = field(default_factory=list)

    def worker(self) -> Processor:
        return Processor(
            TOPICS,
            self.stores,
            write_behind=True,
            committed=lambda topic, p: self.committed[(topic, p)],
        )

    def ack(self, envs: list[Envelope]) -> None:
        for e in envs:
            tp = (e.topic, e.partition)
            self.acked[tp].add(e.offset)
            while self.acked_through[tp] in self.acked[tp]:
                self.acked_through[tp] += 1

    def commit(self) -> None:
        self.committed.update(self.acked_through)

    def run(
        self,
        batch: int,
        crash_at: tuple[int, str] | None,
        again: frozenset[int] = frozenset(),
        commit_every: int = 1,
    ) -> None:
        """Deliver everything from the committed offsets, in log order, in batches; commit
        the acknowledged offsets after every ``commit_every`` batches. Before each batch
        numbered in ``again``, what was handed over before and is not committed yet is handed
        over again (a fetch position gone back: a seek, Faust's resume before its seek), as the
        worker's offset guard lets it through (``Check.AGAIN``)."""
        proc = self.worker()
        todo = [e for e in LOG if e.offset >= self.committed[(e.topic, e.partition)]]
        handed = 0
        for n, start in enumerate(range(0, len(todo), batch)):
            phase = crash_at[1] if crash_at is not None and crash_at[0] == n else None
            chunk = todo[start : start + batch]
            if n in again:
                chunk = [
                    e for e in todo[:handed] if e.offset >= self.committed[(e.topic, e.partition)]
                ] + chunk
            handed = start + batch
            out = [em for e in chunk for em in proc.handle(e, token=e)]
            if phase == "handled":
                raise Crash
            self.published += [em.record for em in out]
            if phase == "published":
                raise Crash
            dirty = proc.state.dirty_partitions()
            for i, p in enumerate(dirty):
                if phase == "state-partly" and i == len(dirty) // 2:
                    raise Crash
                proc.flush(p)
            if phase == "state":
                raise Crash
            proc.flush_clocks()
            if phase == "clocks":
                raise Crash
            self.ack(proc.drain_done())
            if n % commit_every == commit_every - 1:
                self.commit()
        self.commit()


def check(published: list[Any]) -> None:
    by_id: dict[str, str] = {}
    for r in published:
        text = r.model_dump_json()
        assert by_id.setdefault(rid(r), text) == text, f"id {rid(r)} published differently"
    missing = sorted(set(EXPECTED) - set(by_id))
    extra = sorted(set(by_id) - set(EXPECTED))
    assert not missing, f"{len(missing)} missing, e.g. {[EXPECTED[m] for m in missing[:2]]}"
    assert not extra, f"{len(extra)} extra, e.g. {[by_id[x] for x in extra[:2]]}"
    assert by_id == EXPECTED


def test_an_uninterrupted_live_worker_publishes_what_the_replay_does() -> None:
    broker = Broker()
    broker.run(batch=37, crash_at=None)
    check(broker.published)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(min_value=1, max_value=120),
    crashes=st.lists(
        st.tuples(st.integers(min_value=0, max_value=40), st.sampled_from(PHASES)),
        min_size=1,
        max_size=3,
    ),
)
def test_crashes_anywhere_lose_nothing_and_report_nothing_twice(
    batch: int, crashes: list[tuple[int, str]]
) -> None:
    broker = Broker()
    for crash in crashes:
        try:
            broker.run(batch, crash)
        except Crash:
            continue
    broker.run(batch, None)
    check(broker.published)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(min_value=1, max_value=120),
    again=st.frozensets(st.integers(min_value=1, max_value=40), min_size=1, max_size=8),
    commit_every=st.integers(min_value=1, max_value=4),
)
def test_inputs_handed_over_again_are_recognised_as_redelivered_when_released(
    batch: int, again: frozenset[int], commit_every: int
) -> None:
    """A copy of an input handed over again, its first copy applied but not yet committed, is
    held for the watermark like any input. By the time it is released, the commit may have
    come, and a later input of its execution made the entry forget the positions below the
    committed offset: it is still a redelivery, not a DUPLICATE or AFTER_TERMINAL."""
    broker = Broker()
    broker.run(batch, None, again, commit_every)
    check(broker.published)


def test_a_producer_duplicate_is_still_reported_after_a_crash() -> None:
    """The position, not the content, tells a redelivery: the scenario's re-sent statuses
    (same event id, new offset) are DUPLICATE anomalies in every run, crashed or not."""
    broker = Broker()
    with contextlib.suppress(Crash):
        broker.run(25, (3, "clocks"))
    broker.run(25, None)
    kinds = [r.kind for r in broker.published if type(r).__name__ == "Anomaly"]
    assert "DUPLICATE" in kinds
    check(broker.published)
