"""The CLI without a cluster: every ``--help``, the error boundary (one line, an exit code of
its kind, a traceback only with ``--debug``), the checking of produce input, consume's start
positions and filters, and the sample files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.schema_registry.error import SchemaRegistryError
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from streams.cli.consume import (
    Start,
    matches,
    parse_header_filters,
    parse_offset,
    resolve,
    start_from,
)
from streams.cli.errors import BadArgument, ExitCode, explain
from streams.cli.produce import check_lines
from streams.contracts.codec import RegistryUnavailable
from streams.contracts.models.enums import (
    EvidenceSource,
    ExecutionStatus,
    OperationStatus,
    WorkItemKind,
)
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import (
    ExecutionState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.kafka.topics import Topics
from streams.local.demo import describe, feed_line
from streams.settings import Settings, SettingsError

SAMPLES = Path(__file__).resolve().parents[1] / "streams" / "samples"
TOPICS = Topics.from_settings(Settings())
#: where vigil says it cannot reach anything
NOWHERE = "http://127.0.0.1:9"


def vigil(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Any:
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    return CliRunner(env={"COLUMNS": "200", **(env or {})}).invoke(app, list(args), input=stdin)


def _commands() -> list[list[str]]:
    """The path of every command and sub-command, walked from typer's click group."""
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    found: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        found.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "vigil")
def test_every_help_shows_its_text_whole(path: list[str]) -> None:
    """No markup artefacts: every bracketed part of every help text is printed as written
    (terminal markup once ate "[default: …]"), and no markup tag shows."""
    from streams.cli.main import app

    res = vigil(*path, "--help")
    assert res.exit_code == 0, res.output
    shown = _words(res.output)
    assert "Traceback" not in res.output
    assert not re.search(r"\[/?(red|bold|dim|green|yellow|cyan|blue)\]", res.output)
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    texts = [getattr(p, "help", None) or "" for p in command.params]
    for text in texts:
        for bracketed in re.findall(r"\[[^\]]*\]", text):
            assert _words(bracketed) in shown, (bracketed, res.output)


def test_the_dev_help_is_the_long_one() -> None:
    res = vigil("dev", "--help")
    assert "without Docker" in res.output and "VIGIL_DEV_KAFKA_PORT" in res.output


def test_the_exit_codes_are_documented_in_the_help() -> None:
    shown = _words(vigil("--help").output)
    for code in ExitCode:
        if code is not ExitCode.OK:
            assert f"; {code.value} " in shown or f" {code.value} " in shown, code


def test_a_bad_setting_names_its_variable_in_one_line() -> None:
    res = vigil("config", env={"VIGIL_GRACE": "five"})
    assert res.exit_code == ExitCode.SETTING
    assert "VIGIL_GRACE" in res.output and "five" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_debug_adds_the_traceback() -> None:
    res = vigil("--debug", "config", env={"VIGIL_GRACE": "five"})
    assert res.exit_code == ExitCode.SETTING
    assert "Traceback" in res.output and "VIGIL_GRACE" in res.output


def test_config_prints_durations_as_they_are_written() -> None:
    res = vigil("config", env={"VIGIL_CLOSED_RETENTION": "1d"})
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["closed_retention"] == "24h" and shown["grace"] == "5m"
    assert "day" not in res.stdout


def test_topics_list_says_forever_and_speaks_json() -> None:
    table = vigil("topics", "list")
    assert table.exit_code == 0 and "forever" in table.output and "-1d" not in table.output
    rows = json.loads(vigil("topics", "list", "--json").stdout)
    assert [r["name"] for r in rows] == [t.name for t in TOPICS.all()]
    for row in rows:
        if row["cleanup"] == "compact":
            assert row["retention"] is None and row["retention_ms"] is None
        else:
            assert row["retention"] == "forever" and row["retention_ms"] == -1
    week = json.loads(
        vigil("topics", "list", "--json", env={"VIGIL_RETENTION_MS": "604800000"}).stdout
    )
    assert {r["retention"] for r in week if r["cleanup"] == "delete"} == {"7d"}


def test_produce_to_an_unknown_topic_lists_the_topics(tmp_path: Path) -> None:
    sample = SAMPLES / "execution-status.jsonl"
    res = vigil("produce", "vigil.nope", str(sample))
    assert res.exit_code == ExitCode.TOPIC
    assert "unknown topic vigil.nope" in res.output and "vigil.execution-status" in res.output
    assert "Traceback" not in res.output


def test_produce_reports_every_bad_line_by_field_and_publishes_nothing(tmp_path: Path) -> None:
    good = (SAMPLES / "execution-status.jsonl").read_text().splitlines()[:2]
    bad_status = json.dumps({**json.loads(good[0]), "status": "DONE"})
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([good[0], bad_status, "{not json", good[1], "[1, 2]"]) + "\n")

    # no broker is given: a file with bad lines never gets as far as connecting
    res = vigil("produce", "vigil.execution-status", str(path), "--bootstrap", "127.0.0.1:9")

    assert res.exit_code == ExitCode.INPUT
    assert "line 2: ExecutionStatusChanged: status: Input should be" in res.output
    assert "(got 'DONE')" in res.output
    assert "line 3: not JSON" in res.output and "line 5: not a JSON object" in res.output
    assert "3 bad lines" in res.output and "nothing published" in res.output
    assert "line 1" not in res.output and "line 4" not in res.output
    assert "pydantic.dev" not in res.output and "Traceback" not in res.output


def test_produce_dry_run_checks_without_a_cluster(tmp_path: Path) -> None:
    sample = SAMPLES / "approval-events.jsonl"
    res = vigil("produce", "vigil.approval-events", str(sample), "--dry-run")
    assert res.exit_code == 0, res.output
    n = len(sample.read_text().splitlines())
    assert f"{n} valid records" in res.output and "nothing published" in res.output


def test_produce_reads_stdin_and_names_a_missing_file(tmp_path: Path) -> None:
    sample = (SAMPLES / "run-signals.jsonl").read_text()
    res = vigil("produce", "vigil.run-signals", "-", "--dry-run", stdin=sample)
    assert res.exit_code == 0 and "valid records" in res.output
    res = vigil("produce", "vigil.run-signals", str(tmp_path / "missing.jsonl"))
    assert res.exit_code == ExitCode.INPUT and "missing.jsonl: no such file" in res.output


def test_unreachable_services_are_one_line_each() -> None:
    res = vigil("status", "exec-1", "--url", NOWHERE)
    assert res.exit_code == ExitCode.SERVICE and "cannot reach the worker" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["consume", "vigil.alerts", "--offset", "soon"], "--offset 'soon' is not an offset"),
        (["consume", "vigil.alerts", "--header", "owner"], "is not NAME=VALUE"),
        (["consume", "vigil.alerts", "--offset", "5", "--from-beginning"], "give one of"),
        (["consume", "vigil.alerts", "--from-time", "yesterday"], "not a duration"),
        (["consume", "vigil.alerts", "--from-time", "2026-07-26T16:00:00"], "timezone"),
        (["worker", "--batch-wait", "5x"], "--batch-wait: not a duration"),
        (["ticker", "--interval", "often"], "--interval: not a duration"),
    ],
)
def test_bad_arguments_are_usage_errors(args: list[str], complaint: str) -> None:
    res = vigil(*args, "--bootstrap", "127.0.0.1:9")
    assert res.exit_code == ExitCode.USAGE, res.output
    assert complaint in res.output and "Traceback" not in res.output


# -- the boundary's mapping -----------------------------------------------------------------


def _validation_error() -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        ExecutionStatusChanged.model_validate({"event_id": "e", "status": "DONE", "bogus": 1})
    return caught.value


@pytest.mark.parametrize(
    ("exc", "code", "says"),
    [
        (SettingsError("VIGIL_GRACE: not a duration"), ExitCode.SETTING, "VIGIL_GRACE"),
        (_validation_error(), ExitCode.INPUT, "bogus: not a field of ExecutionStatusChanged"),
        (
            KafkaException(KafkaError(KafkaError._TRANSPORT, "down")),
            ExitCode.KAFKA,
            "KAFKA_BOOTSTRAP_SERVERS",
        ),
        (RegistryUnavailable("registering X: timeout"), ExitCode.REGISTRY, "SCHEMA_REGISTRY_URL"),
        (
            SchemaRegistryError(404, 40401, "Subject not found"),
            ExitCode.REGISTRY,
            "vigil schemas register",
        ),
        (
            httpx.ConnectError("refused", request=httpx.Request("GET", NOWHERE)),
            ExitCode.SERVICE,
            "127.0.0.1:9",
        ),
        (FileNotFoundError(2, "No such file or directory", "x.json"), ExitCode.INPUT, "x.json"),
        (BadArgument("--offset: no"), ExitCode.USAGE, "--offset"),
        (KeyboardInterrupt(), ExitCode.INTERRUPTED, "interrupted"),
        (ZeroDivisionError("oops"), ExitCode.INTERNAL, "--debug"),
    ],
)
def test_each_kind_of_failure_has_its_line_and_code(
    exc: BaseException, code: ExitCode, says: str
) -> None:
    explained = explain(exc)
    assert explained.code == code and says in explained.message
    assert "\n" not in explained.message and "pydantic.dev" not in explained.message


def test_exit_codes_are_distinct() -> None:
    assert len({c.value for c in ExitCode}) == len(ExitCode)


# -- produce input ---------------------------------------------------------------------------


def test_every_input_topic_has_a_valid_sample() -> None:
    for spec in TOPICS.inputs():
        short = spec.name.split(".", 1)[1]
        lines = (SAMPLES / f"{short}.jsonl").read_text().splitlines()
        checked = check_lines(lines, spec)
        assert checked.problems == () and len(checked.records) == len(lines) > 0
        # the samples use every event type of their topic but ticks (vigil tick closes them)
        used = {type(r).avro_name for _, r in checked.records}
        assert used == {m.avro_name for m in spec.value_types} - {"ClockTick"}


def test_a_line_on_a_topic_of_several_types_needs_its_type() -> None:
    spec = TOPICS.approval_events
    line = json.dumps({"event_id": "e", "execution_id": "x", "request_id": "r"})
    (problem,) = check_lines([line], spec).problems
    assert '"type" is missing' in problem.message and "ApprovalDecision" in problem.message
    wrong = json.dumps({"type": "Alert"})
    (problem,) = check_lines([wrong], spec).problems
    assert "does not belong on vigil.approval-events" in problem.message


def test_a_tick_line_outside_the_partitions_is_refused() -> None:
    tick = {"type": "ClockTick", "ticker_id": "t", "occurred_at": "2026-07-26T16:00:00Z"}
    lines = [json.dumps(tick | {"partition": p}) for p in (0, 5, 6)]
    checked = check_lines(lines, TOPICS.run_signals)
    assert [n for n, _ in checked.records] == [1, 2]
    (problem,) = checked.problems
    assert problem.line == 3 and "0..5" in problem.message


def test_blank_lines_are_skipped_and_counted() -> None:
    line = (SAMPLES / "execution-status.jsonl").read_text().splitlines()[0]
    checked = check_lines(["", line, "   ", "{"], TOPICS.execution_status)
    assert [n for n, _ in checked.records] == [2]
    assert [p.line for p in checked.problems] == [4]


# -- consume positions and filters -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("beginning", Start("beginning")),
        ("earliest", Start("beginning")),
        ("END", Start("end")),
        ("42", Start("offset", 42)),
        ("-10", Start("last", 10)),
    ],
)
def test_offsets_are_read_like_kcat(text: str, start: Start) -> None:
    assert parse_offset(text) == start


@pytest.mark.parametrize("text", ["", "soon", "1.5", "--3", "+4"])
def test_other_offsets_are_refused_with_the_allowed_forms(text: str) -> None:
    with pytest.raises(BadArgument, match="allowed: beginning, end"):
        parse_offset(text)


@given(
    low=st.integers(0, 1000),
    size=st.integers(0, 1000),
    value=st.integers(0, 3000),
    found=st.integers(-1, 3000),
)
def test_a_start_is_always_inside_the_partition(
    low: int, size: int, value: int, found: int
) -> None:
    high = low + size
    for start in (
        Start("beginning"),
        Start("end"),
        Start("offset", value),
        Start("last", value),
        Start("time", 0),
    ):
        offset = resolve(start, low, high, found if found < 0 or found >= low else low)
        assert low <= offset <= high
    assert resolve(Start("last", value), low, high) == max(high - value, low)
    assert resolve(Start("time", 0), low, high, -1) == high


def test_filters_match_key_and_every_header() -> None:
    headers = {"owner": "RUNTIME_OWNER", "kind": "UNKNOWN_OPERATION"}
    assert matches("op-1", headers, None, ())
    assert matches("op-1", headers, "op-1", (("owner", "RUNTIME_OWNER"),))
    assert not matches("op-2", headers, "op-1", ())
    assert not matches("op-1", headers, None, (("owner", "RUNTIME_OWNER"), ("kind", "X")))
    assert not matches("op-1", {}, None, (("owner", ""),))
    assert matches(None, {"owner": ""}, None, (("owner", ""),))


def test_header_filters_split_at_the_first_equals_sign() -> None:
    assert parse_header_filters(["a=b=c", "empty="]) == (("a", "b=c"), ("empty", ""))
    with pytest.raises(BadArgument):
        parse_header_filters(["=value"])


def test_one_start_option_at_most() -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 7, 26, 16, tzinfo=UTC)
    assert start_from(from_beginning=False, offset=None, from_time=None) == Start("end")
    assert start_from(from_beginning=False, offset=None, from_time=at) == Start(
        "time", int(at.timestamp() * 1000)
    )
    with pytest.raises(BadArgument, match="--offset, --from-time"):
        start_from(from_beginning=False, offset="1", from_time=at)


# -- the commands that talk HTTP: one line, the code of the README's table -------------------


class _Answers(BaseHTTPRequestHandler):
    """A stand-in worker API and console: each path answers with the status it names
    (``/api/executions/x/operations/s409/review`` answers 409), the error long enough to
    wrap at 80 columns."""

    def _answer(self) -> None:
        status = next((int(p[1:]) for p in self.path.split("/") if re.fullmatch(r"s\d{3}", p)), 200)
        body = json.dumps({"error": "refused: " + "a long reason, " * 12, "status": status})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def answers() -> Any:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


REVIEW = ["review", "--verified", "--note", "statement line 7", "--reviewer", "alice"]


@pytest.mark.parametrize(
    ("op", "extra", "env", "code"),
    [
        ("op-1", [], {}, ExitCode.SETTING),  # no write token: a setting
        ("op-1", ["--console", "notaurl"], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.USAGE),
        ("op-1", ["--console", "ftp://x"], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.USAGE),
        ("s401", [], {"VIGIL_CONSOLE_WRITE_TOKEN": "wrong"}, ExitCode.REFUSED),
        ("s404", [], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.REFUSED),
        ("s409", [], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.REFUSED),
        ("s400", [], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.USAGE),
        ("s503", [], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.SERVICE),
        ("", [], {"VIGIL_CONSOLE_WRITE_TOKEN": "t"}, ExitCode.USAGE),
    ],
)
def test_review_exits_with_the_code_of_the_table(
    answers: str, op: str, extra: list[str], env: dict[str, str], code: ExitCode
) -> None:
    res = vigil(
        *REVIEW, op, "--console", answers, *extra, env={"VIGIL_CONSOLE_WRITE_TOKEN": "", **env}
    )
    assert res.exit_code == code, res.output
    assert res.output.startswith("error: ") and len(res.output.strip().splitlines()) == 1


def test_review_of_an_unreachable_console_is_8() -> None:
    res = vigil(*REVIEW, "op-1", "--console", NOWHERE, env={"VIGIL_CONSOLE_WRITE_TOKEN": "t"})
    assert res.exit_code == ExitCode.SERVICE and "cannot reach the console" in res.output


@pytest.mark.parametrize("command", ["status", "watch"])
def test_an_empty_execution_id_is_a_bad_argument(answers: str, command: str) -> None:
    res = vigil(command, "", "--url", answers)
    assert res.exit_code == ExitCode.USAGE, res.output
    assert "execution id is empty" in res.output and "404" not in res.output


def test_status_refusals_follow_the_table(answers: str) -> None:
    assert vigil("status", "s404", "--url", answers).exit_code == ExitCode.REFUSED
    assert vigil("status", "s401", "--url", answers).exit_code == ExitCode.REFUSED
    assert vigil("status", "s400", "--url", answers).exit_code == ExitCode.USAGE
    assert vigil("status", "x", "--url", "localhost:6066").exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    "args",
    [
        ["status", "s409", "--url"],
        ["watch", "s404", "--url"],
        [*REVIEW, "s409", "--console"],
    ],
    ids=["status", "watch", "review"],
)
def test_errors_are_one_line_at_any_width_through_a_process(answers: str, args: list[str]) -> None:
    """stderr a pipe, not a terminal (rich would wrap at 80 columns) and a long answer: the
    error is still one line."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(VIGIL_CONSOLE_WRITE_TOKEN="t", PYTHONPATH=str(SAMPLES.parents[1]))
    res = subprocess.run(
        [sys.executable, "-m", "streams.cli", *args, answers],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "a long reason" in lines[0] and len(lines[0]) > 80
    assert res.returncode == ExitCode.REFUSED


# -- the live feed's lines (vigil watch, vigil demo) ------------------------------------------

_AT = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def test_a_change_that_is_not_the_end_is_shown_with_what_is_open() -> None:
    state = ExecutionState(
        execution_id="exec-1",
        status=ExecutionStatus.WAITING_FOR_TOOL,
        since=_AT,
        first_seen_at=_AT,
        last_event_at=_AT + timedelta(seconds=5),
        last_sequence=3,
        open_operation_ids=("op-a", "op-b"),
        open_approval_ids=("req-1",),
        terminal=False,
        state_id="s-1",
    )
    at, what, subject, detail = describe(state) or ("", "", "", "")
    assert (at, what, subject) == ("16:00:05", "execution", "exec-1")
    assert (
        detail
        == "WAITING_FOR_TOOL since 16:00:00; open: 2 operations (op-a, op-b); 1 approval (req-1)"
    )
    idle = state.model_copy(update={"open_operation_ids": (), "open_approval_ids": ()})
    assert (describe(idle) or ("", "", "", ""))[3].endswith("open: nothing")


def test_a_resolution_names_what_it_ends_then_how() -> None:
    item = ReconciliationWorkItem(
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="exec-1",
        attempt=1,
        connector="bank",
        kind=WorkItemKind.REPLY_TIMEOUT,
        deadline=_AT,
        created_at=_AT,
    )
    resolution = WorkItemResolution(
        resolution_id="r-1",
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="exec-1",
        attempt=1,
        outcome=OperationStatus.VERIFIED,
        evidence_source=EvidenceSource.RECONCILER,
        resolved_at=_AT,
    )
    detail = (describe(resolution, {"wi-1": item}) or ("", "", "", ""))[3]
    assert detail.startswith("ends attempt 1's UNKNOWN (REPLY_TIMEOUT work item)"), detail
    assert detail.endswith("settled VERIFIED by RECONCILER")
    unseen = (describe(resolution) or ("", "", "", ""))[3]
    assert unseen.startswith("ends attempt 1's work item wi-1"), unseen


def test_a_feed_line_prints_brackets_as_written() -> None:
    console = Console(record=True, width=200)
    console.print(feed_line(("16:00:00", "operation", "op-[1]", "UNKNOWN [reply_timeout]")))
    text = console.export_text()
    assert "op-[1]" in text and "UNKNOWN [reply_timeout]" in text
