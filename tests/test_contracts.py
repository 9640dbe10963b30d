"""The Avro contracts and their pydantic mirrors agree, field by field, and round-trip."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import AwareDatetime

from streams.contracts.codec import ALL_MODELS, avro_dict
from streams.contracts.models.base import SCHEMA_DIR, Record

SCHEMA_FILES = sorted(p.stem for p in Path(SCHEMA_DIR).glob("*.avsc"))


def test_every_schema_file_has_a_model_and_back() -> None:
    assert sorted(m.avro_name for m in ALL_MODELS) == SCHEMA_FILES


def _named_types(schema: Any, acc: dict[str, Any]) -> None:
    if isinstance(schema, dict):
        if schema.get("type") in ("record", "enum"):
            acc[schema["name"]] = schema
        for v in schema.values():
            _named_types(v, acc)
    elif isinstance(schema, list):
        for v in schema:
            _named_types(v, acc)


def _resolve(t: Any, named: dict[str, Any]) -> Any:
    if isinstance(t, str) and t.split(".")[-1] in named:
        return named[t.split(".")[-1]]
    return t


def _check_type(ann: Any, avro: Any, named: dict[str, Any], where: str) -> None:
    """Assert that a Python annotation and an Avro type describe the same values."""
    avro = _resolve(avro, named)
    if get_origin(ann) is Annotated:  # Millis: a time plus its validator
        ann = get_args(ann)[0]
    origin = get_origin(ann)
    if origin in (Union, UnionType):
        args = [a for a in get_args(ann) if a is not NoneType]
        assert isinstance(avro, list) and avro[0] == "null", f"{where}: optional needs null first"
        assert len(args) == 1 and len(avro) == 2, where
        _check_type(args[0], avro[1], named, where)
        return
    assert not isinstance(avro, list), f"{where}: Avro union but Python type {ann} is required"
    if origin is tuple:
        assert isinstance(avro, dict) and avro["type"] == "array", where
        _check_type(get_args(ann)[0], avro["items"], named, where)
        return
    if isinstance(ann, type) and issubclass(ann, Enum):
        assert isinstance(avro, dict) and avro["type"] == "enum", where
        assert [e.value for e in ann] == avro["symbols"], f"{where}: enum symbols differ"
        assert avro.get("default") == "UNRECOGNIZED", f"{where}: enum needs a default symbol"
        return
    if isinstance(ann, type) and issubclass(ann, Record):
        assert isinstance(avro, dict) and avro["type"] == "record", where
        _check_fields(ann, avro, named)
        return
    if ann is AwareDatetime or ann is datetime:
        assert avro == {"type": "long", "logicalType": "timestamp-millis"}, where
        return
    expected = {str: "string", int: ("int", "long"), bool: "boolean", bytes: "bytes"}[ann]
    assert avro in (expected if isinstance(expected, tuple) else (expected,)), where


def _check_fields(model: type[Record], schema: dict[str, Any], named: dict[str, Any]) -> None:
    avro_fields = {f["name"]: f for f in schema["fields"]}
    assert list(avro_fields) == list(model.model_fields), f"{model.__name__}: fields differ"
    for name, field in model.model_fields.items():
        af = avro_fields[name]
        assert af.get("doc"), f"{model.__name__}.{name}: every field needs a doc"
        _check_type(field.annotation, af["type"], named, f"{model.__name__}.{name}")
        has_default = "default" in af
        assert has_default == (not field.is_required()), f"{model.__name__}.{name}: default"
        if has_default and af["default"] is not None:
            default = list(field.default) if isinstance(field.default, tuple) else field.default
            assert str(default) == str(af["default"]), f"{model.__name__}.{name}"


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.avro_name)
def test_model_mirrors_schema(model: type[Record]) -> None:
    schema = model.avro_schema()
    assert schema["namespace"].startswith("vigil.v1"), "every record has a namespace"
    assert schema.get("doc")
    named: dict[str, Any] = {}
    _named_types(schema, named)
    _check_fields(model, schema, named)
    fastavro.parse_schema(schema)


def _ms(dt: datetime) -> datetime:
    return dt.replace(microsecond=(dt.microsecond // 1000) * 1000)


times = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(_ms)
text = st.text(min_size=1, max_size=12)


def _strategy(ann: Any, text: st.SearchStrategy[str] = text) -> st.SearchStrategy[Any]:
    if get_origin(ann) is Annotated:
        ann = get_args(ann)[0]
    origin = get_origin(ann)
    if origin in (Union, UnionType):
        (arg,) = [a for a in get_args(ann) if a is not NoneType]
        return st.none() | _strategy(arg, text)
    if origin is tuple:
        return st.lists(_strategy(get_args(ann)[0], text), max_size=3).map(tuple)
    if isinstance(ann, type) and issubclass(ann, Enum):
        return st.sampled_from(list(ann))
    if isinstance(ann, type) and issubclass(ann, Record):
        return model_strategy(ann, text)
    if ann is AwareDatetime or ann is datetime:
        return times
    return {
        str: text,
        int: st.integers(min_value=1, max_value=2**31 - 1),
        bool: st.booleans(),
        bytes: st.binary(max_size=16),
    }[ann]


def model_strategy(
    model: type[Record], text: st.SearchStrategy[str] = text
) -> st.SearchStrategy[Record]:
    """Valid instances of a contract model (``text``: what its strings are drawn from)."""
    fields = model.model_fields.items()
    return st.builds(model, **{n: _strategy(f.annotation, text) for n, f in fields})


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.avro_name)
def test_round_trip_through_fastavro(model: type[Record]) -> None:
    parsed = fastavro.parse_schema(json.loads(model.avro_schema_str()))

    @settings(max_examples=40, deadline=None)
    @given(model_strategy(model))
    def roundtrip(instance: Record) -> None:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, instance.to_avro())
        buf.seek(0)
        back = model.model_validate(fastavro.schemaless_reader(buf, parsed, parsed))
        assert back == instance
        # the codec's hot path writes the very same bytes as the generic dump
        fast = io.BytesIO()
        fastavro.schemaless_writer(fast, parsed, avro_dict(instance))
        assert fast.getvalue() == buf.getvalue()
        # and reading with the writer's schema alone (the codec's path when the writer's
        # schema is ours) gives the same record as resolving against ours
        fast.seek(0)
        assert model.model_validate(fastavro.schemaless_reader(fast, parsed, None)) == instance

    roundtrip()


def test_times_are_kept_to_the_millisecond() -> None:
    from streams.contracts.models.events import RequesterHeartbeat

    t = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    beat = RequesterHeartbeat(event_id="e", execution_id="x", occurred_at=t)
    assert beat.occurred_at == datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)
    other_zone = RequesterHeartbeat(
        event_id="e", execution_id="x", occurred_at=t.astimezone(timezone(timedelta(hours=2)))
    )
    assert other_zone.occurred_at == beat.occurred_at
    assert other_zone.occurred_at.tzinfo is UTC


def test_naive_timestamps_are_refused() -> None:
    from streams.contracts.models.events import RequesterHeartbeat

    with pytest.raises(ValueError):
        RequesterHeartbeat(event_id="e", execution_id="x", occurred_at=datetime(2026, 1, 1))
