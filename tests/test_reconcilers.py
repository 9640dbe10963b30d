"""The reconcilers file (streams/reconcilers.py): bad configuration refused at start naming the
file, the connector and the field; what an HTTP answer means under the rules; the Python
checker's contract. No server, no Kafka."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.contracts.models.enums import CheckFinding
from streams.core.reconcile import CheckResult
from streams.reconcilers import (
    CheckRequest,
    HttpChecker,
    ReconcilersError,
    interpret,
    parse,
    python_checker,
    render_url,
)
from streams.settings import SettingsError

GOOD = """
[connectors.payments]
authoritative = true
settle_delay = "2m"
max_attempts = 4
backoff_initial = "500ms"

[connectors.payments.http]
url = "https://pay.example/v1/payments/by-key/{idempotency_key}?op={operation_id}"
headers = { Authorization = "Bearer ${RECONCILE_TEST_TOKEN}" }
effect_ref_field = "data.0.id"

[[connectors.payments.http.rules]]
status = 200
field = "data.0.status"
equals = "succeeded"
finding = "VERIFIED"

[[connectors.payments.http.rules]]
status = [200, 202]
field = "data.0.status"
in = ["processing", "queued"]
finding = "PENDING"

[[connectors.payments.http.rules]]
status = 404
finding = "ABSENT"

[connectors.crm]
python = "tests.test_reconcilers:sync_checker"
"""


def sync_checker(request: CheckRequest) -> CheckResult:
    return CheckResult(CheckFinding.VERIFIED, effect_ref=f"crm-{request.operation_id}")


async def async_checker(request: CheckRequest) -> CheckResult:
    return CheckResult(CheckFinding.ABSENT, detail="no such record")


def bad_checker(request: CheckRequest) -> str:
    return "yes"


REQUEST = CheckRequest("wi-1", "op/1", "exec-1", 1, "payments", "key 1", None)


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILE_TEST_TOKEN", "s3cret")


def test_a_good_file_gives_each_connector_its_policy_and_checker() -> None:
    conf = parse(GOOD, "r.toml")
    pay = conf.connectors["payments"]
    policy = pay.policy()
    assert policy.authoritative and policy.settle_delay == timedelta(minutes=2)
    assert policy.max_attempts == 4 and policy.backoff_initial == timedelta(milliseconds=500)
    assert pay.http is not None and len(pay.http.rules) == 3
    assert conf.connectors["crm"].python == "tests.test_reconcilers:sync_checker"


@pytest.mark.parametrize(
    ("change", "connector", "field", "why"),
    [
        (("max_attempts = 4", "max_attempts = 0"), "payments", "max_attempts", "greater than"),
        (('settle_delay = "2m"', 'settle_delay = "soon"'), "payments", "settle_delay", "soon"),
        (
            ('settle_delay = "2m"', 'settle_delay = "-5s"'),
            "payments",
            "settle_delay",
            "not a duration",
        ),
        (("{operation_id}", "{operation}"), "payments", "http.url", "unknown field"),
        (("https://pay", "ftp://pay"), "payments", "http.url", "http://"),
        (
            ('finding = "ABSENT"', 'finding = "GONE"'),
            "payments",
            "http.rules.2.finding",
            "'VERIFIED', 'ABSENT' or 'PENDING'",
        ),
        (
            ("RECONCILE_TEST_TOKEN", "RECONCILE_MISSING_TOKEN"),
            "payments",
            "http.headers",
            "RECONCILE_MISSING_TOKEN",
        ),
        (("authoritative = true", "authoritive = true"), "payments", "authoritive", "Extra"),
        (
            ('python = "tests.test_reconcilers:sync_checker"', 'python = "tests.nowhere:check"'),
            "crm",
            "python",
            "tests.nowhere",
        ),
        (
            ('python = "tests.test_reconcilers:sync_checker"', 'python = "not an entry"'),
            "crm",
            "python",
            "module:function",
        ),
        (
            ('python = "tests.test_reconcilers:sync_checker"', ""),
            "crm",
            "(the entry)",
            "exactly one checker",
        ),
    ],
)
def test_bad_configuration_is_refused_naming_file_connector_and_field(
    change: tuple[str, str], connector: str, field: str, why: str
) -> None:
    old, new = change
    assert old in GOOD
    with pytest.raises(ReconcilersError) as err:
        parse(GOOD.replace(old, new, 1), "/etc/vigil/reconcilers.toml")
    text = str(err.value)
    assert text.startswith("/etc/vigil/reconcilers.toml: ")
    assert f"connector {connector!r}, field {field}" in text, text
    assert why in text, text
    assert "s3cret" not in text
    assert isinstance(err.value, SettingsError)  # the CLI's "bad setting", exit code 3


def test_a_file_that_is_not_toml_is_refused_naming_it() -> None:
    with pytest.raises(ReconcilersError, match=r"^r\.toml: not valid TOML"):
        parse("[connectors.x\n", "r.toml")


def checker() -> HttpChecker:
    http = parse(GOOD, "r.toml").connectors["payments"].http
    assert http is not None
    return http


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            200,
            b'{"data": [{"id": "pi_1", "status": "succeeded"}]}',
            (CheckFinding.VERIFIED, "pi_1"),
        ),
        (200, b'{"data": [{"id": "pi_1", "status": "processing"}]}', (CheckFinding.PENDING, None)),
        (202, b'{"data": [{"id": "pi_1", "status": "queued"}]}', (CheckFinding.PENDING, None)),
        (404, b'{"error": "not_found"}', (CheckFinding.ABSENT, None)),
        (404, b"", (CheckFinding.ABSENT, None)),
        (503, b"down", (CheckFinding.ERROR, None)),
        (401, b'{"error": "unauthorized"}', (CheckFinding.ERROR, None)),
        (200, b"<html>oops", (CheckFinding.ERROR, None)),
        (200, b'{"data": [{"status": "succeeded"}]}', (CheckFinding.ERROR, None)),  # no reference
        (200, b'{"data": [{"id": "pi_1", "status": "refunded"}]}', (CheckFinding.ERROR, None)),
        (200, b'{"data": []}', (CheckFinding.ERROR, None)),
    ],
)
def test_what_an_answer_means(
    status: int, body: bytes, expected: tuple[CheckFinding, str | None]
) -> None:
    result = interpret(checker(), status, body)
    assert (result.finding, result.effect_ref) == expected
    if result.finding is CheckFinding.ERROR:
        assert result.detail is not None and str(status) in result.detail
        assert body.decode(errors="replace")[:5] not in (result.detail or "") or not body


def test_json_true_is_not_one() -> None:
    http = HttpChecker.model_validate(
        {
            "url": "http://x/{operation_id}",
            "rules": [{"field": "ok", "equals": True, "finding": "VERIFIED"}],
        }
    )
    assert interpret(http, 200, b'{"ok": 1}').finding is CheckFinding.ERROR
    assert interpret(http, 200, b'{"ok": true}').finding is CheckFinding.VERIFIED


@given(st.integers(100, 599), st.binary(max_size=200))
def test_any_answer_is_a_finding_and_never_raises(status: int, body: bytes) -> None:
    result = interpret(checker(), status, body)
    assert result.finding in set(CheckFinding) - {CheckFinding.UNRECOGNIZED}
    if result.finding is CheckFinding.VERIFIED:
        assert status == 200 and result.effect_ref


def test_url_fields_are_encoded_and_a_missing_one_is_no_url() -> None:
    assert render_url("https://p/{idempotency_key}?op={operation_id}", REQUEST) == (
        "https://p/key%201?op=op%2F1"
    )
    assert render_url("https://p/{effect_ref}", REQUEST) is None


def test_python_checkers_sync_async_and_a_wrong_result() -> None:
    got = asyncio.run(python_checker("tests.test_reconcilers:sync_checker")(REQUEST))
    assert got == CheckResult(CheckFinding.VERIFIED, effect_ref="crm-op/1")
    got = asyncio.run(python_checker("tests.test_reconcilers:async_checker")(REQUEST))
    assert got.finding is CheckFinding.ABSENT
    got = asyncio.run(python_checker("tests.test_reconcilers:bad_checker")(REQUEST))
    assert got.finding is CheckFinding.ERROR and got.detail == "bad_result_str"
