"""Entries written by the state format before the execution aggregate (commit 6733ee4) are
read by the aggregate, and a Processor carrying on from them publishes exactly what that
commit published: the fixture holds its entries and clocks half-way through a small benchmark
workload and the digest of its outputs over the rest (``fixtures/make_state_6733ee4.py``).
Those entries hold format 1 (JSON objects, ISO times); entries are written in format 2 (JSON
arrays, epoch milliseconds), so a restart upgrades each entry it changes."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from bench import core
from streams.contracts.models.base import replace
from streams.contracts.models.enums import AlertKind, AlertStatus
from streams.contracts.models.outputs import Alert
from streams.core.execution import PARTS, Execution
from streams.engine.emission import Emission
from streams.engine.processor import Processor, Stores
from streams.engine.state import Entry
from streams.kafka.topics import Topics
from streams.settings import Settings

FIXTURE = json.loads((Path(__file__).parent / "fixtures/state_6733ee4.json").read_text())


#: Fields holding an id derived from the inputs (they changed when ids were scoped by the
#: execution, issue 26); ``digest_without_ids`` blanks them.
ID_FIELDS = (
    "state_id",
    "open_work_item_id",
    "work_item_id",
    "resolution_id",
    "alert_id",
    "resolves_alert_id",
    "verdict_id",
)


#: Fields added to the contract since, with their default: left out when they hold it.
ADDED_FIELDS: dict[str, dict[str, Any]] = {
    "WorkItemResolution": {"evidence": []},
    "OperationState": {"held_by_execution_id": None},
    "Alert": {"ends_with_resolved": False},
}


def digest_without_ids(emissions: list[Any]) -> str:
    """``core.digest`` of the same emissions with every derived id blanked (``ID_FIELDS``
    and the ``work_item=`` evidence), fields added since left out while they hold their
    default, and each record keyed by its own key field, not by its Kafka key: what stays of
    a run's outputs across a change of the id derivations."""
    per_key: dict[tuple[str, str], Any] = {}
    for em in emissions:
        record = em.record
        key_field = type(record).key_field
        key = (em.topic, "" if key_field is None else str(getattr(record, key_field)))
        data = json.loads(record.model_dump_json())
        for name in ID_FIELDS:
            if data.get(name) is not None:
                data[name] = "-"
        for name, default in ADDED_FIELDS.get(type(record).__name__, {}).items():
            if data.get(name) == default:
                del data[name]
        if "evidence" in data:
            data["evidence"] = [
                "work_item=-" if e.startswith("work_item=") else e for e in data["evidence"]
            ]
        h = per_key.setdefault(key, hashlib.sha256())
        h.update(repr(em.headers).encode())
        h.update(type(record).__name__.encode())
        h.update(json.dumps(data, sort_keys=True).encode())
        h.update(b"\x00")
    total = hashlib.sha256()
    for (topic, key), h in sorted(per_key.items()):
        total.update(f"{topic}\x1f{key}\x1f{h.hexdigest()}\n".encode())
    return total.hexdigest()


def as_before_alert_ends(emissions: list[Any]) -> list[Any]:
    """The emissions as a version before FORBIDDEN_RETRY and ANOMALY alerts were ended would
    publish them: without the RESOLVED alerts that end those two kinds, and with every alert's
    ``ends_with_resolved`` at its default (docs/rules.md#alert-lifecycle). The rest is
    unchanged: only those ends were added."""
    before = []
    for em in emissions:
        record = em.record
        if isinstance(record, Alert):
            if record.status is AlertStatus.RESOLVED and record.kind in (
                AlertKind.FORBIDDEN_RETRY,
                AlertKind.ANOMALY,
            ):
                continue
            em = Emission(
                em.topic,
                em.key,
                replace(record, ends_with_resolved=False),
                em.headers,
                em.partition,
            )
        before.append(em)
    return before


def assert_carries_on_like_6733ee4(rest: list[Any]) -> None:
    """What 6733ee4 published over the rest of the workload, but for the ids, which are
    scoped by the execution now (the very ids the fixture pins, so that they stay
    deterministic), and for the ends of FORBIDDEN_RETRY and ANOMALY alerts, added since
    (``as_before_alert_ends``)."""
    before = as_before_alert_ends(rest)
    digest = core.digest(before)
    assert (digest["outputs"], digest["keys"]) == (
        FIXTURE["rest"]["outputs"],
        FIXTURE["rest"]["keys"],
    )
    assert digest_without_ids(before) == FIXTURE["rest_ids"]["digest_without_ids"]
    now = core.digest(rest)
    assert (now["outputs"], now["digest"]) == (
        FIXTURE["rest_alert_ends"]["outputs"],
        FIXTURE["rest_alert_ends"]["digest"],
    )


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
    assert_carries_on_like_6733ee4(rest)


def _format(entry: Entry) -> set[int]:
    """The formats of an entry's slot and operation book (the parts this module's formats
    cover): 1 for a JSON object, 2 for an array."""
    texts = [entry.inflight, entry.closed, entry.operations]
    return {2 if text.startswith("[") else 1 for text in texts if text}


def test_the_old_entries_are_format_1() -> None:
    entries = [Entry.decode(raw) for raw in _stores().executions.values()]
    assert {f for e in entries for f in _format(e)} == {1}


def test_old_entries_upgraded_to_format_2_hold_the_same_parts_and_carry_on_alike() -> None:
    """Every entry read and written again (all its parts) is format 2, decodes into the same
    aggregate, and a Processor restarting from the upgraded tables publishes exactly what
    6733ee4 published from its own."""
    stores = _stores()
    before = _processor(_stores())
    upgrading = _processor(stores)
    for execution_id in list(stores.executions):
        execution = upgrading._execution(execution_id)
        execution.changed.update(PARTS)
        upgrading._store(execution)
    assert upgrading.flush() == len(stores.executions)
    for execution_id, raw in stores.executions.items():
        assert _format(Entry.decode(raw)) == {2}
        again = _processor(stores)._execution(execution_id).snapshot()
        old = before._execution(execution_id).snapshot()
        # the parts these formats cover (the approval book's is its own); the outputs below
        # check the whole
        assert (again.inflight, again.closed, again.operations) == (
            old.inflight,
            old.closed,
            old.operations,
        )
    envs = core.workload(FIXTURE["executions"])
    processor = _processor(stores)
    rest = []
    for env in envs[FIXTURE["split"] :]:
        rest.extend(processor.handle(env))
    assert_carries_on_like_6733ee4(rest)


def test_a_restart_writes_the_parts_it_changes_in_format_2() -> None:
    """An entry keeps the parts a restart did not change as they were (format 1, still read),
    and holds those it changed in format 2."""
    stores = _stores()
    old = {k: Entry.decode(raw) for k, raw in stores.executions.items()}
    processor = _processor(stores)
    for env in core.workload(FIXTURE["executions"])[FIXTURE["split"] :]:
        processor.handle(env)
    processor.flush()
    rewritten = kept = 0
    for key, raw in stores.executions.items():
        entry, before = Entry.decode(raw), old.get(key, Entry())
        for name in ("inflight", "closed", "operations"):
            text = getattr(entry, name)
            if text is None:
                continue
            if text == getattr(before, name):
                kept += 1
            else:
                assert text.startswith("["), (key, name, text)
                rewritten += 1
    assert rewritten and kept
