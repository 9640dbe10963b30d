"""Entries written by the state format before the execution aggregate (commit 6733ee4) are
read by the aggregate, and a Processor carrying on from them publishes exactly what that
commit published: the fixture holds its entries and clocks half-way through a small benchmark
workload and the digest of its outputs over the rest (``fixtures/make_state_6733ee4.py``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from bench import core
from streams.core.execution import Execution
from streams.processor import Processor, Stores
from streams.settings import Settings
from streams.topics import Topics

FIXTURE = json.loads((Path(__file__).parent / "fixtures/state_6733ee4.json").read_text())


def _stores() -> Stores:
    saved = FIXTURE["stores"]
    return Stores(
        executions={k: base64.b64decode(v) for k, v in saved["executions"].items()},
        clocks=dict(saved["clocks"]),
    )


def _processor(stores: Stores) -> Processor:
    settings = Settings.from_env()
    return Processor.from_settings(
        settings, Topics.from_settings(settings), stores, write_behind=True
    )


def test_every_old_entry_decodes_into_an_aggregate_with_each_kind_of_part() -> None:
    stores = _stores()
    processor = _processor(stores)
    parts = {"inflight": 0, "closed": 0, "operations": 0, "approvals": 0}
    for execution_id in stores.executions:
        execution = processor._execution(execution_id)
        assert isinstance(execution, Execution) and execution.execution_id == execution_id
        snapshot = execution.snapshot()
        for name in parts:
            parts[name] += getattr(snapshot, name) is not None
        assert any(getattr(snapshot, name) is not None for name in parts)
    assert all(parts.values()), parts  # the fixture exercises every part


def test_a_processor_carries_on_from_old_state_with_the_very_same_outputs() -> None:
    envs = core.workload(FIXTURE["executions"])
    processor = _processor(_stores())
    rest = []
    for env in envs[FIXTURE["split"] :]:
        rest.extend(processor.handle(env))
    assert core.digest(rest) == FIXTURE["rest"]
