"""Tests only: a worker whose changelog sends fail (``tests/test_changelog_atomic_kafka.py``).

The test puts this directory on the worker's ``PYTHONPATH`` and sets
``VIGIL_TEST_CHANGELOG_FAILS`` to N: the first N sends of the executions table's changelog
records (``DirectTable.send``) with two records or more go through a producer that hands the
first record to the broker and refuses the others, as a broker failing part of a batch does.
The worker's own code runs otherwise unchanged: ``DirectTable.send`` waits for every record,
the batch fails, the pipeline forgets it and reads its records again.

Nothing here is imported unless that variable is set; production code has no hook for it.
"""

from __future__ import annotations

import os
from typing import Any

#: In the refused records' error, which the worker logs with the failed batch.
MESSAGE = "injected changelog failure"


class _PartlyRefusing:
    """The worker's changelog producer, refusing every record of one send after the first."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    async def deliver(self, topic: str, records: list[Any]) -> dict[int, int]:
        await self.producer.deliver(topic, records[:1])
        partition = records[1][0]
        raise RuntimeError(f"{MESSAGE}: {topic}[{partition}]")


def _install(times: int) -> None:
    from vigil_worker.changelog import DirectTable

    send = DirectTable.send
    left = [times]

    async def failing_send(self: DirectTable, producer: Any) -> int:
        if left[0] > 0 and self.table.name == "executions" and self.pending() >= 2:
            left[0] -= 1
            producer = _PartlyRefusing(producer)
        return await send(self, producer)

    DirectTable.send = failing_send  # type: ignore[method-assign]


_times = os.environ.get("VIGIL_TEST_CHANGELOG_FAILS")
if _times:
    _install(int(_times))
