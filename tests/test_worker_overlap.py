"""The worker's batch loop: a batch's checkpoint is committed while the next batch is applied,
the next is sealed only once that commit is over, and a failed commit forgets the batch
applied meanwhile (``Worker.run``). The loop is driven here with scripted batches and
checkpoints, so that the order of its steps is what is checked; the real steps run through the
broker in the ``*_kafka`` tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from agents.pipeline import Worker
from streams.settings import Settings


class Counters:
    """The processor's counters as the loop sees them: snapshots, numbered in turn."""

    taken = 0

    def __init__(self, label: int) -> None:
        self.label = label

    def snapshot(self) -> Counters:
        Counters.taken += 1
        return Counters(Counters.taken)


class ScriptedCheckpoint:
    def __init__(self, worker: ScriptedWorker, n: int, counted: Any, fail: bool) -> None:
        self.worker, self.n, self.counted, self.fail = worker, n, counted, fail
        self.generation = worker.generation
        self.batch = [n]

    def seal(self) -> None:
        self.worker.log.append(("seal", self.n))

    async def commit(self, consumer: Any) -> bool:
        log = self.worker.log
        log.append(("commit starts", self.n))
        await asyncio.sleep(0.05)  # the broker's round trips
        if self.fail:
            log.append(("commit fails", self.n))
            raise RuntimeError(f"delivery of batch {self.n} failed")
        log.append(("commit ends", self.n))
        return True


class ScriptedWorker(Worker):
    """A Worker with the batch loop of ``Worker.run`` and scripted steps around it."""

    def __init__(self, batches: list[int], failing: set[int]) -> None:  # no Faust app
        self.log: list[tuple[str, Any]] = []
        #: the counters' snapshot taken before each batch
        self.counted: list[tuple[int, Any]] = []
        self.generation = 0
        self.failing = failing
        self.settings = Settings.from_env()
        self.app = SimpleNamespace(consumer=None)
        self.processor = SimpleNamespace(counters=Counters(0))
        self.metrics = SimpleNamespace(
            batch_failures=SimpleNamespace(inc=lambda: self.log.append(("failure counted", None)))
        )
        queue: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()
        for b in batches:
            queue.put_nowait((0, [b]))

        async def scripted() -> AsyncIterator[tuple[int, list[int]]]:
            while True:
                yield await queue.get()

        self.drain = SimpleNamespace(batches=scripted)

    def pace_fetch(self, records: int) -> None:
        pass

    def forget(self) -> None:
        self.log.append(("forget", None))

    async def process(self, generation: int, batch: list[Any], counted: Any = None) -> Any:
        n = batch[0]
        self.log.append(("apply starts", n))
        await asyncio.sleep(0.02)  # applying lets the loop run now and then
        self.log.append(("apply ends", n))
        self.counted.append((n, counted))
        return ScriptedCheckpoint(self, n, counted, n in self.failing)


def run_until(worker: ScriptedWorker, done: tuple[str, Any]) -> list[tuple[str, Any]]:
    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        while done not in worker.log:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # nothing more is to happen
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 10))
    return worker.log


def test_a_commit_runs_while_the_next_batch_is_applied_and_seals_wait_for_it() -> None:
    log = run_until(ScriptedWorker([1, 2, 3], set()), ("commit ends", 3))
    i = log.index
    # batch 2 is applied while batch 1's commit waits on the broker
    assert i(("commit starts", 1)) < i(("apply starts", 2)) < i(("commit ends", 1))
    # and batch 2 is sealed only once batch 1's commit is over
    assert i(("commit ends", 1)) < i(("seal", 2)) < i(("commit starts", 2))
    assert i(("commit ends", 2)) < i(("seal", 3))
    # every batch sealed and committed once, in order, nothing forgotten
    assert [n for step, n in log if step == "seal"] == [1, 2, 3]
    assert [n for step, n in log if step == "commit ends"] == [1, 2, 3]
    assert ("forget", None) not in log


def test_a_failed_commit_forgets_the_batch_applied_meanwhile() -> None:
    worker = ScriptedWorker([1, 2, 3], {1})
    log = run_until(worker, ("commit ends", 3))
    i = log.index
    assert i(("apply starts", 2)) < i(("commit fails", 1)) < i(("forget", None))
    # batch 2 was applied on state the failure forgot: it is never sealed nor committed
    assert ("seal", 2) not in log and ("commit starts", 2) not in log
    # the counters go back to before batch 1, the failed one (not before batch 2)
    before = {n: c for n, c in worker.counted}
    assert worker.processor.counters is before[1]
    assert log.count(("failure counted", None)) == 1
    # the next batch goes on as usual
    assert i(("forget", None)) < i(("seal", 3)) < i(("commit ends", 3))


def test_a_failed_commit_with_no_next_batch_is_settled_at_once() -> None:
    """With nothing more fetched, the loop does not wait for a next batch to notice that the
    commit failed: what it left is forgotten (and the watchdog seeks back) straight away."""
    log = run_until(ScriptedWorker([1], {1}), ("failure counted", None))
    assert log[-3:] == [("commit fails", 1), ("forget", None), ("failure counted", None)]
