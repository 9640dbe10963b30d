"""The ticker: the one place where wall-clock time enters vigil, and it enters as data.

Ticks go into every partition of every input topic so that each partition's stream time (the
minimum over its input topics, see ``streams.core.clock``) advances even when no producer
writes there. A separate process rather than a timer inside the worker: ticks must be
produced even while workers rebalance or restart, and one ticker serves any number of
workers. Two tickers are harmless: stream time is a maximum, a second tick changes nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from datetime import UTC, datetime

from streams.clients import RecordProducer
from streams.codec import AvroCodec
from streams.settings import Settings
from streams.topics import Topics


def _ticker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def tick_once(settings: Settings, codec: AvroCodec, at: datetime) -> int:
    """One tick at event time ``at`` into every partition of every input topic, delivered
    before returning; the number written.

    The ticker's record at a time the operator chooses: after a backfill of historical
    events, one tick past the last of them moves every partition's stream time there, so
    the decisions due in the backfilled range are taken without the wall-clock ticker."""
    if at.tzinfo is None:
        raise ValueError("a tick's time must carry a timezone")
    producer = RecordProducer(settings, codec)
    written = 0
    for spec in Topics.from_settings(settings).inputs():
        producer.tick(spec.name, spec.partitions, at, _ticker_id())
        written += spec.partitions
    producer.flush()
    return written


def run_ticker(settings: Settings, codec: AvroCodec, count: int | None = None) -> int:
    topics = Topics.from_settings(settings).inputs()
    producer = RecordProducer(settings, codec)
    ticker_id = _ticker_id()
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    rounds = 0
    interval = settings.tick_interval.total_seconds()
    while not stop and (count is None or rounds < count):
        now = datetime.now(UTC)
        for spec in topics:
            producer.tick(spec.name, spec.partitions, now, ticker_id)
        producer.flush()
        rounds += 1
        if count is not None and rounds >= count:
            break
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return rounds
