"""The offline audit: the reference snapshot pinned through the CLI, malformed lines, durations."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from streams.audit import EXIT_BAD_LINES, EXIT_OK, EXIT_UNREADABLE, audit, run_audit
from streams.core.approvals import ThresholdSet
from streams.durations import parse_duration

SAMPLE = Path(__file__).resolve().parents[1] / "streams" / "samples" / "reference-audit.jsonl"
AT = "2026-07-26T16:30:00Z"
REFERENCE = {
    "req-export": "WAITING",
    "req-deletion": "STALE_REQUEST",
    "req-rotation": "UNROUTABLE_WAIT",
    "req-invoice": "ORPHANED_WAIT",
    "req-deploy": "STUCK_AFTER_DECISION",
    "req-message": "CLOSED_BY_DECLINE",
}


def _app() -> typer.Typer:
    """A tiny app with the command registered as streams/cli/main.py registers it."""
    app = typer.Typer()
    app.command("audit")(audit)

    @app.command("noop")
    def _noop() -> None:  # a second command, so "audit" stays a sub-command as in the CLI
        """Nothing."""

    return app


def invoke(*args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(_app(), ["audit", *args], input=stdin)


def rows(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_reference_audit_via_cli_json_gives_exactly_its_six_verdicts() -> None:
    result = invoke(str(SAMPLE), "--at", AT, "--grace", "5m", "--heartbeat-fresh", "10m", "--json")
    assert result.exit_code == EXIT_OK, result.output
    got = rows(result.stdout)
    assert {r["request_id"]: r["verdict"] for r in got} == REFERENCE
    assert len(got) == 6
    for r in got:
        assert {
            "request_id",
            "verdict",
            "failed_proofs",
            "owner",
            "next_step",
            "thresholds",
        } <= set(r)
        assert r["owner"] and r["next_step"]
        assert r["thresholds"] == {
            "grace_ms": 300_000,
            "heartbeat_fresh_ms": 600_000,
            "delivery_deadline_ms": 300_000,
            "evaluated_at": "2026-07-26T16:30:00Z",
        }
    by_id = {r["request_id"]: r for r in got}
    assert by_id["req-deploy"]["owner"] == "RUNTIME_OWNER"
    assert by_id["req-deploy"]["failed_proofs"] == [
        {"proof": "CONSUMED_DECISION", "state": "FAILED", "reason": "NO_RESUME_RECEIPT"}
    ]
    assert by_id["req-rotation"]["owner"] == "POLICY_OWNER"
    assert by_id["req-export"]["failed_proofs"] == []


def test_reference_audit_via_run_audit() -> None:
    results, errors = run_audit(
        SAMPLE.read_text().splitlines(), datetime(2026, 7, 26, 16, 30, tzinfo=UTC)
    )
    assert errors == ()
    assert {r.evaluation.request_id: r.evaluation.verdict.value for r in results} == REFERENCE
    assert [r.line for r in results] == [1, 2, 3, 4, 5, 6]


def test_table_output() -> None:
    result = invoke(str(SAMPLE), "--at", AT)
    assert result.exit_code == EXIT_OK, result.output
    for rid, verdict in REFERENCE.items():
        assert rid in result.stdout
        assert verdict in result.stdout


def test_thresholds_from_options_and_from_the_line() -> None:
    # a 30 minute grace: the deploy accepted at 16:18 is still resuming
    longer = invoke(str(SAMPLE), "--at", AT, "--grace", "30m", "--json")
    by_id = {r["request_id"]: r for r in rows(longer.stdout)}
    assert by_id["req-deploy"]["verdict"] == "RESUMING"
    assert by_id["req-deploy"]["thresholds"]["grace_ms"] == 1_800_000
    # the line's own grace_seconds wins over the option
    lines = SAMPLE.read_text().splitlines()
    deploy = json.loads(lines[4]) | {"grace_seconds": 60}
    result = invoke("-", "--at", AT, "--grace", "30m", "--json", stdin=json.dumps(deploy) + "\n")
    (row,) = rows(result.stdout)
    assert row["verdict"] == "STUCK_AFTER_DECISION" and row["thresholds"]["grace_ms"] == 60_000


def test_malformed_lines_are_reported_and_the_others_judged(tmp_path: Path) -> None:
    good = SAMPLE.read_text().splitlines()
    base = json.loads(good[0])
    bad = [
        "{not json",
        json.dumps(base | {"request_id": "r-enum", "delivery": "maybe"}),
        json.dumps(base | {"request_id": "r-naive", "requested_at": "2026-07-26T16:00:00"}),
        json.dumps(base | {"request_id": "r-extra", "approver": "someone"}),
        json.dumps(base | {"request_id": "r-dec", "decided_at": "2026-07-26T16:10:00Z"}),
        json.dumps(base | {"request_id": "r-future", "requested_at": "2026-07-26T17:00:00Z"}),
        json.dumps(base | {"request_id": "r-neg", "grace_seconds": -1}),
        json.dumps(base | {"request_id": ""}),
        "[1, 2]",
        good[0],  # the same request id again
    ]
    path = tmp_path / "snapshot.jsonl"
    path.write_text("\n".join([*good, "", *bad]) + "\n")
    result = invoke(str(path), "--at", AT, "--json")
    assert result.exit_code == EXIT_BAD_LINES
    assert {r["request_id"]: r["verdict"] for r in rows(result.stdout)} == REFERENCE
    errors = {e["line"]: e["error"] for e in rows(result.stderr)}
    assert sorted(errors) == list(range(8, 18))  # line 7 is blank, not an error
    assert "invalid JSON" in errors[8]
    assert "delivery" in errors[9]
    assert "requested_at" in errors[10]
    assert "approver" in errors[11]
    assert "decided_at given without a decision" in errors[12]
    assert "after" in errors[13]
    assert "grace_seconds" in errors[14]
    assert "request_id" in errors[15]
    assert "JSON object" in errors[16]
    assert "already on line 1" in errors[17]
    table = invoke(str(path), "--at", AT)
    assert table.exit_code == EXIT_BAD_LINES
    assert "line 8: invalid JSON" in table.stderr


def test_null_and_absent_fields_are_not_known() -> None:
    line = {"request_id": "r-min", "requested_at": "2026-07-26T16:28:00Z", "delivery": "PENDING"}
    results, errors = run_audit([json.dumps(line)], datetime(2026, 7, 26, 16, 30, tzinfo=UTC))
    assert errors == ()
    evaluation = results[0].evaluation
    # no approver and no resume handle are failures; digest and risk unknown are judged safely
    assert evaluation.verdict.value == "ORPHANED_WAIT"
    reasons = {r for p in evaluation.failed_proofs for r in p.reason.split(",")}
    assert {"NO_RESUME_HANDLE", "NO_APPROVER", "ACTION_DIGEST_UNKNOWN", "ACK_PENDING"} <= reasons
    # one status per proof: no approver fails the route, however pending its delivery is
    states = {p.proof.value: p.state.value for p in evaluation.failed_proofs}
    assert len(states) == len(evaluation.failed_proofs)
    assert states["VERIFIED_ROUTE"] == "FAILED" and states["LIVE_RESUME"] == "FAILED"


def test_unreadable_file_and_bad_options() -> None:
    assert invoke("/nonexistent/snapshot.jsonl", "--at", AT).exit_code == EXIT_UNREADABLE
    assert invoke(str(SAMPLE), "--at", "yesterday").exit_code == 2
    assert invoke(str(SAMPLE), "--at", "2026-07-26T16:30:00").exit_code == 2  # no timezone
    bad_grace = invoke(str(SAMPLE), "--at", AT, "--grace", "soon")
    assert bad_grace.exit_code == 2 and "not a duration" in bad_grace.output


def test_run_audit_needs_an_aware_time() -> None:
    with pytest.raises(ValueError):
        run_audit([], datetime(2026, 7, 26, 16, 30))
    assert run_audit([], datetime(2026, 7, 26, 16, 30, tzinfo=UTC), ThresholdSet()) == ((), ())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5m", timedelta(minutes=5)),
        ("90s", timedelta(seconds=90)),
        ("1h", timedelta(hours=1)),
        ("300", timedelta(seconds=300)),
        ("1h30m", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("2d", timedelta(days=2)),
        ("1.5s", timedelta(seconds=1.5)),
        (" 10M ", timedelta(minutes=10)),
        ("0", timedelta(0)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "m", "-5m", "5x", "5m5m", "5mm", "1h 30m", "abc"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
