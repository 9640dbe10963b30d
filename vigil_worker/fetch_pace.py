"""How long the broker may hold the worker's fetch: patient when caught up, eager under a backlog.

Why: with Faust's fetch sizes (one byte, 1.5 s) the broker answers as soon as one record is
there, so under a light live load every record or two costs a fetch round trip, built and
parsed in Python on the consumer thread: at 500 events/s that was most of the worker's CPU.
Asking for 16 KiB with a short wait batches those trickles: less than half the CPU, and a
lower p99 latency (BENCHMARKS.md, step 6).

Under a backlog the same request is a brake. aiokafka keeps one fetch in flight per broker,
and asks only for partitions it holds no records of. When those are the quiet ones (the clock
ticks, a changelog, Faust's leader topic) the broker holds the request for the whole wait, and
the busy partitions, emptied meanwhile, wait behind it: with 16 KiB and 25 ms a backlog was
read 12 % slower. So the worker asks for one byte while its batches come full, and goes back
to the patient request once they shrink.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vigil.fetch")

#: the broker answers as soon as it has a record: what a backlog wants
EAGER_MIN_BYTES = 1


@dataclass(frozen=True)
class FetchSizes:
    """A fetch request's minimum bytes and maximum wait (ms), as the broker reads them."""

    min_bytes: int
    max_wait_ms: int


@dataclass
class FetchPace:
    """Chooses the fetch sizes from the size of the batches the worker is handed.

    A batch of ``full`` records or more (the drain closes a batch at its size limit only when
    records are waiting) means a backlog: eager. A batch under ``full // 4`` means caught up:
    patient. In between nothing changes, so a load near the limit does not flap."""

    patient: FetchSizes
    full: int
    eager: bool = False

    @property
    def sizes(self) -> FetchSizes:
        if self.eager:
            return FetchSizes(EAGER_MIN_BYTES, self.patient.max_wait_ms)
        return self.patient

    def after_batch(self, records: int) -> FetchSizes | None:
        """The sizes to ask for from now on, or None when they stay as they are."""
        if self.patient.min_bytes <= EAGER_MIN_BYTES:
            return None  # patient is eager already: nothing to switch
        if not self.eager and records >= self.full:
            self.eager = True
        elif self.eager and records < max(1, self.full // 4):
            self.eager = False
        else:
            return None
        return self.sizes


def running_fetcher(consumer: Any) -> Any | None:
    """The aiokafka ``Fetcher`` behind Faust's consumer, once its thread has started it."""
    thread = getattr(consumer, "_thread", None)
    kafka_consumer = getattr(thread, "_consumer", None)
    return getattr(kafka_consumer, "_fetcher", None)


def apply_sizes(fetcher: Any, sizes: FetchSizes) -> bool:
    """Set the sizes the fetcher writes into each new fetch request.

    aiokafka reads ``_fetch_min_bytes`` and ``_fetch_max_wait_ms`` each time it builds a
    request (``Fetcher._get_actions_per_node``); a request in flight keeps the sizes it went
    out with. Two int attributes, each set in one step: safe from the event loop's thread."""
    if fetcher is None or not hasattr(fetcher, "_fetch_min_bytes"):
        return False
    fetcher._fetch_min_bytes = sizes.min_bytes
    fetcher._fetch_max_wait_ms = sizes.max_wait_ms
    log.info(
        "fetches now ask for %s byte(s) within %s ms (%s)",
        sizes.min_bytes,
        sizes.max_wait_ms,
        "batches come full: a backlog" if sizes.min_bytes == EAGER_MIN_BYTES else "caught up",
    )
    return True
