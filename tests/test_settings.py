"""Settings read from the environment: every kind of variable is refused naming the variable,
its value and what it takes; durations everywhere; old names still read; secrets never shown."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.console.settings import ConsoleSettings
from streams.settings import VARIABLES, Settings, SettingsError

#: every variable a test may set, cleared first so the machine's environment cannot leak in
ALL = [*VARIABLES.values(), "VIGIL_CONSOLE_PORT", "VIGIL_CONSOLE_ALERTS_SINCE"]


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ALL:
        monkeypatch.delenv(variable, raising=False)


def refused(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as info:
        Settings.from_env()
    return str(info.value)


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("VIGIL_PARTITIONS", "six", "not a whole number"),
        ("VIGIL_PARTITIONS", "0", "must be at least 1"),
        ("VIGIL_BATCH_SIZE", "1e3", "not a whole number"),
        ("VIGIL_WEB_PORT", "70000", "must be at most 65535"),
        ("VIGIL_GRACE", "five", "examples: 300, 90s, 5m"),
        ("VIGIL_TICK_INTERVAL", "0s", "must be longer than zero"),
        ("VIGIL_SSE_KEEPALIVE", "-1", "not a duration"),
        ("VIGIL_SESSION_TIMEOUT", "99999999999d", "too long a duration"),
        ("VIGIL_REGISTRY_RETRY_MAX", "soon", "not a duration"),
        ("VIGIL_RETENTION", "never", "not a duration"),
        ("VIGIL_RETENTION", "0s", "'forever' or a positive duration"),
        ("VIGIL_RETENTION_MS", "7d", "not a whole number"),
        ("VIGIL_RETENTION_MS", "-2", "must be at least -1"),
        ("KAFKA_SECURITY_PROTOCOL", "TLS", "'PLAINTEXT', 'SSL', 'SASL_PLAINTEXT' or 'SASL_SSL'"),
        ("KAFKA_SASL_MECHANISM", "GSSAPI", "'PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512' or"),
        ("KAFKA_SSL_CA_FILE", "/nonexistent/ca.pem", "no such file: /nonexistent/ca.pem"),
        ("VIGIL_AUTO_REGISTER", "maybe", "not one of true, false"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable_and_what_it_takes(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, allowed: str
) -> None:
    message = refused(monkeypatch, **{variable: value})
    assert message.startswith(f"{variable}={value.upper() if 'PROTOCOL' in variable else value!r}")
    assert allowed in message
    assert "pydantic" not in message and "http" not in message


def test_every_bad_variable_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    message = refused(monkeypatch, VIGIL_PARTITIONS="six", VIGIL_GRACE="five")
    assert "VIGIL_PARTITIONS='six'" in message and "VIGIL_GRACE='five'" in message


def test_a_refused_secret_is_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    message = refused(
        monkeypatch,
        KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        KAFKA_SASL_MECHANISM="PLAIN",
        KAFKA_SASL_PASSWORD="hunter2",
    )
    assert message == "KAFKA_SASL_USERNAME: needed with KAFKA_SASL_MECHANISM=PLAIN"


def test_defaults_and_empty_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_PARTITIONS", "")
    s = Settings.from_env()
    assert s == Settings()
    assert (s.partitions, s.retention_ms, s.sse_keepalive) == (6, -1, timedelta(seconds=15))


@pytest.mark.parametrize(
    ("env", "retention_ms"),
    [
        ({}, -1),
        ({"VIGIL_RETENTION": "forever"}, -1),
        ({"VIGIL_RETENTION": "30d"}, 30 * 86_400_000),
        ({"VIGIL_RETENTION": "1h30m"}, 5_400_000),
        ({"VIGIL_RETENTION_MS": "604800000"}, 604_800_000),
        ({"VIGIL_RETENTION_MS": "-1"}, -1),
        # the new name wins over the old one
        ({"VIGIL_RETENTION": "1d", "VIGIL_RETENTION_MS": "-1"}, 86_400_000),
        ({"VIGIL_RETENTION": "forever", "VIGIL_RETENTION_MS": "5000"}, -1),
    ],
)
def test_retention_by_duration_or_by_the_old_milliseconds(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], retention_ms: int
) -> None:
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    assert Settings.from_env().retention_ms == retention_ms


@pytest.mark.parametrize(
    ("text", "seconds"), [("15", 15.0), ("0.5", 0.5), ("500ms", 0.5), ("1m", 60.0)]
)
def test_sse_keepalive_is_a_duration_and_a_bare_number_is_seconds(
    monkeypatch: pytest.MonkeyPatch, text: str, seconds: float
) -> None:
    monkeypatch.setenv("VIGIL_SSE_KEEPALIVE", text)
    assert Settings.from_env().sse_keepalive.total_seconds() == seconds


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_every_duration_variable_takes_every_unit(count: int, unit: str) -> None:
    size = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    expected = timedelta(seconds=count * size)
    with pytest.MonkeyPatch.context() as mp:
        for variable in ALL:
            mp.delenv(variable, raising=False)
        for name in ("tick_interval", "batch_wait", "session_timeout", "state_gauges_interval"):
            mp.setenv(VARIABLES[name], f"{count}{unit}")
        s = Settings.from_env()
    assert s.tick_interval == s.batch_wait == s.session_timeout == expected


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    monkeypatch.setenv("VIGIL_OUTPUT_SUFFIX", "-env")
    s = Settings.from_env(bootstrap_servers="flag:9092", output_suffix=None)
    assert (s.bootstrap_servers, s.output_suffix) == ("flag:9092", "-env")


def test_secrets_are_masked_and_left_out_of_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "KAFKA_SASL_PASSWORD": "pw-secret",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "oauth-secret",
        "KAFKA_SSL_KEY_PASSWORD": "key-secret",
        "SCHEMA_REGISTRY_BASIC_AUTH": "u:registry-secret",
        "VIGIL_API_TOKEN": "api-secret",
    }
    for variable, value in secrets.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    monkeypatch.setenv("KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "https://idp/token")
    monkeypatch.setenv("KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "vigil")
    s = Settings.from_env()
    shown = repr(s) + str(s.public())
    for value in secrets.values():
        assert value not in shown
    assert s.public()["oauth_client_secret"] == "***"
    assert s.oauth_client_secret == "oauth-secret"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFKA_SASL_MECHANISM: KAFKA_SECURITY_PROTOCOL"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "oauthbearer"},
            "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL, KAFKA_SASL_OAUTHBEARER_CLIENT_ID, "
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET: needed with KAFKA_SASL_MECHANISM=OAUTHBEARER",
        ),
        (
            {"KAFKA_SASL_MECHANISM": "PLAIN"},
            "KAFKA_SASL_MECHANISM=PLAIN: KAFKA_SECURITY_PROTOCOL=PLAINTEXT uses no SASL",
        ),
        ({"KAFKA_SSL_CA_FILE": "{file}"}, "KAFKA_SSL_CA_FILE: KAFKA_SECURITY_PROTOCOL=PLAINTEXT"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERT_FILE": "{file}"},
            "KAFKA_SSL_CERT_FILE and KAFKA_SSL_KEY_FILE: set both or neither",
        ),
        (
            {"SCHEMA_REGISTRY_SSL_CA_FILE": "{file}"},
            "SCHEMA_REGISTRY_SSL_*: SCHEMA_REGISTRY_URL is not an https:// URL",
        ),
    ],
)
def test_tls_and_sasl_settings_that_do_not_fit_together(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], message: str
) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("-")
    env = {k: v.format(file=pem) for k, v in env.items()}
    assert refused(monkeypatch, **env).startswith(message)


def test_console_settings_name_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_CONSOLE_PORT", "http")
    with pytest.raises(SettingsError, match=r"^VIGIL_CONSOLE_PORT='http': not a whole number"):
        ConsoleSettings.from_env(Settings())
    monkeypatch.setenv("VIGIL_CONSOLE_PORT", "6081")
    monkeypatch.setenv("VIGIL_CONSOLE_ALERTS_SINCE", "a week")
    with pytest.raises(SettingsError, match=r"^VIGIL_CONSOLE_ALERTS_SINCE='a week'.*\(or 'all'\)"):
        ConsoleSettings.from_env(Settings())
    monkeypatch.setenv("VIGIL_CONSOLE_ALERTS_SINCE", "36h")
    console = ConsoleSettings.from_env(Settings(data_dir="d"), host="0.0.0.0")
    assert (console.host, console.port, console.alerts_since) == (
        "0.0.0.0",
        6081,
        timedelta(hours=36),
    )
    assert console.db == str(Path("d") / "console.sqlite3")
    monkeypatch.setenv("VIGIL_CONSOLE_ALERTS_SINCE", "all")
    assert ConsoleSettings.from_env(Settings()).alerts_since is None


def test_every_variable_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    missing = [v for v in ALL if f"`{v}`" not in readme]
    assert not missing, missing
