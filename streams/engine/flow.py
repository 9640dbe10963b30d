"""Flow control in event time: which input topic partitions to stop reading, and which to read
again, so that events waiting for the watermark stay bounded.

Why: the processor holds each event until every input of its partition has moved past it. A
topic partition read far ahead of the others (a backlog in one topic, a fetcher that favours
it, a replay reading everything at once) would otherwise pile its events up in memory, one
by one, as long as the backlog. Kafka Streams bounds the records it buffers per partition
(``buffered.records.per.partition``); vigil counts the events waiting instead, and pauses only
a topic partition that is ahead: the input that sets the watermark is never paused, so time
always moves. The live worker (``vigil_worker/pipeline.py``) and ``vigil replay`` both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

Key = tuple[str, int]  # (input topic, partition)


def hold_back(
    held: Mapping[Key, int],
    paused: Iterable[Key],
    ahead: Callable[[str, int], bool],
    limit: int,
) -> tuple[list[Key], list[Key]]:
    """(to pause, to resume): pause a topic partition with more than ``limit`` events waiting
    while it is ahead; resume a paused one at half the limit, or once it is no longer ahead."""
    paused = set(paused)
    pause = sorted(
        key for key, n in held.items() if key not in paused and n > limit and ahead(*key)
    )
    resume = sorted(key for key in paused if held.get(key, 0) <= limit // 2 or not ahead(*key))
    return pause, resume
