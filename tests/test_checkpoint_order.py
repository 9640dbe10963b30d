"""The checkpoint (``vigil_worker/pipeline.py``) never publishes outputs of a state it cannot store.

Before, the outputs of a batch went out first and its execution entries were packed and sent
after; an entry too large for a changelog record failed the batch only then, so every retry
had published execution states that were never stored (issue 26: WAITING_FOR_TOOL with 1 to
10 open operations on the topic, 0 in the worker). Now every entry is packed and checked
before any output leaves. Stand-ins for the worker's tables and producers record the order
of what reaches the broker; the processor is the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from streams.contracts.models import events as ev
from streams.contracts.models.enums import ExecutionStatus, OperationEventKind
from streams.engine.processor import Processor, Stores
from streams.engine.state import EntryTooLarge
from tests.test_entry_bounds import key
from tests.test_processor import T0, TOPICS, env, ticks
from vigil_worker.checkpoint import Checkpoint, Position


class Table(dict[str, Any]):
    """A table that records its writes as changelog records, sent by ``send``."""

    def __init__(self, broker: list[str]) -> None:
        super().__init__()
        self.broker = broker
        self.pending: list[str] = []

    @contextlib.contextmanager
    def writing_to(self, partition: int) -> Iterator[None]:
        yield

    def __setitem__(self, k: str, v: Any) -> None:
        super().__setitem__(k, v)
        self.pending.append(k)

    async def send(self, producer: Any) -> int:
        self.broker += [f"state:{k}" for k in self.pending]
        n, self.pending = len(self.pending), []
        return n


class Outputs:
    def __init__(self, broker: list[str]) -> None:
        self.broker = broker

    def send_emission(self, em: Any, value: bytes | None = None) -> bytes:
        self.broker.append(f"output:{type(em.record).__name__}")
        return b""

    def flush(self, timeout: float) -> None:
        pass


class Worker:
    """What ``Checkpoint`` asks of the worker, and nothing else."""

    def __init__(self, entry_limit: int) -> None:
        self.broker: list[str] = []
        self.executions = Table(self.broker)
        self.clocks = Table(self.broker)
        committed: dict[tuple[str, int], int] = {}
        self.processor = Processor(
            TOPICS,
            Stores(executions=self.executions, clocks=self.clocks),
            write_behind=True,
            committed=lambda topic, p: committed.get((topic, p)),
        )
        self.outputs = Outputs(self.broker)
        self.entry_limit = entry_limit
        self.generation = 0
        self.failed: list[tuple[Position, str]] = []
        self.approval_index = type("Index", (), {"note": lambda self, records: None})()
        self.app = type("App", (), {"producer": None})()
        self.changelog = None  # the stand-in tables' ``send`` sends to ``broker``, not to it
        self.ack_order = type("Order", (), {"finish": lambda s, d: None, "release": lambda s: []})()

    async def still_owner(self, generation: int) -> bool:
        return True

    def failed_on(self, position: Position, exc: BaseException) -> None:
        self.failed.append((position, type(exc).__name__))

    def hold_back(self, consumer: Any) -> None:
        pass


def batch(worker: Worker, operations: int) -> tuple[Checkpoint, list[Any]]:
    """One execution's status and operations, released by ticks, into one checkpoint."""
    proc = worker.processor
    checkpoint = Checkpoint(worker, 0)  # type: ignore[arg-type]
    ticks(proc, T0)
    events: list[Any] = [
        env(
            ev.ExecutionStatusChanged(
                event_id="s1",
                execution_id="ex",
                sequence=1,
                status=ExecutionStatus.RUNNING,
                occurred_at=T0 + timedelta(seconds=1),
            )
        )
    ]
    for n in range(operations):
        events.append(
            env(
                ev.OperationEvent(
                    event_id=f"o{n}",
                    execution_id="ex",
                    operation_id=f"op-{n}",
                    attempt=1,
                    idempotency_key=key(n),
                    connector="sms",
                    kind=OperationEventKind.SENT,
                    occurred_at=T0 + timedelta(seconds=2),
                )
            )
        )
    for e in events:
        checkpoint.emissions += proc.handle(e, token=e)
        checkpoint.partitions.add(e.partition)
    for spec in TOPICS.inputs():
        for p in range(3):
            tick = ev.ClockTick(ticker_id="t", partition=p, occurred_at=T0 + timedelta(seconds=3))
            checkpoint.emissions += proc.handle(env(tick, spec.name, key="", partition=p))
    return checkpoint, events


def test_outputs_go_out_only_after_every_entry_is_packed_and_before_it_is_sent() -> None:
    worker = Worker(entry_limit=1_000_000)
    checkpoint, _ = batch(worker, 3)
    assert checkpoint.emissions
    assert asyncio.run(checkpoint.commit(consumer=None))
    first_state = worker.broker.index("state:ex")
    assert all(x.startswith("output:") for x in worker.broker[:first_state])
    assert worker.broker[:first_state], "the outputs precede the state"


def test_a_batch_whose_entry_is_too_large_publishes_nothing_and_blames_its_last_input() -> None:
    worker = Worker(entry_limit=2000)
    checkpoint, events = batch(worker, 10)
    assert checkpoint.emissions
    with pytest.raises(EntryTooLarge):
        asyncio.run(checkpoint.commit(consumer=None))
    assert worker.broker == []  # nothing reached the broker: no output, no state
    last = events[-1]
    assert worker.failed == [(Position(last.topic, last.partition, last.offset), "EntryTooLarge")]
