"""Whether data written with one Avro schema can be read with another: Avro's schema
resolution, checked on the schemas alone (no record, no registry).

A new version of a contract schema is *backward compatible* with an old one when the new one,
as the reader, resolves every schema the old one, as the writer, can produce — the rules of
the Avro specification ("Schema Resolution"): same named types (by unqualified name or a
reader alias), primitive promotions, a reader field the writer lacks needs a default, a writer
enum symbol the reader lacks needs the reader enum's default, and every branch of a writer
union must resolve against the reader. Pure: ``vigil schemas check`` feeds it the versions
from git history.
"""

from __future__ import annotations

from typing import Any

from fastavro.schema import expand_schema, parse_schema

#: writer primitive -> the reader primitives it is promoted to (besides itself)
PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def expanded(schema: Any) -> Any:
    """``schema`` with every reference to a named type replaced by its definition (fastavro
    parses it, so an invalid schema raises ``SchemaParseException`` here)."""
    return expand_schema(parse_schema(schema, _write_hint=False))


def incompatibilities(reader: Any, writer: Any) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader``: one line per problem,
    with its path; empty when the reader resolves the writer."""
    problems: list[str] = []
    _resolve(expanded(reader), expanded(writer), "", problems, set())
    return problems


def _type(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        t = schema["type"]
        return t if isinstance(t, str) else _type(t)
    return str(schema)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    aliases = {_short(a) for a in reader.get("aliases", ())}
    return _short(writer["name"]) in {_short(reader["name"])} | aliases


def _unwrap(schema: Any) -> Any:
    """``{"type": "string", "logicalType": ...}`` and ``{"type": {...}}`` resolve as their
    type; named types and complex types stay dicts."""
    while isinstance(schema, dict) and not isinstance(schema["type"], str):
        schema = schema["type"]
    if isinstance(schema, dict) and schema["type"] in PRIMITIVES:
        return schema["type"]
    return schema


def _matches(reader: Any, writer: Any) -> bool:
    """Whether the reader type can be chosen for the writer type (a union's branch): the same
    kind (and named types the same name), or a promotion."""
    r, w = _type(reader), _type(writer)
    if r in ("record", "enum", "fixed") and r == w:
        return _names_match(_unwrap(reader), _unwrap(writer))
    return r == w or r in PROMOTIONS.get(w, frozenset())


def _resolve(reader: Any, writer: Any, path: str, out: list[str], seen: set[Any]) -> None:
    reader, writer = _unwrap(reader), _unwrap(writer)
    r, w = _type(reader), _type(writer)
    at = path or "/"
    if w == "union":
        for i, branch in enumerate(writer):
            _resolve(reader, branch, f"{path}[writer branch {i}: {_type(branch)}]", out, seen)
        return
    if r == "union":
        branch = next((b for b in reader if _type(b) == w and _matches(b, writer)), None)
        if branch is None:
            branch = next((b for b in reader if _matches(b, writer)), None)
        if branch is None:
            out.append(f"{at}: the reader's union has no branch for the writer's {w}")
            return
        _resolve(branch, writer, path, out, seen)
        return
    if not _matches(reader, writer):
        name = f" {writer['name']}" if isinstance(writer, dict) and "name" in writer else ""
        out.append(f"{at}: the writer's {w}{name} cannot be read as {r}")
        return
    if r == "record":
        key = (id(reader), id(writer))
        if key in seen:  # a recursive type already being resolved
            return
        seen.add(key)
        by_name = {f["name"]: f for f in writer["fields"]}
        for field in reader["fields"]:
            names = [field["name"], *field.get("aliases", ())]
            source = next((by_name[n] for n in names if n in by_name), None)
            fpath = f"{path}/{field['name']}"
            if source is None:
                if "default" not in field:
                    out.append(
                        f"{fpath}: the reader's field has no default and the writer lacks it"
                    )
                continue
            _resolve(field["type"], source["type"], fpath, out, seen)
    elif r == "enum":
        missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
        if missing and "default" not in reader:
            out.append(
                f"{at}: enum {reader['name']} lacks the writer's symbols {', '.join(missing)} "
                "and has no default"
            )
    elif r == "array":
        _resolve(reader["items"], writer["items"], f"{path}[]", out, seen)
    elif r == "map":
        _resolve(reader["values"], writer["values"], f"{path}{{}}", out, seen)
    elif r == "fixed" and reader["size"] != writer["size"]:
        out.append(f"{at}: fixed {reader['name']} is {reader['size']} bytes, not {writer['size']}")
