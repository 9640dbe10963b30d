"""The ticker: the one place where wall-clock time enters vigil, and it enters as data.

Ticks go into every partition of every input topic so that each partition's stream time (the
minimum over its input topics, see ``streams.core.clock``) advances even when no producer
writes there. A separate process rather than a timer inside the worker: ticks must be
produced even while workers rebalance or restart, and one ticker serves any number of
workers. Two tickers are harmless: stream time is a maximum, a second tick changes nothing.

If the ticker stops, deadlines stop firing and nothing else says so: it serves its own
``/metrics`` (ticks written, the time of the last delivered round, errors) and ``/healthz``
(503 once no round was delivered for ``STALE_ROUNDS`` intervals) on ``VIGIL_TICKER_HOST`` /
``VIGIL_TICKER_PORT`` (127.0.0.1:6068; port 0: no server), for Prometheus and for the
container's health check.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge

from streams.contracts.codec import AvroCodec
from streams.kafka.clients import RecordProducer
from streams.kafka.topics import Topics
from streams.read.status_http import listen_address, serve
from streams.settings import Settings

log = logging.getLogger("vigil.ticker")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6068
#: rounds without a delivered one after which the ticker reports itself unhealthy
STALE_ROUNDS = 5


def health_address(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Where the ticker serves /metrics and /healthz: the arguments, else VIGIL_TICKER_HOST
    and VIGIL_TICKER_PORT, else 127.0.0.1:6068. Port 0 turns the server off."""
    return listen_address("VIGIL_TICKER_HOST", "VIGIL_TICKER_PORT", DEFAULT_PORT, host, port)


class TickerStatus:
    """The ticker's metrics and health, shared by the tick loop and the HTTP thread."""

    def __init__(self, interval: float) -> None:
        from streams.read.metrics import register_process_collectors

        self.interval = interval
        self.registry = CollectorRegistry()
        register_process_collectors(self.registry)
        self.ticks = Counter(
            "vigil_ticker_ticks",
            "Clock ticks delivered (one per partition of every input topic and round)",
            registry=self.registry,
        )
        self.rounds = Counter(
            "vigil_ticker_rounds", "Rounds of ticks delivered", registry=self.registry
        )
        self.errors = Counter(
            "vigil_ticker_errors",
            "Rounds that failed (not delivered: logged, the next round tries again)",
            registry=self.registry,
        )
        self.last_tick = Gauge(
            "vigil_ticker_last_tick_timestamp_seconds",
            "Unix time of the last round of ticks delivered (0 before the first)",
            registry=self.registry,
        )
        Gauge(
            "vigil_ticker_interval_seconds",
            "Time between two rounds of ticks (VIGIL_TICK_INTERVAL)",
            registry=self.registry,
        ).set(interval)
        self.delivered_at: float | None = None  # monotonic

    def delivered(self, ticks: int) -> None:
        self.ticks.inc(ticks)
        self.rounds.inc()
        self.last_tick.set(time.time())
        self.delivered_at = time.monotonic()

    def healthy(self) -> tuple[bool, str]:
        """Healthy while the last delivered round is recent (``STALE_ROUNDS`` intervals, at
        least 5 s: a slow broker answer is not a stopped clock)."""
        if self.delivered_at is None:
            return False, "no round of ticks delivered yet"
        age = time.monotonic() - self.delivered_at
        if age > max(STALE_ROUNDS * self.interval, 5.0):
            return False, f"last round of ticks delivered {age:.1f} s ago"
        return True, f"last round of ticks delivered {age:.1f} s ago"


def serve_status(status: TickerStatus, host: str, port: int) -> ThreadingHTTPServer:
    """/metrics and /healthz on a daemon thread (never in the way of the tick loop)."""
    return serve(status.registry, status.healthy, host, port, thread_name="ticker-http")


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


def run_ticker(
    settings: Settings,
    codec: AvroCodec,
    count: int | None = None,
    health: tuple[str, int] | None = None,
    status: TickerStatus | None = None,
) -> int:
    """Tick every ``tick_interval`` until SIGTERM/SIGINT (or ``count`` rounds); the number
    of rounds. A round that fails is logged and counted, and the next one tries again.
    ``health``: where to serve /metrics and /healthz (None: ``health_address()``)."""
    topics = Topics.from_settings(settings).inputs()
    producer = RecordProducer(settings, codec)
    ticker_id = _ticker_id()
    interval = settings.tick_interval.total_seconds()
    status = status or TickerStatus(interval)
    host, port = health or health_address()
    server = None
    if port:
        try:
            server = serve_status(status, host, port)
            log.info("ticker metrics and health on http://%s:%s", host, port)
        except OSError as exc:  # the clock matters more than its metrics: tick anyway
            log.error("cannot serve the ticker's metrics and health on %s:%s: %s", host, port, exc)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    if threading.current_thread() is threading.main_thread():  # (signals go to the main one)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    rounds = 0
    try:
        while not stop and (count is None or rounds < count):
            now = datetime.now(UTC)
            try:
                for spec in topics:
                    producer.tick(spec.name, spec.partitions, now, ticker_id)
                producer.flush()
            except Exception:
                status.errors.inc()
                log.exception("a round of ticks was not delivered; the next one tries again")
            else:
                status.delivered(sum(spec.partitions for spec in topics))
            rounds += 1
            if count is not None and rounds >= count:
                break
            deadline = time.monotonic() + interval
            while not stop and time.monotonic() < deadline:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    return rounds
