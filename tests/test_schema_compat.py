"""The offline compatibility check of ``vigil schemas check``: Avro schema resolution decided
on the schemas alone, on real incompatible changes, cross-checked against fastavro actually
reading data written with the old schema; and every schema of the project against every
earlier version of it in git history (what CI runs)."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.utils import generate_many
from typer.testing import CliRunner

from streams.contracts.compat import incompatibilities
from streams.contracts.models.base import SCHEMA_DIR

ROOT = Path(__file__).resolve().parents[1]


def record(*fields: dict[str, Any], name: str = "R") -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "t", "fields": list(fields)}


def f(name: str, type_: Any, **kw: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **kw}


COLOUR = {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}
BASE = record(f("id", "string"), f("n", "int"), f("c", COLOUR), f("again", "t.Colour"))

#: (what changes, the new schema as reader of BASE, whether it can read BASE's data)
CHANGES: list[tuple[str, dict[str, Any], bool]] = [
    ("unchanged", BASE, True),
    (
        "field added with a default",
        record(*BASE["fields"], f("x", ["null", "string"], default=None)),
        True,
    ),
    ("field added without default", record(*BASE["fields"], f("x", "string")), False),
    ("field removed", record(*BASE["fields"][1:]), True),
    ("int promoted to long", record(BASE["fields"][0], f("n", "long"), *BASE["fields"][2:]), True),
    (
        "int narrowed from long",
        record(BASE["fields"][0], f("n", "boolean"), *BASE["fields"][2:]),
        False,
    ),
    ("string changed to int", record(f("id", "int"), *BASE["fields"][1:]), False),
    ("made optional", record(f("id", ["null", "string"]), *BASE["fields"][1:]), True),
    (
        "enum symbol removed",
        record(*BASE["fields"][:2], f("c", dict(COLOUR, symbols=["RED"])), BASE["fields"][3]),
        False,
    ),
    (
        "enum symbol removed, with an enum default",
        record(
            *BASE["fields"][:2],
            f("c", dict(COLOUR, symbols=["RED", "OTHER"], default="OTHER")),
            BASE["fields"][3],
        ),
        True,
    ),
    (
        "enum symbol added",
        record(
            *BASE["fields"][:2],
            f("c", dict(COLOUR, symbols=["RED", "GREEN", "BLUE"])),
            BASE["fields"][3],
        ),
        True,
    ),
    (
        "field renamed with an alias",
        record(f("ident", "string", aliases=["id"]), *BASE["fields"][1:]),
        True,
    ),
    ("field renamed without alias", record(f("ident", "string"), *BASE["fields"][1:]), False),
    ("record renamed", record(*BASE["fields"], name="Other"), False),
    (
        "record renamed with an alias",
        dict(record(*BASE["fields"], name="Other"), aliases=["R"]),
        True,
    ),
]


@pytest.mark.parametrize(("what", "reader", "readable"), CHANGES, ids=[c[0] for c in CHANGES])
def test_resolution_decides_like_avro(what: str, reader: dict[str, Any], readable: bool) -> None:
    problems = incompatibilities(reader, BASE)
    assert (problems == []) is readable, problems
    # what fastavro does with data BASE wrote: every record read when the check says so
    parsed_writer, parsed_reader = parse_schema(BASE), parse_schema(reader)
    outcomes = []
    for datum in generate_many(BASE, 40):
        buf = io.BytesIO()
        schemaless_writer(buf, parsed_writer, datum)
        try:
            schemaless_reader(io.BytesIO(buf.getvalue()), parsed_writer, parsed_reader)
            outcomes.append(True)
        except Exception:
            outcomes.append(False)
    if readable:
        assert all(outcomes)
    else:
        assert not all(outcomes)


def test_a_writer_union_needs_every_branch_readable() -> None:
    optional = record(f("id", ["null", "string"]))
    required = record(f("id", "string"))
    assert incompatibilities(optional, required) == []
    assert incompatibilities(required, optional) == [
        "/id[writer branch 0: null]: the writer's null cannot be read as string"
    ]


def test_nested_records_arrays_and_maps_are_resolved() -> None:
    inner = record(f("v", "int"), name="Inner")
    old = record(
        f("xs", {"type": "array", "items": inner}), f("m", {"type": "map", "values": "int"})
    )
    new_inner = record(f("v", "int"), f("w", "string"), name="Inner")
    new = record(
        f("xs", {"type": "array", "items": new_inner}), f("m", {"type": "map", "values": "double"})
    )
    assert incompatibilities(new, old) == [
        "/xs[]/w: the reader's field has no default and the writer lacks it"
    ]


def test_every_project_schema_reads_every_earlier_version_in_git() -> None:
    """CI's check on vigil's own contract: ``vigil schemas check --offline`` over schemas/."""
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    res = CliRunner().invoke(app, ["schemas", "check", "--offline"])
    assert res.exit_code == 0, res.output
    assert "all compatible" in res.output
    checked = int(res.output.split("schema file(s), ")[1].split(" earlier")[0])
    assert checked >= len(list(SCHEMA_DIR.glob("*.avsc")))  # the history was there to check


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def test_check_finds_a_change_that_only_the_oldest_version_rules_out(tmp_path: Path) -> None:
    """v2 dropped a string field; the working copy brings it back as an int with a default:
    it reads v2's data but not v1's, so the check fails against v1 only."""
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    git(tmp_path, "init", "-q")
    path = tmp_path / "Thing.avsc"
    v1 = record(f("id", "string"), f("note", "string"), name="Thing")
    v2 = record(f("id", "string"), name="Thing")
    v3 = record(f("id", "string"), f("note", "int", default=0), name="Thing")
    for version in (v1, v2):
        path.write_text(json.dumps(version, indent=2))
        git(tmp_path, "add", "Thing.avsc")
        git(tmp_path, "commit", "-q", "-m", "v")
    path.write_text(json.dumps(v3, indent=2))
    res = CliRunner().invoke(
        app, ["schemas", "check", "--offline", str(path)], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 1, res.output
    lines = [line for line in res.output.splitlines() if "against git" in line]
    assert len(lines) == 1
    assert "/note: the writer's string cannot be read as int" in lines[0]
    assert "2 earlier version(s) checked: 1 incompatible" in res.output

    path.write_text(json.dumps(record(f("id", "string"), name="Thing")))
    res = CliRunner().invoke(app, ["schemas", "check", "--offline", str(path)])
    assert res.exit_code == 0, res.output

    path.write_text("{not json")
    res = CliRunner().invoke(app, ["schemas", "check", "--offline", str(path)])
    assert res.exit_code == 2
