"""The three deadlines a verdict depends on (grace, heartbeat freshness, delivery
deadline), their defaults, and a request's or an action policy's partial overrides of them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, field_validator

from streams.contracts.models.base import construct, to_millis
from streams.contracts.models.outputs import Thresholds


class _Frozen(BaseModel):
    """Immutable, strict, JSON-storable (``model_dump_json`` / ``model_validate_json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _non_negative(value: timedelta | None) -> timedelta | None:
    if value is not None and value < timedelta(0):
        raise ValueError("a threshold cannot be negative")
    return value


class _NonNegative(_Frozen):
    @field_validator("*")
    @classmethod
    def _check(cls, value: timedelta | None) -> timedelta | None:
        return _non_negative(value)


class ThresholdSet(_NonNegative):
    """The three deadlines a verdict depends on, with their defaults (docs/rules.md#thresholds)."""

    grace: timedelta = timedelta(minutes=5)
    heartbeat_fresh: timedelta = timedelta(minutes=10)
    delivery_deadline: timedelta = timedelta(minutes=5)

    def record(self, evaluated_at: datetime) -> Thresholds:
        """The contract form published with every verdict (milliseconds plus evaluation time)."""
        ms = timedelta(milliseconds=1)
        values = {
            "grace_ms": self.grace // ms,
            "heartbeat_fresh_ms": self.heartbeat_fresh // ms,
            "delivery_deadline_ms": self.delivery_deadline // ms,
            "evaluated_at": evaluated_at,
        }
        if evaluated_at.tzinfo is None:
            return Thresholds(**values)  # refused, with validation's own error
        # Built without re-validation (once per evaluation): whole milliseconds are ints, and
        # the time is put in UTC milliseconds as the record's validator would.
        values["evaluated_at"] = to_millis(evaluated_at)
        return construct(Thresholds, values)


class ThresholdOverrides(_NonNegative):
    """A partial ThresholdSet: what one request or one action policy says; None = not said."""

    grace: timedelta | None = None
    heartbeat_fresh: timedelta | None = None
    delivery_deadline: timedelta | None = None


def request_overrides(
    grace_seconds: float | None,
    heartbeat_fresh_seconds: float | None,
    delivery_deadline_seconds: float | None,
) -> ThresholdOverrides:
    """Per-request thresholds as the events and snapshots carry them (seconds)."""

    def td(seconds: float | None) -> timedelta | None:
        return None if seconds is None else timedelta(seconds=seconds)

    return ThresholdOverrides(
        grace=td(grace_seconds),
        heartbeat_fresh=td(heartbeat_fresh_seconds),
        delivery_deadline=td(delivery_deadline_seconds),
    )


def _resolve(
    policy_name: str | None,
    action: str | None,
    overrides: ThresholdOverrides,
    policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None,
    defaults: ThresholdSet | None,
) -> ThresholdSet:
    """``resolve_thresholds`` for a request with this policy name, action and overrides: all
    that the answer depends on."""
    defaults = defaults or ThresholdSet()
    policy: ThresholdOverrides | ThresholdSet | None = None
    for name in (policy_name, action):
        if name is not None and policies and name in policies:
            policy = policies[name]
            break

    def pick(field: str) -> timedelta:
        for source in (overrides, policy):
            value = getattr(source, field, None) if source is not None else None
            if value is not None:
                return value  # type: ignore[no-any-return]
        return getattr(defaults, field)  # type: ignore[no-any-return]

    return ThresholdSet(
        grace=pick("grace"),
        heartbeat_fresh=pick("heartbeat_fresh"),
        delivery_deadline=pick("delivery_deadline"),
    )
