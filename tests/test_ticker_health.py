"""The ticker's own metrics and health endpoint: served while it ticks against the real
broker, stale (503) when rounds stop being delivered, and where the settings say."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streams import ticker as tk
from tests.support import deployment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def metric_values(body: bytes) -> dict[str, float]:
    return {
        s.name: s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if not s.labels
    }


def test_health_address_from_arguments_environment_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VIGIL_TICKER_HOST", raising=False)
    monkeypatch.delenv("VIGIL_TICKER_PORT", raising=False)
    assert tk.health_address() == ("127.0.0.1", 6068)
    monkeypatch.setenv("VIGIL_TICKER_HOST", "0.0.0.0")
    monkeypatch.setenv("VIGIL_TICKER_PORT", "7000")
    assert tk.health_address() == ("0.0.0.0", 7000)
    assert tk.health_address("10.0.0.1", 0) == ("10.0.0.1", 0)


def test_status_is_stale_before_the_first_round_and_after_silent_intervals() -> None:
    status = tk.TickerStatus(interval=0.05)
    port = free_port()
    server = tk.serve_status(status, "127.0.0.1", port)
    try:
        code, body = get(f"http://127.0.0.1:{port}/healthz")
        assert code == 503 and json.loads(body)["status"] == "STALE"
        status.delivered(6)
        code, body = get(f"http://127.0.0.1:{port}/healthz")
        assert code == 200 and json.loads(body)["status"] == "OK"
        status.delivered_at = time.monotonic() - 6.0  # past 5 intervals and past 5 s
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 503
        values = metric_values(get(f"http://127.0.0.1:{port}/metrics")[1])
        assert values["vigil_ticker_ticks_total"] == 6
        assert values["vigil_ticker_rounds_total"] == 1
        assert values["vigil_ticker_interval_seconds"] == 0.05
        assert abs(values["vigil_ticker_last_tick_timestamp_seconds"] - time.time()) < 60
        assert "process_cpu_seconds_total" in values
        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.kafka
def test_a_running_ticker_serves_metrics_and_health(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=2)
    settings = replace(dep.settings, tick_interval=timedelta(seconds=0.1))
    port = free_port()
    status = tk.TickerStatus(settings.tick_interval.total_seconds())
    rounds: list[int] = []
    thread = threading.Thread(
        target=lambda: rounds.append(
            tk.run_ticker(settings, dep.codec, count=30, health=("127.0.0.1", port), status=status)
        ),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and status.delivered_at is None and thread.is_alive():
        time.sleep(0.05)
    code, _ = get(f"http://127.0.0.1:{port}/healthz")
    assert code == 200
    values = metric_values(get(f"http://127.0.0.1:{port}/metrics")[1])
    per_round = sum(spec.partitions for spec in dep.topics.inputs())
    assert values["vigil_ticker_ticks_total"] == per_round * values["vigil_ticker_rounds_total"]
    assert values["vigil_ticker_errors_total"] == 0
    thread.join(timeout=60)
    assert rounds == [30]
    assert status.rounds._value.get() == 30
    with pytest.raises(OSError):  # the server stops with the ticker
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
