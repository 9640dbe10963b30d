"""The reconcilers file: per connector, how to ask the source of truth whether an effect
happened, and how patiently (``VIGIL_RECONCILERS_FILE``, TOML).

Two kinds of checker:

- **HTTP**, declarative: a GET on a URL template over the work item's fields, headers whose
  secrets come from environment variables, TLS settings, and rules that map the answer
  (status code, a JSON field and its value) to VERIFIED, ABSENT (not there) or PENDING, with
  the JSON field that carries the effect reference.
- **Python**: ``module:function``, sync or async, called with a ``CheckRequest`` and returning
  a ``CheckResult``, for sources that need a client library.

Example::

    [connectors.payments]
    authoritative = true          # "not found" there means it did not and will not happen
    settle_delay = "2m"           # ... once this long has passed since the deadline
    max_attempts = 8
    give_up_after = "1h"
    backoff_initial = "1s"
    backoff_max = "5m"
    timeout = "5s"
    concurrency = 4
    rate = 10                     # checks started per second at most

    [connectors.payments.http]
    url = "https://pay.example/v1/payments?idempotency_key={idempotency_key}"
    headers = { Authorization = "Bearer ${PAYMENTS_TOKEN}" }
    tls = { ca_file = "/etc/ssl/pay-ca.pem" }
    effect_ref_field = "id"

    [[connectors.payments.http.rules]]
    status = 200
    field = "status"
    equals = "succeeded"
    finding = "VERIFIED"

    [[connectors.payments.http.rules]]
    status = 404
    finding = "ABSENT"

    [connectors.crm]
    python = "mycompany.crm_checks:check"

URL fields: ``{effect_ref}``, ``{idempotency_key}``, ``{operation_id}``, ``{execution_id}``,
``{attempt}``, ``{connector}``, ``{work_item_id}`` (URL-encoded). ``${NAME}`` in a header is the
environment variable NAME, read at start; a header's value is never logged. Rules are tried in
order, the first that matches wins; an answer no rule matches is an ERROR (``http_<code>``), as
are a timeout, no answer and a body that is not the JSON a rule needs.

A bad file is refused at start with the file, the connector and the field named.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import re
import ssl
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from streams.contracts.models.enums import CheckFinding
from streams.core.bounds import duration_problem
from streams.core.reconcile import CheckResult, Policy
from streams.durations import parse_duration
from streams.settings import SettingsError

#: the fields of a work item a URL template may name
URL_FIELDS = (
    "effect_ref",
    "idempotency_key",
    "operation_id",
    "execution_id",
    "attempt",
    "connector",
    "work_item_id",
)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ReconcilersError(SettingsError):
    """The reconcilers file is unusable; the message names the file, connector and field."""


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """What a checker is told about the work item it checks."""

    work_item_id: str
    operation_id: str
    execution_id: str
    attempt: int
    connector: str
    idempotency_key: str | None
    effect_ref: str | None

    def fields(self) -> dict[str, str | None]:
        return {
            "effect_ref": self.effect_ref,
            "idempotency_key": self.idempotency_key,
            "operation_id": self.operation_id,
            "execution_id": self.execution_id,
            "attempt": str(self.attempt),
            "connector": self.connector,
            "work_item_id": self.work_item_id,
        }


Checker = Callable[[CheckRequest], Awaitable[CheckResult]]


# ------------------------------------------------------------------------------ the file


def _duration(value: Any) -> timedelta:
    try:
        d = parse_duration(str(value))
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{value!r} is not a duration ({exc})") from exc
    problem = duration_problem(d, positive=False)
    if problem is not None:
        raise ValueError(f"{value!r} {problem}")
    return d


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Strict):
    """One mapping of an answer to a finding: every condition given must hold."""

    status: int | list[int] | None = None
    field: str | None = None
    equals: str | int | float | bool | None = None
    one_of: list[str | int | float | bool] | None = Field(default=None, alias="in")
    finding: Literal["VERIFIED", "ABSENT", "PENDING"]

    @model_validator(mode="after")
    def _field_needs_value(self) -> Rule:
        if (self.equals is not None or self.one_of is not None) and self.field is None:
            raise ValueError("'equals' and 'in' need a 'field' (a JSON path such as data.0.status)")
        if self.status is None and self.field is None:
            raise ValueError("a rule needs a 'status' or a 'field' to match")
        return self

    def statuses(self) -> tuple[int, ...] | None:
        if self.status is None:
            return None
        return tuple(self.status) if isinstance(self.status, list) else (self.status,)


class Tls(_Strict):
    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @model_validator(mode="after")
    def _files(self) -> Tls:
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name} {path!r} does not exist")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class HttpChecker(_Strict):
    method: Literal["GET"] = "GET"
    url: str
    headers: dict[str, str] = {}
    tls: Tls = Tls()
    effect_ref_field: str | None = None
    rules: list[Rule] = Field(min_length=1)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} must start with http:// or https://")
        names = set(re.findall(r"\{([^{}]*)\}", value))
        unknown = sorted(names - set(URL_FIELDS))
        if unknown:
            raise ValueError(f"unknown field(s) {unknown} in the URL; allowed: {list(URL_FIELDS)}")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            for var in _ENV_REF.findall(text):
                if not os.environ.get(var):
                    raise ValueError(f"header {name!r} needs the environment variable {var}")
        return value


class ConnectorReconciler(_Strict):
    authoritative: bool = False
    settle_delay: timedelta = timedelta(minutes=5)
    max_attempts: int = Field(default=10, ge=1, le=1000)
    give_up_after: timedelta = timedelta(hours=1)
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_factor: float = Field(default=2.0, ge=1.0, le=10.0)
    backoff_max: timedelta = timedelta(minutes=5)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    timeout: timedelta = timedelta(seconds=10)
    concurrency: int = Field(default=4, ge=1, le=1000)
    rate: float = Field(default=10.0, gt=0.0, le=100_000.0)
    http: HttpChecker | None = None
    python: str | None = None

    @field_validator(
        "settle_delay", "give_up_after", "backoff_initial", "backoff_max", "timeout", mode="before"
    )
    @classmethod
    def _durations(cls, value: Any) -> timedelta:
        return value if isinstance(value, timedelta) else _duration(value)

    @field_validator("python")
    @classmethod
    def _entry_point(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            raise ValueError(f"{value!r} must be module:function")
        return value

    @model_validator(mode="after")
    def _one_checker(self) -> ConnectorReconciler:
        if (self.http is None) == (self.python is None):
            raise ValueError("give exactly one checker: an [http] table or python = 'module:fn'")
        if self.timeout <= timedelta(0):
            raise ValueError("timeout must be more than zero")
        if self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_max must not be less than backoff_initial")
        return self

    def policy(self) -> Policy:
        return Policy(
            authoritative=self.authoritative,
            settle_delay=self.settle_delay,
            max_attempts=self.max_attempts,
            give_up_after=self.give_up_after,
            backoff_initial=self.backoff_initial,
            backoff_factor=self.backoff_factor,
            backoff_max=self.backoff_max,
            jitter=self.jitter,
            timeout=self.timeout,
            concurrency=self.concurrency,
            rate=self.rate,
        )


class ReconcilersFile(_Strict):
    connectors: dict[str, ConnectorReconciler] = {}


def _where(loc: tuple[Any, ...]) -> tuple[str | None, str]:
    """(connector, field) of a pydantic error location under ``connectors``."""
    parts = [str(p) for p in loc]
    if len(parts) >= 2 and parts[0] == "connectors":
        rest = [p for p in parts[2:] if not p.startswith(("function-", "tagged-union"))]
        return parts[1], ".".join(rest) or "(the entry)"
    return None, ".".join(parts) or "(the file)"


def parse(text: str, source: str) -> ReconcilersFile:
    """The reconcilers of TOML ``text``; ``source`` names it in errors."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ReconcilersError(f"{source}: not valid TOML: {exc}") from exc
    try:
        parsed = ReconcilersFile.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            connector, fld = _where(tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            where = f"connector {connector!r}, field {fld}" if connector else f"field {fld}"
            problems.append(f"{source}: {where}: {msg}")
        raise ReconcilersError("; ".join(problems)) from exc
    for name, conn in parsed.connectors.items():
        if conn.python is not None:
            try:
                resolve_python(conn.python)
            except (ImportError, AttributeError, TypeError) as exc:
                raise ReconcilersError(
                    f"{source}: connector {name!r}, field python: {conn.python!r}: {exc}"
                ) from exc
    return parsed


def load(path: str | Path) -> ReconcilersFile:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ReconcilersError(f"{p}: cannot be read: {exc}") from exc
    return parse(text, str(p))


def resolve_python(entry: str) -> Callable[..., Any]:
    module, _, attr = entry.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{entry} is not callable")
    return obj  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------ HTTP rules


_MISSING = object()


def json_path(body: Any, path: str) -> Any:
    """``data.0.status`` in a parsed JSON body: keys, and list indexes as numbers; a missing
    step gives ``_MISSING``."""
    node = body
    for step in path.split("."):
        if isinstance(node, Mapping) and step in node:
            node = node[step]
        elif (
            isinstance(node, list)
            and step.lstrip("-").isdigit()
            and -len(node) <= int(step) < len(node)
        ):
            node = node[int(step)]
        else:
            return _MISSING
    return node


def _same(value: Any, wanted: Any) -> bool:
    # JSON true is not 1: compare type families as JSON does
    if isinstance(value, bool) or isinstance(wanted, bool):
        return isinstance(value, bool) and isinstance(wanted, bool) and value == wanted
    return bool(value == wanted)


def interpret(checker: HttpChecker, status: int, body: bytes) -> CheckResult:
    """What an HTTP answer means under ``checker``'s rules. Pure: tested without a server."""
    parsed: Any = _MISSING
    malformed = False
    if body:
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            malformed = True
    for i, rule in enumerate(checker.rules):
        codes = rule.statuses()
        if codes is not None and status not in codes:
            continue
        if rule.field is not None:
            if parsed is _MISSING:
                if malformed:
                    return CheckResult(CheckFinding.ERROR, detail=f"malformed_json_http_{status}")
                continue
            value = json_path(parsed, rule.field)
            if value is _MISSING:
                continue
            if rule.equals is not None and not _same(value, rule.equals):
                continue
            if rule.one_of is not None and not any(_same(value, w) for w in rule.one_of):
                continue
        finding = CheckFinding(rule.finding)
        detail = f"rule{i + 1}_http_{status}"
        if finding is CheckFinding.VERIFIED:
            ref = None
            if checker.effect_ref_field is not None:
                found = (
                    json_path(parsed, checker.effect_ref_field)
                    if parsed is not _MISSING
                    else _MISSING
                )
                if found is _MISSING or found is None or isinstance(found, (dict, list)):
                    return CheckResult(CheckFinding.ERROR, detail=f"no_effect_ref_http_{status}")
                ref = str(found)
            return CheckResult(finding, effect_ref=ref, detail=detail)
        return CheckResult(finding, detail=detail)
    if malformed:
        return CheckResult(CheckFinding.ERROR, detail=f"malformed_json_http_{status}")
    return CheckResult(CheckFinding.ERROR, detail=f"http_{status}")


def render_url(template: str, request: CheckRequest) -> str | None:
    """The URL for ``request``, or None when it names a field the item does not have."""
    values = request.fields()
    missing = False

    def sub(m: re.Match[str]) -> str:
        nonlocal missing
        value = values.get(m.group(1))
        if value is None:
            missing = True
            return ""
        return quote(value, safe="")

    url = re.sub(r"\{([^{}]*)\}", sub, template)
    return None if missing else url


def _headers(checker: HttpChecker) -> dict[str, str]:
    return {
        name: _ENV_REF.sub(lambda m: os.environ.get(m.group(1), ""), value)
        for name, value in checker.headers.items()
    }


def _ssl_context(tls: Tls) -> ssl.SSLContext | bool:
    if not tls.verify:
        return False
    ctx = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file and tls.key_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def http_checker(
    checker: HttpChecker, timeout: timedelta
) -> tuple[Checker, Callable[[], Awaitable[None]]]:
    """A checker for ``checker`` and the coroutine that closes its connection pool. Errors
    become ERROR results named by their kind, never by their text (which may quote a URL with
    a secret in it)."""
    import httpx

    headers = _headers(checker)
    client = httpx.AsyncClient(
        headers=headers,
        verify=_ssl_context(checker.tls),
        timeout=timeout.total_seconds(),
        follow_redirects=False,
    )

    async def check(request: CheckRequest) -> CheckResult:
        url = render_url(checker.url, request)
        if url is None:
            return CheckResult(CheckFinding.ERROR, detail="url_field_missing")
        try:
            r = await client.get(url)
        except httpx.TimeoutException:
            return CheckResult(CheckFinding.ERROR, detail="timeout")
        except httpx.HTTPError as exc:
            return CheckResult(CheckFinding.ERROR, detail=f"unreachable_{type(exc).__name__}")
        return interpret(checker, r.status_code, r.content)

    return check, client.aclose


def python_checker(entry: str) -> Checker:
    """The function ``entry`` as a checker: a sync one runs in a thread; what it returns must
    be a ``CheckResult``."""
    fn = resolve_python(entry)

    async def check(request: CheckRequest) -> CheckResult:
        if inspect.iscoroutinefunction(fn):
            out = await fn(request)
        else:
            out = await asyncio.to_thread(fn, request)
            if inspect.isawaitable(out):
                out = await out
        if not isinstance(out, CheckResult):
            return CheckResult(CheckFinding.ERROR, detail=f"bad_result_{type(out).__name__}")
        return out

    return check


__all__ = [
    "URL_FIELDS",
    "CheckRequest",
    "Checker",
    "ConnectorReconciler",
    "HttpChecker",
    "ReconcilersError",
    "ReconcilersFile",
    "Rule",
    "http_checker",
    "interpret",
    "json_path",
    "load",
    "parse",
    "python_checker",
    "render_url",
]
