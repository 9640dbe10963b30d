"""What is known about one approval request: the minimum kept of the request itself and
every fact about it (deliveries, acknowledgements, decisions, receipts, the execution's digest
changes and heartbeats), each collection canonical; and the thresholds that apply to it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar

from pydantic import AwareDatetime, field_validator

from streams.contracts.models.base import to_millis
from streams.contracts.models.enums import (
    DecisionCode,
    DeliveryOutcome,
    Risk,
)
from streams.core.approvals.thresholds import (
    ThresholdOverrides,
    ThresholdSet,
    _Frozen,
    _resolve,
)
from streams.core.approvals.vocabulary import _EARLIEST

#: A fact's time; None = unknown, but known to have happened before the evaluation.
FactTime = AwareDatetime | None


def _utc_ms(value: Any) -> Any:
    """Times as the contracts hold them (UTC, milliseconds), so that stored facts, change
    points and published ``evaluated_at`` all agree to the millisecond."""
    return to_millis(value) if isinstance(value, datetime) else value


def _sort_key(time: datetime | None) -> tuple[bool, datetime]:
    return (time is not None, time or _EARLIEST)


T = TypeVar("T")


def _canonical(items: Iterable[T], key: Callable[[T], Any]) -> tuple[T, ...]:
    """Sorted and without duplicates: the same facts in any order make the same value."""
    return tuple(sorted(set(items), key=key))


class _TimedModel(_Frozen):
    @field_validator("*")
    @classmethod
    def _times(cls, value: Any) -> Any:
        return _utc_ms(value)


class RequestPart(_TimedModel):
    """What the ``ApprovalRequested`` event said. Only the minimum is kept (as specified):
    route reference, digest, handle reference and times — no raw request, no personal data.

    ``risk`` None means unknown and is judged like HIGH (the stricter route proof), as is
    UNRECOGNIZED: a route is not "verified" on a guess about the policy.
    """

    action: str | None = None
    action_digest: str | None = None
    requested_at: FactTime = None
    expires_at: FactTime = None
    approver_ref: str | None = None
    resume_handle: str | None = None
    risk: Risk | None = Risk.LOW
    policy: str | None = None
    overrides: ThresholdOverrides = ThresholdOverrides()

    @property
    def needs_acknowledgement(self) -> bool:
        return self.risk is not Risk.LOW


class DeliveryFact(_TimedModel):
    at: FactTime
    outcome: DeliveryOutcome


class DecisionFact(_TimedModel):
    at: FactTime
    code: DecisionCode
    #: The digest the approver decided on, when the decision event carries it.
    action_digest: str | None = None


class DigestFact(_TimedModel):
    at: FactTime
    digest: str


def _fact_key(fact: DeliveryFact | DecisionFact | DigestFact) -> tuple[Any, ...]:
    return (*_sort_key(fact.at), fact.model_dump_json())


class ApprovalFacts(_TimedModel):
    """Everything known about one approval request, plus its execution's digest changes and
    heartbeats (those are per execution; ``ApprovalBook`` shares them between requests).

    ``request`` is None while only facts that arrived before their request are held. Every
    collection is kept sorted and de-duplicated, so equal facts give equal values whatever the
    order they were added in, and a redelivered event changes nothing.
    """

    request_id: str
    execution_id: str | None = None
    request: RequestPart | None = None
    deliveries: tuple[DeliveryFact, ...] = ()
    acknowledgements: tuple[FactTime, ...] = ()
    decisions: tuple[DecisionFact, ...] = ()
    receipts: tuple[FactTime, ...] = ()
    digests: tuple[DigestFact, ...] = ()
    heartbeats: tuple[FactTime, ...] = ()

    @field_validator("deliveries", "decisions", "digests")
    @classmethod
    def _canonical_facts(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
        return _canonical(value, _fact_key)

    @field_validator("acknowledgements", "receipts", "heartbeats")
    @classmethod
    def _canonical_times(cls, value: tuple[datetime | None, ...]) -> tuple[datetime | None, ...]:
        return _canonical((_utc_ms(v) for v in value), _sort_key)


def resolve_thresholds(
    request: ApprovalFacts | RequestPart | None,
    policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None = None,
    defaults: ThresholdSet | None = None,
) -> ThresholdSet:
    """Per threshold: the request's own value, else its action policy's, else the default.

    The policy is looked up by the request's ``policy`` name, else by its ``action`` name (a
    low-risk preview may resume in seconds; a production change may wait on purpose). Each of
    the three thresholds is resolved on its own, so a policy may set only the grace period.
    """
    part = request.request if isinstance(request, ApprovalFacts) else request
    if part is None:
        return defaults or ThresholdSet()
    return _resolve(part.policy, part.action, part.overrides, policies, defaults)


class ThresholdResolver:
    """``resolve_thresholds`` with the configuration bound: the ``thresholds_for`` of advance.

    The answer depends only on the request's policy, action and own overrides, so it is
    remembered by those (a value, not an identity): stream time moves often and every open
    request is judged with its thresholds. ``millis`` gives them in milliseconds for the
    ledger's request records. ``policies`` and ``defaults`` must not change afterwards."""

    __slots__ = ("_by_ms", "_fallback", "_resolve_for")

    def __init__(
        self,
        policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None = None,
        defaults: ThresholdSet | None = None,
    ) -> None:
        self._fallback = defaults or ThresholdSet()

        @lru_cache(maxsize=1024)
        def resolve_for(
            policy_name: str | None, action: str | None, overrides: ThresholdOverrides
        ) -> ThresholdSet:
            return _resolve(policy_name, action, overrides, policies, defaults)

        self._resolve_for = resolve_for
        self._by_ms: dict[tuple[Any, ...], tuple[int, int, int]] = {}

    def __call__(self, facts: ApprovalFacts) -> ThresholdSet:
        part = facts.request
        if part is None:
            return self._fallback
        return self._resolve_for(part.policy, part.action, part.overrides)

    def millis(self, request: Any) -> tuple[int, int, int]:
        """(grace, heartbeat freshness, delivery deadline) in ms for a ledger ``Request``
        (its ``policy``, ``action`` and ``overrides`` in ms)."""
        key = (request.policy, request.action, request.overrides)
        found = self._by_ms.get(key)
        if found is None:
            if len(self._by_ms) >= 1024:
                self._by_ms.clear()
            grace, fresh, deadline = request.overrides
            overrides = ThresholdOverrides(
                grace=_ms_delta(grace),
                heartbeat_fresh=_ms_delta(fresh),
                delivery_deadline=_ms_delta(deadline),
            )
            th = self._resolve_for(request.policy, request.action, overrides)
            found = self._by_ms[key] = (
                th.grace // _ONE_MS,
                th.heartbeat_fresh // _ONE_MS,
                th.delivery_deadline // _ONE_MS,
            )
        return found


_ONE_MS = timedelta(milliseconds=1)


def _ms_delta(ms: int | None) -> timedelta | None:
    return None if ms is None else timedelta(milliseconds=ms)


def threshold_resolver(
    policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None = None,
    defaults: ThresholdSet | None = None,
) -> ThresholdResolver:
    """``resolve_thresholds`` with the configuration bound (see ``ThresholdResolver``)."""
    return ThresholdResolver(policies, defaults)
