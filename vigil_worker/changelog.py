"""A Faust table whose changelog records the worker sends itself, once per batch.

Why: a write to a Faust table goes to ``Topic.send_soon``, a buffer that one background task
drains record by record through ``Topic.publish_message`` (futures, callbacks and an
``asyncio.Event`` per record). ``Producer.flush`` then waits for that buffer in steps of at most
100 ms and returns when one step times out, so "flushed" does not promise that every state
record reached the broker. The worker's delivery protocol (outputs, then state, then offsets)
needs that promise, and the per-record path costs more than the rest of the write.

``DirectTable`` keeps Faust's table for everything else (its store, memory or RocksDB, the
changelog topic it declares, recovery, standbys) and changes only the write: the changelog
record, serialized exactly as Faust would (the table's own key and value serializers, the
partition of the record being processed), is kept until ``send`` hands the batch to the
producer and waits for the broker. The offsets it gets back are recorded as Faust's
``_on_changelog_sent`` does, so a RocksDB store knows where its data ends.

Why the store waits for the broker too: the store is what the worker reads back, and an
execution entry read back says which inputs it has applied. Were the store written at once and
the send to fail, the batch's inputs would come again, be judged applied from the store, be
acknowledged, and their effect would never reach the changelog (a restart, which recovers the
table from it, loses it). So a batch's writes wait in an overlay (key -> value, or a deletion)
that reads consult first; ``send`` moves them into the store only once the broker has
acknowledged every record of the batch. A send that fails, even in part, and ``discard`` drop
the overlay with the records: the store is then behind what the changelog may already hold,
never ahead of it, and the inputs read again are applied again (with the same result).

Why librdkafka sends them (``ChangelogProducer``), not Faust's producer: Faust's is aiokafka's,
which builds, batches, writes and acknowledges every record in Python on the event loop's
thread, a coroutine and a future per record. librdkafka does all of that in its own threads,
outside the interpreter lock; the worker only hands it each record and waits for the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterator, MutableMapping
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, Producer
from faust.streams import _current_event, current_event
from faust.types import TP

from streams.settings import Settings

#: The overlay's value for a key the batch deleted.
_DELETED: Any = object()

#: One changelog record: its partition, key and value (None: a deletion), serialized.
ChangelogRecord = tuple[int, bytes | None, bytes | None]

#: Changelog records handed to librdkafka before waiting for them (``deliver``). A batch
#: rarely writes more, but one that does (a watermark deciding every waiting key at once, a
#: backlog's first batches) would otherwise have librdkafka copy all its records at once; the
#: memory its copies take stays with the process after they are sent (the C heap keeps it).
DELIVER_CHUNK = 4096


class ChangelogRefused(RuntimeError):
    """Changelog records the broker did not take (or not within the wait)."""


class ChangelogProducer:
    """Changelog records through librdkafka: idempotent, acknowledged by every in-sync
    replica, in order per partition. One per writer that sends a batch at a time (the
    pipeline's checkpoint, the claims stage): ``deliver`` waits for its own records by
    flushing the producer, so two writers sharing one would wait for each other's."""

    def __init__(self, settings: Settings, max_request_size: int) -> None:
        self.producer = Producer(
            settings.confluent_conf()
            | {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                # as large as what Faust's producer takes (``producer_max_request_size``):
                # the worker bounds an entry by that (``pipeline.entry_bound``)
                "message.max.bytes": max_request_size,
            }
        )

    async def deliver(self, topic: str, records: list[ChangelogRecord]) -> dict[int, int]:
        """Every record sent and waited for; the last offset written per partition. Raises
        ``ChangelogRefused`` if the broker refused any of them (some may be written)."""
        produce, poll = self.producer.produce, self.producer.poll
        got: list[tuple[int, int]] = []
        errors: list[str] = []

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                got.append((msg.partition(), msg.offset()))
            else:
                errors.append(f"{topic}[{msg.partition()}]: {err}")

        left = 0
        for start in range(0, len(records), DELIVER_CHUNK):
            for partition, key, value in records[start : start + DELIVER_CHUNK]:
                while True:
                    try:
                        produce(
                            topic, value=value, key=key, partition=partition, on_delivery=report
                        )
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        poll(0.05)
            left = await asyncio.to_thread(self.producer.flush, 60.0)
            if left or errors:
                break
        if errors or left or len(got) != len(records):
            raise ChangelogRefused(
                f"{len(records) - len(got)} of {len(records)} changelog records of {topic} "
                f"not written: {errors[:3] or f'{left} still queued after 60 s'}"
            )
        last: dict[int, int] = {}
        for partition, offset in got:
            if offset > last.get(partition, -1):
                last[partition] = offset
        return last

    def close(self) -> None:
        self.producer.flush(10.0)


class _At:
    """What a store asks of "the event being processed": the partition a write belongs to (a
    RocksDB store keeps one database per partition)."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


class DirectTable(MutableMapping[str, Any]):
    """A Faust table, read as usual, written with changelog records sent per batch; its
    store takes a batch's writes only once the broker has all of the batch's records."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._pending: list[ChangelogRecord] = []
        #: the writes whose records are pending or being sent: key -> (partition, value or
        #: ``_DELETED``). Replaced, never cleared in place: a send holds on to its own.
        self._overlay: dict[str, tuple[int, Any]] = {}
        #: the partition writes go to (``writing_to``); else the current Faust event's
        self._writing: int | None = None

    # -- reads: the batch's writes, then the table's own ---------------------------------------
    # Between batches the overlay is empty, and a read costs one test more than the table's.
    def __getitem__(self, key: str) -> Any:
        overlay = self._overlay
        if overlay:
            hit = overlay.get(key)
            if hit is not None:
                if hit[1] is _DELETED:
                    raise KeyError(key)
                return hit[1]
        return self.table[key]

    def get(self, key: str, default: Any = None) -> Any:
        overlay = self._overlay
        if overlay:
            hit = overlay.get(key)
            if hit is not None:
                return default if hit[1] is _DELETED else hit[1]
        return self.table.get(key, default)

    def items(self) -> Any:
        overlay = self._overlay
        if not overlay:
            return self.table.items()
        return [
            *((k, v) for k, v in self.table.items() if k not in overlay),
            *((k, v) for k, (_, v) in overlay.items() if v is not _DELETED),
        ]

    def __contains__(self, key: object) -> bool:
        overlay = self._overlay
        if overlay:
            hit = overlay.get(key)  # type: ignore[call-overload]
            if hit is not None:
                return hit[1] is not _DELETED
        return key in self.table

    def __iter__(self) -> Iterator[str]:
        overlay = self._overlay
        if not overlay:
            return iter(self.table)
        return iter(
            [
                *(k for k in self.table if k not in overlay),
                *(k for k, (_, v) in overlay.items() if v is not _DELETED),
            ]
        )

    def __len__(self) -> int:
        if not self._overlay:
            return len(self.table)
        return sum(1 for _ in self)

    # -- writes: the overlay and a pending record now, the store once the broker has them -----
    def __setitem__(self, key: str, value: Any) -> None:
        partition = self._partition()
        self._overlay[key] = (partition, value)
        self._log(partition, key, value, self.table.value_serializer)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        partition = self._partition()
        self._overlay[key] = (partition, _DELETED)
        self._log(partition, key, None, "raw")

    @contextlib.contextmanager
    def writing_to(self, partition: int) -> Iterator[None]:
        """Writes made inside go to ``partition`` (changelog and store), whatever event Faust
        is processing: the worker writes a batch's state partition by partition."""
        previous, self._writing = self._writing, partition
        try:
            yield
        finally:
            self._writing = previous

    def _partition(self) -> int:
        if self._writing is not None:
            return self._writing
        event = current_event()
        if event is None:
            raise RuntimeError(f"{self.table.name}: written outside of a record's partition")
        return int(event.message.partition)

    def _log(self, partition: int, key: str, value: Any, value_serializer: Any) -> None:
        topic = self.table.changelog_topic
        k, _ = topic.prepare_key(key, self.table.key_serializer)
        v = None if value is None else topic.prepare_value(value, value_serializer)[0]
        self._pending.append((partition, k, v))

    def pending(self) -> int:
        return len(self._pending)

    def discard(self) -> None:
        """Forget the writes not sent yet, records and overlay together: reads return what
        the store holds. A send under way still applies what the broker acknowledges."""
        self._pending = []
        self._overlay = {}

    async def send(self, producer: Any) -> int:
        """Send the pending changelog records through ``producer`` (a ``ChangelogProducer``)
        and wait until the broker has every one; then, and only then, the store takes the
        writes. If any record fails, none is applied and the writes are dropped (the error is
        raised): the store stays behind the changelog."""
        pending, self._pending = self._pending, []
        writes = self._overlay
        if not pending:
            return 0
        name = self.table.changelog_topic.get_topic_name()
        try:
            last = await producer.deliver(name, pending)
        except BaseException:
            if self._overlay is writes:
                self._overlay = {}
            raise
        self._apply(writes)
        if self._overlay is writes:
            self._overlay = {}
        for partition, offset in last.items():
            self.table.data.set_persisted_offset(TP(name, partition), offset)
        return len(pending)

    def _apply(self, writes: dict[str, tuple[int, Any]]) -> None:
        """Put the acknowledged writes into the store, each as the event of its partition."""
        data = self.table.data
        current: int | None = None
        at: _At | None = None
        token = None
        try:
            for key, (partition, value) in writes.items():
                if partition != current:
                    if token is not None:
                        _current_event.reset(token)
                    at, current = _At(partition), partition
                    token = _current_event.set(weakref.ref(at))
                if value is _DELETED:
                    # (a key written and deleted in the same batch was never in the store)
                    with contextlib.suppress(KeyError):
                        del data[key]
                else:
                    data[key] = value
        finally:
            if token is not None:
                _current_event.reset(token)
