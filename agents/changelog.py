"""A Faust table whose changelog records the worker sends itself, once per batch.

Why: a write to a Faust table goes to ``Topic.send_soon``, a buffer that one background task
drains record by record through ``Topic.publish_message`` (futures, callbacks and an
``asyncio.Event`` per record). ``Producer.flush`` then waits for that buffer in steps of at most
100 ms and returns when one step times out, so "flushed" does not promise that every state
record reached the broker. The worker's delivery protocol (outputs, then state, then offsets)
needs that promise, and the per-record path costs more than the rest of the write.

``DirectTable`` keeps Faust's table for everything else (its store, memory or RocksDB, the
changelog topic it declares, recovery, standbys) and changes only the write: the value goes
into the table's store, and the changelog record, serialized exactly as Faust would (the
table's own key and value serializers, the partition of the record being processed), is kept
until ``send`` hands the batch to the producer and waits for the broker. The offsets it gets
back are recorded as Faust's ``_on_changelog_sent`` does, so a RocksDB store knows where its
data ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from typing import Any

from faust.streams import current_event
from faust.types import TP


class DirectTable(MutableMapping[str, Any]):
    """A Faust table, read as usual, written with changelog records sent per batch."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._pending: list[tuple[int, bytes | None, bytes | None]] = []

    # -- reads: the table's own ----------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.table[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.table.get(key, default)

    def items(self) -> Any:
        return self.table.items()

    def __contains__(self, key: object) -> bool:
        return key in self.table

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    # -- writes: the store now, the changelog at ``send`` ---------------------------------------
    def __setitem__(self, key: str, value: Any) -> None:
        self.table.data[key] = value
        self._log(key, value, self.table.value_serializer)

    def __delitem__(self, key: str) -> None:
        del self.table.data[key]
        self._log(key, None, "raw")

    def _log(self, key: str, value: Any, value_serializer: Any) -> None:
        event = current_event()
        if event is None:
            raise RuntimeError(f"{self.table.name}: written outside of a record's partition")
        topic = self.table.changelog_topic
        k, _ = topic.prepare_key(key, self.table.key_serializer)
        v = None if value is None else topic.prepare_value(value, value_serializer)[0]
        self._pending.append((event.message.partition, k, v))

    def pending(self) -> int:
        return len(self._pending)

    def discard(self) -> None:
        self._pending.clear()

    async def send(self, producer: Any) -> int:
        """Send the pending changelog records and wait until the broker has every one."""
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        name = self.table.changelog_topic.get_topic_name()
        futures = [await producer.send(name, k, v, p, None, None) for p, k, v in pending]
        await producer.flush()
        results = await asyncio.gather(*futures)
        last: dict[int, int] = {}
        for md in results:
            last[md.partition] = max(last.get(md.partition, -1), md.offset)
        for partition, offset in last.items():
            self.table.data.set_persisted_offset(TP(name, partition), offset)
        return len(pending)
