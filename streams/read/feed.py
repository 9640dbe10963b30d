"""The live feed behind ``GET /v1/executions/{id}/stream``: the recent outputs of each
execution, held in memory, with their deterministic ids as SSE event ids.

Because the event id is the output record's own id, a client that reconnects with
``Last-Event-ID`` resumes right after it, even across a worker restart, as long as the record
is still held (the last ``per_execution`` outputs of the ``max_executions`` most recently
active executions). A record no longer held is not invented: the client gets what is held.

Why records are held as the Avro bytes the worker published, not as models: most are never
watched, and a model with its dict, fields set and datetimes weighs five to ten times its
encoding. Holding models cost about 900 bytes per in-flight execution at 100,000 in flight
(BENCHMARKS.md, step 4); a record is decoded again only when a client reads it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from streams.contracts.models.base import Record

ID_FIELDS = (
    "state_id",
    "resolution_id",
    "work_item_id",
    "verdict_id",
    "alert_id",
    "anomaly_id",
    "dead_letter_id",
)


def record_id(record: Record) -> str:
    values = record.__dict__
    for f in _id_fields(type(record)):
        value = values.get(f)
        if value:
            return str(value)
    raise ValueError(f"{record.avro_name} has no id field")


_ID_FIELDS_OF: dict[type[Record], tuple[str, ...]] = {}


def _id_fields(model: type[Record]) -> tuple[str, ...]:
    """The id fields a model has, looked up once per model: ``getattr`` for a field a model
    lacks goes through pydantic's ``__getattr__`` and an exception, for every output."""
    names = _ID_FIELDS_OF.get(model)
    if names is None:
        names = _ID_FIELDS_OF[model] = tuple(f for f in ID_FIELDS if f in model.model_fields)
    return names


#: How a held record is read back: (topic, the value as published) -> the record.
Decode = Callable[[str, bytes], Record]


@dataclass(frozen=True, slots=True)
class FeedEvent:
    id: str
    kind: str
    topic: str
    value: bytes
    decode: Decode
    terminal: bool = False

    @property
    def record(self) -> Record:
        return self.decode(self.topic, self.value)

    @property
    def data(self) -> str:
        """The record as JSON, made when a client reads it, not for every output published
        (most are never watched)."""
        return self.record.model_dump_json()

    def sse(self) -> bytes:
        return f"id: {self.id}\nevent: {self.kind}\ndata: {self.data}\n\n".encode()


class Feed:
    def __init__(
        self, decode: Decode, per_execution: int = 256, max_executions: int = 10_000
    ) -> None:
        self.decode = decode
        self.per_execution = per_execution
        self.max_executions = max_executions
        #: execution id -> its held events, oldest first. A list, not a ``deque(maxlen=...)``:
        #: a deque takes a 600-byte block even for the three or four events most executions
        #: have, and there are up to ``max_executions`` of them.
        self._events: OrderedDict[str, list[FeedEvent]] = OrderedDict()
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def publish(self, published: Iterable[tuple[Record, str, bytes]]) -> None:
        """Hold outputs as published: (record, topic, encoded value)."""
        decode = self.decode
        for record, topic, value in published:
            values = record.__dict__
            execution_id = values.get("execution_id")
            if not execution_id:
                continue
            terminal = bool(values.get("terminal", False))
            event = FeedEvent(record_id(record), record.avro_name, topic, value, decode, terminal)
            buf = self._events.get(execution_id)
            if buf is None:
                buf = self._events[execution_id] = []
                while len(self._events) > self.max_executions:
                    self._events.popitem(last=False)
            else:
                self._events.move_to_end(execution_id)
            if buf and buf[-1].id == event.id:
                continue  # a redelivered duplicate
            buf.append(event)
            if len(buf) > self.per_execution:
                del buf[0]
            for waiter in self._waiters.get(execution_id, ()):
                waiter.set()

    def held(self, execution_id: str, after: str | None = None) -> list[FeedEvent]:
        """Held events of the execution, those after ``after`` if it is still held."""
        events = list(self._events.get(execution_id, ()))
        if after is not None:
            for i, e in enumerate(events):
                if e.id == after:
                    return events[i + 1 :]
        return events

    def subscribe(self, execution_id: str) -> asyncio.Event:
        waiter = asyncio.Event()
        self._waiters.setdefault(execution_id, set()).add(waiter)
        return waiter

    def unsubscribe(self, execution_id: str, waiter: asyncio.Event) -> None:
        waiters = self._waiters.get(execution_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[execution_id]
