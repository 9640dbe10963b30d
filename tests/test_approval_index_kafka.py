"""Approval lookups on a live worker: unknown ids answered from the index without reading the
table, and the index rebuilt from the recovered table after a restart."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from streams.contracts.models.events import ApprovalRequested
from streams.contracts.models.outputs import ApprovalVerdict
from streams.local.scenario import Tick
from tests.support import deployment, play, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
N = 300  # approval requests, one execution each


def _metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not on /metrics"
    return float(m.group(1))


def _requests() -> list[ApprovalRequested]:
    return [
        ApprovalRequested(
            event_id=f"ix-{i}-requested",
            execution_id=f"ix-ex-{i}",
            request_id=f"ix-req-{i}",
            action="refund",
            action_digest="d1",
            occurred_at=T0 + timedelta(milliseconds=i),
        )
        for i in range(N)
    ]


def test_unknown_approval_ids_are_answered_from_the_index_and_it_survives_a_restart(
    cluster, tmp_path: Path
) -> None:
    dep = deployment(cluster, tmp_path)
    play(dep, [*_requests(), Tick(T0 + timedelta(seconds=5))])
    sample = [f"ix-req-{i}" for i in range(0, N, 15)]
    with worker(dep) as w:
        base = f"http://127.0.0.1:{w.web_port}"
        dep.read_until(
            [dep.topics.approval_verdicts.name],
            lambda rs: (
                len({r.record.request_id for r in rs if isinstance(r.record, ApprovalVerdict)}) >= N
            ),
        )
        deadline = time.monotonic() + 30
        while _metric(base, "vigil_approval_index_entries") < N:
            assert time.monotonic() < deadline, "the index never took every verdict"
            time.sleep(0.5)
        assert _metric(base, "vigil_approval_index_entries") == N
        rows_read = _metric(base, "vigil_approval_index_rows_read_total")

        with ThreadPoolExecutor(40) as pool:
            unknown = list(
                pool.map(
                    lambda i: httpx.get(f"{base}/v1/approvals/nobody-{i}", timeout=30).status_code,
                    range(40),
                )
            )
            known = list(
                pool.map(lambda r: httpx.get(f"{base}/v1/approvals/{r}", timeout=30), sample)
            )
        assert unknown == [404] * 40
        assert [r.status_code for r in known] == [200] * len(sample)
        assert [r.json()["execution_id"] for r in known] == [
            r.replace("ix-req-", "ix-ex-") for r in sample
        ]
        # the lookups read no table row: only a rebuild does, and none ran
        assert _metric(base, "vigil_approval_index_rows_read_total") == rows_read

    # A restart: nothing in memory, the table recovered from its changelog, and no input
    # processed again (all committed), so no verdict is published to feed the index.
    with worker(dep) as w:
        base = f"http://127.0.0.1:{w.web_port}"
        codes: list[int] = []
        deadline = time.monotonic() + 60
        while True:
            code = httpx.get(f"{base}/v1/approvals/{sample[3]}", timeout=30).status_code
            codes.append(code)
            if code == 200:
                break
            assert time.monotonic() < deadline, codes
            time.sleep(0.5)
        # before the index was whole it said so (503), never that the request did not exist
        assert set(codes) <= {503, 200}, codes
        assert _metric(base, "vigil_approval_index_entries") == N
        assert _metric(base, "vigil_approval_index_rows_read_total") >= N
        for rid in sample:
            r = httpx.get(f"{base}/v1/approvals/{rid}", timeout=30)
            assert r.status_code == 200 and r.json()["request_id"] == rid
        assert httpx.get(f"{base}/v1/approvals/nobody", timeout=30).status_code == 404
