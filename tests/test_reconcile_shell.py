"""The reconciler's shell without Kafka: its per-connector rate limit and the metrics of items
waiting (streams/reconcile.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import WorkItemKind
from streams.core import reconcile as rc
from streams.reconcile import RateLimit, ReconcilerStatus


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 500.0), st.integers(1, 300))
def test_the_rate_limit_lets_through_a_burst_then_rate_per_second(rate: float, n: int) -> None:
    """n checks at once take (n - burst) / rate seconds of waiting, never less: a connector
    sees at most ``rate`` checks a second after its burst of ``max(1, rate)``."""
    now = [0.0]

    async def fake_sleep(seconds: float) -> None:
        assert seconds > 0
        now[0] += seconds

    async def run() -> None:
        limit = RateLimit(rate, clock=lambda: now[0])
        for _ in range(n):
            await limit.acquire()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(asyncio, "sleep", fake_sleep)
        asyncio.run(run())
    burst = max(1.0, rate)
    expected = max(0.0, (n - burst) / rate)
    assert now[0] == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_items_waiting_and_the_oldest_per_connector() -> None:
    status = ReconcilerStatus()
    t0 = datetime.now(UTC) - timedelta(minutes=5)

    def item(wid: str, connector: str, seen: datetime) -> rc.ReconciliationCheck:
        return rc.taken(
            work_item_id=wid,
            operation_id=f"op-{wid}",
            execution_id="ex",
            attempt=1,
            connector=connector,
            idempotency_key=None,
            effect_ref=None,
            kind=WorkItemKind.REPLY_TIMEOUT,
            deadline=seen,
            created_at=seen,
            traceparent=None,
            now=seen,
        )

    items = [
        item("a", "pay", t0),
        item("b", "pay", t0 + timedelta(minutes=4)),
        item("c", "sms", t0),
    ]
    status.items = lambda: items
    status.assigned = 3
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in status.registry.collect()
        for s in family.samples
        if s.name.startswith("vigil_reconciler_")
    }
    assert got[("vigil_reconciler_items_waiting", (("connector", "pay"),))] == 2
    assert got[("vigil_reconciler_items_waiting", (("connector", "sms"),))] == 1
    assert got[("vigil_reconciler_oldest_item_age_seconds", (("connector", "pay"),))] >= 300
    assert got[("vigil_reconciler_partitions_assigned", ())] == 3
    assert status.healthy()[0]
    status.assigned = None
    assert not status.healthy()[0]
