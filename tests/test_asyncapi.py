"""The AsyncAPI 3 document: generated from the catalogue and schemas, checked in, and valid
against the official AsyncAPI 3.0.0 JSON Schema."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import jsonschema
import yaml
from typer.testing import CliRunner

from streams.cli.main import _mount_optional, app
from streams.contracts.asyncapi import AVRO_FORMAT, document, generate, render
from streams.kafka.topics import Role, Topics
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CHECKED_IN = ROOT / "docs" / "asyncapi.yaml"
SCHEMA = Path(__file__).resolve().parent / "asyncapi" / "asyncapi-3.0.0-without-id.schema.json"
REGENERATE = "vigil asyncapi --output docs/asyncapi.yaml"


@cache
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def errors(doc: dict) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
        for e in validator().iter_errors(doc)
    ]


def test_the_checked_in_document_is_the_generated_one() -> None:
    assert CHECKED_IN.read_text() == generate(), f"out of date: run {REGENERATE}"


def test_the_checked_in_document_is_valid_asyncapi_3() -> None:
    doc = yaml.safe_load(CHECKED_IN.read_text())
    assert doc["asyncapi"] == "3.0.0"
    assert errors(doc) == []


def test_the_yaml_says_what_the_document_says() -> None:
    """The emitter's text, read by a YAML parser, is the document (JSON types)."""
    doc = document()
    assert yaml.safe_load(render(doc)) == json.loads(json.dumps(doc))
    tricky = {
        "k": ["null", "", "yes", "on", "3.0.0", "a: b", "x #y", "-1", "{p}", "ü", "$ref", "a\nb"],
        "n": [0, -1, None, True, False, 1.5],
        "e": {"d": {}, "l": []},
        "l": [[1, 2], [{"a": 1, "b": {"c": [1]}}]],
    }
    assert yaml.safe_load(render(tricky)) == tricky


def test_the_validator_refuses_a_broken_document() -> None:
    """The schema really checks: a wrong action, a message without its channel's ref target
    shape, and a missing version are each refused."""
    doc = json.loads(json.dumps(document()))
    for break_it in (
        lambda d: d["operations"]["receiveExecutionStatus"].update(action="publish"),
        lambda d: d["info"].pop("version"),
        lambda d: d["channels"]["alerts"]["bindings"]["kafka"].update(partitions=0),
        lambda d: d["components"]["messages"]["Alert"].update(headers="kind"),
    ):
        broken = copy.deepcopy(doc)
        break_it(broken)
        assert errors(broken), break_it


def test_every_topic_key_record_and_header_is_described() -> None:
    doc = document()
    topics = Topics.from_settings(Settings())
    channels = {c["address"]: c for c in doc["channels"].values()}
    assert len(channels) == len(topics.all())
    messages = doc["components"]["messages"]
    for spec in topics.all():
        channel = channels["{prefix}" + spec.name[len("vigil") :]]
        assert set(channel["messages"]) == {m.avro_name for m in spec.value_types}
        kafka = channel["bindings"]["kafka"]
        assert kafka["partitions"] == spec.partitions
        assert kafka["topicConfiguration"]["cleanup.policy"] == [spec.cleanup_policy]
        assert channel["x-vigil-role"] == str(spec.role)
        for model in spec.value_types:
            m = messages[model.avro_name]
            assert m["payload"] == {"schemaFormat": AVRO_FORMAT, "schema": model.avro_schema()}
            key = m["bindings"]["kafka"]["key"]
            keyed = model.key_field is not None or model.avro_name == "IdempotencyClaim"
            assert key["type"] == ("string" if keyed else "null")
    ops = doc["operations"].values()
    receives = {o["channel"]["$ref"] for o in ops if o["action"] == "receive"}
    sends = {o["channel"]["$ref"] for o in ops if o["action"] == "send"}
    internal = len(topics.internal())  # written and read by the workers
    assert len(receives) == len(topics.inputs()) + internal
    assert len(sends) == len(topics.outputs()) + internal
    inputs = {
        f"#/channels/{cid}"
        for cid, c in doc["channels"].items()
        if c["x-vigil-role"] in (Role.INPUT, Role.INTERNAL)
    }
    assert receives == inputs
    headers = messages["Alert"]["headers"]["properties"]
    assert set(headers) == {"kind", "status", "verdict", "owner", "severity", "traceparent"}
    assert "headers" not in messages["Anomaly"]


def test_cli_writes_prints_and_checks(tmp_path: Path) -> None:
    _mount_optional()
    runner = CliRunner()
    target = tmp_path / "asyncapi.yaml"
    res = runner.invoke(app, ["asyncapi", "--output", str(target)])
    assert res.exit_code == 0, res.output
    assert target.read_text() == generate()
    assert runner.invoke(app, ["asyncapi", "--output", str(target), "--check"]).exit_code == 0
    printed = runner.invoke(app, ["asyncapi"])
    assert printed.exit_code == 0 and printed.stdout == generate()
    target.write_text(generate().replace("partitions: 6", "partitions: 7", 1))
    stale = runner.invoke(app, ["asyncapi", "--output", str(target), "--check"])
    assert stale.exit_code == 1
    assert "vigil asyncapi --output" in stale.stderr
    assert runner.invoke(app, ["asyncapi", "--check"]).exit_code != 0
