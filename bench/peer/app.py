"""Peer: the operations part of vigil's job, written plainly with Quix Streams 3.28.

Reads the operation-events input topic (Confluent-framed Avro: 5-byte header, writer schema by
id from the registry, fastavro schemaless), keeps per-execution operation state in Quix's
RocksDB state (keyed by the message key = execution id, changelogged by Quix), and in event
time (stream time = max record timestamp seen on the partition; ClockTick records advance it
too) marks an attempt UNKNOWN when its reply deadline passes (and flags ACKNOWLEDGED attempts
whose verification is overdue). Publishes every operation state change (JSON) to one topic and
a reconciliation work item (and its resolution once the source settles it) to another.

Env: KAFKA_BOOTSTRAP_SERVERS, SCHEMA_REGISTRY_URL, PEER_INPUT, PEER_STATE_TOPIC,
PEER_WORK_TOPIC, PEER_GROUP, PEER_STATE_DIR, PEER_PARTITIONS.
"""

from __future__ import annotations

import heapq
import io
import json
import os
import struct
import sys
import time
import urllib.request

from fastavro import parse_schema, schemaless_reader
from quixstreams import Application, message_context
from quixstreams.models import Deserializer, TopicConfig

REPLY_TIMEOUT_MS = 30_000  # vigil's default reply timeout (VIGIL_REPLY_TIMEOUT)
VERIFY_TIMEOUT_MS = 300_000  # vigil's default verification timeout
RETRY = {
    "PREPARED": "NOTHING_SENT",
    "SENT": "WAIT",
    "ACKNOWLEDGED": "WAIT",
    "RECONCILING": "WAIT",
    "VERIFIED": "NOT_NEEDED",
    "UNKNOWN": "FORBIDDEN",
    "FAILED": "SAFE",
    "CANCELLED": "SAFE",
    "MANUAL_REVIEW": "OWNER_DECIDES",
}
SOURCE = {"CONNECTOR", "RECONCILER", "HUMAN"}
SETTLES_UNKNOWN = {"VERIFIED", "FAILED", "MANUAL_REVIEW", "RECONCILING"}
OPEN_BEFORE_REPLY = {None, "PREPARED", "SENT"}


class ConfluentAvro(Deserializer):
    """Confluent wire format → dict (+ '_t': the writer schema's record name)."""

    def __init__(self, registry: str) -> None:
        super().__init__()
        self.registry = registry.rstrip("/")
        self.schemas: dict[int, tuple[object, str]] = {}

    def _schema(self, sid: int) -> tuple[object, str]:
        with urllib.request.urlopen(f"{self.registry}/schemas/ids/{sid}") as r:
            raw = json.loads(json.loads(r.read())["schema"])
        got = self.schemas[sid] = (parse_schema(raw), raw["name"])
        return got

    def __call__(self, value: bytes, ctx: object) -> dict:
        if value[0] != 0:
            raise ValueError("not Confluent-framed")
        (sid,) = struct.unpack_from(">I", value, 1)
        schema, name = self.schemas.get(sid) or self._schema(sid)
        rec = schemaless_reader(io.BytesIO(value[5:]), schema, None)
        rec["_t"] = name
        return rec


def ms(dt) -> int | None:  # fastavro gives timestamp-millis as aware datetimes
    return None if dt is None else int(dt.timestamp() * 1000)


def main() -> None:
    env = os.environ
    app = Application(
        broker_address=env["KAFKA_BOOTSTRAP_SERVERS"],
        consumer_group=env["PEER_GROUP"],
        auto_offset_reset="earliest",
        state_dir=env["PEER_STATE_DIR"],
        loglevel="INFO",
    )
    parts = int(env.get("PEER_PARTITIONS", "6"))
    cfg = TopicConfig(num_partitions=parts, replication_factor=1)
    src = app.topic(
        env["PEER_INPUT"],
        key_deserializer="str",
        value_deserializer=ConfluentAvro(env["SCHEMA_REGISTRY_URL"]),
    )
    out_state = app.topic(
        env["PEER_STATE_TOPIC"], key_serializer="str", value_serializer="json", config=cfg
    )
    out_work = app.topic(
        env["PEER_WORK_TOPIC"], key_serializer="str", value_serializer="json", config=cfg
    )

    sdf = app.dataframe(src)
    # per partition: stream time, and a heap of armed deadlines (due_ms, n, exec, op, attempt, kind)
    clock: dict[int, int] = {}
    heaps: dict[int, list] = {}
    seq = [0]

    def publish(ex: str, op: str, a: str, r: dict) -> dict:
        return {
            "_k": "s",
            "operation_id": op,
            "execution_id": ex,
            "attempt": int(a),
            "status": r["status"],
            "retry": RETRY[r["status"]],
            "reason": r.get("reason"),
            "since": r["since"],
            "reply_due_at": r.get("reply_due"),
            "verify_due_at": r.get("verify_due"),
            "connector": r["connector"],
            "idempotency_key": r["idem"],
            "effect_ref": r.get("effect_ref"),
            "open_work_item_id": r.get("work"),
        }

    def work_item(ex: str, op: str, a: str, r: dict, kind: str, due: int) -> dict:
        wid = f"{op}:{a}:{kind}"
        r["work"] = wid
        return {
            "_k": "w",
            "work_item_id": wid,
            "operation_id": op,
            "execution_id": ex,
            "attempt": int(a),
            "idempotency_key": r["idem"],
            "connector": r["connector"],
            "kind": kind,
            "deadline": due,
            "created_at": due,
        }

    def arm(p: int, due: int, ex: str, op: str, a: str, kind: str) -> None:
        seq[0] += 1
        heapq.heappush(heaps.setdefault(p, []), (due, seq[0], ex, op, a, kind))

    def fire(p: int, now: int, tx, out: list) -> None:
        """Every armed deadline strictly before stream time ``now``, in due order."""
        heap = heaps.get(p)
        while heap and heap[0][0] < now:
            due, _, ex, op, a, kind = heapq.heappop(heap)
            st = tx.as_state(prefix=ex)  # the state of that execution (another key)
            ops = st.get("ops")
            r = ops and ops.get(op, {}).get(a)
            if r is None:
                continue
            if kind == "REPLY_TIMEOUT" and r["status"] == "SENT" and r.get("reply_due") == due:
                r["status"], r["since"], r["reason"] = "UNKNOWN", due, "reply_timeout"
            elif (
                kind == "VERIFICATION_TIMEOUT"
                and r["status"] == "ACKNOWLEDGED"
                and r.get("verify_due") == due
            ):
                r["reason"] = "verification_timeout"
            else:
                continue  # settled before its deadline
            out.append(work_item(ex, op, a, r, kind, due))
            out.append(publish(ex, op, a, r))
            st.set("ops", ops)

    def process(value: dict, key, ts: int, _headers, state) -> list:
        p = message_context().partition
        out: list = []
        if ts > clock.get(p, -1):
            clock[p] = ts
            fire(p, ts, state._transaction, out)  # the partition's transaction
        if value["_t"] != "OperationEvent":
            return out  # a clock tick: it only moves time
        ex, op, a, kind = (
            value["execution_id"],
            value["operation_id"],
            str(value["attempt"]),
            value["kind"],
        )
        ops = state.get("ops") or {}
        attempts = ops.setdefault(op, {})
        r = attempts.get(a)
        if r is None:
            r = attempts[a] = {
                "status": None,
                "kinds": [],
                "connector": value["connector"],
                "idem": value.get("idempotency_key"),
            }
        if kind in r["kinds"]:
            return out  # duplicate
        status = r["status"]
        new = None
        if kind == "SENT":
            if status in (None, "PREPARED"):
                new = "SENT"
                r["reply_due"] = ms(value.get("reply_due_at")) or ts + REPLY_TIMEOUT_MS
                arm(p, r["reply_due"], ex, op, a, "REPLY_TIMEOUT")
        elif kind == "ACKNOWLEDGED":
            if status in OPEN_BEFORE_REPLY:  # after UNKNOWN a late ack settles nothing
                new = "ACKNOWLEDGED"
                r["verify_due"] = ts + VERIFY_TIMEOUT_MS
                arm(p, r["verify_due"], ex, op, a, "VERIFICATION_TIMEOUT")
        elif status == "UNKNOWN":
            if kind in SETTLES_UNKNOWN and value["evidence_source"] in SOURCE:
                new = kind
        elif status not in ("VERIFIED", "FAILED", "CANCELLED"):
            new = kind
        r["kinds"].append(kind)
        if new is not None:
            r["status"], r["since"], r["reason"] = new, ts, None
            if value.get("effect_ref"):
                r["effect_ref"] = value["effect_ref"]
            if r.get("work") and new in SETTLES_UNKNOWN - {"RECONCILING"}:
                out.append(
                    {
                        "_k": "w",
                        "resolution_of": r["work"],
                        "operation_id": op,
                        "execution_id": ex,
                        "attempt": int(a),
                        "status": new,
                        "at": ts,
                    }
                )
                r["work"] = None
            out.append(publish(ex, op, a, r))
        state.set("ops", ops)
        return out

    sdf = sdf.apply(process, stateful=True, expand=True, metadata=True)
    states = sdf[sdf.apply(lambda v: v["_k"] == "s")]
    states.to_topic(out_state, key=lambda v: v["operation_id"])
    works = sdf[sdf.apply(lambda v: v["_k"] == "w")]
    works.to_topic(out_work, key=lambda v: v["operation_id"])
    print(f"PEER_RUN {time.time():.3f}", flush=True)
    app.run()


if __name__ == "__main__":
    sys.exit(main())
