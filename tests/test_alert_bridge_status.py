"""The alert bridge's own metrics and health, without Kafka: the health transitions (joined the
group or not, Alertmanager failing for longer than the threshold or not), the counters its
posts move against a local HTTP server answering as told, and both served over HTTP."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from streams import alert_bridge as ab
from streams.read.status_http import serve
from streams.settings import Settings
from tests.support import free_port


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


def value(of: ab.BridgeStatus, name: str, **labels: str) -> float:
    got = of.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_status_address_from_arguments_environment_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VIGIL_ALERT_BRIDGE_HOST", raising=False)
    monkeypatch.delenv("VIGIL_ALERT_BRIDGE_PORT", raising=False)
    assert ab.status_address() == ("127.0.0.1", 6069)
    monkeypatch.setenv("VIGIL_ALERT_BRIDGE_HOST", "0.0.0.0")
    monkeypatch.setenv("VIGIL_ALERT_BRIDGE_PORT", "7069")
    assert ab.status_address() == ("0.0.0.0", 7069)
    assert ab.status_address("10.0.0.1", 0) == ("10.0.0.1", 0)


def test_status_class() -> None:
    assert [ab.status_class(c) for c in (200, 202, 400, 404, 429, 500, 503, None)] == [
        "2xx",
        "2xx",
        "4xx",
        "4xx",
        "4xx",
        "5xx",
        "5xx",
        "unreachable",
    ]


def test_health_transitions() -> None:
    s = ab.BridgeStatus(failing_after=120.0)
    ok, detail = s.healthy(now=0.0)
    assert not ok and "no assignment" in detail  # not in the group yet
    s.assignment(0)  # an empty assignment: a standby replica, healthy
    assert s.healthy(now=0.0)[0]
    s.answered(None, now=10.0)  # Alertmanager unreachable
    s.answered(503, now=70.0)
    assert s.healthy(now=130.0)[0]  # 120 s since the first failure, not more
    ok, detail = s.healthy(now=130.5)
    assert not ok and "accepted no post for 120 s" in detail
    s.answered(400, now=131.0)  # a refusal does not reset the failing time
    assert not s.healthy(now=131.0)[0]
    s.answered(200, now=132.0)  # accepted: healthy at once
    assert s.healthy(now=132.0) == (True, "Alertmanager accepts the posts")
    s.answered(500, now=200.0)  # a new run of failures counts from its own first
    assert s.healthy(now=319.0)[0] and not s.healthy(now=321.0)[0]
    s.answered(204, now=322.0)
    s.assignment(None)  # revoked, not yet reassigned
    assert not s.healthy(now=322.0)[0]
    s.assignment(2)
    assert s.healthy(now=322.0)[0]
    assert value(s, "vigil_alert_bridge_posts_accepted_total") == 2
    assert value(s, "vigil_alert_bridge_posts_failed_total", status="unreachable") == 1
    assert value(s, "vigil_alert_bridge_posts_failed_total", status="5xx") == 2
    assert value(s, "vigil_alert_bridge_posts_failed_total", status="4xx") == 1
    assert value(s, "vigil_alert_bridge_partitions_assigned") == 2
    assert value(s, "vigil_alert_bridge_last_accepted_timestamp_seconds") > 0


answers = st.lists(
    st.tuples(
        st.sampled_from([200, 202, 400, 404, 429, 500, 503, None]),
        st.floats(min_value=0, max_value=100),
    ),
    max_size=30,
)


@given(answers, st.floats(min_value=0, max_value=400))
def test_unhealthy_exactly_when_no_post_was_accepted_since_a_failure_long_ago(
    seq: list[tuple[int | None, float]], after: float
) -> None:
    s = ab.BridgeStatus(failing_after=120.0)
    s.assignment(1)
    now, first_failure = 0.0, None
    for code, gap in seq:
        now += gap
        s.answered(code, now=now)
        if code is not None and 200 <= code < 300:
            first_failure = None
        elif first_failure is None:
            first_failure = now
    now += after
    expected = first_failure is None or now - first_failure <= 120.0
    assert s.healthy(now=now)[0] == expected
    failed = sum(1 for code, _ in seq if code is None or not 200 <= code < 300)
    assert value(s, "vigil_alert_bridge_posts_accepted_total") == len(seq) - failed
    assert (
        sum(
            value(s, "vigil_alert_bridge_posts_failed_total", status=c)
            for c in ("4xx", "5xx", "unreachable")
        )
        == failed
    )


def test_metrics_and_health_served_over_http() -> None:
    s = ab.BridgeStatus(failing_after=0.0)
    s.alerts_read.inc(3)
    s.firing.set(2)
    s.commits.inc()
    port = free_port()
    server = serve(s.registry, s.healthy, "127.0.0.1", port, unhealthy_word="FAILING")
    try:
        code, body = get(f"http://127.0.0.1:{port}/healthz")
        assert code == 503 and json.loads(body)["status"] == "FAILING"
        s.assignment(1)
        code, body = get(f"http://127.0.0.1:{port}/healthz")
        assert code == 200 and json.loads(body)["status"] == "OK"
        s.answered(None)  # failing for longer than 0 s at once
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 503
        got = samples(get(f"http://127.0.0.1:{port}/metrics")[1])
        assert got[("vigil_alert_bridge_alerts_read_total", ())] == 3
        assert got[("vigil_alert_bridge_alerts_firing", ())] == 2
        assert got[("vigil_alert_bridge_commits_total", ())] == 1
        assert got[("vigil_alert_bridge_posts_failed_total", (("status", "unreachable"),))] == 1
        assert got[("vigil_alert_bridge_last_accepted_timestamp_seconds", ())] == 0
        assert ("process_cpu_seconds_total", ()) in got
        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def answering() -> Iterator[tuple[str, list[int]]]:
    """A local HTTP server answering each POST with the next code of the list (then 200)."""
    codes: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(codes.pop(0) if codes else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", codes
    finally:
        server.shutdown()
        server.server_close()


def test_the_bridge_counts_its_posts_and_retries(answering: tuple[str, list[int]]) -> None:
    url, codes = answering
    bridge = ab.AlertBridge(
        Settings(),
        ab.BridgeSettings(alertmanager_url=url),
        codec=None,  # type: ignore[arg-type]  # nothing is decoded here
    )
    try:
        alert = {"labels": {"alertname": "VigilTest", "alert_id": "a-1"}}
        codes += [503, 429]
        assert bridge._deliver([alert])  # two failures, retried, then accepted
        codes += [400]
        assert bridge._deliver([alert])  # refused: skipped, not retried
        status = bridge.status
        assert value(status, "vigil_alert_bridge_posts_failed_total", status="5xx") == 1
        assert value(status, "vigil_alert_bridge_posts_failed_total", status="4xx") == 2
        assert value(status, "vigil_alert_bridge_posts_accepted_total") == 1
        assert value(status, "vigil_alert_bridge_retries_total") == 2
        bridge.book.active["a-1"] = (0, None)  # type: ignore[assignment]
        assert value(status, "vigil_alert_bridge_alerts_firing") == 1
    finally:
        bridge.consumer.close()
        bridge.am.close()

    down = ab.Alertmanager(f"http://127.0.0.1:{free_port()}", timeout=2.0, answered=status.answered)
    with pytest.raises(ab.AlertmanagerDown):
        down.post([alert])
    assert value(status, "vigil_alert_bridge_posts_failed_total", status="unreachable") == 1
