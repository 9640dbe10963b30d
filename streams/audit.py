"""The offline approval audit: ``vigil audit FILE --at TIME``.

Judges a JSON Lines snapshot of approval requests (one object per request) with the very same
evaluator the stream uses (``streams.core.approvals``, docs/rules.md#approval-waits), so the
audit and the live worker can never disagree. A snapshot knows *that* things happened but
often not *when* (a delivery ``"delivered"``, a current digest): such facts have an unknown
time, which the evaluator answers conservatively (see its module docstring).

Exit codes: 0 when every line was judged, 1 when the file cannot be read, 2 when any line was
malformed (those lines are reported with their number and reason; every other line is still
judged and printed) — or, as for any command, when an option is invalid.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from rich.console import Console
from rich.table import Table

from streams.contracts.models.base import to_millis
from streams.contracts.models.enums import DecisionCode, DeliveryOutcome, Risk
from streams.core.approvals import (
    ApprovalFacts,
    DecisionFact,
    DeliveryFact,
    DigestFact,
    Evaluation,
    RequestPart,
    ThresholdSet,
    evaluate,
    request_overrides,
    resolve_thresholds,
)
from streams.durations import parse_duration

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_BAD_LINES = 2


class SnapshotLine(BaseModel):
    """One line of a snapshot file. Null or absent means "not known". Unknown fields are
    refused (a misspelt field would otherwise silently read as "not known")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: str = Field(min_length=1)
    execution_id: str | None = None
    action: str | None = None
    action_digest: str | None = None
    current_action_digest: str | None = None
    requested_at: AwareDatetime | None = None
    expires_at: AwareDatetime | None = None
    approver_ref: str | None = None
    delivery: Literal["delivered", "failed", "pending"] | None = None
    acknowledged_at: AwareDatetime | None = None
    risk: Literal["low", "high"] | None = None
    resume_handle: str | None = None
    requester_heartbeat_at: AwareDatetime | None = None
    decision: Literal["accept", "decline", "cancel"] | None = None
    decided_at: AwareDatetime | None = None
    resume_receipt_at: AwareDatetime | None = None
    grace_seconds: float | None = Field(default=None, ge=0)
    heartbeat_fresh_seconds: float | None = Field(default=None, ge=0)
    delivery_deadline_seconds: float | None = Field(default=None, ge=0)

    @field_validator("delivery", "risk", "decision", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _decided_needs_decision(self) -> SnapshotLine:
        if self.decided_at is not None and self.decision is None:
            raise ValueError("decided_at given without a decision")
        return self

    def to_facts(self) -> ApprovalFacts:
        """The evaluator's facts. Snapshot facts without a time get an unknown time."""
        request = RequestPart(
            action=self.action,
            action_digest=self.action_digest,
            requested_at=self.requested_at,
            expires_at=self.expires_at,
            approver_ref=self.approver_ref,
            resume_handle=self.resume_handle,
            risk=None if self.risk is None else Risk(self.risk.upper()),
            overrides=request_overrides(
                self.grace_seconds, self.heartbeat_fresh_seconds, self.delivery_deadline_seconds
            ),
        )
        deliveries = ()
        if self.delivery in ("delivered", "failed"):
            outcome = DeliveryOutcome(self.delivery.upper())
            deliveries = (DeliveryFact(at=None, outcome=outcome),)
        return ApprovalFacts(
            request_id=self.request_id,
            execution_id=self.execution_id,
            request=request,
            deliveries=deliveries,
            acknowledgements=_times(self.acknowledged_at),
            decisions=()
            if self.decision is None
            else (DecisionFact(at=self.decided_at, code=DecisionCode(self.decision.upper())),),
            receipts=_times(self.resume_receipt_at),
            digests=()
            if self.current_action_digest is None
            else (DigestFact(at=None, digest=self.current_action_digest),),
            heartbeats=_times(self.requester_heartbeat_at),
        )


def _times(value: datetime | None) -> tuple[datetime, ...]:
    return () if value is None else (value,)


@dataclass(frozen=True, slots=True)
class AuditResult:
    line: int
    evaluation: Evaluation

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object: the verdict record's fields, plus the line number."""
        e = self.evaluation
        return {
            "line": self.line,
            "request_id": e.request_id,
            "execution_id": e.execution_id,
            "verdict": e.verdict.value,
            "failed_proofs": [f.model_dump(mode="json") for f in e.failed_proofs],
            "owner": e.owner.value,
            "next_step": e.next_step,
            "thresholds": e.thresholds.model_dump(mode="json"),
            "evaluated_at": e.model_dump(mode="json")["evaluated_at"],
        }


@dataclass(frozen=True, slots=True)
class AuditError:
    line: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "error": self.reason}


def _reason(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "line"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def run_audit(
    lines: Iterable[str], at: datetime, defaults: ThresholdSet | None = None
) -> tuple[tuple[AuditResult, ...], tuple[AuditError, ...]]:
    """Judge every line at ``at``. Blank lines are skipped; a line that is not a valid request
    (bad JSON, bad field, a request id seen before, a request made after ``at``) becomes an
    ``AuditError`` and the rest are judged anyway. Thresholds: the line's own, else
    ``defaults`` (the snapshot carries no policy)."""
    if at.tzinfo is None:
        raise ValueError("the evaluation time must carry a timezone")
    at = to_millis(at)
    defaults = defaults or ThresholdSet()
    results: list[AuditResult] = []
    errors: list[AuditError] = []
    first_line: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            errors.append(AuditError(number, f"invalid JSON: {exc.msg} (column {exc.colno})"))
            continue
        if not isinstance(raw, dict):
            errors.append(AuditError(number, "expected a JSON object"))
            continue
        try:
            snapshot = SnapshotLine.model_validate(raw)
        except ValidationError as exc:
            errors.append(AuditError(number, _reason(exc)))
            continue
        if snapshot.request_id in first_line:
            errors.append(
                AuditError(
                    number,
                    f"request_id {snapshot.request_id!r} already on line "
                    f"{first_line[snapshot.request_id]}",
                )
            )
            continue
        first_line[snapshot.request_id] = number
        facts = snapshot.to_facts()
        try:
            evaluation = evaluate(facts, at, resolve_thresholds(facts, None, defaults))
        except ValueError as exc:
            errors.append(AuditError(number, str(exc)))
            continue
        results.append(AuditResult(number, evaluation))
    return tuple(results), tuple(errors)


def _parse_at(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO-8601 time: {value!r}") from exc
    if parsed.tzinfo is None:
        raise typer.BadParameter("give a timezone, e.g. 2026-07-26T16:30:00Z")
    return parsed


def _parse_threshold(value: str, option: str) -> Any:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _table(results: Iterable[AuditResult]) -> Table:
    table = Table(title="approval audit", show_lines=True)
    for column in ("request", "verdict", "owner"):
        table.add_column(column, no_wrap=True)
    table.add_column("failed proofs")
    table.add_column("next safe step")
    for result in results:
        e = result.evaluation
        proofs = "\n".join(f"{f.proof.value} {f.state.value}: {f.reason}" for f in e.failed_proofs)
        table.add_row(e.request_id, e.verdict.value, e.owner.value, proofs or "-", e.next_step)
    return table


def audit(
    file: Annotated[Path, typer.Argument(help="JSON Lines snapshot, one request a line; -: stdin")],
    at: Annotated[
        str,
        typer.Option(
            "--at",
            help="evaluation time, ISO-8601 with timezone: facts stamped at it count and "
            "deadlines due at it are reached",
        ),
    ],
    grace: Annotated[str, typer.Option(help="default grace period to resume")] = "5m",
    heartbeat_fresh: Annotated[str, typer.Option(help="default heartbeat freshness")] = "10m",
    delivery_deadline: Annotated[str, typer.Option(help="default delivery deadline")] = "5m",
    json_output: Annotated[
        bool, typer.Option("--json", help="one JSON object per request instead of a table")
    ] = False,
) -> None:
    """Judge approval snapshots offline with the live evaluator: waiting or stuck, and who owns
    the next step.

    At --at T, a fact stamped T counts and a deadline due at T is reached (an answer stamped at
    its expiry is judged with both): the verdicts a `vigil replay --to T` of the same facts
    ends with.

    Exit code 0: every line judged; 1: file unreadable; 2: some lines were malformed (reported
    on stderr with their line number; the other lines are still judged).
    """
    when = _parse_at(at)
    defaults = ThresholdSet(
        grace=_parse_threshold(grace, "--grace"),
        heartbeat_fresh=_parse_threshold(heartbeat_fresh, "--heartbeat-fresh"),
        delivery_deadline=_parse_threshold(delivery_deadline, "--delivery-deadline"),
    )
    err = Console(stderr=True, soft_wrap=True)
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        err.print(f"cannot read {file}: {exc}", markup=False)
        raise typer.Exit(EXIT_UNREADABLE) from exc
    results, errors = run_audit(text.splitlines(), when, defaults)
    if json_output:
        for result in results:
            typer.echo(json.dumps(result.to_json(), sort_keys=True))
        for error in errors:
            typer.echo(json.dumps(error.to_json(), sort_keys=True), err=True)
    else:
        Console().print(_table(results))
        for error in errors:
            err.print(f"line {error.line}: {error.reason}", markup=False)
    if errors:
        raise typer.Exit(EXIT_BAD_LINES)
