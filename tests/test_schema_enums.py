"""Enums used by several schemas come from one source (``streams.contracts.models.enums``):
every copy in ``schemas/`` is what the source generates, and ``vigil schemas enums`` puts a
drifted copy back."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from streams.contracts.enum_copies import avro_enum, sources, sync
from streams.contracts.models.base import SCHEMA_DIR


def enum_definitions(schema: Any) -> list[dict[str, Any]]:
    if isinstance(schema, list):
        return [e for s in schema for e in enum_definitions(s)]
    if not isinstance(schema, dict):
        return []
    if schema.get("type") == "enum":
        return [schema]
    found = [
        e for k in ("type", "items", "values") if k in schema for e in enum_definitions(schema[k])
    ]
    return found + [e for f in schema.get("fields", ()) for e in enum_definitions(f["type"])]


def run(*args: str) -> Any:
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    return CliRunner().invoke(app, ["schemas", "enums", *args])


def test_every_enum_copy_is_its_source() -> None:
    known = sources()
    uses: Counter[str] = Counter()
    for path in sorted(SCHEMA_DIR.glob("*.avsc")):
        for definition in enum_definitions(json.loads(path.read_text())):
            uses[definition["name"]] += 1
            assert definition == avro_enum(known[definition["name"]]), path.name
        assert not sync(path, write=False), path.name
    assert {name for name, n in uses.items() if n > 1} >= {"Owner", "ExecutionStatus"}
    assert set(uses) <= set(known)
    assert run("--check").exit_code == 0


def test_a_drifted_copy_is_reported_then_rewritten(tmp_path: Path) -> None:
    original = (SCHEMA_DIR / "WorkItemResolution.avsc").read_text()
    path = tmp_path / "WorkItemResolution.avsc"
    shutil.copy(SCHEMA_DIR / "WorkItemResolution.avsc", path)
    schema = json.loads(original)
    status = next(e for e in enum_definitions(schema) if e["name"] == "OperationStatus")
    status["symbols"].remove("UNKNOWN")  # edited here but not in OperationState.avsc
    status["doc"] = "drifted"
    path.write_text(json.dumps(schema, indent=2) + "\n")

    res = run("--check", str(path))
    assert res.exit_code == 1
    assert "differs" in res.output
    assert path.read_text() != original  # --check writes nothing

    res = run(str(path))
    assert res.exit_code == 0, res.output
    assert path.read_text() == original
    assert run("--check", str(path)).exit_code == 0
