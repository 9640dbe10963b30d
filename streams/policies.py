"""Per-action approval thresholds and per-connector operation deadlines, from configuration:
the middle of the three sources a threshold comes from (docs/rules.md#thresholds).

A low-risk preview may resume in seconds while a production change waits for a maintenance
window on purpose, and an SMS gateway answers in seconds while a bank transfer is verified in
hours: one global threshold would turn both into false alarms or missed ones. The file
(``VIGIL_POLICIES_FILE``) is JSON::

    {"approval_policies": {"deploy": {"grace": "2h", "heartbeat_fresh": "30m",
                                      "delivery_deadline": "10m"}},
     "connectors": {"sms": {"reply_timeout": "10s", "verify_timeout": "2m"}}}

Durations take the forms of ``streams.durations.parse_duration``; every field is optional.
Each is bounded as the durations records carry are (``streams.core.bounds``): at most 365
days, never negative, and a connector timeout more than zero; one outside is refused at load
with the file, the entry and the field named, as are the defaults passed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from streams.core.approvals import ThresholdOverrides, ThresholdSet
from streams.core.bounds import duration_problem
from streams.core.operations import OperationConfig
from streams.durations import parse_duration


class _Durations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: fields that must be more than zero (the core needs a positive operation timeout)
    positive_fields: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _parse(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        try:
            duration = parse_duration(str(value))
        except OverflowError as exc:  # digits beyond what a timedelta holds
            raise ValueError(f"{value!r} is beyond any usable duration") from exc
        problem = duration_problem(duration, positive=info.field_name in cls.positive_fields)
        if problem is not None:
            raise ValueError(f"{value!r} {problem}")
        return duration


class _ApprovalPolicy(_Durations):
    grace: timedelta | None = None
    heartbeat_fresh: timedelta | None = None
    delivery_deadline: timedelta | None = None


class _Connector(_Durations):
    positive_fields: ClassVar[frozenset[str]] = frozenset({"reply_timeout", "verify_timeout"})
    reply_timeout: timedelta | None = None
    verify_timeout: timedelta | None = None


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    approval_policies: dict[str, _ApprovalPolicy] = {}
    connectors: dict[str, _Connector] = {}


@dataclass(frozen=True)
class Policies:
    thresholds: ThresholdSet = field(default_factory=ThresholdSet)
    approval_policies: dict[str, ThresholdOverrides] = field(default_factory=dict)
    operations: OperationConfig = field(default_factory=OperationConfig)


class PolicyError(ValueError):
    """The policies file is unreadable or invalid; the message says where."""


def load_policies(
    path: str | Path | None,
    *,
    grace: timedelta,
    heartbeat_fresh: timedelta,
    delivery_deadline: timedelta,
    reply_timeout: timedelta,
    verify_timeout: timedelta,
) -> Policies:
    """Defaults from settings, refined per action policy and per connector by the file."""
    defaults = dict(
        grace=grace,
        heartbeat_fresh=heartbeat_fresh,
        delivery_deadline=delivery_deadline,
        reply_timeout=reply_timeout,
        verify_timeout=verify_timeout,
    )
    for name, value in defaults.items():
        problem = duration_problem(value, positive=name in _Connector.positive_fields)
        if problem is not None:
            raise PolicyError(f"default {name} = {value} {problem}")
    parsed = _PolicyFile()
    if path:
        try:
            parsed = _PolicyFile.model_validate(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, ValidationError, ValueError) as exc:
            raise PolicyError(f"policies file {path}: {exc}") from exc
    overrides = {
        connector: (c.reply_timeout or reply_timeout, c.verify_timeout or verify_timeout)
        for connector, c in parsed.connectors.items()
    }
    return Policies(
        thresholds=ThresholdSet(
            grace=grace, heartbeat_fresh=heartbeat_fresh, delivery_deadline=delivery_deadline
        ),
        approval_policies={
            name: ThresholdOverrides(**p.model_dump())
            for name, p in parsed.approval_policies.items()
        },
        operations=OperationConfig(
            reply_timeout=reply_timeout, verify_timeout=verify_timeout, overrides=overrides
        ),
    )
