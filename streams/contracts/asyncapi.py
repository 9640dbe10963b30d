"""An AsyncAPI 3.0.0 document of vigil's topics, made from the topic catalogue and the schemas.

Why generated: the catalogue (``streams.kafka.topics``) and the ``.avsc`` files are what the worker
really reads and writes; a document written by hand would drift from them. ``vigil asyncapi``
writes ``docs/asyncapi.yaml`` from them, and ``--check`` (and ``tests/test_asyncapi.py``) fails
when the checked-in file differs, so a change to a schema or a topic comes with its document.

What it says: one channel per topic (address ``{prefix}.<name>``, partitions and topic
configuration as Kafka bindings), one message per record type with its Avro schema as the
payload (``schemaFormat`` Avro 1.9.0), its key and registry subject strategy as Kafka message
bindings, the alerts' Kafka headers, and vigil's side of each channel as an operation (it
receives the inputs, sends the outputs) with the delivery guarantee.

The YAML is emitted here (block style, keys in the document's order, strings quoted as JSON
when plain style could be misread), so the text depends on nothing but the inputs.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from streams.contracts.models.base import Record
from streams.kafka.topics import Role, Topics, TopicSpec
from streams.settings import Settings

AVRO_FORMAT = "application/vnd.apache.avro+json;version=1.9.0"
KAFKA_BINDING = "0.5.0"
TRACEPARENT_PATTERN = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
DELIVERY = (
    "At-least-once with deterministic, idempotent outputs: the worker sends a batch's outputs "
    "(idempotent producer, acks=all, murmur2 partitioner) and waits for the broker before it "
    "stores its state and commits the inputs. After a crash the same inputs give the same "
    "records with the same ids, so a consumer deduplicates by id (see topology.md, Delivery "
    "guarantee)."
)
WRITER_DELIVERY = (
    "At-least-once: vigil reconcile writes a work item's progress (idempotent producer, "
    "acks=all) before it commits the work item, and the latest record per work item id is "
    "its state (see topology.md, Reconciler)."
)
INTERNAL = (
    "Internal: written and read by the workers themselves, the join of attempts across "
    "executions by connector and idempotency key (topology.md, Blind retries across "
    "executions). At-least-once with deterministic ids; a reader keeps what it has seen by id."
)
_INT_CONFIGS = frozenset(
    {
        "retention.ms",
        "delete.retention.ms",
        "min.compaction.lag.ms",
        "message.timestamp.after.max.ms",
    }
)


def _version() -> str:
    """The project's version: from pyproject.toml in a source tree (the checked-in document
    must not depend on what is installed), else from the installed package."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.exists():
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    from importlib.metadata import version

    return version("vigil")


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(p.capitalize() for p in rest)


def _address(spec: TopicSpec, settings: Settings) -> str:
    return "{prefix}" + spec.name[len(settings.topic_prefix) :]


def _topic_configuration(spec: TopicSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in sorted(spec.config().items()):
        if name == "cleanup.policy":
            out[name] = value.split(",")
        elif name in _INT_CONFIGS:
            out[name] = int(value)
        else:
            out[name] = value
    return out


def _key_schema(model: type[Record], spec: TopicSpec) -> dict[str, Any]:
    if model.avro_name == "IdempotencyClaim":
        return {
            "type": "string",
            "description": (
                "UTF-8 text of the record's connector and idempotency_key, each "
                "percent-encoded (RFC 3986: every character but A-Z a-z 0-9 - . _ ~ as %XX of "
                f"its UTF-8 bytes), joined by '/' (topic key: {spec.key})."
            ),
        }
    if model.avro_name == "ClaimsProgress":
        return {"type": "null", "description": "Unkeyed: written to each partition."}
    if model.key_field is None:
        return {"type": "null", "description": "Unkeyed: a tick is written to each partition."}
    if model.key_scoped:
        return {
            "type": "string",
            "description": (
                f"UTF-8 text of the record's execution_id and {model.key_field}, each "
                "percent-encoded (RFC 3986: every character but A-Z a-z 0-9 - . _ ~ as %XX of "
                f"its UTF-8 bytes), joined by '/' (topic key: {spec.key})."
            ),
        }
    return {
        "type": "string",
        "description": f"UTF-8 text of the record's {model.key_field} (topic key: {spec.key}).",
    }


def _alert_headers() -> dict[str, Any]:
    from streams.contracts.models.outputs import Alert

    fields = {f["name"]: f for f in Alert.avro_schema()["fields"]}

    def symbols(name: str) -> list[str]:
        return list(fields[name]["type"]["symbols"])

    return {
        "type": "object",
        "description": "Set on every alert, so that a subscriber can filter without decoding.",
        "properties": {
            "kind": {"type": "string", "enum": symbols("kind")},
            "status": {"type": "string", "enum": symbols("status")},
            "verdict": {
                "type": "string",
                "description": "The verdict or anomaly kind the alert is about; empty if none.",
            },
            "owner": {"type": "string", "enum": symbols("owner")},
            "severity": {"type": "string", "enum": symbols("severity")},
            "traceparent": {
                "type": "string",
                "pattern": TRACEPARENT_PATTERN,
                "description": "W3C traceparent of the alert's record; only when it has one.",
            },
        },
        "required": ["kind", "status", "verdict", "owner", "severity"],
    }


def _message(model: type[Record], spec: TopicSpec) -> dict[str, Any]:
    schema = model.avro_schema()
    message: dict[str, Any] = {
        "name": model.avro_name,
        "title": f"{schema['namespace']}.{schema['name']}",
        "summary": schema.get("doc", model.avro_name),
        "contentType": "application/vnd.apache.avro+binary",
        "description": (
            "Avro binary in the Confluent wire format (a zero byte, the 4-byte schema id, the "
            "record); consumers decode by the schema id."
        ),
    }
    if model.avro_name == "Alert":
        message["headers"] = _alert_headers()
    message["payload"] = {"schemaFormat": AVRO_FORMAT, "schema": schema}
    strategy = "TopicNameStrategy" if spec.value_subject else "TopicRecordNameStrategy"
    message["bindings"] = {
        "kafka": {
            "key": _key_schema(model, spec),
            "schemaIdLocation": "payload",
            "schemaIdPayloadEncoding": "confluent",
            "schemaLookupStrategy": strategy,
            "bindingVersion": KAFKA_BINDING,
        }
    }
    return message


def document(settings: Settings | None = None) -> dict[str, Any]:
    """The AsyncAPI document of the catalogue for ``settings`` (the defaults: what ships)."""
    s = settings or Settings()
    topics = Topics.from_settings(s)
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for spec in topics.all():
        cid = _camel(spec.name[len(s.topic_prefix) + 1 : len(spec.name) - len(s.output_suffix)])
        refs = {}
        for model in spec.value_types:
            messages.setdefault(model.avro_name, _message(model, spec))
            refs[model.avro_name] = {"$ref": f"#/components/messages/{model.avro_name}"}
        channels[cid] = {
            "address": _address(spec, s),
            "title": spec.name[len(s.topic_prefix) + 1 :],
            "description": f"{spec.doc} Key: {spec.key}.",
            "messages": refs,
            "parameters": {"prefix": {"$ref": "#/components/parameters/prefix"}},
            "bindings": {
                "kafka": {
                    "partitions": spec.partitions,
                    "topicConfiguration": _topic_configuration(spec),
                    "bindingVersion": KAFKA_BINDING,
                }
            },
            "x-vigil-role": str(spec.role),
            "x-vigil-key": spec.key,
        }
        actions = {Role.INPUT: ("receive",), Role.OUTPUT: ("send",)}.get(
            spec.role, ("send", "receive")
        )
        for action in actions:
            receive = action == "receive"
            op: dict[str, Any] = {
                "action": action,
                "channel": {"$ref": f"#/channels/{cid}"},
                "summary": (
                    f"The worker reads {spec.name[len(s.topic_prefix) + 1 :]}."
                    if receive
                    else f"{spec.writer or 'The worker'} publishes "
                    f"{spec.name[len(s.topic_prefix) + 1 :]}."
                ),
                "description": (
                    "Records are processed in event-time order per partition; the offsets are "
                    "committed once their effect is stored and their outputs delivered."
                    if spec.role is Role.INPUT
                    else INTERNAL
                    if spec.role is Role.INTERNAL
                    else DELIVERY
                    if spec.writer is None
                    else WRITER_DELIVERY
                ),
                "messages": [{"$ref": f"#/channels/{cid}/messages/{name}"} for name in refs],
            }
            if receive:
                op["bindings"] = {
                    "kafka": {
                        "groupId": {"type": "string", "enum": [s.app_id]},
                        "bindingVersion": KAFKA_BINDING,
                    }
                }
            op["x-vigil-delivery"] = "at-least-once, deterministic ids"
            operations[action + cid[0].upper() + cid[1:]] = op
    return {
        "asyncapi": "3.0.0",
        "id": "urn:vigil:pipeline",
        "info": {
            "title": "vigil",
            "version": _version(),
            "description": (
                "The topics vigil reads and writes. Generated by `vigil asyncapi` from the topic "
                "catalogue (streams/kafka/topics.py) and the Avro schemas (schemas/); do not edit "
                "by hand. Keys are UTF-8 strings; values are Avro in the Confluent wire format; "
                "the input topics are co-partitioned by execution_id with the murmur2 partitioner. "
                "Output topic names end with VIGIL_OUTPUT_SUFFIX (empty by default)."
            ),
        },
        "defaultContentType": "application/vnd.apache.avro+binary",
        "servers": {
            "development": {
                "host": s.bootstrap_servers,
                "protocol": "kafka",
                "description": "The development broker of `vigil dev up`.",
                "bindings": {
                    "kafka": {
                        "schemaRegistryUrl": s.schema_registry_url,
                        "schemaRegistryVendor": "confluent",
                        "bindingVersion": KAFKA_BINDING,
                    }
                },
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "parameters": {
                "prefix": {
                    "description": "The deployment's topic prefix (VIGIL_TOPIC_PREFIX).",
                    "default": s.topic_prefix,
                }
            },
            "messages": messages,
        },
    }


# -- YAML ----------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./ ()-]*")
_RESERVED = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"})


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    text = str(value)
    if (
        _PLAIN.fullmatch(text)
        and text.lower() not in _RESERVED
        and not text.endswith(" ")
        and ": " not in text
        and " #" not in text
    ):
        return text
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a YAML double-quoted one


def _emit(value: Any, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        for k, v in value.items():
            key = _scalar(k)
            if (isinstance(v, dict) and v) or (isinstance(v, list) and v):
                out.append(f"{pad}{key}:")
                _emit(v, indent + 1, out)
            else:
                out.append(f"{pad}{key}: {_inline(v)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                sub: list[str] = []
                _emit(item, indent + 1, sub)
                first = sub[0][len(pad) + 2 :]
                out.append(f"{pad}- {first}")
                out.extend(sub[1:])
            elif isinstance(item, list) and item:
                sub = []
                _emit(item, indent + 1, sub)
                out.append(f"{pad}-")
                out.extend(sub)
            else:
                out.append(f"{pad}- {_inline(item)}")
    else:  # pragma: no cover - the document's root is a mapping
        out.append(pad + _inline(value))


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def render(doc: dict[str, Any]) -> str:
    """``doc`` as YAML text (block style)."""
    out: list[str] = []
    _emit(doc, 0, out)
    return "\n".join(out) + "\n"


def generate(settings: Settings | None = None) -> str:
    return render(document(settings))
