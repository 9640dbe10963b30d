"""``vigil alert-bridge``: vigil's alerts topic into Alertmanager (``POST /api/v2/alerts``).

A downstream consumer like the console: the worker knows nothing of it. Delivery is at least
once. The consumer group (``<app_id>-alert-bridge``) commits a batch's offsets only after
Alertmanager answered 2xx to the post that carries the batch; while Alertmanager cannot be
reached (or answers 5xx, 404, 429...) the same post is retried with a doubling delay and
nothing further is read. Posting an alert again is harmless: Alertmanager merges alerts with
the same labels. Only a 400 (Alertmanager refusing the payload itself, which no retry can
change) is logged and skipped.

Alertmanager keeps alerts in memory only and ends an alert at its ``endsAt``. So the bridge
keeps the set of alerts it has fired and not seen resolved (``AlertBook``), posts each with
``endsAt`` = now + validity, and posts the whole set again every refresh interval (at once
after Alertmanager comes back from an outage, which may have been a restart that forgot
them). A bridge that stops lets its alerts lapse within the validity rather than leave them
firing for ever. On a partition assignment the set is rebuilt by reading the partition from
its beginning up to the group's committed offset (posting nothing); it is what lets a new or
restarted bridge refresh alerts fired long ago, and end them with the labels they were fired
with when their RESOLVED record comes.

It serves its own ``/metrics`` and ``/healthz`` (``BridgeStatus``) on
``VIGIL_ALERT_BRIDGE_HOST`` / ``VIGIL_ALERT_BRIDGE_PORT`` (127.0.0.1:6069; port 0: no server).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from streams.contracts.codec import AvroCodec, DecodeError, RegistryUnavailable
from streams.contracts.models.enums import AlertStatus
from streams.contracts.models.outputs import Alert
from streams.core.alertmanager import (
    Firing,
    firing,
    refresh_ends_at,
    resolved_ends_at,
    with_resolution,
)
from streams.durations import parse_duration
from streams.kafka.topics import Topics
from streams.read.status_http import listen_address, serve
from streams.settings import Settings, SettingsError, _env

log = logging.getLogger("vigil.alert_bridge")

#: alerts per POST (Alertmanager takes a list; this keeps one request's body modest)
POST_CHUNK = 500
#: resolved alert ids remembered per partition, to ignore a FIRING record published again
#: after its RESOLVED one (a worker may publish the same record twice after a restart)
ENDED_MEMORY = 100_000
#: where /metrics and /healthz are served when VIGIL_ALERT_BRIDGE_PORT is not set
DEFAULT_STATUS_PORT = 6069
#: seconds of failed posts (no answer, or an answer other than 2xx) and no accepted one after
#: which /healthz answers 503: past Alertmanager restarts, short of the alerts' validity
FAILING_AFTER = 120.0


def status_address(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Where the bridge serves /metrics and /healthz: the arguments, else
    VIGIL_ALERT_BRIDGE_HOST and VIGIL_ALERT_BRIDGE_PORT, else 127.0.0.1:6069 (port 0: none)."""
    return listen_address(
        "VIGIL_ALERT_BRIDGE_HOST", "VIGIL_ALERT_BRIDGE_PORT", DEFAULT_STATUS_PORT, host, port
    )


def status_class(code: int | None) -> str:
    """A post's outcome as a label: ``2xx``, ``4xx``, ``5xx`` (any other code by its first
    digit) or ``unreachable`` (no HTTP answer)."""
    return "unreachable" if code is None else f"{code // 100}xx"


class BridgeStatus:
    """The bridge's metrics and health, written by its loop and read by the HTTP thread.

    Healthy while the consumer holds an assignment (an empty one too: a replica with no
    partition is a standby, not a fault) and Alertmanager has not failed every post for
    ``failing_after`` seconds. Nothing to post is no evidence either way: an idle bridge in
    front of a stopped Alertmanager stays healthy until it has something to say."""

    def __init__(self, failing_after: float = FAILING_AFTER) -> None:
        from streams.read.metrics import register_process_collectors

        self.failing_after = failing_after
        self.registry = CollectorRegistry()
        register_process_collectors(self.registry)
        self.alerts_read = Counter(
            "vigil_alert_bridge_alerts_read",
            "Records read from the alerts topic (rebuilds after an assignment not included)",
            registry=self.registry,
        )
        self.posts_accepted = Counter(
            "vigil_alert_bridge_posts_accepted",
            "Posts to Alertmanager's /api/v2/alerts it answered with 2xx",
            registry=self.registry,
        )
        self.posts_failed = Counter(
            "vigil_alert_bridge_posts_failed",
            "Posts to Alertmanager not accepted, by status class (4xx, 5xx, unreachable): "
            "retried, except a 400 (logged and skipped)",
            ["status"],
            registry=self.registry,
        )
        self.retries = Counter(
            "vigil_alert_bridge_retries",
            "Posts of a batch tried again after Alertmanager did not accept them",
            registry=self.registry,
        )
        self.commits = Counter(
            "vigil_alert_bridge_commits",
            "Offset commits of the alerts topic after Alertmanager accepted their batch",
            registry=self.registry,
        )
        self.commit_failures = Counter(
            "vigil_alert_bridge_commit_failures",
            "Commits that failed (a rebalance: the batch is posted again, harmlessly)",
            registry=self.registry,
        )
        self.firing = Gauge(
            "vigil_alert_bridge_alerts_firing",
            "Alerts fired and not resolved that the bridge holds and posts again every refresh",
            registry=self.registry,
        )
        self.last_accepted = Gauge(
            "vigil_alert_bridge_last_accepted_timestamp_seconds",
            "Unix time of the last post Alertmanager accepted (0 before the first)",
            registry=self.registry,
        )
        self.assigned = Gauge(
            "vigil_alert_bridge_partitions_assigned",
            "Partitions of the alerts topic assigned to this bridge",
            registry=self.registry,
        )
        self.joined = False
        self.failing_since: float | None = (
            None  # monotonic, first post failed since the last accepted
        )

    def answered(self, code: int | None, now: float | None = None) -> None:
        """One request to post alerts came back with ``code`` (None: no answer)."""
        now = time.monotonic() if now is None else now
        if code is not None and 200 <= code < 300:
            self.posts_accepted.inc()
            self.last_accepted.set(time.time())
            self.failing_since = None
        else:
            self.posts_failed.labels(status_class(code)).inc()
            if self.failing_since is None:
                self.failing_since = now

    def assignment(self, partitions: int | None) -> None:
        """The consumer's partitions after a rebalance (None: revoked, not yet reassigned)."""
        self.joined = partitions is not None
        self.assigned.set(partitions or 0)

    def healthy(self, now: float | None = None) -> tuple[bool, str]:
        now = time.monotonic() if now is None else now
        if not self.joined:
            return False, "the consumer holds no assignment of the alerts topic"
        if self.failing_since is not None:
            failing = now - self.failing_since
            if failing > self.failing_after:
                return False, f"Alertmanager has accepted no post for {failing:.0f} s"
            return True, f"posts failing for {failing:.0f} s"
        return True, "Alertmanager accepts the posts"


@dataclass(frozen=True)
class BridgeSettings:
    #: VIGIL_ALERTMANAGER_URL — Alertmanager's base URL (the bridge posts to /api/v2/alerts)
    alertmanager_url: str = "http://127.0.0.1:9093"
    #: VIGIL_CONSOLE_URL — the console's address, for each alert's generatorURL (its page)
    console_url: str = "http://127.0.0.1:6080"
    #: VIGIL_ALERT_BRIDGE_REFRESH — how often every firing alert is posted again
    refresh: timedelta = timedelta(minutes=1)
    #: VIGIL_ALERT_BRIDGE_VALIDITY — each post's endsAt lies this far ahead (more than refresh)
    validity: timedelta = timedelta(minutes=5)
    #: VIGIL_ALERT_BRIDGE_EVENT_TTL — how long a FORBIDDEN_RETRY or ANOMALY alert written before
    #: vigil ended those kinds (no ``ends_with_resolved``: no RESOLVED record will come) stays
    #: active after the bridge first saw it; every other alert lasts until its RESOLVED record
    event_ttl: timedelta = timedelta(hours=1)
    #: VIGIL_ALERT_BRIDGE_RETRY_MAX — the longest pause between attempts while Alertmanager is down
    retry_max: timedelta = timedelta(seconds=30)
    #: HTTP timeout of one request to Alertmanager
    timeout: float = field(default=10.0)

    @classmethod
    def from_env(cls, **overrides: Any) -> BridgeSettings:
        def duration(name: str, default: str) -> timedelta:
            text = _env(name, default) or default
            try:
                return parse_duration(text)
            except ValueError as exc:
                raise SettingsError(f"{name}: {exc}") from exc

        s = cls(
            alertmanager_url=_env("VIGIL_ALERTMANAGER_URL", cls.alertmanager_url)
            or cls.alertmanager_url,
            console_url=_env("VIGIL_CONSOLE_URL", cls.console_url) or cls.console_url,
            refresh=duration("VIGIL_ALERT_BRIDGE_REFRESH", "1m"),
            validity=duration("VIGIL_ALERT_BRIDGE_VALIDITY", "5m"),
            event_ttl=duration("VIGIL_ALERT_BRIDGE_EVENT_TTL", "1h"),
            retry_max=duration("VIGIL_ALERT_BRIDGE_RETRY_MAX", "30s"),
        )
        s = replace(s, **{k: v for k, v in overrides.items() if v is not None})
        if s.validity <= s.refresh:
            raise SettingsError(
                f"VIGIL_ALERT_BRIDGE_VALIDITY ({s.validity}) must exceed "
                f"VIGIL_ALERT_BRIDGE_REFRESH ({s.refresh}): alerts would lapse between posts"
            )
        return s


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A RESOLVED record whose FIRING alert the bridge does not hold (fired before the
    topic's retention, or never seen): Alertmanager is asked for alerts with its id."""

    alert_id: str
    ends_at: datetime
    resolved: Alert


class AlertBook:
    """The alerts fired and not yet resolved, by partition of the alerts topic (a revoked
    partition's alerts are another bridge's to refresh)."""

    def __init__(self, settings: BridgeSettings) -> None:
        self.settings = settings
        self.active: dict[str, tuple[int, Firing]] = {}
        self.ended: dict[int, OrderedDict[str, None]] = {}

    def apply(
        self, alert: Alert, partition: int, now: datetime
    ) -> dict[str, Any] | Unmatched | None:
        """Take one record into the book; what to post for it (None: nothing)."""
        s = self.settings
        ended = self.ended.setdefault(partition, OrderedDict())
        if alert.status is AlertStatus.FIRING:
            if alert.alert_id in ended:
                return None
            known = self.active.get(alert.alert_id)
            f = (
                known[1]
                if known is not None
                else firing(alert, console_url=s.console_url, seen_at=now, event_ttl=s.event_ttl)
            )
            self.active[alert.alert_id] = (partition, f)
            return f.payload(refresh_ends_at(f, now, s.validity))
        if alert.status is AlertStatus.RESOLVED and alert.resolves_alert_id:
            target = alert.resolves_alert_id
            ended[target] = None
            while len(ended) > ENDED_MEMORY:
                ended.popitem(last=False)
            entry = self.active.pop(target, None)
            if entry is None:
                return Unmatched(target, min(alert.occurred_at, now), alert)
            f = with_resolution(entry[1], alert)
            return f.payload(resolved_ends_at(f, alert, now))
        return None

    def due(self, now: datetime) -> list[dict[str, Any]]:
        """Every active alert to post again; alerts that lapse (``Firing.expires_at``) leave once
        past it."""
        out = []
        for alert_id, (_, f) in list(self.active.items()):
            if f.expires_at is not None and f.expires_at <= now:
                del self.active[alert_id]
                continue
            out.append(f.payload(refresh_ends_at(f, now, self.settings.validity)))
        return out

    def drop(self, partitions: Iterable[int]) -> None:
        gone = set(partitions)
        for alert_id in [a for a, (p, _) in self.active.items() if p in gone]:
            del self.active[alert_id]
        for p in gone:
            self.ended.pop(p, None)


class AlertmanagerDown(Exception):
    """No answer, or an answer a retry may change (5xx, 404, 429...)."""


class AlertmanagerRefused(Exception):
    """400: Alertmanager refuses the payload itself."""


class Alertmanager:
    """The two calls of Alertmanager's v2 API the bridge needs."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        answered: Callable[[int | None], None] = lambda code: None,
    ) -> None:
        self.base = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout)
        self.answered = answered  # told each post's status code (None: no answer)

    def post(self, alerts: list[dict[str, Any]]) -> None:
        for i in range(0, len(alerts), POST_CHUNK):
            try:
                r = self.http.post(f"{self.base}/api/v2/alerts", json=alerts[i : i + POST_CHUNK])
            except httpx.HTTPError as exc:
                self.answered(None)
                raise AlertmanagerDown(f"{type(exc).__name__}: {exc}") from exc
            self.answered(r.status_code)
            if r.status_code == 400:
                raise AlertmanagerRefused(r.text[:500])
            if not 200 <= r.status_code < 300:
                raise AlertmanagerDown(f"HTTP {r.status_code}: {r.text[:200]}")

    def find(self, alert_id: str) -> list[dict[str, Any]]:
        """Alertmanager's alerts labelled ``alert_id``."""
        try:
            r = self.http.get(
                f"{self.base}/api/v2/alerts", params={"filter": f'alert_id="{alert_id}"'}
            )
        except httpx.HTTPError as exc:
            raise AlertmanagerDown(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise AlertmanagerDown(f"HTTP {r.status_code}: {r.text[:200]}")
        return list(r.json())

    def close(self) -> None:
        self.http.close()


def _ended_copy(found: dict[str, Any], u: Unmatched) -> dict[str, Any]:
    starts = found.get("startsAt") or u.ends_at.isoformat()
    ends = max(datetime.fromisoformat(starts.replace("Z", "+00:00")), u.ends_at)
    return {
        "labels": found["labels"],
        "annotations": {**found.get("annotations", {}), "resolution": u.resolved.next_step},
        "startsAt": starts,
        "endsAt": ends.isoformat().replace("+00:00", "Z"),
        "generatorURL": found.get("generatorURL", ""),
    }


class AlertBridge:
    """The consume → post → commit loop."""

    def __init__(
        self,
        settings: Settings,
        bridge: BridgeSettings,
        codec: AvroCodec,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        status: BridgeStatus | None = None,
    ) -> None:
        self.settings = settings
        self.bridge = bridge
        self.codec = codec
        self.clock = clock
        self.topic = Topics.from_settings(settings).alerts.name
        self.group_id = f"{settings.app_id}-alert-bridge"
        self.book = AlertBook(bridge)
        self.status = status or BridgeStatus()
        self.status.firing.set_function(lambda: len(self.book.active))
        self.am = Alertmanager(bridge.alertmanager_url, bridge.timeout, self.status.answered)
        self.stop = threading.Event()
        self._refresh_at = 0.0
        self.consumer = Consumer(
            settings.confluent_conf()
            | {
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                # a long Alertmanager outage holds the loop in its retries, not in a poll
                "max.poll.interval.ms": 900_000,
            }
        )

    # ------------------------------------------------------------------ decoding

    def _decode(self, msg: Any) -> Alert | None:
        delay = 0.5
        while True:
            try:
                rec = self.codec.decode(msg.topic(), msg.value(), (Alert,))
                return rec if isinstance(rec, Alert) else None
            except DecodeError as exc:
                log.error("skipping %s/%d@%d: %s", msg.topic(), msg.partition(), msg.offset(), exc)
                return None
            except RegistryUnavailable as exc:
                log.warning("schema registry unavailable (%s); retrying in %.1fs", exc, delay)
                if self.stop.wait(delay):
                    raise
                delay = min(delay * 2, self.bridge.retry_max.total_seconds())

    # ------------------------------------------------------------------ rebuild

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.status.assignment(len(partitions))
        committed = consumer.committed(partitions, timeout=30)
        upto = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
        started = time.monotonic()
        seen = self._rebuild(upto) if upto else 0
        log.info(
            "assigned %s; rebuilt %d firing alerts from %d records in %.1fs",
            sorted(tp.partition for tp in partitions),
            len(self.book.active),
            seen,
            time.monotonic() - started,
        )
        self._refresh_at = 0.0  # post the rebuilt alerts at once (Alertmanager may lack them)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.book.drop(tp.partition for tp in partitions)
        self.status.assignment(None)

    def _rebuild(self, upto: dict[int, int]) -> int:
        """Read each partition from its beginning to the committed offset into the book."""
        reader = Consumer(
            self.settings.confluent_conf()
            | {"group.id": f"{self.group_id}-rebuild", "enable.auto.commit": False}
        )
        try:
            remaining = {}
            for p, end in upto.items():
                low, _ = reader.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
                if end > low:
                    remaining[p] = end
            reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in remaining])
            seen = 0
            while remaining and not self.stop.is_set():
                for msg in reader.consume(500, 1.0):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(msg.error())
                        continue
                    p = msg.partition()
                    if p not in remaining or msg.offset() >= remaining[p]:
                        continue
                    seen += 1
                    alert = self._decode(msg)
                    if alert is not None:
                        self.book.apply(alert, p, alert.occurred_at)
                    if msg.offset() + 1 >= remaining[p]:
                        del remaining[p]
            return seen
        finally:
            reader.close()

    # ------------------------------------------------------------------ delivery

    def _deliver(self, alerts: list[dict[str, Any]]) -> bool:
        """Post until Alertmanager accepts (True) or the bridge is stopped (False)."""
        delay, failures = 0.5, 0
        while not self.stop.is_set():
            try:
                self.am.post(alerts)
            except AlertmanagerRefused as exc:
                log.error("Alertmanager refused %d alerts (skipped): %s", len(alerts), exc)
                return True
            except AlertmanagerDown as exc:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning(
                        "Alertmanager %s unavailable (%s), attempt %d; retrying in %.1fs",
                        self.am.base,
                        exc,
                        failures,
                        delay,
                    )
                if self.stop.wait(delay):
                    break
                self.status.retries.inc()
                delay = min(delay * 2, self.bridge.retry_max.total_seconds())
                continue
            if failures:
                log.info("Alertmanager back after %d failed attempts", failures)
                self._refresh_at = 0.0  # it may have restarted and forgotten every alert
            return True
        return False

    def _resolve_unmatched(self, unmatched: list[Unmatched]) -> list[dict[str, Any]]:
        out = []
        for u in unmatched:
            while not self.stop.is_set():
                try:
                    found = self.am.find(u.alert_id)
                    break
                except AlertmanagerDown as exc:
                    log.warning("Alertmanager unavailable (%s); retrying", exc)
                    self.stop.wait(1.0)
            else:
                return out
            out.extend(_ended_copy(a, u) for a in found)
        return out

    def _refresh(self) -> None:
        alerts = self.book.due(self.clock())
        next_in = self.bridge.refresh.total_seconds()
        if alerts:
            try:
                self.am.post(alerts)
            except (AlertmanagerDown, AlertmanagerRefused) as exc:
                log.warning("refresh of %d alerts failed: %s", len(alerts), exc)
                next_in = min(next_in, 2.0)
        self._refresh_at = time.monotonic() + next_in

    def step(self, timeout: float = 0.5) -> int:
        """One batch: read, post, commit. The number of records read."""
        msgs = self.consumer.consume(POST_CHUNK, timeout)
        last: dict[int, int] = {}
        posts: dict[str, dict[str, Any]] = {}
        unmatched: list[Unmatched] = []
        now = self.clock()
        for msg in msgs:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer: %s", msg.error())
                continue
            last[msg.partition()] = msg.offset()
            self.status.alerts_read.inc()
            alert = self._decode(msg)
            if alert is None:
                continue
            what = self.book.apply(alert, msg.partition(), now)
            if isinstance(what, Unmatched):
                unmatched.append(what)
            elif what is not None:
                # one post per alert and batch, its last state: a FIRING and its RESOLVED in
                # the same batch reach Alertmanager as one ended alert, never as a page
                posts[what["labels"]["alert_id"]] = what
        payload = list(posts.values())
        if unmatched:
            payload += self._resolve_unmatched(unmatched)
        if payload and not self._deliver(payload):
            return len(msgs)  # stopped: nothing committed, the records are read again
        if last:
            offsets = [TopicPartition(self.topic, p, o + 1) for p, o in last.items()]
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
                self.status.commits.inc()
            except KafkaException as exc:  # a rebalance: the records come again, harmlessly
                self.status.commit_failures.inc()
                log.warning("commit failed (%s); the batch will be posted again", exc)
        if time.monotonic() >= self._refresh_at:
            self._refresh()
        return len(msgs)

    def run(self) -> None:
        log.info(
            "alert-bridge: %s (group %s) → %s/api/v2/alerts",
            self.topic,
            self.group_id,
            self.am.base,
        )
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not self.stop.is_set():
                self.step()
        finally:
            self.consumer.close()
            self.am.close()


def run_alert_bridge(
    settings: Settings,
    bridge: BridgeSettings,
    codec: AvroCodec,
    status_at: tuple[str, int] | None = None,
) -> None:
    """Run until SIGTERM or SIGINT. ``status_at``: where to serve /metrics and /healthz
    (None: ``status_address()``; port 0: nowhere)."""
    b = AlertBridge(settings, bridge, codec)
    host, port = status_at or status_address()
    server = None
    if port:
        try:
            server = serve(
                b.status.registry,
                b.status.healthy,
                host,
                port,
                unhealthy_word="FAILING",
                thread_name="alert-bridge-http",
            )
            log.info("alert-bridge metrics and health on http://%s:%s", host, port)
        except OSError as exc:  # the alerts matter more than the bridge's metrics: run anyway
            log.error("cannot serve the bridge's metrics and health on %s:%s: %s", host, port, exc)

    def _stop(*_: object) -> None:
        b.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        b.run()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
