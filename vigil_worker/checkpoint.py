"""A batch made durable: its outputs, then its state, then its clocks, then its acknowledgements.

``Checkpoint`` is what the worker (``vigil_worker/pipeline.py``) does with a batch once every
record of it is applied; the order of its steps is the delivery guarantee (topology.md,
"Delivery guarantee").
"""

from __future__ import annotations

import asyncio
import bisect
from typing import TYPE_CHECKING, Any, NamedTuple

from streams.contracts.models.outputs import ClaimsProgress
from streams.engine.emission import Emission
from streams.engine.state import EntryTooLarge
from streams.kafka.clients import DeliveryFailed

if TYPE_CHECKING:
    from vigil_worker.pipeline import Worker


def superseded(emissions: list[Emission]) -> set[int]:
    """The indexes of the claims progress records a later one of the same batch supersedes:
    same input partition, same claims partition. A progress says that every claim of its
    input partition stamped before its watermark is written before it; the last one of a
    batch comes after every claim the earlier ones covered and says more, so the join loses
    nothing but the wait for it (it decides a little later, within the batch, and finds
    fewer claims late). The processor gives one per watermark move, up to hundreds a batch
    when one input topic is read ahead of the others: each to every claims partition."""
    last: dict[tuple[int, int | None], int] = {}
    skip: set[int] = set()
    for i, em in enumerate(emissions):
        record = em.record
        if type(record) is ClaimsProgress:
            where = (record.source_partition, em.partition)
            before = last.get(where)
            if before is not None:
                skip.add(before)
            last[where] = i
    return skip


class Position(NamedTuple):
    """An input record's coordinates."""

    topic: str
    partition: int
    offset: int


class Origin(NamedTuple):
    """Where the outputs of one input start among a batch's emissions."""

    first: int
    position: Position


class Failure(NamedTuple):
    """How many failed batches an input was part of the cause of, and the last error."""

    count: int
    error: str


class Checkpoint:
    """What one batch leaves to make durable, made durable in the order that makes it safe
    (``commit``):

    0. the state (execution entries) packed into changelog records, each checked against
       the largest record the changelog takes, before anything leaves: a batch whose state
       could never be stored publishes nothing, so no output describes a state that is not
       stored;
    1. the outputs, delivered to the broker;
    2. then the state that says they were published, delivered;
    3. then the partition clocks, with how far each input is processed, delivered;
    4. then the inputs acknowledged, so that Faust may commit their offsets.

    A crash between two steps leaves the earlier ones done and the later ones not: the inputs
    come again, find their outputs published and their state either stored (skipped as
    redelivered) or not (applied again, with the same result). Before steps 1 to 3 the worker
    checks it still owns the batch's partitions (``Worker.still_owner``), and step 4 is
    skipped after a rebalance: a rebalance in between drops the rest.
    """

    def __init__(self, worker: Worker, generation: int) -> None:
        self.worker = worker
        self.generation = generation
        #: what the batch's inputs produced, in order
        self.emissions: list[Emission] = []
        #: which input each output came from, in order
        self.origins: list[Origin] = []
        #: the partitions of the batch's inputs: only their clocks are stored
        self.partitions: set[int] = set()
        #: the value of each output as sent (step 1), for the feed
        self.sent: list[bytes] = []

    def origin(self, index: int) -> Position:
        """The input the ``index``-th emission came from."""
        i = bisect.bisect_right(self.origins, index, key=lambda o: o.first) - 1
        return self.origins[i].position

    async def commit(self, consumer: Any) -> bool:
        """The four steps, in order. False, the rest left undone, when the worker no longer
        owns the batch."""
        still_owner, generation = self.worker.still_owner, self.generation
        self.prepare_state()
        if self.emissions:
            if not await still_owner(generation):
                return False
            await self.deliver_outputs()
        if not await still_owner(generation):
            return False
        await self.store_state()
        if not await still_owner(generation):
            return False
        ready = await self.store_clocks()
        if self.worker.generation == generation:
            # (else a rebalance came during the send: its forget() dropped what would be
            # acknowledged, and pausing now could pause a partition this worker lost; the
            # records come again, and the clock, if stored, says they are processed)
            self.acknowledge(consumer, ready)
        return True

    async def deliver_outputs(self) -> None:
        """1. Every output sent, then waited for until the broker has them all. An output
        refused, before it left or by the broker, counts against the input it came from.

        Of the claims progress an input partition sent to one claims partition, only the last
        of the batch goes out (``superseded``); the others are recorded as sent empty."""
        worker = self.worker
        send, sent = worker.outputs.send_emission, self.sent
        skip = superseded(self.emissions)
        record: Any = None
        value: bytes | None = None
        for i, em in enumerate(self.emissions):
            if i in skip:
                sent.append(b"")
                continue
            try:
                # a record sent to every partition (a claims progress) is encoded once
                value = send(em, value if em.record is record else None)
                record = em.record
                sent.append(value)
            except Exception as exc:  # refused before it left (too large, unencodable)
                worker.failed_on(self.origin(i), exc)
                raise
        try:
            await asyncio.to_thread(worker.outputs.flush, 60.0)
        except DeliveryFailed as exc:
            index = {
                (em.topic, value): i
                for i, (em, value) in enumerate(zip(self.emissions, sent, strict=True))
            }
            for topic, value, error in exc.failed:
                i = index.get((topic, value))
                if i is not None:
                    worker.failed_on(self.origin(i), RuntimeError(error))
            raise
        worker.approval_index.note(em.record for em in self.emissions)  # ahead of the table

    def prepare_state(self) -> None:
        """0. The execution entries the batch changed, each written to its partition's
        changelog records (sent in step 2) and to the table's overlay. An entry larger than a
        changelog record can carry raises ``EntryTooLarge``, blamed on the last input it applied:
        the batch fails before any of it is published, and that input is quarantined once it
        has failed ``VIGIL_MAX_RECORD_FAILURES`` batches. (The processor keeps entries below
        ``VIGIL_MAX_ENTRY_BYTES``, far below that limit: this is the last line.)"""
        worker = self.worker
        processor, executions = worker.processor, worker.executions
        for p in processor.state.dirty_partitions():
            with executions.writing_to(p):
                try:
                    processor.flush(p, worker.entry_limit)
                except EntryTooLarge as exc:
                    if exc.last is not None:
                        rank, partition, offset = exc.last
                        position = Position(processor.input_names[rank], partition, offset)
                        worker.failed_on(position, exc)
                    raise

    async def store_state(self) -> None:
        """2. The execution entries the batch changed (``prepare_state``), delivered."""
        await self.worker.executions.send(self.worker.changelog)

    async def store_clocks(self) -> list[Any]:
        """3. The clocks of the batch's partitions, with how far each input is processed (the
        records now acknowledged in offset order), delivered. Returns those records."""
        worker = self.worker
        processor, ack_order = worker.processor, worker.ack_order
        for done in processor.drain_done():
            ack_order.finish(done)
        ready = ack_order.release()
        for msg in ready:  # in offset order per partition: the last one is the furthest
            processor.acknowledged(msg.topic, msg.partition, msg.offset + 1)
        for p in list(processor.dirty_partitions()):
            if p in self.partitions:
                with worker.clocks.writing_to(p):
                    processor.flush_clocks(p)
        await worker.clocks.send(worker.changelog)
        return ready

    def acknowledge(self, consumer: Any, ready: list[Any]) -> None:
        """4. The records acknowledged: Faust may commit their offsets. Then the inputs that
        run ahead are paused (``Worker.hold_back``)."""
        for msg in ready:
            consumer.ack(msg)
        self.worker.hold_back(consumer)
