"""The Avro enums of ``schemas/``, generated from one source: the ``StrEnum`` classes of
``streams.contracts.models.enums`` (their symbols in order, their docstring as the enum's doc, the
default ``UNRECOGNIZED``).

Why generated copies rather than schema references: an enum such as ``Owner`` or
``ExecutionStatus`` is used by several records, and each ``.avsc`` keeps its own inline copy
so that every schema stays self-contained — registered, read and checked on its own by any
consumer (ksqlDB, Connect converters, registry UIs, ``fastavro``) with no reference to resolve,
no order in which subjects must be registered, and no ``references`` support needed from the
registry's Confluent API. The copies cannot drift: ``vigil schemas enums`` rewrites them from
the source (``--check`` only reports), and a test fails while any copy differs.
"""

from __future__ import annotations

import inspect
import json
from enum import StrEnum
from pathlib import Path
from typing import Any

from streams.contracts.models import enums

NAMESPACE = "vigil.v1"
DEFAULT = "UNRECOGNIZED"


def sources() -> dict[str, type[StrEnum]]:
    """Every enum of the contracts, by its Avro name (the class name)."""
    return {
        name: obj
        for name, obj in vars(enums).items()
        if inspect.isclass(obj) and issubclass(obj, StrEnum) and obj is not StrEnum
    }


def avro_enum(source: type[StrEnum]) -> dict[str, Any]:
    """The Avro definition of ``source``, key for key as the ``.avsc`` files write it."""
    doc = source.__doc__
    if not doc or doc == StrEnum.__doc__:
        raise ValueError(f"enum {source.__name__} has no docstring to be its Avro doc")
    return {
        "type": "enum",
        "name": source.__name__,
        "namespace": NAMESPACE,
        "doc": " ".join(doc.split()),
        "symbols": [member.value for member in source],
        "default": DEFAULT,
    }


def regenerate(schema: Any, known: dict[str, type[StrEnum]]) -> Any:
    """``schema`` with every enum definition replaced by the one generated from its source."""
    if isinstance(schema, list):
        return [regenerate(s, known) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "enum":
        source = known.get(schema["name"].rsplit(".", 1)[-1])
        if source is None:
            raise ValueError(
                f"enum {schema['name']} has no source in streams.contracts.models.enums"
            )
        return avro_enum(source)
    out = dict(schema)
    for key in ("type", "items", "values"):
        if key in out:
            out[key] = regenerate(out[key], known)
    if "fields" in out:
        out["fields"] = [dict(f, type=regenerate(f["type"], known)) for f in out["fields"]]
    return out


def render(schema: Any) -> str:
    """The text of an ``.avsc`` file as the project writes them."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def sync(path: Path, write: bool) -> bool:
    """Whether the enum copies of ``path`` differ from their source; rewrites the file when
    ``write``. A file whose enums are current is left byte for byte."""
    text = path.read_text()
    wanted = render(regenerate(json.loads(text), sources()))
    if wanted == text:
        return False
    if write:
        path.write_text(wanted)
    return True
