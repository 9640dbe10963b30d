"""The CLI's error boundary: every failure a user can cause or meet becomes one line and an
exit code.

A person at a terminal (or a script) needs to know what is wrong and what would be right, and
a script needs to tell the kinds of failure apart; a traceback serves neither, so it is shown
only with ``vigil --debug``. Commands raise the exceptions below (or let those of the
libraries through); ``explain`` maps each to its message and code, and ``streams.cli.main``
prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """The exit codes of ``vigil``, one per kind of failure."""

    OK = 0
    #: the command ran and the answer is no: not found, refused, a service unhealthy
    REFUSED = 1
    #: a bad argument or option (click's own usage errors use it too)
    USAGE = 2
    #: a bad setting: an environment variable (named in the message) has an unusable value
    SETTING = 3
    #: a bad input file or line: missing, unreadable, not JSON, not a valid record
    INPUT = 4
    #: a topic that is not in the catalogue, or not on the cluster
    TOPIC = 5
    #: the Kafka broker cannot be reached or refused the request
    KAFKA = 6
    #: the schema registry cannot be reached or answered with an error
    REGISTRY = 7
    #: a worker's HTTP API or the console cannot be reached
    SERVICE = 8
    #: an error vigil did not expect (a bug: ``--debug`` shows the traceback)
    INTERNAL = 70
    #: stopped with Ctrl-C
    INTERRUPTED = 130


#: The codes as the ``--help`` epilog and the README list them.
EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 refused or not found; 2 bad argument or option; 3 bad setting "
    "(environment variable); 4 bad input file or line; 5 unknown topic; 6 Kafka unreachable; "
    "7 schema registry unreachable; 8 worker API or console unreachable; 70 unexpected error "
    "(--debug shows the traceback); 130 interrupted."
)


class CliError(Exception):
    """A failure the command can explain: ``str(exc)`` is the line printed."""

    code: ExitCode = ExitCode.REFUSED

    def __init__(self, message: str, code: ExitCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class BadInput(CliError):
    code = ExitCode.INPUT


class BadArgument(CliError):
    code = ExitCode.USAGE


class BadSetting(CliError):
    """An environment variable (named in the message) is missing or unusable."""

    code = ExitCode.SETTING


class UnknownTopic(CliError):
    code = ExitCode.TOPIC

    def __init__(self, name: str, known: list[str] | tuple[str, ...], where: str) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"unknown topic {name} ({where}); topics: {listed}")
        self.name = name


class KafkaUnreachable(CliError):
    code = ExitCode.KAFKA


class ServiceUnreachable(CliError):
    code = ExitCode.SERVICE


def refused_by(service: str, status: int, message: str) -> CliError:
    """A service's HTTP refusal as the error of its kind: what the request asked was refused
    or not found (401, 403, 404, 409: exit 1), the request itself was bad (400, 415, 422:
    exit 2), the service failed (5xx: exit 8)."""
    line = f"{service} answered {status}: {message}"
    if status >= 500:
        return ServiceUnreachable(line)
    if status in (400, 415, 422):
        return BadArgument(line)
    return CliError(line, ExitCode.REFUSED)


def one_line(message: str) -> str:
    """``message`` on one line: a newline inside an exception's text (a server's answer, a
    log tail) would split the one line a script reads."""
    return " ".join(message.split())


@dataclass(frozen=True, slots=True)
class Explained:
    message: str
    code: ExitCode


def render_validation_error(exc: Any) -> str:
    """A pydantic ``ValidationError`` as one line: each failing field with pydantic's message
    and the value given, without the documentation URLs pydantic appends."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error.get("loc", ())) or "record"
        text = f"{where}: {error['msg']}"
        if error.get("type") not in ("missing", "extra_forbidden") and "input" in error:
            given = repr(error["input"])
            text += f" (got {given[:60] + '…' if len(given) > 60 else given})"
        elif error.get("type") == "extra_forbidden":
            text = f"{where}: not a field of {exc.title}"
        parts.append(text)
    return "; ".join(parts)


def explain(exc: BaseException) -> Explained:
    """The line and exit code for ``exc``; an exception not recognised is INTERNAL."""
    if isinstance(exc, CliError):
        return Explained(one_line(str(exc)), exc.code)
    if isinstance(exc, KeyboardInterrupt):
        return Explained("interrupted", ExitCode.INTERRUPTED)
    from streams.settings import SettingsError

    if isinstance(exc, SettingsError):
        return Explained(f"bad setting: {exc}", ExitCode.SETTING)
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        if exc.title.endswith("Settings"):
            return Explained(f"bad setting: {render_validation_error(exc)}", ExitCode.SETTING)
        return Explained(f"invalid {exc.title}: {render_validation_error(exc)}", ExitCode.INPUT)
    from streams.contracts.codec import RegistryUnavailable

    if isinstance(exc, RegistryUnavailable):
        return Explained(
            f"schema registry unavailable ({exc}); check SCHEMA_REGISTRY_URL or --registry",
            ExitCode.REGISTRY,
        )
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):
        hint = (
            "; `vigil schemas register` registers vigil's schemas"
            if exc.http_status_code == 404
            else ""
        )
        return Explained(f"schema registry: {exc}{hint}", ExitCode.REGISTRY)
    from confluent_kafka import KafkaException

    if isinstance(exc, KafkaException):
        err = exc.args[0] if exc.args else exc
        text = err.str() if hasattr(err, "str") else str(err)
        return Explained(
            f"Kafka: {text}; check KAFKA_BOOTSTRAP_SERVERS or --bootstrap", ExitCode.KAFKA
        )
    import httpx

    if isinstance(exc, httpx.TransportError):
        where = exc.request.url if _has_request(exc) else "the service"
        return Explained(f"cannot reach {where}: {exc}", ExitCode.SERVICE)
    if isinstance(exc, UnicodeDecodeError):
        return Explained(f"not UTF-8 text: {exc}", ExitCode.INPUT)
    if isinstance(exc, OSError) and exc.filename is not None:
        return Explained(f"cannot read {exc.filename}: {exc.strerror}", ExitCode.INPUT)
    return Explained(
        f"unexpected error: {type(exc).__name__}: {exc} (vigil --debug … shows the traceback)",
        ExitCode.INTERNAL,
    )


def _has_request(exc: Any) -> bool:
    try:
        exc.request  # noqa: B018 - httpx raises RuntimeError when the error has no request
    except RuntimeError:
        return False
    return True
