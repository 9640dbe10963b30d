"""Configuration from environment variables (CLI flags override them).

Every setting has a documented default that works with ``vigil dev up``. Secrets (SASL
password, registry credentials) are read here and never logged: ``Settings.__repr__`` masks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from streams.core.bounds import duration_problem
from streams.durations import parse_duration

if TYPE_CHECKING:
    from streams.policies import Policies

DEV_BOOTSTRAP = "127.0.0.1:19092"
DEV_REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"
SECRET_FIELDS = frozenset({"sasl_password", "registry_basic_auth", "api_token"})


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


class SettingsError(ValueError):
    """A setting is unusable; the message names its variable."""


def _flag(variable: str, default: bool = False) -> bool:
    """A yes/no setting: true/yes/on/1 or false/no/off/0, any case."""
    text = _env(variable)
    if text is None:
        return default
    value = {"true": True, "yes": True, "on": True, "1": True}.get(text.lower())
    if value is None and text.lower() not in ("false", "no", "off", "0"):
        raise SettingsError(
            f"{variable}: {text!r} is not one of true, false, yes, no, on, off, 1, 0"
        )
    return bool(value)


#: The durations the core adds to event times, with their variables, and whether zero is
#: refused (the core needs a positive operation timeout). Each is bounded like the durations
#: records carry (``streams.core.bounds``), so no sum of a time and a setting leaves the
#: range of dates the core computes with.
DOMAIN_DURATIONS = {
    "closed_retention": ("VIGIL_CLOSED_RETENTION", False),
    "grace": ("VIGIL_GRACE", False),
    "heartbeat_fresh": ("VIGIL_HEARTBEAT_FRESH", False),
    "delivery_deadline": ("VIGIL_DELIVERY_DEADLINE", False),
    "reply_timeout": ("VIGIL_REPLY_TIMEOUT", True),
    "verify_timeout": ("VIGIL_VERIFY_TIMEOUT", True),
    "orphan_after": ("VIGIL_ORPHAN_AFTER", False),
    "max_future_skew": ("VIGIL_MAX_FUTURE_SKEW", False),
}


def _duration(variable: str, default: str) -> timedelta:
    """The duration in ``variable``; a text that is none, or too large even for a timedelta,
    is refused naming the variable."""
    text = _env(variable, default)
    assert text is not None
    try:
        return parse_duration(text)
    except (ValueError, OverflowError) as exc:
        raise SettingsError(f"{variable}: {exc}") from exc


@dataclass(frozen=True)
class Settings:
    #: KAFKA_BOOTSTRAP_SERVERS — when unset, ``vigil dev up`` provides 127.0.0.1:19092.
    bootstrap_servers: str = DEV_BOOTSTRAP
    #: SCHEMA_REGISTRY_URL — Confluent-compatible API (Apicurio: .../apis/ccompat/v7).
    schema_registry_url: str = DEV_REGISTRY
    #: VIGIL_TOPIC_PREFIX — every topic name starts with it.
    topic_prefix: str = "vigil"
    #: VIGIL_OUTPUT_SUFFIX — appended to output topic names (replays write to their own set).
    output_suffix: str = ""
    #: VIGIL_PARTITIONS — partitions of every input and output topic (co-partitioned).
    partitions: int = 6
    #: VIGIL_REPLICATION_FACTOR
    replication_factor: int = 1
    #: VIGIL_APP_ID — Faust application id (consumer group, changelog topic prefix).
    app_id: str = "vigil"
    #: VIGIL_STORE — Faust table store: memory:// or rocksdb://
    store: str = "memory://"
    #: VIGIL_DATA_DIR — Faust data directory (RocksDB tables, worker state).
    data_dir: str = "vigil-data"
    #: VIGIL_WEB_HOST / VIGIL_WEB_PORT — the worker's HTTP server (API, metrics).
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    #: VIGIL_TICK_INTERVAL — how often the ticker writes clock ticks (e.g. 1s, 500ms).
    tick_interval: timedelta = timedelta(seconds=1)
    #: VIGIL_RETENTION_MS — retention of the non-compacted topics. Record timestamps are event
    #: times, so Kafka's time retention counts in event time; -1 (keep everything) by default,
    #: because a backfill or a replay of last quarter's events must not be deleted on arrival.
    retention_ms: int = -1
    #: VIGIL_CLOSED_RETENTION — how long closed executions/approvals are remembered.
    closed_retention: timedelta = timedelta(hours=24)
    #: VIGIL_GRACE, VIGIL_HEARTBEAT_FRESH, VIGIL_DELIVERY_DEADLINE — approval thresholds used
    #: when neither the request nor its action policy says otherwise.
    grace: timedelta = timedelta(minutes=5)
    heartbeat_fresh: timedelta = timedelta(minutes=10)
    delivery_deadline: timedelta = timedelta(minutes=5)
    #: VIGIL_REPLY_TIMEOUT, VIGIL_VERIFY_TIMEOUT — operation deadlines when a SENT or an
    #: ACKNOWLEDGED event carries none and its connector has no entry in the policies file.
    reply_timeout: timedelta = timedelta(seconds=30)
    verify_timeout: timedelta = timedelta(minutes=5)
    #: VIGIL_POLICIES_FILE — JSON with per-action approval thresholds and per-connector
    #: deadlines (see streams/policies.py).
    policies_file: str | None = None
    #: VIGIL_ORPHAN_AFTER — facts for an approval request that has not arrived this long after
    #: them are reported as ORPHAN_FACT anomalies and dropped.
    orphan_after: timedelta = timedelta(hours=1)
    #: VIGIL_MAX_FUTURE_SKEW — events further ahead of their partition's stream time are
    #: anomalies (a producer clock gone wrong must not drag stream time forward).
    max_future_skew: timedelta = timedelta(hours=1)
    #: VIGIL_API_TOKEN — when set, every HTTP endpoint wants "Authorization: Bearer <token>".
    api_token: str | None = field(default=None, repr=False)
    #: VIGIL_SSE_KEEPALIVE — seconds between keep-alive comments on idle SSE streams.
    sse_keepalive: float = 15.0
    #: VIGIL_BATCH_SIZE, VIGIL_BATCH_WAIT — the worker takes up to this many input records, or
    #: what came within this wait, processes them, delivers their outputs, then writes its state
    #: once for the lot: larger batches, fewer round trips; a longer wait, more latency.
    batch_size: int = 5000
    batch_wait: timedelta = timedelta(milliseconds=20)
    #: VIGIL_FETCH_BYTES — bytes the consumer fetches ahead per input partition. The fetched
    #: records wait in memory as Python objects until processed; under a backlog that is the
    #: worker's largest transient allocation, and the process keeps the memory afterwards.
    fetch_bytes: int = 256 * 1024
    #: VIGIL_FETCH_MIN_BYTES, VIGIL_FETCH_MAX_WAIT — once caught up, the broker answers the
    #: worker's fetch when it has this many bytes for it, or when the wait is over. Faust's
    #: own (one byte, 1.5 s) cost a fetch round trip per record or two under a light load:
    #: with 16 KiB and 25 ms the worker used 0.55 CPU-s per second at 2,000 events/s against
    #: 0.88, and its p99 fell from 217-237 to 199 ms. While its batches come full (a backlog)
    #: the worker asks for one byte instead, with the same wait (``agents/fetch_pace.py``).
    #: ``1`` keeps every fetch eager.
    fetch_min_bytes: int = 16 * 1024
    fetch_max_wait: timedelta = timedelta(milliseconds=25)
    #: VIGIL_MAX_HELD — events an input topic partition may have waiting for the watermark
    #: before the worker stops reading it (resumed at half). Only a topic partition ahead of
    #: the others is paused: a backlog in one topic then costs memory in proportion to this,
    #: not to the backlog (Kafka Streams' buffered.records.per.partition, in event time).
    max_held: int = 2000
    #: VIGIL_REGISTRY_RETRY_MAX, VIGIL_REGISTRY_OUTAGE_ALERT — while the schema registry cannot
    #: be asked about a record's schema, the worker waits and reads the records again, 0.5 s
    #: after the first failure, doubling up to this; an outage that lasts the alert time is
    #: logged as an error (the first failure as a warning, each counted in
    #: ``vigil_registry_unavailable_total``).
    registry_retry_max: timedelta = timedelta(seconds=30)
    registry_outage_alert: timedelta = timedelta(minutes=1)
    #: VIGIL_MAX_RECORD_FAILURES — failed batches an input record may cause (an exception in
    #: the core while it is applied, an output of it the broker refuses) before the worker
    #: sets it aside as a dead letter with a CRITICAL alert and its partition moves on.
    max_record_failures: int = 3
    #: VIGIL_SESSION_TIMEOUT — the consumer group session: a worker silent for longer loses its
    #: partitions, and a worker stopped for longer writes nothing until a heartbeat proves it
    #: a member again (``agents/lease.py``).
    session_timeout: timedelta = timedelta(seconds=30)
    #: VIGIL_STATE_GAUGES_INTERVAL — how often the open-work gauges of /metrics (executions in
    #: flight, UNKNOWN operations, open work items and approvals) are counted, off the event
    #: loop; a scrape reads the last count (``vigil_state_gauges_age_seconds``).
    state_gauges_interval: timedelta = timedelta(seconds=10)
    #: KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    #: SCHEMA_REGISTRY_BASIC_AUTH — "user:secret"
    registry_basic_auth: str | None = field(default=None, repr=False)
    #: VIGIL_AUTO_REGISTER — whether the worker and the CLI register a schema the registry
    #: lacks (a dev convenience, off by default: ``vigil schemas register`` registers them).
    auto_register: bool = False

    def __post_init__(self) -> None:
        for name, (variable, positive) in DOMAIN_DURATIONS.items():
            value = getattr(self, name)
            problem = duration_problem(value, positive=positive)
            if problem is not None:
                raise SettingsError(f"{variable} ({name}) = {value} {problem}")

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        d = cls()
        s = cls(
            bootstrap_servers=_env("KAFKA_BOOTSTRAP_SERVERS", d.bootstrap_servers),  # type: ignore[arg-type]
            schema_registry_url=_env("SCHEMA_REGISTRY_URL", d.schema_registry_url),  # type: ignore[arg-type]
            topic_prefix=_env("VIGIL_TOPIC_PREFIX", d.topic_prefix),  # type: ignore[arg-type]
            output_suffix=_env("VIGIL_OUTPUT_SUFFIX", d.output_suffix),  # type: ignore[arg-type]
            partitions=int(_env("VIGIL_PARTITIONS", str(d.partitions))),  # type: ignore[arg-type]
            replication_factor=int(_env("VIGIL_REPLICATION_FACTOR", "1")),  # type: ignore[arg-type]
            app_id=_env("VIGIL_APP_ID", d.app_id),  # type: ignore[arg-type]
            store=_env("VIGIL_STORE", d.store),  # type: ignore[arg-type]
            data_dir=_env("VIGIL_DATA_DIR", d.data_dir),  # type: ignore[arg-type]
            web_host=_env("VIGIL_WEB_HOST", d.web_host),  # type: ignore[arg-type]
            web_port=int(_env("VIGIL_WEB_PORT", str(d.web_port))),  # type: ignore[arg-type]
            tick_interval=_duration("VIGIL_TICK_INTERVAL", "1s"),
            retention_ms=int(_env("VIGIL_RETENTION_MS", "-1")),  # type: ignore[arg-type]
            closed_retention=_duration("VIGIL_CLOSED_RETENTION", "24h"),
            grace=_duration("VIGIL_GRACE", "5m"),
            heartbeat_fresh=_duration("VIGIL_HEARTBEAT_FRESH", "10m"),
            delivery_deadline=_duration("VIGIL_DELIVERY_DEADLINE", "5m"),
            reply_timeout=_duration("VIGIL_REPLY_TIMEOUT", "30s"),
            verify_timeout=_duration("VIGIL_VERIFY_TIMEOUT", "5m"),
            policies_file=_env("VIGIL_POLICIES_FILE"),
            orphan_after=_duration("VIGIL_ORPHAN_AFTER", "1h"),
            max_future_skew=_duration("VIGIL_MAX_FUTURE_SKEW", "1h"),
            api_token=_env("VIGIL_API_TOKEN"),
            sse_keepalive=float(_env("VIGIL_SSE_KEEPALIVE", "15")),  # type: ignore[arg-type]
            batch_size=int(_env("VIGIL_BATCH_SIZE", str(d.batch_size))),  # type: ignore[arg-type]
            batch_wait=_duration("VIGIL_BATCH_WAIT", "20ms"),
            fetch_bytes=int(_env("VIGIL_FETCH_BYTES", str(d.fetch_bytes))),  # type: ignore[arg-type]
            fetch_min_bytes=int(_env("VIGIL_FETCH_MIN_BYTES", str(d.fetch_min_bytes))),  # type: ignore[arg-type]
            fetch_max_wait=_duration("VIGIL_FETCH_MAX_WAIT", "25ms"),
            max_held=int(_env("VIGIL_MAX_HELD", str(d.max_held))),  # type: ignore[arg-type]
            registry_retry_max=parse_duration(_env("VIGIL_REGISTRY_RETRY_MAX", "30s")),  # type: ignore[arg-type]
            registry_outage_alert=parse_duration(_env("VIGIL_REGISTRY_OUTAGE_ALERT", "1m")),  # type: ignore[arg-type]
            max_record_failures=int(
                _env("VIGIL_MAX_RECORD_FAILURES", str(d.max_record_failures))  # type: ignore[arg-type]
            ),
            session_timeout=parse_duration(_env("VIGIL_SESSION_TIMEOUT", "30s")),  # type: ignore[arg-type]
            state_gauges_interval=parse_duration(_env("VIGIL_STATE_GAUGES_INTERVAL", "10s")),  # type: ignore[arg-type]
            security_protocol=_env("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),  # type: ignore[arg-type]
            sasl_mechanism=_env("KAFKA_SASL_MECHANISM"),
            sasl_username=_env("KAFKA_SASL_USERNAME"),
            sasl_password=_env("KAFKA_SASL_PASSWORD"),
            registry_basic_auth=_env("SCHEMA_REGISTRY_BASIC_AUTH"),
            auto_register=_flag("VIGIL_AUTO_REGISTER"),
        )
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})

    def public(self) -> dict[str, Any]:
        """Settings safe to print: secrets masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = "***" if f.name in SECRET_FIELDS and value else value
        return out

    def policies(self) -> Policies:
        from streams.policies import load_policies

        return load_policies(
            self.policies_file,
            grace=self.grace,
            heartbeat_fresh=self.heartbeat_fresh,
            delivery_deadline=self.delivery_deadline,
            reply_timeout=self.reply_timeout,
            verify_timeout=self.verify_timeout,
        )

    def confluent_conf(self) -> dict[str, Any]:
        """librdkafka settings for confluent-kafka clients (CLI, ticker, tests)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password
        return conf
