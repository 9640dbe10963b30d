"""The batch drain's own rules, without a broker: how records become batches.

The drain runs against a real Faust consumer in every Kafka test (tests/test_pipeline_kafka.py,
tests/test_faults_kafka.py); here a consumer that replays scripted ``getmany`` results checks
what those tests cannot pin down: batch size and wait, records below Faust's read offset,
other topics going through Faust's callback, the claims topic's batches in a queue of their
own, and batches dropped across a rebalance.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from faust.types import TP

from vigil_worker.drain import BatchDrain

INPUT = "in"
CLAIMS = "claims"


@dataclass
class Msg:
    topic: str
    partition: int
    offset: int

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


class _Flag:
    def __init__(self) -> None:
        self.set = False

    def is_set(self) -> bool:
        return self.set


class _Diag:
    def set_flag(self, _: str) -> None: ...

    def unset_flag(self, _: str) -> None: ...


@dataclass
class ScriptedConsumer:
    """What ``BatchDrain.run`` uses of a Faust consumer; ``getmany`` returns the next
    scripted fetch (then nothing, after a short sleep, as an idle consumer does)."""

    fetches: list[list[Msg]]
    on_fetch: Any = None
    callback_got: list[Msg] = field(default_factory=list)
    gaps: list[tuple[TP, int, int]] = field(default_factory=list)
    _read_offset: defaultdict[TP, int | None] = field(
        default_factory=lambda: defaultdict(lambda: None)
    )
    _stopped: _Flag = field(default_factory=_Flag)
    _commit_every: int | None = None
    _n_acked: int = 0
    should_stop: bool = False
    consumer_stopped_errors: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        self.diag = _Diag()
        self.suspend_flow = asyncio.Event()
        self.app = type("App", (), {})()
        self.app.topics = type("Topics", (), {"acks_enabled_for": staticmethod(lambda t: True)})
        self.transport = type("Transport", (), {"app": type("A", (), {"should_stop": True})})

    async def callback(self, message: Msg) -> None:
        self.callback_got.append(message)

    async def getmany(self, timeout: float) -> Any:
        if self.fetches:
            fetch = self.fetches.pop(0)
            if self.on_fetch is not None:
                self.on_fetch(fetch)
            for m in fetch:
                yield m.tp, m
        else:
            await asyncio.sleep(min(timeout, 0.01))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_first(self, *coros: Any) -> None:
        await coros[0]
        for c in coros[1:]:
            c.close()

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        self.gaps.append((tp, start, end))

    async def commit(self) -> None: ...


async def _drain(
    fetches: list[list[Msg]],
    *,
    size: int = 500,
    wait: float = 0.05,
    run_for: float = 0.3,
    generation: list[int] | None = None,
    on_fetch: Any = None,
) -> tuple[list[tuple[int, list[tuple[int, int]]]], ScriptedConsumer]:
    got, _, consumer = await _drain_both(
        fetches, size=size, wait=wait, run_for=run_for, generation=generation, on_fetch=on_fetch
    )
    return got, consumer


async def _drain_both(
    fetches: list[list[Msg]],
    *,
    size: int = 500,
    wait: float = 0.05,
    run_for: float = 0.3,
    generation: list[int] | None = None,
    on_fetch: Any = None,
) -> tuple[list[Any], list[Any], ScriptedConsumer]:
    """The input batches and the claims (side) batches the drain handed over."""
    gen = generation if generation is not None else [0]
    drain = BatchDrain(
        [INPUT], lambda: gen[0], batch_size=size, batch_wait=wait, depth=100, side=[CLAIMS]
    )
    consumer = ScriptedConsumer(fetches, on_fetch=on_fetch)
    fetcher = type("Fetcher", (), {"_stopped": _Flag()})()
    task = asyncio.ensure_future(drain.run(consumer, fetcher))
    await asyncio.sleep(run_for)
    consumer._stopped.set = True
    await asyncio.wait_for(task, 2)
    queued: list[list[Any]] = [[], []]
    for out, queue in zip(queued, (drain.queue, drain.side_queue), strict=True):
        while not queue.empty():
            g, batch = queue.get_nowait()
            out.append((g, [(m.partition, m.offset) for m in batch]))
    return queued[0], queued[1], consumer


def _msgs(partition: int, offsets: range, topic: str = INPUT) -> list[Msg]:
    return [Msg(topic, partition, o) for o in offsets]


def test_a_fetch_larger_than_the_batch_size_is_cut_into_batches_in_offset_order() -> None:
    got, _ = asyncio.run(_drain([_msgs(0, range(0, 25))], size=10))
    assert [len(b) for _, b in got] == [10, 10, 5]
    assert [o for _, b in got for _, o in b] == list(range(25))


def test_small_fetches_are_gathered_until_the_wait_is_over() -> None:
    # three fetches in quick succession fit in one batch; it closes after the wait
    got, _ = asyncio.run(
        _drain(
            [_msgs(0, range(0, 2)), _msgs(1, range(0, 2)), _msgs(0, range(2, 3))],
            wait=0.5,
            run_for=1.0,
        )
    )
    assert got == [(0, [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2)])]


def test_records_below_the_read_offset_are_dropped_and_gaps_reported() -> None:
    # Faust's own rule: after offset 5 a record 3 is stale; a jump 5 -> 9 is a gap to ack
    got, consumer = asyncio.run(
        _drain([_msgs(0, range(4, 6)), [Msg(INPUT, 0, 3), Msg(INPUT, 0, 9)]], wait=0.0)
    )
    offsets = [o for _, b in got for _, o in b]
    assert offsets == [4, 5, 9]
    assert consumer.gaps == [(TP(INPUT, 0), 6, 9)]


def test_other_topics_go_through_fausts_callback_not_into_batches() -> None:
    changelog = _msgs(0, range(0, 3), topic="app-executions-changelog")
    got, consumer = asyncio.run(_drain([changelog + _msgs(0, range(0, 2))], wait=0.0))
    assert [(m.topic, m.offset) for m in consumer.callback_got] == [
        ("app-executions-changelog", o) for o in range(3)
    ]
    assert got == [(0, [(0, 0), (0, 1)])]


def test_the_claims_topic_goes_to_its_own_queue_in_batches_of_its_own() -> None:
    claims = _msgs(1, range(0, 12), topic=CLAIMS)
    inputs, side, consumer = asyncio.run(
        _drain_both([claims[:5] + _msgs(0, range(0, 3)) + claims[5:]], size=10, wait=0.0)
    )
    assert inputs == [(0, [(0, 0), (0, 1), (0, 2)])]
    assert side == [(0, [(1, o) for o in range(10)]), (0, [(1, 10), (1, 11)])]
    assert consumer.callback_got == []


def test_claims_being_gathered_across_a_rebalance_are_dropped() -> None:
    gen = [0]
    fetches = [_msgs(0, range(0, 2), topic=CLAIMS), _msgs(0, range(2, 4), topic=CLAIMS)]

    def rebalance_on_the_second_fetch(fetch: list[Msg]) -> None:
        if fetch and fetch[0].offset == 2:
            gen[0] += 1

    inputs, side, _ = asyncio.run(
        _drain_both(
            fetches, wait=0.5, run_for=1.0, generation=gen, on_fetch=rebalance_on_the_second_fetch
        )
    )
    assert inputs == [] and side == []


def test_a_partial_batch_from_before_a_rebalance_is_dropped() -> None:
    gen = [0]
    # records 0..2, then a fetch during which the group rebalances, then records 3..4
    fetches = [_msgs(0, range(0, 3)), [], _msgs(0, range(3, 5))]

    def rebalance_on_the_empty_fetch(fetch: list[Msg]) -> None:
        if not fetch:
            gen[0] += 1

    got, _ = asyncio.run(
        _drain(
            fetches, wait=0.5, run_for=1.0, generation=gen, on_fetch=rebalance_on_the_empty_fetch
        )
    )
    # 0..2 were held for the wait when the generation changed: dropped (the new owner, or the
    # watchdog, reads them again); 3..4 came after and carry the new generation
    assert got == [(1, [(0, 3), (0, 4)])]


def test_a_batch_being_filled_across_a_rebalance_is_dropped_whole() -> None:
    gen = [0]
    fetches = [_msgs(0, range(0, 3)), _msgs(0, range(3, 5))]

    def rebalance_on_the_second_fetch(fetch: list[Msg]) -> None:
        if fetch and fetch[0].offset == 3:
            gen[0] += 1

    got, _ = asyncio.run(
        _drain(
            fetches, wait=0.5, run_for=1.0, generation=gen, on_fetch=rebalance_on_the_second_fetch
        )
    )
    # the rebalance came while the batch was being filled: none of it is handed on, not even
    # the records fetched after it (they may belong to a revoked partition); the partition's
    # owner reads them again from the committed offset
    assert got == []


def test_busy_while_a_batch_is_queued_or_being_processed() -> None:
    async def scenario() -> list[bool]:
        drain = BatchDrain([INPUT], lambda: 0)
        seen = [drain.busy()]
        await drain.queue.put((0, []))
        seen.append(drain.busy())
        it = drain.batches().__aiter__()
        await it.__anext__()
        seen.append(drain.busy())  # taken, not yet done
        waiting = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0)
        seen.append(drain.busy())  # back for the next one: idle
        await drain.queue.put((0, []))
        drain.clear()
        seen.append(drain.busy())
        waiting.cancel()
        return seen

    assert asyncio.run(scenario()) == [False, True, True, False, False]
