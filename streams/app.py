"""The Faust application: configuration of the worker, its tables and its agent."""

from __future__ import annotations

import logging

import faust

from streams.contracts.codec import AvroCodec
from streams.kafka.security import broker_credentials
from streams.settings import Settings

log = logging.getLogger("vigil")


def create_app(settings: Settings, codec: AvroCodec | None = None) -> faust.App:
    """A Faust app with vigil's agent registered.

    at-least-once (Faust flushes the producer before committing offsets) with deterministic
    output ids; Faust's ``exactly_once`` has open bugs (topology.md, Delivery guarantee). One
    agent, concurrency 1: with more, Faust may commit past a record still being processed.

    The topics Faust creates (the tables' changelogs, its leader topic) are replicated as
    vigil's own (``with_replication``: decided from the cluster's brokers unless set).
    """
    from streams.kafka.admin import with_replication

    settings = with_replication(settings)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap_servers}",
        broker_credentials=broker_credentials(settings),
        store=settings.store,
        datadir=settings.data_dir,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        processing_guarantee="at_least_once",
        broker_session_timeout=settings.session_timeout.total_seconds(),
        consumer_auto_offset_reset="earliest",
        web_host=settings.web_host,
        web_bind=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        autodiscover=False,
        table_cleanup_interval=60.0,
        producer_acks=-1,
        # What the consumer holds fetched but unprocessed: at most one batch handed over per
        # poll, and ``fetch_bytes`` read ahead per partition (memory per in-flight execution,
        # BENCHMARKS.md).
        broker_max_poll_records=settings.batch_size,
        consumer_max_fetch_size=settings.fetch_bytes,
        # Events held for the watermark are unacknowledged on purpose; on a rebalance they are
        # dropped from memory and redelivered to the new owner, so there is nothing to wait for.
        stream_wait_empty=False,
        # Faust's own views expose table data and cluster topology without authentication.
        web_tables_enabled=False,
        web_router_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
    )
    from vigil_worker.pipeline import register

    codec = codec or AvroCodec.connect(
        settings.registry_config(),
        auto_register=settings.auto_register,
    )
    register(app, settings, codec)
    return app


def tune_gc() -> None:
    """Fewer garbage collections for a process that turns records into short-lived objects.

    Why: every record builds a handful of pydantic models and dicts; with CPython's default
    gen-0 threshold (700 allocations) the collector runs every few records and walks every
    young object, about 15 % of the processor's time. Almost nothing vigil allocates is
    cyclic, so collecting every 50,000 allocations costs little memory. ``gc.freeze`` moves what
    start-up built (modules, schemas, the app) out of the collector's sight for good."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def quiet_timer_drift(loglevel: str) -> None:
    """Below debug level, mode's "Timer ... woke up too late" lines are not logged.

    Why: the worker processes a batch in one go, so under a backlog each batch holds the event
    loop for up to a second or two, every Faust timer wakes late, and mode logs each at INFO:
    one line a second or more, for as long as the backlog lasts, saying nothing an operator
    can act on (lag and batch metrics say it better). ``--loglevel debug`` keeps them."""
    level = logging.getLevelName(loglevel.upper())
    if not isinstance(level, int) or level > logging.DEBUG:
        logging.getLogger("mode.timers").setLevel(logging.WARNING)


def run_worker(settings: Settings, loglevel: str = "info") -> None:
    """Run one worker in the foreground until SIGINT/SIGTERM (Faust handles both)."""
    from faust.worker import Worker

    app = create_app(settings)
    tune_gc()
    quiet_timer_drift(loglevel)
    log.info("vigil worker starting with %s", settings.public())
    Worker(app, loglevel=loglevel).execute_from_commandline()
