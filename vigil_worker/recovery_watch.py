"""Faust's table recovery that stops making progress.

Why: after a rebalance, Faust restores the tables from their changelogs before it hands the
worker any input, and it waits for every active changelog partition to reach the offset it
measured as its end. The changelog's records reach the recovery only through the consumer's
fetch loop (``vigil_worker/drain.py``), which, like Faust's own, drops records below a
partition's read offset. A changelog partition whose records stop coming leaves the worker
alive, in recovery, with nothing processed and nothing said: the input watchdog only sees its
input partitions paused. Once a changelog partition's remaining count has not moved for
``stall_after`` seconds, the worker says so, with what the consumer holds of it, and seeks it
back to the offset recovery last applied, with its read offset, so its records come again.
Recovery applies a record only if it is past the offset it last applied, so a record read
twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field


@dataclass
class RecoveryWatch:
    """Per changelog partition: its remaining count and since when it has not moved."""

    stall_after: float = 15.0
    _seen: dict[Hashable, tuple[int, float]] = field(default_factory=dict)

    def stalled(self, remaining: Mapping[Hashable, int], now: float) -> list[Hashable]:
        """The partitions with records left whose count has not moved for ``stall_after``
        seconds. Each is reported once per ``stall_after`` of standing still: its clock starts
        again when it is reported."""
        seen = self._seen
        for tp in list(seen):
            if remaining.get(tp, 0) <= 0:
                del seen[tp]
        stalled = []
        for tp, left in remaining.items():
            if left <= 0:
                continue
            last = seen.get(tp)
            if last is None or last[0] != left:
                seen[tp] = (left, now)
            elif now - last[1] >= self.stall_after:
                stalled.append(tp)
                seen[tp] = (left, now)
        return stalled

    def reset(self) -> None:
        """Recovery is over (or has not begun): nothing is waited for."""
        self._seen.clear()
