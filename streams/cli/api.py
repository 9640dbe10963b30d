"""``vigil status`` and ``vigil watch``: the worker's HTTP API for a person at a terminal."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.console import Console
from rich.table import Table

from streams.cli.errors import BadArgument, ServiceUnreachable, refused_by
from streams.contracts.codec import ALL_MODELS

UrlOpt = Annotated[
    str, typer.Option("--url", envvar="VIGIL_API_URL", help="A worker's HTTP address.")
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="VIGIL_API_TOKEN",
        help="Bearer token, if the API wants one.",
        show_default=False,
    ),
]
MODELS = {m.avro_name: m for m in ALL_MODELS}


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def service_url(option: str, value: str) -> str:
    """``value`` without its trailing slash, or a bad argument (exit 2) when it is not an
    http(s) address: a typo in an address is the user's to fix, not an unreachable service."""
    try:
        parsed = httpx.URL(value)
    except (httpx.InvalidURL, TypeError) as exc:
        raise BadArgument(f"{option} {value!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BadArgument(f"{option} {value!r} is not an http:// or https:// address") from None
    return value.rstrip("/")


def required_id(what: str, value: str) -> str:
    """``value``, or a bad argument when it is empty: an empty id would ask for the
    collection's path and come back as a puzzling 404."""
    if not value.strip():
        raise BadArgument(f"the {what} is empty: give one, e.g. exec-1")
    return value


def _fail(resp: httpx.Response, service: str) -> NoReturn:
    """The service's refusal as one line and the exit code of its kind
    (``streams.cli.errors.refused_by``)."""
    try:
        answer = resp.json()
        message = answer.get("error", resp.text) if isinstance(answer, dict) else resp.text
    except ValueError:
        message = resp.text
    raise refused_by(service, resp.status_code, str(message)[:300] or resp.reason_phrase)


def status(
    execution_id: Annotated[str, typer.Argument(help="Execution id.")],
    url: UrlOpt = "http://127.0.0.1:6066",
    token: TokenOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Print one execution: status (or "status unknown" before any status event), closed or
    in flight with what is open, operations with retry verdicts, approvals with verdicts."""
    out = Console()
    base = service_url("--url", url)
    execution_id = required_id("execution id", execution_id)
    try:
        resp = httpx.get(
            f"{base}/v1/executions/{execution_id}",
            headers=_headers(token),
            follow_redirects=True,
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise ServiceUnreachable(f"cannot reach the worker at {url}: {exc}") from None
    if resp.status_code != 200:
        _fail(resp, f"the worker at {url}")
    body: dict[str, Any] = resp.json()
    if json_output:
        print(json.dumps(body, indent=2))
        return
    out.print(_headline(body), highlight=False)
    if body["operations"]:
        t = Table(
            "operation",
            "attempt",
            "status",
            "retry",
            "reason",
            "since",
            "work item",
            title="Operations",
        )
        for op in body["operations"]:
            style = "red" if op["status"] == "UNKNOWN" else ""
            t.add_row(
                op["operation_id"],
                str(op["attempt"]),
                f"[{style}]{op['status']}[/]" if style else op["status"],
                op["retry"],
                op.get("reason") or "",
                op["since"],
                op.get("open_work_item_id") or "",
            )
        out.print(t)
    if body["approvals"]:
        t = Table(
            "request", "verdict", "owner", "failed proofs", "next safe step", title="Approvals"
        )
        for a in body["approvals"]:
            proofs = ", ".join(f"{f['proof']}:{f['reason']}" for f in a.get("failed_proofs", []))
            t.add_row(
                a["request_id"],
                a.get("verdict") or "(not judged yet)",
                a.get("owner") or "",
                proofs,
                a.get("next_step") or "",
            )
        out.print(t)


def _headline(body: dict[str, Any]) -> str:
    """The execution's line: its status (or that none is known yet), since when, and
    whether it is closed or in flight with what open."""
    from rich.markup import escape

    if body.get("status") is None and not body.get("status_known", True):
        status = "status unknown (no status event yet)"
    else:
        status = f"{body.get('status') or '-'}  since {body.get('since') or '-'}"
    if body.get("in_flight"):
        opened = [
            f"{len(ids)} open {noun}{'' if len(ids) == 1 else 's'} ({', '.join(ids)})"
            for ids, noun in (
                (body.get("open_operation_ids") or [], "operation"),
                (body.get("open_approval_ids") or [], "approval"),
            )
            if ids
        ]
        state = "in flight" + (f": {'; '.join(opened)}" if opened else "")
    else:
        state = "closed"
    return f"[bold]{escape(str(body['execution_id']))}[/bold]  {escape(status)}  ({escape(state)})"


def watch(
    execution_id: Annotated[str, typer.Argument(help="Execution id.")],
    url: UrlOpt = "http://127.0.0.1:6066",
    token: TokenOpt = None,
    retries: Annotated[int, typer.Option(help="Reconnect this many times after a drop.")] = 5,
) -> None:
    """Follow an execution live until it reaches a terminal state, one line per change (an
    execution's: its status, since when, and its open operations and approvals).

    Reads the worker's Server-Sent Events; after a drop it reconnects with Last-Event-ID, so
    nothing the worker still holds is missed.
    """
    from streams.contracts.models.outputs import ReconciliationWorkItem
    from streams.local.demo import describe, feed_line

    out = Console()
    base = service_url("--url", url)
    execution_id = required_id("execution id", execution_id)
    work_items: dict[str, ReconciliationWorkItem] = {}
    last: str | None = None
    attempts = 0
    while True:
        headers = _headers(token) | ({"Last-Event-ID": last} if last else {})
        try:
            with httpx.stream(
                "GET",
                f"{base}/v1/executions/{execution_id}/stream",
                headers=headers,
                follow_redirects=True,
                timeout=httpx.Timeout(10, read=120),
            ) as resp:
                if resp.status_code != 200:
                    resp.read()
                    _fail(resp, f"the worker at {url}")
                event: dict[str, str] = {}
                for line in resp.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        key, _, value = line.partition(": ")
                        event[key] = value
                        continue
                    if "data" in event:
                        last = event.get("id", last)
                        model = MODELS.get(event.get("event", ""))
                        record = model.model_validate(json.loads(event["data"])) if model else None
                        if isinstance(record, ReconciliationWorkItem):
                            work_items[record.work_item_id] = record
                        shown = describe(record, work_items) if record is not None else None
                        if shown is None and record is not None:
                            shown = ("-", record.avro_name, execution_id, event["data"][:200])
                        if shown:
                            out.print(feed_line(shown), highlight=False)
                    event = {}
            return  # the server ends the stream at the terminal state
        except httpx.HTTPError as exc:
            attempts += 1
            if attempts > retries:
                raise ServiceUnreachable(
                    f"lost the stream of {url} after {retries} reconnections: {exc}"
                ) from None
            time.sleep(min(5.0, 0.5 * attempts))
