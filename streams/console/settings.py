"""Settings of ``vigil console`` (environment variables; ``vigil console`` flags override them).

The Kafka, registry and topic settings are the worker's (``streams.settings.Settings``); these
are the console's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.durations import parse_duration
from streams.settings import Port, Settings, settings_error


@dataclass(frozen=True)
class ConsoleSettings:
    #: VIGIL_CONSOLE_HOST / VIGIL_CONSOLE_PORT — where the console listens (loopback unless told).
    host: str = "127.0.0.1"
    port: int = 6080
    #: VIGIL_CONSOLE_DB — the SQLite file of the view (default ``<data_dir>/console.sqlite3``).
    db: str = "vigil-data/console.sqlite3"
    #: VIGIL_CONSOLE_TOKEN — read token ("Authorization: Bearer"); none: reads are open.
    read_token: str | None = field(default=None, repr=False)
    #: VIGIL_CONSOLE_WRITE_TOKEN — write token (manual review); none: writes are refused.
    write_token: str | None = field(default=None, repr=False)
    #: VIGIL_CONSOLE_ALERTS_SINCE — on an empty view, how much of the non-compacted topics
    #: (approval-verdicts, reconciliation-work, alerts) is read: the records of each partition
    #: whose timestamp (event time) is within this of the partition's newest record. ``all``:
    #: from the beginning. None means ``all``.
    alerts_since: timedelta | None = timedelta(days=7)

    @classmethod
    def from_env(cls, settings: Settings, **overrides: Any) -> ConsoleSettings:
        try:
            env = _ConsoleEnvironment()
        except ValidationError as exc:
            secrets = frozenset({"VIGIL_CONSOLE_TOKEN", "VIGIL_CONSOLE_WRITE_TOKEN"})
            raise settings_error(exc, secrets) from None
        s = cls(
            host=env.host,
            port=env.port,
            db=env.db or str(Path(settings.data_dir) / "console.sqlite3"),
            read_token=env.read_token,
            write_token=env.write_token,
            alerts_since=env.alerts_since,
        )
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})


def _since(value: object) -> object:
    if not isinstance(value, str):
        return value
    if value.strip().lower() == "all":
        return None
    try:
        return parse_duration(value)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{exc} (or 'all')") from None


class _ConsoleEnvironment(BaseSettings):
    """The console's variables, typed (``streams.settings`` reads the shared ones)."""

    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True
    )

    host: str = Field("127.0.0.1", validation_alias="VIGIL_CONSOLE_HOST")
    port: Port = Field(6080, validation_alias="VIGIL_CONSOLE_PORT")
    db: str | None = Field(None, validation_alias="VIGIL_CONSOLE_DB")
    read_token: str | None = Field(None, validation_alias="VIGIL_CONSOLE_TOKEN")
    write_token: str | None = Field(None, validation_alias="VIGIL_CONSOLE_WRITE_TOKEN")
    alerts_since: Annotated[timedelta | None, BeforeValidator(_since)] = Field(
        "7d", validation_alias="VIGIL_CONSOLE_ALERTS_SINCE"
    )
