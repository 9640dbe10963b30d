"""``streams.client`` against a real worker on the real broker: typed views, typed errors, a
307 followed with the token, and a stream cut mid-way that loses and repeats nothing."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streams.client import (
    AsyncClient,
    BadRequest,
    Client,
    NotFound,
    StreamEvent,
    Unauthorized,
    Unreachable,
)
from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    ExecutionStatus,
    OperationStatus,
    Owner,
    RetryVerdict,
)
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import ApprovalVerdict, ExecutionState
from streams.local.scenario import REFERENCE_AT, Tick, demo_scenario
from tests.registry_proxy import Mode, RegistryProxy
from tests.support import by_id, deployment, free_port, play, worker

pytestmark = pytest.mark.kafka
TOKEN = "client-s3cret"
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def running(cluster, tmp_path_factory):
    """The demo scenario through one worker that wants a bearer token."""
    dep = deployment(cluster, tmp_path_factory.mktemp("client"))
    play(dep, demo_scenario())
    with worker(dep, env={"VIGIL_API_TOKEN": TOKEN, "VIGIL_SSE_KEEPALIVE": "1"}) as w:
        dep.read_until(
            [dep.topics.approval_verdicts.name],
            lambda rs: any(
                isinstance(r.record, ApprovalVerdict)
                and r.record.evaluated_at > REFERENCE_AT - timedelta(minutes=5)
                for r in rs
            ),
        )
        yield dep, f"http://127.0.0.1:{w.web_port}"


def test_get_returns_the_typed_execution(running) -> None:
    _, base = running
    with Client(base, TOKEN) as client:
        n = client.get("exec-refund")
        assert n.status is ExecutionStatus.RUNNING and n.in_flight
        (op,) = n.operations
        assert op.operation_id == "op-refund-1" and op.attempt == 2
        assert op.status is OperationStatus.UNKNOWN and op.retry is RetryVerdict.FORBIDDEN
        assert op.open_work_item_id and isinstance(op.since, datetime)
        deploy = client.get("exec-deploy")
        (appr,) = deploy.approvals
        assert appr.verdict is ApprovalVerdictCode.STUCK_AFTER_DECISION
        assert appr.owner is Owner.RUNTIME_OWNER and appr.next_step
        # no status event, an open approval: in flight with its status unknown, not closed
        assert deploy.status is None and deploy.status_known is False
        assert deploy.in_flight and deploy.open_approval_ids == (appr.request_id,)


def test_approval_and_typed_errors(running) -> None:
    _, base = running
    with Client(base, TOKEN) as client:
        a = client.approval("req-rotation")
        assert a.verdict is ApprovalVerdictCode.UNROUTABLE_WAIT and a.owner is Owner.POLICY_OWNER
        assert any(f.proof == "VERIFIED_ROUTE" for f in a.failed_proofs)
        # by its execution too: request ids repeat across executions
        scoped = client.approval("req-rotation", execution_id="exec-rotation")
        assert scoped == a
        with pytest.raises(NotFound):
            client.approval("req-rotation", execution_id="exec-refund")
        with pytest.raises(NotFound) as nf:
            client.get("no-such-run")
        assert nf.value.status == 404 and "no-such-run" in str(nf.value)
        with pytest.raises(BadRequest):
            client.get(" bad id")
    with Client(base, token="") as client, pytest.raises(Unauthorized):
        client.get("exec-refund")
    with Client(base, "wrong") as client, pytest.raises(Unauthorized):
        client.approval("req-rotation")
    nobody = f"http://127.0.0.1:{free_port()}"
    with Client(nobody, TOKEN, timeout=2) as client, pytest.raises(Unreachable):
        client.get("exec-refund")


class _Redirector:
    """Another "worker" on another port that owns nothing: it answers every request with a
    307 to the real worker, as a worker does for an execution it does not own. It refuses a
    request without the token, like a worker with ``VIGIL_API_TOKEN``."""

    def __init__(self, target: str) -> None:
        outer = self
        self.seen_auth: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.seen_auth.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                self.send_response(307)
                self.send_header("Location", f"{target}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_307_to_the_owner_is_followed_with_the_token(running) -> None:
    """httpx drops ``Authorization`` on a redirect to another origin (another port is
    another origin); the owner wants the token too, so the client sends it there itself."""
    _, base = running
    redirector = _Redirector(base)
    try:
        with Client(redirector.url, TOKEN) as client:
            assert client.get("exec-refund").operations[0].operation_id == "op-refund-1"
            assert client.approval("req-rotation").verdict is ApprovalVerdictCode.UNROUTABLE_WAIT
            first = next(iter(client.stream("exec-refund")))
            assert first.kind and first.id
        assert redirector.seen_auth and set(redirector.seen_auth) == {f"Bearer {TOKEN}"}
    finally:
        redirector.close()


def _status(ex: str, seq: int, st: ExecutionStatus, minute: int = 40) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(
        event_id=f"{ex}-{seq}",
        execution_id=ex,
        sequence=seq,
        status=st,
        occurred_at=T0 + timedelta(minutes=minute, seconds=seq),
    )


def _published_ids(dep, ex: str, done) -> list[str]:
    """Ids of every output about ``ex`` on the output topics, once ``done`` holds."""
    topics = [t.name for t in dep.topics.outputs() if t.name != dep.topics.anomalies.name]
    records = dep.read_until(
        topics,
        lambda rs: done([r.record for r in rs if getattr(r.record, "execution_id", None) == ex]),
    )
    return list(by_id(r for r in records if getattr(r.record, "execution_id", None) == ex))


def _terminal(records) -> bool:
    return any(isinstance(r, ExecutionState) and r.terminal for r in records)


def test_stream_cut_mid_way_loses_and_repeats_nothing(running) -> None:
    """The stream goes through a TCP proxy the test controls. After the first event the
    proxy cuts the connection and refuses new ones while the execution moves on (four more
    status changes); healed, the client resumes with Last-Event-ID and gets exactly the
    outputs published meanwhile, then the terminal state ends the stream."""
    dep, base = running
    ex = "exec-client-cut"
    play(
        dep, [_status(ex, 1, ExecutionStatus.RUNNING), Tick(T0 + timedelta(minutes=40, seconds=2))]
    )
    _published_ids(dep, ex, lambda rs: len(rs) >= 1)
    got: list[StreamEvent] = []
    first = threading.Event()
    errors: list[BaseException] = []
    with RegistryProxy(base) as proxy:

        def read() -> None:
            try:
                with Client(proxy.url, TOKEN, reconnects=30) as client:
                    for event in client.stream(ex):
                        got.append(event)
                        first.set()
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(20), errors
        proxy.set(Mode.REFUSE)  # cuts the open stream; new connections are closed at once
        play(
            dep,
            [
                _status(ex, 2, ExecutionStatus.WAITING_FOR_TOOL),
                _status(ex, 3, ExecutionStatus.RUNNING),
                _status(ex, 4, ExecutionStatus.VALIDATING_OUTPUT),
                _status(ex, 5, ExecutionStatus.COMPLETED),
                Tick(T0 + timedelta(minutes=40, seconds=7)),
            ],
        )
        published = _published_ids(dep, ex, _terminal)
        proxy.set(Mode.FORWARD)
        reader.join(30)
        assert not reader.is_alive() and not errors, errors
        reconnections = proxy.connections
    ids = [e.id for e in got]
    assert len(ids) == len(set(ids)), f"repeated: {ids}"
    assert set(ids) == set(published), (ids, published)
    assert reconnections >= 3  # the first stream, refused attempts, the resumed one
    states = [e.record for e in got if isinstance(e.record, ExecutionState)]
    assert [s.status for s in states] == [
        ExecutionStatus.RUNNING,
        ExecutionStatus.WAITING_FOR_TOOL,
        ExecutionStatus.RUNNING,
        ExecutionStatus.VALIDATING_OUTPUT,
        ExecutionStatus.COMPLETED,
    ]
    assert got[-1].terminal


def test_async_client(running) -> None:
    dep, base = running
    ex = "exec-client-async"
    play(
        dep,
        [
            _status(ex, 1, ExecutionStatus.RUNNING, minute=41),
            _status(ex, 2, ExecutionStatus.FAILED, minute=41),
            Tick(T0 + timedelta(minutes=41, seconds=3)),
        ],
    )
    published = _published_ids(dep, ex, _terminal)

    async def run() -> tuple[object, list[StreamEvent]]:
        async with AsyncClient(base, TOKEN) as client:
            n = await client.get("exec-refund")
            events = [e async for e in client.stream(ex)]
            with pytest.raises(NotFound):
                await client.get("no-such-run")
            return n, events

    n, events = asyncio.run(asyncio.wait_for(run(), 30))
    assert n.operations[0].retry is RetryVerdict.FORBIDDEN  # type: ignore[attr-defined]
    assert sorted(e.id for e in events) == sorted(published)
    assert events[-1].terminal
