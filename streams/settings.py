"""Configuration from environment variables (CLI flags override them).

Every variable is read by one typed model (``_Environment``, pydantic-settings), so a bad value
is refused at start with a ``SettingsError`` that names the variable, what it holds and what is
allowed. Durations are written the same way everywhere (``24h``, ``30s``, ``500ms``; a bare
number is seconds). Every setting has a documented default that works with ``vigil dev up``.
Secrets (SASL password, OAuth client secret, key password, registry credentials, API token)
are never logged: ``Settings.__repr__`` leaves them out and ``Settings.public`` masks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.core.bounds import duration_problem
from streams.durations import parse_duration

if TYPE_CHECKING:
    from streams.policies import Policies

DEV_BOOTSTRAP = "127.0.0.1:19092"
DEV_REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"
SECRET_FIELDS = frozenset(
    {
        "sasl_password",
        "registry_basic_auth",
        "api_token",
        "ssl_key_password",
        "oauth_client_secret",
    }
)
#: Kafka's ``security.protocol`` values and the SASL mechanisms vigil configures.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    """How to reach the schema registry: the connection part of the settings, in the terms
    of confluent's client."""

    url: str
    basic_auth: str | None = None  # "user:secret"; never logged
    #: seconds one HTTP request to the registry may take (connect, read). The worker decodes
    #: on its event loop: without a bound, a registry that does not answer stalls everything.
    timeout: float = 5.0
    #: the client's own retries, for a blip (100 ms, then up to 500 ms apart); an outage is
    #: waited out by the caller (the worker backs off and reads the records again)
    max_retries: int = 1
    #: TLS of an https registry in confluent's keys (``ssl.ca.location``,
    #: ``ssl.certificate.location``, ``ssl.key.location``): ``Settings.registry_tls``
    tls: tuple[tuple[str, str], ...] = ()

    def client_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "url": self.url,
            "timeout": self.timeout,
            "max.retries": self.max_retries,
            "retries.wait.ms": 100,
            "retries.max.wait.ms": 500,
        }
        if self.basic_auth:
            conf["basic.auth.user.info"] = self.basic_auth
        conf.update(self.tls)
        return conf


class SettingsError(ValueError):
    """A setting is unusable; the message names its variable."""


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
    "anomaly_alert_ttl": ("VIGIL_ANOMALY_ALERT_TTL", True),
    "claims_grace": ("VIGIL_CLAIMS_GRACE", False),
    "max_future_skew": ("VIGIL_MAX_FUTURE_SKEW", False),
    "allowed_lateness": ("VIGIL_ALLOWED_LATENESS", False),
}


def _to_duration(value: object) -> object:
    """A text read as a duration (``parse_duration``); one too large even for a timedelta is
    refused like any other bad text."""
    if not isinstance(value, str):
        return value
    try:
        return parse_duration(value)
    except OverflowError:
        raise ValueError(f"too long a duration: {value!r}") from None


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be longer than zero (examples: 500ms, 15s, 1m)")
    return value


def _existing_file(value: str | None) -> str | None:
    if value is not None and not Path(value).is_file():
        raise ValueError(f"no such file: {value}")
    return value


def _upper(value: object) -> object:
    return value.strip().upper() if isinstance(value, str) else value


def _retention_ms(value: object) -> object:
    """``forever`` (Kafka's -1) or a positive duration, as Kafka's ``retention.ms``."""
    if not isinstance(value, str):
        return value
    if value.strip().lower() == "forever":
        return -1
    duration = _to_duration(value)
    assert isinstance(duration, timedelta)
    ms = duration // timedelta(milliseconds=1)
    if ms <= 0:
        raise ValueError("must be 'forever' or a positive duration (examples: 7d, 720h)")
    return ms


Duration = Annotated[timedelta, BeforeValidator(_to_duration)]
PositiveDuration = Annotated[timedelta, BeforeValidator(_to_duration), AfterValidator(_positive)]
ExistingFile = Annotated[str | None, AfterValidator(_existing_file)]
Count = Annotated[int, Field(ge=1)]
#: The bounds of ``VIGIL_MAX_ENTRY_BYTES``: an entry of an execution with a few facts must fit;
#: the upper one is below nine tenths of what a changelog record carries by default (Faust's
#: producer sends 1,000,000 bytes a request; the record's key and framing need some).
MIN_ENTRY_BYTES = 4096
MAX_ENTRY_BYTES = 890_000
Port = Annotated[int, Field(ge=0, le=65535)]


def _var(name: str, default: Any = None, **kw: Any) -> Any:
    return Field(default, validation_alias=name, **kw)


class _Environment(BaseSettings):
    """What the environment says, typed; field names are ``Settings``' (each read from the
    variable its alias names). Unset or empty variables take the default."""

    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True
    )

    bootstrap_servers: str = _var("KAFKA_BOOTSTRAP_SERVERS", DEV_BOOTSTRAP)
    schema_registry_url: str = _var("SCHEMA_REGISTRY_URL", DEV_REGISTRY)
    topic_prefix: str = _var("VIGIL_TOPIC_PREFIX", "vigil")
    output_suffix: str = _var("VIGIL_OUTPUT_SUFFIX", "")
    partitions: Count = _var("VIGIL_PARTITIONS", 6)
    replication_factor: Count | None = _var("VIGIL_REPLICATION_FACTOR")
    min_insync_replicas: Count | None = _var("VIGIL_MIN_INSYNC_REPLICAS")
    app_id: str = _var("VIGIL_APP_ID", "vigil")
    store: str = _var("VIGIL_STORE", "memory://")
    data_dir: str = _var("VIGIL_DATA_DIR", "vigil-data")
    web_host: str = _var("VIGIL_WEB_HOST", "127.0.0.1")
    web_port: Port = _var("VIGIL_WEB_PORT", 6066)
    tick_interval: PositiveDuration = _var("VIGIL_TICK_INTERVAL", "1s")
    retention: Annotated[int | None, BeforeValidator(_retention_ms)] = _var("VIGIL_RETENTION")
    retention_ms_old: Annotated[int | None, Field(ge=-1)] = _var("VIGIL_RETENTION_MS")
    closed_retention: Duration = _var("VIGIL_CLOSED_RETENTION", "24h")
    grace: Duration = _var("VIGIL_GRACE", "5m")
    heartbeat_fresh: Duration = _var("VIGIL_HEARTBEAT_FRESH", "10m")
    delivery_deadline: Duration = _var("VIGIL_DELIVERY_DEADLINE", "5m")
    reply_timeout: Duration = _var("VIGIL_REPLY_TIMEOUT", "30s")
    verify_timeout: Duration = _var("VIGIL_VERIFY_TIMEOUT", "5m")
    policies_file: str | None = _var("VIGIL_POLICIES_FILE")
    orphan_after: Duration = _var("VIGIL_ORPHAN_AFTER", "1h")
    anomaly_alert_ttl: Duration = _var("VIGIL_ANOMALY_ALERT_TTL", "1h")
    claims_grace: Duration = _var("VIGIL_CLAIMS_GRACE", "0s")
    max_future_skew: Duration = _var("VIGIL_MAX_FUTURE_SKEW", "1h")
    allowed_lateness: Duration = _var("VIGIL_ALLOWED_LATENESS", "0s")
    api_token: str | None = _var("VIGIL_API_TOKEN")
    sse_keepalive: PositiveDuration = _var("VIGIL_SSE_KEEPALIVE", "15s")
    batch_size: Count = _var("VIGIL_BATCH_SIZE", 1000)
    batch_wait: Duration = _var("VIGIL_BATCH_WAIT", "20ms")
    fetch_bytes: Count = _var("VIGIL_FETCH_BYTES", 256 * 1024)
    fetch_min_bytes: Count = _var("VIGIL_FETCH_MIN_BYTES", 16 * 1024)
    fetch_max_wait: Duration = _var("VIGIL_FETCH_MAX_WAIT", "25ms")
    max_held: Count = _var("VIGIL_MAX_HELD", 2000)
    registry_retry_max: PositiveDuration = _var("VIGIL_REGISTRY_RETRY_MAX", "30s")
    registry_outage_alert: Duration = _var("VIGIL_REGISTRY_OUTAGE_ALERT", "1m")
    max_record_failures: Count = _var("VIGIL_MAX_RECORD_FAILURES", 3)
    max_entry_bytes: Annotated[int, Field(ge=MIN_ENTRY_BYTES, le=MAX_ENTRY_BYTES)] = _var(
        "VIGIL_MAX_ENTRY_BYTES", 512 * 1024
    )
    state_cache_mb: Annotated[int, Field(ge=0)] = _var("VIGIL_STATE_CACHE_MB", 8)
    session_timeout: PositiveDuration = _var("VIGIL_SESSION_TIMEOUT", "30s")
    state_gauges_interval: PositiveDuration = _var("VIGIL_STATE_GAUGES_INTERVAL", "10s")
    security_protocol: Annotated[
        Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"], BeforeValidator(_upper)
    ] = _var("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    sasl_mechanism: Annotated[
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None,
        BeforeValidator(_upper),
    ] = _var("KAFKA_SASL_MECHANISM")
    sasl_username: str | None = _var("KAFKA_SASL_USERNAME")
    sasl_password: str | None = _var("KAFKA_SASL_PASSWORD")
    oauth_token_url: str | None = _var("KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL")
    oauth_client_id: str | None = _var("KAFKA_SASL_OAUTHBEARER_CLIENT_ID")
    oauth_client_secret: str | None = _var("KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET")
    oauth_scope: str | None = _var("KAFKA_SASL_OAUTHBEARER_SCOPE")
    ssl_ca_file: ExistingFile = _var("KAFKA_SSL_CA_FILE")
    ssl_cert_file: ExistingFile = _var("KAFKA_SSL_CERT_FILE")
    ssl_key_file: ExistingFile = _var("KAFKA_SSL_KEY_FILE")
    ssl_key_password: str | None = _var("KAFKA_SSL_KEY_PASSWORD")
    registry_basic_auth: str | None = _var("SCHEMA_REGISTRY_BASIC_AUTH")
    registry_ssl_ca_file: ExistingFile = _var("SCHEMA_REGISTRY_SSL_CA_FILE")
    registry_ssl_cert_file: ExistingFile = _var("SCHEMA_REGISTRY_SSL_CERT_FILE")
    registry_ssl_key_file: ExistingFile = _var("SCHEMA_REGISTRY_SSL_KEY_FILE")
    auto_register: bool = _var("VIGIL_AUTO_REGISTER", False)


#: The variable of each setting read from the environment.
VARIABLES: dict[str, str] = {
    name: str(info.validation_alias) for name, info in _Environment.model_fields.items()
}


def _problem(error: Any) -> str:
    """One validation error in words that say what is allowed, without library URLs."""
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "int_parsing":
        return "not a whole number"
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    if kind == "bool_parsing":
        return "not one of true, false, yes, no, on, off, 1, 0"
    return str(error["msg"])


def settings_error(exc: ValidationError, secrets: frozenset[str] = frozenset()) -> SettingsError:
    """A ``SettingsError`` naming each refused variable, its value (never a secret's) and
    what the variable takes."""
    lines = []
    for error in exc.errors():
        variable = str(error["loc"][0]) if error["loc"] else "settings"
        shown = "" if variable in secrets else f"={error['input']!r}"
        lines.append(f"{variable}{shown}: {_problem(error)}")
    return SettingsError("; ".join(lines))


def read_environment() -> _Environment:
    """The environment's settings, or a ``SettingsError`` naming every variable refused."""
    try:
        return _Environment()
    except ValidationError as exc:
        raise settings_error(exc, frozenset(VARIABLES[name] for name in SECRET_FIELDS)) from None


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
    #: VIGIL_REPLICATION_FACTOR, VIGIL_MIN_INSYNC_REPLICAS — replicas of every topic vigil
    #: creates (its own and its tables' changelogs) and their ``min.insync.replicas``. Unset
    #: (None): decided from the brokers the cluster reports when the topics are created
    #: (``streams.kafka.topics.replication``): three replicas, two in sync, on three brokers
    #: or more; one replica per broker, one in sync, on fewer.
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
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
    #: VIGIL_RETENTION — retention of the non-compacted topics: ``forever`` (the default) or a
    #: duration (``30d``), kept here in Kafka's ``retention.ms`` (-1: forever). Record
    #: timestamps are event times, so Kafka's time retention counts in event time; forever by
    #: default, because a backfill or a replay of last quarter's events must not be deleted on
    #: arrival. The older ``VIGIL_RETENTION_MS`` (milliseconds, -1 forever) is read when
    #: ``VIGIL_RETENTION`` is unset.
    retention_ms: int = -1
    #: VIGIL_CLOSED_RETENTION — how long closed executions/approvals are remembered.
    closed_retention: timedelta = timedelta(hours=24)
    #: VIGIL_GRACE, VIGIL_HEARTBEAT_FRESH, VIGIL_DELIVERY_DEADLINE — approval thresholds used
    #: when neither the request nor its action policy says otherwise (docs/rules.md#thresholds).
    grace: timedelta = timedelta(minutes=5)
    heartbeat_fresh: timedelta = timedelta(minutes=10)
    delivery_deadline: timedelta = timedelta(minutes=5)
    #: VIGIL_REPLY_TIMEOUT, VIGIL_VERIFY_TIMEOUT — operation deadlines when a SENT or an
    #: ACKNOWLEDGED event carries none and its connector has no entry in the policies file
    #: (docs/rules.md#deadlines).
    reply_timeout: timedelta = timedelta(seconds=30)
    verify_timeout: timedelta = timedelta(minutes=5)
    #: VIGIL_POLICIES_FILE — JSON with per-action approval thresholds and per-connector
    #: deadlines (see streams/policies.py).
    policies_file: str | None = None
    #: VIGIL_ORPHAN_AFTER — facts for an approval request that has not arrived this long after
    #: them are reported as ORPHAN_FACT anomalies and dropped.
    orphan_after: timedelta = timedelta(hours=1)
    #: VIGIL_ANOMALY_ALERT_TTL — how long, in stream time, an ANOMALY alert stays firing: it
    #: ends this long after the anomaly's time (docs/rules.md#alert-lifecycle). An anomaly is
    #: an input refused, not a condition that can go away, so time is what ends its alert.
    anomaly_alert_ttl: timedelta = timedelta(hours=1)
    #: VIGIL_CLAIMS_GRACE — how far behind the claims partition's watermark a claim may come
    #: and still be judged as if in order (docs/rules.md#blind-retries-across-executions): a
    #: send is decided once the watermark is past it plus this.
    claims_grace: timedelta = timedelta(0)
    #: VIGIL_MAX_FUTURE_SKEW — events further ahead of their partition's stream time are
    #: anomalies (a producer clock gone wrong must not drag stream time forward).
    max_future_skew: timedelta = timedelta(hours=1)
    #: VIGIL_ALLOWED_LATENESS — how far an event may sit behind its own topic partition's time
    #: (the largest event time written before it there, ticks included) and still be judged at
    #: its own time. Every decision waits this long in stream time for such stragglers; an
    #: event further behind is late, and takes its place at that time minus the lateness
    #: (docs/rules.md#time). Zero by default: nothing waits, and an event written behind any
    #: newer record of its topic partition is late.
    allowed_lateness: timedelta = timedelta(0)
    #: VIGIL_API_TOKEN — when set, every HTTP endpoint wants "Authorization: Bearer <token>".
    api_token: str | None = field(default=None, repr=False)
    #: VIGIL_SSE_KEEPALIVE — time between keep-alive comments on idle SSE streams (a bare
    #: number is seconds).
    sse_keepalive: timedelta = timedelta(seconds=15)
    #: VIGIL_BATCH_SIZE, VIGIL_BATCH_WAIT — the worker takes up to this many input records, or
    #: what came within this wait, processes them, delivers their outputs, then writes its state
    #: once for the lot: larger batches, fewer round trips; a longer wait, more latency. What a
    #: batch holds until its checkpoint is memory the allocator keeps afterwards: at 100,000
    #: executions in flight, 5,000-record batches left the worker about 1 KiB per execution
    #: larger than 1,000-record ones, which are as fast now that entries stay decoded across
    #: batches (BENCHMARKS.md, issue 30 step 5).
    batch_size: int = 1000
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
    #: the worker asks for one byte instead, with the same wait (``vigil_worker/fetch_pace.py``).
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
    #: VIGIL_MAX_ENTRY_BYTES — the largest an execution's packed table entry may grow to by
    #: an input: an input that would take it further is quarantined (a dead letter and a
    #: CRITICAL alert), since an entry is one changelog record and Kafka refuses a record
    #: larger than its maximum message size for ever. At most 890,000: Faust's producer
    #: sends at most 1,000,000 bytes a request, and what deadlines add after the last input,
    #: and the input positions the live worker keeps, need room above the bound. A worker
    #: whose changelog topic takes less (``max.message.bytes``) keeps entries within nine
    #: tenths of what it takes, and logs an error saying so.
    max_entry_bytes: int = 512 * 1024
    #: VIGIL_STATE_CACHE_MB — what the execution entries kept decoded between batches may
    #: weigh (estimated; 0: none kept), and as much again the claims join's books. An execution
    #: whose inputs span many batches is then unpacked and decoded once, not once per batch: a
    #: fixed amount of memory, whatever the number of executions in flight
    #: (``streams.engine.state.ExecutionStore``, ``vigil_worker.claims.ClaimsStage``).
    state_cache_mb: int = 8
    #: VIGIL_SESSION_TIMEOUT — the consumer group session: a worker silent for longer loses its
    #: partitions, and a worker stopped for longer writes nothing until a heartbeat proves it
    #: a member again (``vigil_worker/lease.py``).
    session_timeout: timedelta = timedelta(seconds=30)
    #: VIGIL_STATE_GAUGES_INTERVAL — how often the open-work gauges of /metrics (executions in
    #: flight, UNKNOWN operations, open work items and approvals) are counted, off the event
    #: loop; a scrape reads the last count (``vigil_state_gauges_age_seconds``).
    state_gauges_interval: timedelta = timedelta(seconds=10)
    #: KAFKA_SECURITY_PROTOCOL — PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: str = "PLAINTEXT"
    #: KAFKA_SASL_MECHANISM — PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (with KAFKA_SASL_USERNAME and
    #: KAFKA_SASL_PASSWORD) or OAUTHBEARER (with the KAFKA_SASL_OAUTHBEARER_* below).
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    #: KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL, KAFKA_SASL_OAUTHBEARER_CLIENT_ID,
    #: KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET, KAFKA_SASL_OAUTHBEARER_SCOPE — OAuth 2 client
    #: credentials: every client fetches its token from the endpoint and fetches a new one
    #: before it expires (``streams.kafka.security``).
    oauth_token_url: str | None = None
    oauth_client_id: str | None = None
    oauth_client_secret: str | None = field(default=None, repr=False)
    oauth_scope: str | None = None
    #: KAFKA_SSL_CA_FILE — PEM file of the CA(s) that signed the brokers' certificates (default:
    #: the system's trust store); KAFKA_SSL_CERT_FILE, KAFKA_SSL_KEY_FILE, KAFKA_SSL_KEY_PASSWORD
    #: — a client certificate (PEM) and its key, for brokers that authenticate clients by TLS.
    ssl_ca_file: str | None = None
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    #: SCHEMA_REGISTRY_BASIC_AUTH — "user:secret"
    registry_basic_auth: str | None = field(default=None, repr=False)
    #: SCHEMA_REGISTRY_SSL_CA_FILE, SCHEMA_REGISTRY_SSL_CERT_FILE, SCHEMA_REGISTRY_SSL_KEY_FILE —
    #: the same for an https registry (its CA is not taken from KAFKA_SSL_CA_FILE: the registry
    #: is often signed by another CA).
    registry_ssl_ca_file: str | None = None
    registry_ssl_cert_file: str | None = None
    registry_ssl_key_file: str | None = None
    #: VIGIL_AUTO_REGISTER — whether the worker and the CLI register a schema the registry
    #: lacks (a dev convenience, off by default: ``vigil schemas register`` registers them).
    auto_register: bool = False

    def __post_init__(self) -> None:
        for name, (variable, positive) in DOMAIN_DURATIONS.items():
            value = getattr(self, name)
            problem = duration_problem(value, positive=positive)
            if problem is not None:
                raise SettingsError(f"{variable} ({name}) = {value} {problem}")
        problem = self.security_problem()
        if problem is not None:
            raise SettingsError(problem)
        factor, in_sync = self.replication_factor, self.min_insync_replicas
        if factor is not None and in_sync is not None and in_sync > factor:
            raise SettingsError(
                f"VIGIL_MIN_INSYNC_REPLICAS={in_sync} is more than VIGIL_REPLICATION_FACTOR="
                f"{factor}: no write could ever be acknowledged"
            )

    def security_problem(self) -> str | None:
        """What makes the TLS and SASL settings unusable together, naming the variables."""
        protocol, mechanism = self.security_protocol, self.sasl_mechanism
        if protocol not in SECURITY_PROTOCOLS:
            return f"KAFKA_SECURITY_PROTOCOL={protocol!r}: must be one of {SECURITY_PROTOCOLS}"
        if protocol.startswith("SASL_"):
            if mechanism not in SASL_MECHANISMS:
                return (
                    f"KAFKA_SASL_MECHANISM: KAFKA_SECURITY_PROTOCOL={protocol} needs one of "
                    f"{', '.join(SASL_MECHANISMS)}"
                )
            if mechanism == "OAUTHBEARER":
                wanted = {
                    "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": self.oauth_token_url,
                    "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": self.oauth_client_id,
                    "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": self.oauth_client_secret,
                }
            else:
                wanted = {
                    "KAFKA_SASL_USERNAME": self.sasl_username,
                    "KAFKA_SASL_PASSWORD": self.sasl_password,
                }
            missing = [variable for variable, value in wanted.items() if not value]
            if missing:
                return f"{', '.join(missing)}: needed with KAFKA_SASL_MECHANISM={mechanism}"
        elif mechanism:
            return (
                f"KAFKA_SASL_MECHANISM={mechanism}: KAFKA_SECURITY_PROTOCOL={protocol} uses no "
                "SASL (set it to SASL_SSL or SASL_PLAINTEXT)"
            )
        if not protocol.endswith("SSL"):
            for variable, value in (
                ("KAFKA_SSL_CA_FILE", self.ssl_ca_file),
                ("KAFKA_SSL_CERT_FILE", self.ssl_cert_file),
                ("KAFKA_SSL_KEY_FILE", self.ssl_key_file),
            ):
                if value:
                    return (
                        f"{variable}: KAFKA_SECURITY_PROTOCOL={protocol} uses no TLS (set it "
                        "to SSL or SASL_SSL)"
                    )
        for prefix, cert, key in (
            ("KAFKA_SSL", self.ssl_cert_file, self.ssl_key_file),
            ("SCHEMA_REGISTRY_SSL", self.registry_ssl_cert_file, self.registry_ssl_key_file),
        ):
            if bool(cert) != bool(key):
                return f"{prefix}_CERT_FILE and {prefix}_KEY_FILE: set both or neither"
        registry_tls = self.registry_ssl_ca_file or self.registry_ssl_cert_file
        if registry_tls and not self.schema_registry_url.startswith("https://"):
            return (
                "SCHEMA_REGISTRY_SSL_*: SCHEMA_REGISTRY_URL is not an https:// URL "
                f"({self.schema_registry_url})"
            )
        return None

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """The settings of the environment, with ``overrides`` (the CLI's flags; None: not
        given) taking precedence."""
        env = read_environment()
        values = env.model_dump(exclude={"retention", "retention_ms_old"})
        if env.retention is not None:
            values["retention_ms"] = env.retention
        elif env.retention_ms_old is not None:
            values["retention_ms"] = env.retention_ms_old
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

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
        if self.sasl_mechanism == "OAUTHBEARER":
            # librdkafka fetches the token itself (client credentials grant) and refreshes it
            conf.update(
                {
                    "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.token.endpoint.url": self.oauth_token_url,
                    "sasl.oauthbearer.client.id": self.oauth_client_id,
                    "sasl.oauthbearer.client.secret": self.oauth_client_secret,
                }
            )
            if self.oauth_scope:
                conf["sasl.oauthbearer.scope"] = self.oauth_scope
        for key, value in (
            ("ssl.ca.location", self.ssl_ca_file),
            ("ssl.certificate.location", self.ssl_cert_file),
            ("ssl.key.location", self.ssl_key_file),
            ("ssl.key.password", self.ssl_key_password),
        ):
            if value:
                conf[key] = value
        return conf

    def registry_config(self) -> RegistryConfig:
        """The schema-registry client's settings: URL, credentials and TLS."""
        return RegistryConfig(
            self.schema_registry_url,
            self.registry_basic_auth,
            tls=tuple(self.registry_tls().items()),
        )

    def registry_tls(self) -> dict[str, str]:
        """The TLS settings of the schema-registry client, in confluent's keys."""
        return {
            key: value
            for key, value in (
                ("ssl.ca.location", self.registry_ssl_ca_file),
                ("ssl.certificate.location", self.registry_ssl_cert_file),
                ("ssl.key.location", self.registry_ssl_key_file),
            )
            if value
        }
