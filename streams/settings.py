"""Configuration from environment variables (CLI flags override them).

Every setting has a documented default that works with ``vigil dev up``. Secrets (SASL
password, registry credentials) are read here and never logged: ``Settings.__repr__`` masks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any

from streams.durations import parse_duration

DEV_BOOTSTRAP = "127.0.0.1:19092"
DEV_REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"
SECRET_FIELDS = frozenset({"sasl_password", "registry_basic_auth"})


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


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
    #: KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    #: SCHEMA_REGISTRY_BASIC_AUTH — "user:secret"
    registry_basic_auth: str | None = field(default=None, repr=False)

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
            tick_interval=parse_duration(_env("VIGIL_TICK_INTERVAL", "1s")),  # type: ignore[arg-type]
            retention_ms=int(_env("VIGIL_RETENTION_MS", "-1")),  # type: ignore[arg-type]
            closed_retention=parse_duration(_env("VIGIL_CLOSED_RETENTION", "24h")),  # type: ignore[arg-type]
            security_protocol=_env("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),  # type: ignore[arg-type]
            sasl_mechanism=_env("KAFKA_SASL_MECHANISM"),
            sasl_username=_env("KAFKA_SASL_USERNAME"),
            sasl_password=_env("KAFKA_SASL_PASSWORD"),
            registry_basic_auth=_env("SCHEMA_REGISTRY_BASIC_AUTH"),
        )
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})

    def public(self) -> dict[str, Any]:
        """Settings safe to print: secrets masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = "***" if f.name in SECRET_FIELDS and value else value
        return out

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
