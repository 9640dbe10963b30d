"""Settings of ``vigil console`` (environment variables; ``vigil console`` flags override them).

The Kafka, registry and topic settings are the worker's (``streams.settings.Settings``); these
are the console's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from streams.durations import parse_duration
from streams.settings import Settings, SettingsError


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


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
        since_text = _env("VIGIL_CONSOLE_ALERTS_SINCE") or "7d"
        port_text = _env("VIGIL_CONSOLE_PORT") or "6080"
        try:
            port = int(port_text)
        except ValueError:
            raise SettingsError(f"VIGIL_CONSOLE_PORT: not a port: {port_text!r}") from None
        s = cls(
            host=_env("VIGIL_CONSOLE_HOST") or "127.0.0.1",
            port=port,
            db=_env("VIGIL_CONSOLE_DB") or str(Path(settings.data_dir) / "console.sqlite3"),
            read_token=_env("VIGIL_CONSOLE_TOKEN"),
            write_token=_env("VIGIL_CONSOLE_WRITE_TOKEN"),
            alerts_since=parse_since(since_text),
        )
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})


def parse_since(text: str) -> timedelta | None:
    """``all`` or a duration (``7d``, ``36h``); refused naming the variable otherwise."""
    if text.strip().lower() == "all":
        return None
    try:
        return parse_duration(text)
    except (ValueError, OverflowError) as exc:
        raise SettingsError(f"VIGIL_CONSOLE_ALERTS_SINCE: {exc} (or 'all')") from exc
