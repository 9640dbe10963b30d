"""``vigil produce``: a JSON Lines file checked whole before anything is published.

A file half published is the worst outcome of a bad line: the good records before it are in
the log for good, and fixing the file and running it again publishes them twice. So every
line is validated first (JSON, record type, fields, a tick's partition) and nothing is sent
unless all are valid, or the user asks for the valid ones alone (``--skip-bad``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from streams.cli.errors import BadInput, render_validation_error
from streams.contracts.models.base import Record
from streams.contracts.models.events import ClockTick
from streams.kafka.topics import TopicSpec


@dataclass(frozen=True, slots=True)
class LineProblem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class CheckedFile:
    """The valid records of a file, with their line numbers, and the problems of the others."""

    records: tuple[tuple[int, Record], ...]
    problems: tuple[LineProblem, ...]


def check_line(text: str, spec: TopicSpec) -> Record:
    """One line as the record it describes on ``spec``'s topic; ``ValueError`` saying why not.

    ``"type"`` names the record type; it may be left out when the topic carries one type
    besides clock ticks."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"not a JSON object but {type(obj).__name__}")
    types = {m.avro_name: m for m in spec.value_types}
    events = [m.avro_name for m in spec.value_types if m is not ClockTick]
    name = obj.pop("type", None)
    if name is None:
        if len(events) != 1:
            raise ValueError(f'"type" is missing; {spec.name} carries {", ".join(types)}')
        name = events[0]
    if name not in types:
        raise ValueError(
            f'"type" {name!r} does not belong on {spec.name}; one of {", ".join(types)}'
        )
    try:
        record = types[name].model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"{name}: {render_validation_error(exc)}") from None
    if isinstance(record, ClockTick) and not 0 <= record.partition < spec.partitions:
        raise ValueError(
            f"ClockTick partition {record.partition} is out of range: {spec.name} has "
            f"partitions 0..{spec.partitions - 1}"
        )
    return record


def check_lines(lines: Iterable[str], spec: TopicSpec) -> CheckedFile:
    """Every non-blank line checked (numbered from 1, blank lines counted)."""
    records: list[tuple[int, Record]] = []
    problems: list[LineProblem] = []
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            records.append((n, check_line(text, spec)))
        except ValueError as exc:
            problems.append(LineProblem(n, str(exc)))
    return CheckedFile(tuple(records), tuple(problems))


def read_lines(file: Path) -> list[str]:
    """The lines of ``file`` ('-': standard input), or ``BadInput`` naming the file."""
    if str(file) == "-":
        return sys.stdin.read().splitlines()
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BadInput(f"{file}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{file}: a directory, not a JSON Lines file") from None
    except PermissionError:
        raise BadInput(f"{file}: not readable (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{file}: not UTF-8 text (byte {exc.start})") from None
