"""A Python client for other services: vigil's answers as typed objects.

    from streams.client import Client

    client = Client()                       # VIGIL_API_URL / VIGIL_API_TOKEN
    n = client.get("exec-refund")
    n.status                                # ExecutionStatus.RUNNING
    [(o.operation_id, o.retry) for o in n.operations]

``Client`` (blocking) and ``AsyncClient`` (asyncio) have the same methods:

- ``get(execution_id)`` → ``Execution``, ``approval(request_id)`` → ``Approval``: a worker's
  ``/v1`` API. A worker answers a 307 for an execution another worker owns; the client follows
  it and sends the token there too (the workers of a deployment share it).
- ``stream(execution_id)`` → the execution's changes as ``StreamEvent``s (each carries the
  output record, typed), until a terminal state. A dropped connection is resumed with
  ``Last-Event-ID``: the worker answers with the events after it, and an id already yielded is
  never yielded again, so nothing is lost or repeated while the worker still holds the events.
- ``approvals(...)``, ``operations(...)``, ``work_items(...)``, ``executions(...)``,
  ``alerts(...)`` → a ``Page`` of rows from a console (``vigil console``), with
  ``next_cursor`` and ``total``; ``pages(...)`` follows the cursors. ``summary()``,
  ``timeline(id)``, ``lag()`` likewise. An operation row lists every attempt the console
  knows of (``OperationRow.attempts``), and ``operations(status="UNKNOWN")`` finds an
  operation whose older attempt is UNKNOWN under a VERIFIED later one (``blocking=True``: any
  attempt still blocking a retry).

Errors are typed: ``NotFound`` (404), ``Unauthorized`` (401/403), ``BadRequest`` (400, with the
allowed values), ``Unreachable`` (no connection, a timeout, a 5xx that did not clear up);
all are ``ClientError``.

Why pydantic models that ignore unknown fields, and enums that read an unknown value as
UNRECOGNIZED: a service built against this client must keep working when the server gains a
field or a status, exactly as the Avro contracts evolve.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from streams.contracts.codec import ALL_MODELS
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    ExecutionStatus,
    OperationStatus,
    Owner,
    RetryVerdict,
)

DEFAULT_API_URL = "http://127.0.0.1:6066"
DEFAULT_CONSOLE_URL = "http://127.0.0.1:6080"
#: redirects followed per request: a worker names the owner, which answers itself
MAX_REDIRECTS = 5

E = TypeVar("E", bound=StrEnum)


def _lenient(enum: type[E]) -> Any:
    """An enum field that reads a value this build does not know as UNRECOGNIZED."""

    def read(value: Any) -> Any:
        if value is None or isinstance(value, enum):
            return value
        try:
            return enum(value)
        except ValueError:
            return enum("UNRECOGNIZED")

    return BeforeValidator(read)


Status = Annotated[ExecutionStatus, _lenient(ExecutionStatus)]
OpStatus = Annotated[OperationStatus, _lenient(OperationStatus)]
Retry = Annotated[RetryVerdict, _lenient(RetryVerdict)]
Verdict = Annotated[ApprovalVerdictCode, _lenient(ApprovalVerdictCode)]
OwnerCode = Annotated[Owner, _lenient(Owner)]


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# ---------------------------------------------------------------------------------------------
# What a worker answers


class Operation(_View):
    """One operation of an execution: its latest attempt, and the operation's retry verdict
    (``retry``: FORBIDDEN while an attempt is UNKNOWN; ``held_by_*`` names the attempt that
    gives it when it is not the latest)."""

    operation_id: str
    attempt: int
    idempotency_key: str | None = None
    connector: str = ""
    status: OpStatus
    retry: Retry
    reason: str | None = None
    since: datetime
    reply_due_at: datetime | None = None
    verify_due_at: datetime | None = None
    effect_ref: str | None = None
    open_work_item_id: str | None = None
    held_by_operation_id: str | None = None
    held_by_attempt: int | None = None
    held_by_status: OpStatus | None = None
    #: set when the holder is another execution's attempt under the same connector and key
    held_by_execution_id: str | None = None


class FailedProof(_View):
    proof: str
    state: str | None = None
    reason: str


class Approval(_View):
    """One approval request and its verdict, with why (failed proofs), whose move it is
    (owner) and the next safe step."""

    request_id: str
    execution_id: str | None = None
    action: str | None = None
    approver_ref: str | None = None
    requested_at: datetime | None = None
    verdict: Verdict | None = None
    verdict_since: datetime | None = None
    owner: OwnerCode | None = None
    next_step: str | None = None
    failed_proofs: tuple[FailedProof, ...] = ()
    thresholds: dict[str, Any] | None = None


class Execution(_View):
    """One execution as a worker holds it: status, since when, operations, approvals.

    ``status`` is None while no status event of the execution was seen (``status_known``
    False): it may still be in flight (``in_flight``) with an approval or operation open
    (``open_approval_ids``, ``open_operation_ids``)."""

    execution_id: str
    status: Status | None = None
    status_known: bool = True
    in_flight: bool = False
    open_operation_ids: tuple[str, ...] = ()
    open_approval_ids: tuple[str, ...] = ()
    since: datetime | None = None
    first_seen_at: datetime | None = None
    last_event_at: datetime | None = None
    last_sequence: int | None = None
    operations: tuple[Operation, ...] = ()
    approvals: tuple[Approval, ...] = ()

    def operation(self, operation_id: str) -> Operation:
        return next(o for o in self.operations if o.operation_id == operation_id)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One change of an execution: the output record the pipeline published, typed
    (``ExecutionState``, ``OperationState``, ``ApprovalVerdict``, ``Alert``…)."""

    #: the record's own deterministic id, the SSE event id
    id: str
    #: the record type (``ExecutionState``…)
    kind: str
    #: None for a record type this build does not know; ``data`` has it as sent
    record: Record | None
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return bool(getattr(self.record, "terminal", False) or self.data.get("terminal"))


# ---------------------------------------------------------------------------------------------
# What a console answers


class AsOf(_View):
    offsets: dict[str, int] = Field(default_factory=dict)
    event_time: datetime | None = None


class Row(_View):
    """A list row from the console: the fields named here typed, every other one kept."""

    model_config = ConfigDict(frozen=True, extra="allow")


class ApprovalRow(Row):
    request_id: str
    execution_id: str | None = None
    verdict: Verdict | None = None
    owner: OwnerCode | None = None
    next_step: str | None = None
    failed_proofs: tuple[Any, ...] = ()
    action: str | None = None
    requested_at: datetime | None = None
    evaluated_at: datetime | None = None
    age_seconds: float | None = None


class AttemptRow(_View):
    """One attempt of an operation as the console knows it: ``blocks_retry`` while it is
    sent and not settled (attempt 1 UNKNOWN under a VERIFIED attempt 2 does), with its open
    work item."""

    attempt: int
    status: OpStatus
    blocks_retry: bool = True
    open_work_item_id: str | None = None


class OperationRow(Row):
    """An operation in a console's list: its latest attempt (``attempt``, ``status``), the
    operation's retry verdict, and every attempt the console knows of (``attempts``);
    ``blocking`` while one of them still blocks a retry."""

    operation_id: str
    execution_id: str
    attempt: int
    connector: str = ""
    status: OpStatus
    retry: Retry
    since: datetime
    owner: str | None = None
    open_work_item_id: str | None = None
    attempts: tuple[AttemptRow, ...] = ()
    blocking: bool = False

    def blocking_attempts(self) -> tuple[AttemptRow, ...]:
        """The attempts that still block a retry: each to be settled (reviewed) on its own."""
        return tuple(a for a in self.attempts if a.blocks_retry)


class WorkItemRow(Row):
    work_item_id: str
    operation_id: str
    execution_id: str
    kind: str | None = None
    deadline: datetime | None = None
    created_at: datetime | None = None
    next_step: str | None = None


class ExecutionRow(Row):
    execution_id: str
    status: Status | None = None
    since: datetime | None = None
    terminal: bool | None = None


class AlertRow(Row):
    alert_id: str
    kind: str | None = None
    status: str | None = None
    severity: str | None = None
    owner: str | None = None
    execution_id: str | None = None
    subject_id: str | None = None
    next_step: str | None = None
    occurred_at: datetime | None = None


R = TypeVar("R", bound=BaseModel)


class Page(_View, Generic[R]):
    """One page of a list: ``next_cursor`` (None on the last page) asks for the next one;
    ``total`` is how many rows the filters select in all (None from an older console)."""

    items: tuple[R, ...]
    next_cursor: str | None = None
    total: int | None = None
    as_of: AsOf = Field(default_factory=AsOf)


# ---------------------------------------------------------------------------------------------
# Errors


class ClientError(Exception):
    """Any failure of a vigil call. ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class NotFound(ClientError):
    """404: no such execution, approval or operation."""


class Unauthorized(ClientError):
    """401 / 403: no token, a wrong one, or a write refused."""


class BadRequest(ClientError):
    """400: a malformed id or an unknown filter; ``allowed`` lists what is accepted."""

    @property
    def allowed(self) -> dict[str, Any]:
        return dict(self.body.get("allowed") or {}) if isinstance(self.body, dict) else {}


class Conflict(ClientError):
    """409: an action the state does not allow (a review of a settled operation)."""


class Unreachable(ClientError):
    """No answer: connection refused or cut, a timeout, or a 5xx that did not clear up."""


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    message = body.get("error", resp.text) if isinstance(body, dict) else str(body)
    message = f"{resp.status_code} {resp.request.method} {resp.request.url.path}: {message}"
    code = resp.status_code
    cls: type[ClientError] = (
        NotFound
        if code == 404
        else Unauthorized
        if code in (401, 403)
        else BadRequest
        if code == 400
        else Conflict
        if code == 409
        else Unreachable
        if code >= 500
        else ClientError
    )
    raise cls(message, code, body)


def _redirect_target(resp: httpx.Response) -> httpx.URL | None:
    if resp.status_code not in (301, 302, 303, 307, 308) or "location" not in resp.headers:
        return None
    target = resp.request.url.join(resp.headers["location"])
    if target.scheme not in ("http", "https"):
        raise ClientError(f"redirect to {target} refused", resp.status_code)
    return target


# ---------------------------------------------------------------------------------------------
# Server-Sent Events


class SSEParser:
    """Lines in, complete events out (``id``, ``event``, ``data``); comments skipped."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}
        self._data: list[str] = []

    def feed(self, line: str) -> dict[str, str] | None:
        if line == "":
            if not self._data:
                self._fields = {}
                return None
            event = {**self._fields, "data": "\n".join(self._data)}
            self._fields, self._data = {}, []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name in ("id", "event"):
            self._fields[name] = value
        return None


_MODELS: dict[str, type[Record]] = {m.avro_name: m for m in ALL_MODELS}


def _stream_event(raw: Mapping[str, str]) -> StreamEvent:
    data = json.loads(raw["data"])
    kind = raw.get("event", "")
    model = _MODELS.get(kind)
    record = model.model_validate(data) if model is not None else None
    return StreamEvent(id=raw.get("id", ""), kind=kind, record=record, data=data)


class _Seen:
    """Ids already yielded (the newest ``limit``): a resumed stream never repeats one."""

    def __init__(self, limit: int = 10_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self.limit = limit
        self.last: str | None = None

    def add(self, event_id: str) -> bool:
        """True the first time an id is seen."""
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)
        self.last = event_id
        return True


# ---------------------------------------------------------------------------------------------
# Clients

_LISTS: dict[str, tuple[str, type[Row]]] = {
    "approvals": ("/api/approvals", ApprovalRow),
    "operations": ("/api/operations", OperationRow),
    "work_items": ("/api/work-items", WorkItemRow),
    "executions": ("/api/executions", ExecutionRow),
    "alerts": ("/api/alerts", AlertRow),
}


def _query(params: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def _id_path(prefix: str, identifier: str, suffix: str = "") -> str:
    return f"{prefix}/{quote(identifier, safe='')}{suffix}"


def _approval_path(request_id: str, execution_id: str | None) -> str:
    if execution_id is None:
        return _id_path("/v1/approvals", request_id)
    return _id_path("/v1/executions", execution_id, _id_path("/approvals", request_id))


class _Base:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        console_url: str | None = None,
        console_token: str | None = None,
        timeout: float = 10.0,
        reconnects: int = 10,
        stream_idle: float = 60.0,
    ) -> None:
        env = os.environ
        self.url = (url or env.get("VIGIL_API_URL") or DEFAULT_API_URL).rstrip("/")
        self.token = token if token is not None else env.get("VIGIL_API_TOKEN") or None
        self.console_url = (
            console_url or env.get("VIGIL_CONSOLE_URL") or DEFAULT_CONSOLE_URL
        ).rstrip("/")
        self.console_token = (
            console_token if console_token is not None else env.get("VIGIL_CONSOLE_TOKEN") or None
        )
        self.timeout = timeout
        #: reconnections of a stream in a row without an event before it gives up
        self.reconnects = reconnects
        #: a stream silent this long (no event, no keep-alive comment) is taken as dropped
        self.stream_idle = stream_idle

    def _headers(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}


class Client(_Base):
    """Blocking client. Use as a context manager, or call ``close()``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._http = httpx.Client(timeout=self.timeout, follow_redirects=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _get(self, base: str, path: str, token: str | None, params: Any = None) -> Any:
        url = httpx.URL(base + path)
        headers = self._headers(token)
        try:
            for _ in range(MAX_REDIRECTS + 1):
                resp = self._http.get(url, headers=headers, params=params)
                target = _redirect_target(resp)
                if target is None:
                    _raise_for(resp)
                    return resp.json()
                url, params = target, None  # the Location carries the query
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach {url}: {exc}") from exc
        raise Unreachable(f"more than {MAX_REDIRECTS} redirects from {base + path}")

    def get(self, execution_id: str) -> Execution:
        """The execution as the worker that owns it holds it."""
        body = self._get(self.url, _id_path("/v1/executions", execution_id), self.token)
        return Execution.model_validate(body)

    def approval(
        self, request_id: str, *, execution_id: str | None = None, wait: float = 10.0
    ) -> Approval:
        """One approval request. Request ids repeat across executions: with ``execution_id``
        the request of that execution (``/v1/executions/{id}/approvals/{request_id}``), else
        the one the workers' approval index finds by the request id alone. While the workers
        rebuild that index (503 after a rebalance) it asks again, up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        path = _approval_path(request_id, execution_id)
        while True:
            try:
                body = self._get(self.url, path, self.token)
                return Approval.model_validate(body)
            except Unreachable as exc:
                if exc.status != 503 or time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def stream(self, execution_id: str) -> Iterator[StreamEvent]:
        """The execution's changes, until its terminal state (then the worker ends the
        stream). Reconnects with ``Last-Event-ID`` after a dropped connection."""
        seen = _Seen()
        failures = 0
        path = _id_path("/v1/executions", execution_id, "/stream")
        while True:
            url = httpx.URL(self.url + path)
            headers = self._headers(self.token)
            if seen.last is not None:
                headers["Last-Event-ID"] = seen.last
            terminal = False
            try:
                for _ in range(MAX_REDIRECTS + 1):
                    with self._http.stream(
                        "GET",
                        url,
                        headers=headers,
                        timeout=httpx.Timeout(self.timeout, read=self.stream_idle),
                    ) as resp:
                        target = _redirect_target(resp)
                        if target is not None:
                            url = target
                            continue
                        if resp.status_code >= 400:
                            resp.read()
                            _raise_for(resp)
                        parser = SSEParser()
                        for line in resp.iter_lines():
                            raw = parser.feed(line)
                            if raw is None:
                                continue
                            event = _stream_event(raw)
                            if event.id and not seen.add(event.id):
                                continue
                            failures = 0
                            terminal = terminal or event.terminal
                            yield event
                    break
            except httpx.HTTPError as exc:
                if terminal:
                    return
                failures += 1
                if failures > self.reconnects:
                    raise Unreachable(f"stream of {execution_id} lost: {exc}") from exc
                time.sleep(min(2.0, 0.1 * 2**failures))
                continue
            if terminal:
                return
            # the server ended the stream without a terminal state (a worker stopping): resume
            failures += 1
            if failures > self.reconnects:
                raise Unreachable(f"stream of {execution_id} ended without a terminal state")
            time.sleep(min(2.0, 0.1 * 2**failures))

    # -- the console ---------------------------------------------------------------------

    def _page(self, name: str, params: Mapping[str, Any]) -> Page[Any]:
        path, row = _LISTS[name]
        body = self._get(self.console_url, path, self.console_token, _query(params))
        return Page[row].model_validate(body)  # type: ignore[valid-type]

    def approvals(self, **params: Any) -> Page[ApprovalRow]:
        """Approval waits: ``verdict``, ``owner``, ``action``, ``execution_id``, ``open``,
        ``sort``, ``limit``, ``cursor``."""
        return self._page("approvals", params)

    def operations(self, **params: Any) -> Page[OperationRow]:
        """Operations: ``status``, ``connector``, ``owner``, ``execution_id``, ``sort``…"""
        return self._page("operations", params)

    def work_items(self, **params: Any) -> Page[WorkItemRow]:
        """Reconciliation work items (open ones, oldest first, by default)."""
        return self._page("work_items", params)

    def executions(self, **params: Any) -> Page[ExecutionRow]:
        return self._page("executions", params)

    def alerts(self, **params: Any) -> Page[AlertRow]:
        return self._page("alerts", params)

    def pages(self, name: str, **params: Any) -> Iterator[Any]:
        """Every row of a list (``"approvals"``, ``"operations"``…), page after page."""
        cursor = params.pop("cursor", None)
        while True:
            page = self._page(name, {**params, "cursor": cursor})
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def summary(self) -> dict[str, Any]:
        return self._get(self.console_url, "/api/summary", self.console_token)

    def timeline(self, execution_id: str) -> dict[str, Any]:
        path = _id_path("/api/executions", execution_id, "/timeline")
        return self._get(self.console_url, path, self.console_token)

    def lag(self) -> dict[str, Any]:
        return self._get(self.console_url, "/api/lag", self.console_token)


class AsyncClient(_Base):
    """The same calls for asyncio: ``await client.get(id)``, ``async for e in
    client.stream(id)``. Use as an async context manager, or ``await client.aclose()``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._http = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, base: str, path: str, token: str | None, params: Any = None) -> Any:
        url = httpx.URL(base + path)
        headers = self._headers(token)
        try:
            for _ in range(MAX_REDIRECTS + 1):
                resp = await self._http.get(url, headers=headers, params=params)
                target = _redirect_target(resp)
                if target is None:
                    _raise_for(resp)
                    return resp.json()
                url, params = target, None
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach {url}: {exc}") from exc
        raise Unreachable(f"more than {MAX_REDIRECTS} redirects from {base + path}")

    async def get(self, execution_id: str) -> Execution:
        body = await self._get(self.url, _id_path("/v1/executions", execution_id), self.token)
        return Execution.model_validate(body)

    async def approval(
        self, request_id: str, *, execution_id: str | None = None, wait: float = 10.0
    ) -> Approval:
        deadline = time.monotonic() + wait
        path = _approval_path(request_id, execution_id)
        while True:
            try:
                body = await self._get(self.url, path, self.token)
                return Approval.model_validate(body)
            except Unreachable as exc:
                if exc.status != 503 or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    async def stream(self, execution_id: str) -> AsyncIterator[StreamEvent]:
        seen = _Seen()
        failures = 0
        path = _id_path("/v1/executions", execution_id, "/stream")
        while True:
            url = httpx.URL(self.url + path)
            headers = self._headers(self.token)
            if seen.last is not None:
                headers["Last-Event-ID"] = seen.last
            terminal = False
            try:
                for _ in range(MAX_REDIRECTS + 1):
                    async with self._http.stream(
                        "GET",
                        url,
                        headers=headers,
                        timeout=httpx.Timeout(self.timeout, read=self.stream_idle),
                    ) as resp:
                        target = _redirect_target(resp)
                        if target is not None:
                            url = target
                            continue
                        if resp.status_code >= 400:
                            await resp.aread()
                            _raise_for(resp)
                        parser = SSEParser()
                        async for line in resp.aiter_lines():
                            raw = parser.feed(line)
                            if raw is None:
                                continue
                            event = _stream_event(raw)
                            if event.id and not seen.add(event.id):
                                continue
                            failures = 0
                            terminal = terminal or event.terminal
                            yield event
                    break
            except httpx.HTTPError as exc:
                if terminal:
                    return
                failures += 1
                if failures > self.reconnects:
                    raise Unreachable(f"stream of {execution_id} lost: {exc}") from exc
                await asyncio.sleep(min(2.0, 0.1 * 2**failures))
                continue
            if terminal:
                return
            failures += 1
            if failures > self.reconnects:
                raise Unreachable(f"stream of {execution_id} ended without a terminal state")
            await asyncio.sleep(min(2.0, 0.1 * 2**failures))

    async def _page(self, name: str, params: Mapping[str, Any]) -> Page[Any]:
        path, row = _LISTS[name]
        body = await self._get(self.console_url, path, self.console_token, _query(params))
        return Page[row].model_validate(body)  # type: ignore[valid-type]

    async def approvals(self, **params: Any) -> Page[ApprovalRow]:
        return await self._page("approvals", params)

    async def operations(self, **params: Any) -> Page[OperationRow]:
        return await self._page("operations", params)

    async def work_items(self, **params: Any) -> Page[WorkItemRow]:
        return await self._page("work_items", params)

    async def executions(self, **params: Any) -> Page[ExecutionRow]:
        return await self._page("executions", params)

    async def alerts(self, **params: Any) -> Page[AlertRow]:
        return await self._page("alerts", params)

    async def pages(self, name: str, **params: Any) -> AsyncIterator[Any]:
        cursor = params.pop("cursor", None)
        while True:
            page = await self._page(name, {**params, "cursor": cursor})
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def summary(self) -> dict[str, Any]:
        return await self._get(self.console_url, "/api/summary", self.console_token)

    async def timeline(self, execution_id: str) -> dict[str, Any]:
        path = _id_path("/api/executions", execution_id, "/timeline")
        return await self._get(self.console_url, path, self.console_token)

    async def lag(self) -> dict[str, Any]:
        return await self._get(self.console_url, "/api/lag", self.console_token)


__all__ = [
    "AlertRow",
    "Approval",
    "ApprovalRow",
    "AsOf",
    "AsyncClient",
    "AttemptRow",
    "BadRequest",
    "Client",
    "ClientError",
    "Conflict",
    "Execution",
    "ExecutionRow",
    "FailedProof",
    "NotFound",
    "Operation",
    "OperationRow",
    "Page",
    "SSEParser",
    "StreamEvent",
    "Unauthorized",
    "Unreachable",
    "WorkItemRow",
]
