"""Around Faust's consumer thread: the offset guard's seeks run on it, and the aiokafka
consumer it creates gets vigil's fetch sizes. No Kafka.

Faust's ``Consumer.seek`` calls aiokafka from the caller's thread. That drops prefetched
records while the consumer thread iterates over them, and under load it killed the fetcher
(BENCHMARKS.md, step 5). These tests stand in for Faust's consumer thread with a real thread
that runs queued calls one at a time, as ``mode``'s ``QueueServiceThread`` does."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiokafka.errors import IllegalStateError
from faust.types import TP

from streams.settings import Settings
from vigil_worker.consumer import seek_in_consumer_thread, tune_fetch
from vigil_worker.pipeline import survive_round


class ConsumerThread:
    """Runs queued calls on one thread of its own, like Faust's consumer thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="consumer")
        self.seeks: list[tuple[TP, int, str]] = []
        self.assigned: set[TP] = {TP("in.execution-status", p) for p in range(4)}
        self.asked_on: list[str] = []

    async def call_thread(self, fun: Any, *args: Any) -> Any:
        return await asyncio.wrap_future(self._pool.submit(fun, *args))

    def assignment(self) -> set[TP]:
        self.asked_on.append(threading.current_thread().name)
        return set(self.assigned)

    def seek(self, tp: TP, offset: int) -> None:
        if tp not in self.assigned:  # as aiokafka does
            raise IllegalStateError(f"No current assignment for partition {tp}")
        self.seeks.append((tp, offset, threading.current_thread().name))


class Consumer:
    def __init__(self) -> None:
        self._thread = ConsumerThread()
        self._read_offset: dict[TP, int | None] = {}
        self.direct: list[tuple[TP, int]] = []

    async def seek(self, tp: TP, offset: int) -> None:  # Faust's path: the caller's thread
        self.direct.append((tp, offset))

    def assignment(self) -> set[TP]:
        return {TP("in.execution-status", p) for p in range(4)}


def test_the_seek_runs_on_the_consumer_thread_and_sets_the_read_offset() -> None:
    consumer = Consumer()
    tp = TP("in.execution-status", 1)
    assert asyncio.run(seek_in_consumer_thread(consumer, tp, 71_800)) is True
    assert consumer.direct == []
    assert [(t, o) for t, o, _ in consumer._thread.seeks] == [(tp, 71_800)]
    assert consumer._thread.seeks[0][2].startswith("consumer")
    assert consumer._read_offset == {tp: 71_800}
    assert consumer._thread.asked_on and all(
        name.startswith("consumer") for name in consumer._thread.asked_on
    )


def test_a_partition_a_rebalance_took_away_is_not_sought() -> None:
    """The seek was decided before an await; meanwhile the partition moved. aiokafka would
    raise IllegalStateError (and, in the watchdog, a Faust timer's exception crashes the
    app): the seek is skipped, and the read offset is left alone."""
    consumer = Consumer()
    tp = TP("in.execution-status", 3)
    consumer._thread.assigned.discard(tp)
    assert asyncio.run(seek_in_consumer_thread(consumer, tp, 40)) is False
    assert consumer._thread.seeks == [] and consumer._read_offset == {}


def test_a_consumer_without_a_thread_skips_a_partition_it_no_longer_holds() -> None:
    consumer = Consumer()
    del consumer._thread
    gone = TP("in.execution-status", 9)
    assert asyncio.run(seek_in_consumer_thread(consumer, gone, 5)) is False
    assert consumer.direct == []


def test_a_round_that_raises_is_logged_counted_and_survived(caplog) -> None:
    failures: list[int] = []
    rounds: list[int] = []

    async def round_() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise IllegalStateError("No current assignment for partition")

    async def main() -> None:
        for _ in range(3):
            await survive_round("the watchdog", round_, lambda: failures.append(1))

    asyncio.run(main())
    assert len(rounds) == 3 and failures == [1]
    assert "the watchdog: a round failed" in caplog.text
    assert "IllegalStateError" in caplog.text


def test_a_cancelled_round_is_not_swallowed() -> None:
    async def round_() -> None:
        raise asyncio.CancelledError

    async def main() -> None:
        await survive_round("the watchdog", round_, lambda: None)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_a_consumer_without_a_thread_seeks_as_faust_does() -> None:
    consumer = Consumer()
    del consumer._thread
    tp = TP("in.execution-status", 0)
    assert asyncio.run(seek_in_consumer_thread(consumer, tp, 5)) is True
    assert consumer.direct == [(tp, 5)]


def test_the_consumer_faust_creates_fetches_with_vigils_sizes(monkeypatch) -> None:
    import aiokafka

    class Thread:
        def _create_worker_consumer(self, transport: Any) -> Any:
            # as Faust does: one byte, 1.5 s, no setting for either
            return aiokafka.AIOKafkaConsumer(
                bootstrap_servers="127.0.0.1:1", fetch_min_bytes=1, fetch_max_wait_ms=1500
            )

    class FaustConsumer:
        _thread = Thread()

    monkeypatch.setenv("VIGIL_FETCH_MIN_BYTES", "32768")
    monkeypatch.setenv("VIGIL_FETCH_MAX_WAIT", "8ms")
    settings = Settings.from_env()
    assert (settings.fetch_min_bytes, settings.fetch_max_wait.total_seconds()) == (32768, 0.008)
    consumer = FaustConsumer()
    tune_fetch(consumer, settings.fetch_min_bytes, 8)

    async def create() -> Any:
        return consumer._thread._create_worker_consumer(None)

    kafka_consumer = asyncio.run(create())
    # what aiokafka's start() hands to its Fetcher
    assert kafka_consumer._fetch_min_bytes == 32768
    assert kafka_consumer._fetch_max_wait_ms == 8


def test_the_defaults_wait_for_16_kib_or_25_ms(monkeypatch) -> None:
    monkeypatch.delenv("VIGIL_FETCH_MIN_BYTES", raising=False)
    monkeypatch.delenv("VIGIL_FETCH_MAX_WAIT", raising=False)
    d = Settings()
    assert d.fetch_min_bytes == 16 * 1024
    assert d.fetch_max_wait.total_seconds() == 0.025
    from_env = Settings.from_env()
    assert (from_env.fetch_min_bytes, from_env.fetch_max_wait) == (16 * 1024, d.fetch_max_wait)
