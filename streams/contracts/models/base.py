"""Base class of every contract model, and the link from a model to its ``.avsc`` file."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict

from streams.contracts.keys import scoped_key

#: The Avro contracts: the top-level ``schemas/`` directory, packaged as
#: ``streams.contracts.schemas`` (pyproject maps it), so an installed wheel has them too.
SCHEMA_DIR = Path(str(resources.files("streams.contracts.schemas")))


M = TypeVar("M", bound=BaseModel)


def to_millis(value: datetime) -> datetime:
    """Avro ``timestamp-millis`` keeps milliseconds; truncating on the way in keeps
    round-trips exact instead of surprising a consumer with a changed microsecond."""
    if value.tzinfo is UTC and value.microsecond % 1000 == 0:
        return value  # already what it must be: the common case, kept cheap
    value = value.astimezone(UTC)
    return value.replace(microsecond=(value.microsecond // 1000) * 1000)


#: The type of every time field of a contract record: aware (a naive time is refused) and
#: truncated to milliseconds. A validator on these fields alone, not one on every field: it
#: runs for each field of each decoded record, a fifth of the cost of validating one.
Millis = Annotated[AwareDatetime, AfterValidator(to_millis)]


# The instance slots every pydantic model has, set directly: ``construct`` and ``replace``
# run several times per event, and this is what ``model_construct`` does, minus its generic
# handling of defaults, aliases, extras and private attributes.
_new = object.__new__
_set_dict = object.__setattr__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def construct(cls: type[M], values: dict[str, Any]) -> M:
    """``cls.model_construct(**values)`` for values already known valid, at a quarter of its
    cost, for the models built once or more per event. ``values`` must name every field, in
    declaration order and with the types validation would give (enums as enums, tuples as
    tuples, times in UTC milliseconds for a ``Record``): then the instance equals, dumps and
    serialises exactly as the validated one. ``fields_set`` is all of them."""
    new = _new(cls)
    _set_dict(new, "__dict__", values)
    _set_fields_set(new, set(values))
    _set_extra(new, None)
    _set_private(new, None)
    return new


def constructor(cls: type[M]) -> Callable[[dict[str, Any]], M]:
    """``construct`` for one class, made once: the instance's fields set (every field, as
    ``construct`` requires them all) is built once and shared by the instances, which are
    frozen and never change it."""
    fields_set = set(cls.model_fields)

    def make(values: dict[str, Any]) -> M:
        new = _new(cls)
        _set_dict(new, "__dict__", values)
        _set_fields_set(new, fields_set)
        _set_extra(new, None)
        _set_private(new, None)
        return new

    return make


def replace(model: M, **changes: Any) -> M:
    """``model.model_copy(update=changes)`` without its generic machinery, for the books,
    slots and attempts that change on every event: the same ``__dict__`` and fields set, no
    validation. For frozen models without private attributes or extras, as vigil's are."""
    new = _new(type(model))
    _set_dict(new, "__dict__", {**model.__dict__, **changes})
    _set_fields_set(new, model.__pydantic_fields_set__ | changes.keys())
    _set_extra(new, None)
    _set_private(new, None)
    return new


@cache
def schema_text(name: str) -> str:
    """The ``.avsc`` text of a record, by its simple name."""
    return (SCHEMA_DIR / f"{name}.avsc").read_text()


class Record(BaseModel):
    """A contract record: immutable, strict about unknown fields, times in UTC milliseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Simple name of the Avro record; the ``.avsc`` file is ``schemas/<name>.avsc``.
    avro_name: ClassVar[str]
    #: Field whose value is the Kafka key (``None``: unkeyed, like clock ticks).
    key_field: ClassVar[str | None] = "execution_id"
    #: The key is ``scoped_key(execution_id, <key_field>)``: the field names an operation or
    #: an approval request (or an alert's subject), which is unique only within its execution.
    key_scoped: ClassVar[bool] = False
    #: Field whose value is the Kafka record timestamp: event time, never the send time.
    time_field: ClassVar[str | None] = "occurred_at"

    @classmethod
    def avro_schema_str(cls) -> str:
        return schema_text(cls.avro_name)

    @classmethod
    def avro_schema(cls) -> dict[str, Any]:
        return json.loads(cls.avro_schema_str())

    @classmethod
    def avro_fullname(cls) -> str:
        s = cls.avro_schema()
        return f"{s['namespace']}.{s['name']}"

    def kafka_key(self) -> str | None:
        if self.key_field is None:
            return None
        value = getattr(self, self.key_field)
        if self.key_scoped:
            return scoped_key(self.execution_id, value)
        return value

    def to_avro(self) -> dict[str, Any]:
        """The dict that fastavro writes: enums as their symbol strings, nested records as dicts."""
        return self.model_dump(mode="python")
