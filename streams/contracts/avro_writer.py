"""Avro binary writers made once per schema, for the hot path of encoding outputs.

Why not fastavro alone: its ``schemaless_writer`` interprets the schema on every call. For
each field it dispatches on the type's name, and for each union it tries the branches in turn
until one validates the value. On the benchmark's outputs that is about 8 µs per record, the
largest single cost of the worker's shell (BENCHMARKS.md, step 8). The schemas here are
small and fixed, so the dispatch can be done once: ``compile_writer`` turns a parsed record
schema into Python source with one line or two per field, and compiles it.

The bytes must be exactly fastavro's, since they are the public contract on the output
topics. ``tests/test_avro_writer.py`` holds them equal on every contract model, for values
drawn by hypothesis. A schema with a type this module does not handle gets no compiled
writer (``UnsupportedSchema``), and the codec keeps fastavro for it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

#: (a record's field values, the bytes to put first) -> those bytes, then the record's Avro
Writer = Callable[[dict[str, Any], bytes], bytes]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class UnsupportedSchema(Exception):
    """The schema uses a type or a union this module does not compile."""


def write_long(n: int, out: bytearray) -> None:
    """Zig-zag, then base-128 varint, as Avro's int and long (64-bit range)."""
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def write_string(s: str, out: bytearray) -> None:
    b = s.encode()
    write_long(len(b), out)
    out += b


def write_bytes(b: bytes, out: bytearray) -> None:
    write_long(len(b), out)
    out += b


def _long_bytes(n: int) -> bytes:
    out = bytearray()
    write_long(n, out)
    return bytes(out)


def millis(t: datetime) -> int:
    """``timestamp-millis`` of an aware time, computed exactly as fastavro does: whole
    milliseconds from the epoch, sub-millisecond digits dropped."""
    d = t - EPOCH
    return (d.days * 86_400 + d.seconds) * 1000 + d.microseconds // 1000


def compile_writer(schema: dict[str, Any]) -> Writer:
    """A function from a record's field values to its Avro bytes: the model's ``__dict__``
    (nested records as models) or ``codec.avro_dict`` (nested records as dicts)."""
    gen = _Generator()
    body = gen.record(schema, "v", 1)
    src = "def write(v, head=b''):\n    out = bytearray(head)\n" + body + "    return bytes(out)\n"
    namespace: dict[str, Any] = {
        "write_long": write_long,
        "write_string": write_string,
        "write_bytes": write_bytes,
        "EPOCH": EPOCH,
        **gen.constants,
    }
    exec(compile(src, f"<avro writer {schema.get('name')}>", "exec"), namespace)
    return namespace["write"]  # type: ignore[no-any-return]


class _Generator:
    """Source for one schema; named types are resolved as they are defined (fastavro's parsed
    schemas define each named type at its first use and refer to it by name afterwards)."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.constants: dict[str, Any] = {}
        self._n = 0

    def _var(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def record(self, schema: dict[str, Any], value: str, depth: int) -> str:
        self._define(schema)
        pad = "    " * depth
        lines = []
        if value != "v":  # a nested record: a contract model or, from avro_dict, a dict
            lines.append(f"{pad}{value} = {value} if type({value}) is dict else {value}.__dict__\n")
        for field in schema["fields"]:
            var = self._var("f")
            lines.append(f"{pad}{var} = {value}[{field['name']!r}]\n")
            lines.append(self.value(field["type"], var, depth))
        return "".join(lines)

    def _define(self, schema: dict[str, Any]) -> None:
        name = schema.get("name")
        if name:
            ns = schema.get("namespace")
            full = name if "." in name or not ns else f"{ns}.{name}"
            self.named[full] = schema
            self.named.setdefault(name, schema)

    def value(self, t: Any, var: str, depth: int) -> str:
        pad = "    " * depth
        if isinstance(t, str):
            if t in self.named:
                return self.value(self.named[t], var, depth)
            if t == "string":
                # inline: most strings here are ids, shorter than 64 bytes (a one-byte length)
                b = self._var("b")
                return (
                    f"{pad}{b} = {var}.encode()\n"
                    f"{pad}if len({b}) < 64:\n"
                    f"{pad}    out.append(len({b}) << 1)\n"
                    f"{pad}else:\n"
                    f"{pad}    write_long(len({b}), out)\n"
                    f"{pad}out += {b}\n"
                )
            simple = {
                "long": f"{pad}write_long({var}, out)\n",
                "int": f"{pad}write_long({var}, out)\n",
                "boolean": f"{pad}out.append(1 if {var} else 0)\n",
                "bytes": f"{pad}write_bytes({var}, out)\n",
            }
            if t not in simple:
                raise UnsupportedSchema(f"type {t!r}")
            return simple[t]
        if isinstance(t, list):
            return self._union(t, var, depth)
        kind = t["type"]
        if kind == "record":
            return self.record(t, var, depth)
        if kind == "enum":
            self._define(t)
            table = self._var("enum")
            self.constants[table] = {s: _long_bytes(i) for i, s in enumerate(t["symbols"])}
            return f"{pad}out += {table}[{var}]\n"
        if kind == "array":
            item = self._var("i")
            return (
                f"{pad}if {var}:\n"
                f"{pad}    write_long(len({var}), out)\n"
                f"{pad}    for {item} in {var}:\n"
                + self.value(t["items"], item, depth + 2)
                + f"{pad}out.append(0)\n"
            )
        if kind == "long" and t.get("logicalType") == "timestamp-millis":
            d = self._var("d")  # millis(), inline
            return (
                f"{pad}{d} = {var} - EPOCH\n"
                f"{pad}write_long(({d}.days * 86400 + {d}.seconds) * 1000"
                f" + {d}.microseconds // 1000, out)\n"
            )
        if kind in ("string", "long", "int", "boolean", "bytes") and "logicalType" not in t:
            return self.value(kind, var, depth)
        raise UnsupportedSchema(f"type {t!r}")

    def _union(self, branches: list[Any], var: str, depth: int) -> str:
        """Only ``["null", X]``: fastavro writes None as branch 0 and anything else as X."""
        if len(branches) != 2 or branches[0] != "null" or branches[1] == "null":
            raise UnsupportedSchema(f"union {branches!r}")
        pad = "    " * depth
        return (
            f"{pad}if {var} is None:\n"
            f"{pad}    out.append(0)\n"
            f"{pad}else:\n"
            f"{pad}    out.append(2)\n" + self.value(branches[1], var, depth + 1)
        )
