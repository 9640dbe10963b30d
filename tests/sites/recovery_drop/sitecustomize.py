"""Tests only: a worker whose table recovery loses a changelog partition's records
(``tests/test_recovery_watch_kafka.py``).

The test puts this directory on the worker's ``PYTHONPATH`` and sets
``VIGIL_TEST_RECOVERY_DROPS`` to N: in the first N recoveries with records to restore, right
after Faust seeks the active changelog partitions to where it reads from, the consumer's read
offset of the executions changelog's first partition with records left is set past its end.
The fetch loop then drops every record of that partition as one already read, as it drops
records fetched before a seek, and recovery waits for them for ever. The worker's own code
runs otherwise unchanged.

Nothing here is imported unless that variable is set; production code has no hook for it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Printed when the fault is injected; the test looks for it.
MESSAGE = "injected: recovery drops"


def _install(times: int) -> None:
    from faust.tables.recovery import Recovery

    seek = Recovery._seek_offsets
    left = [times]

    async def dropping_seek(
        self: Recovery, consumer: Any, tps: Any, offsets: Any, title: str
    ) -> None:
        await seek(self, consumer, tps, offsets, title)
        if title != "active" or left[0] <= 0:
            return
        for tp in sorted(tps):
            end = self.active_highwaters.get(tp)
            start = offsets.get(tp)
            if "executions" in tp.topic and end is not None and end > (start or -1):
                consumer._read_offset[tp] = end + 1
                left[0] -= 1
                print(f"{MESSAGE} {tp.topic}[{tp.partition}] up to {end}", file=sys.stderr)
                return

    Recovery._seek_offsets = dropping_seek  # type: ignore[method-assign]


_times = os.environ.get("VIGIL_TEST_RECOVERY_DROPS")
if _times:
    _install(int(_times))
