"""The compiled Avro writers (``streams/contracts/avro_writer.py``) write the output topics'
bytes, a public contract: they must be fastavro's bytes exactly, for every contract model."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.avro_writer import UnsupportedSchema, compile_writer, millis, write_long
from streams.contracts.codec import ALL_MODELS, avro_dict
from streams.contracts.models.base import Record
from tests.test_contracts import model_strategy

#: ids, reasons and names as they come: any length (a length of 64 bytes or more takes two
#: bytes), any script (multi-byte UTF-8)
wide_text = st.text(min_size=1, max_size=90)


def _fastavro(schema: dict[str, Any], value: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    return buf.getvalue()


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.avro_name)
def test_every_contract_model_is_written_as_fastavro_writes_it(model: type[Record]) -> None:
    schema = model.avro_schema()
    write = compile_writer(schema)

    @settings(max_examples=60, deadline=None)
    @given(model_strategy(model, wide_text))
    def same_bytes(instance: Record) -> None:
        expected = _fastavro(schema, avro_dict(instance))
        assert write(instance.__dict__) == expected  # the codec's path: the model's fields
        assert write(avro_dict(instance)) == expected  # nested records as dicts
        assert write(instance.__dict__, b"\x00\x00\x00\x00\x07") == b"\x00\x00\x00\x00\x07" + (
            expected
        )

    same_bytes()


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_a_long_is_zigzag_varint_over_the_whole_64_bit_range(n: int) -> None:
    out = bytearray()
    write_long(n, out)
    assert bytes(out) == _fastavro({"type": "long"}, n)


@pytest.mark.parametrize(
    "n", [0, -1, 1, 63, 64, -64, -65, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
)
def test_the_edges_of_each_varint_length(n: int) -> None:
    out = bytearray()
    write_long(n, out)
    assert bytes(out) == _fastavro({"type": "long"}, n)


@given(
    st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    )
)
def test_millis_is_fastavros_timestamp_millis_before_and_after_the_epoch(t: datetime) -> None:
    schema = {"type": "long", "logicalType": "timestamp-millis"}
    out = bytearray()
    write_long(millis(t), out)
    assert bytes(out) == _fastavro(schema, t)


def test_strings_of_every_length_class_and_script() -> None:
    schema = {"type": "record", "name": "S", "fields": [{"name": "s", "type": "string"}]}
    write = compile_writer(schema)
    for s in ["", "a", "x" * 63, "x" * 64, "é" * 32, "é" * 31 + "e", "日本" * 40, "🙂" * 300]:
        assert write({"s": s}) == _fastavro(schema, {"s": s}), s


def test_a_timezone_other_than_utc_is_the_same_instant() -> None:
    schema = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    t = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)
    shifted = t.astimezone(timezone(timedelta(hours=-5, minutes=-30)))
    assert shifted.utcoffset() != timedelta(0)
    assert compile_writer(schema)({"t": shifted}) == _fastavro(schema, {"t": t})


@pytest.mark.parametrize(
    "field_type",
    [
        "double",
        {"type": "map", "values": "string"},
        ["null", "string", "long"],
        ["string", "null"],
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "int", "logicalType": "date"},
    ],
    ids=repr,
)
def test_a_type_it_does_not_compile_is_refused_not_guessed(field_type: Any) -> None:
    schema = {"type": "record", "name": "U", "fields": [{"name": "u", "type": field_type}]}
    with pytest.raises(UnsupportedSchema):
        compile_writer(schema)
