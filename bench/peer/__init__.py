"""The peer section: vigil's worker against a plain Quix Streams app on the same log.

``app.py`` beside this module is the peer: the operations part of vigil's job written plainly
with Quix Streams (per-execution state in its RocksDB store, a deadline heap, JSON out), the
app a team would write instead of adopting vigil. It does much less (no alerts, no
forbidden-retry detection, no watermark across topics, no anomalies or dead letters, plain
at-least-once, deadlines armed before a restart never fire): a ratio against it is the price
of those, not a like-for-like comparison.

``section`` (``python -m bench.run --sections peer``):

1. the peer's own virtual environment (``bench/peer/.venv``, quixstreams pinned), made on
   first use;
2. per round, a fresh deployment and the operations-only log: the throughput section's mix
   (same seed, spacing and step), keeping only its OperationEvent records, with the same tick
   rounds on all four input topics (vigil's watermark needs every input topic's clock; the
   peer reads operation-events, its ticks included), pre-produced;
3. the systems one after the other on that log, their order alternating from round to round
   (vigil first in odd rounds): vigil's worker, timed as the throughput section times it
   (its Ready log line to the LogAppendTime of its last output), its outputs checked record
   for record against what the pure ``Processor`` publishes for the same records; the peer,
   timed from its "started" log line to the LogAppendTime of its last output, its UNKNOWN set
   and final statuses checked against vigil's; with ``--peer-against TREE``, also the worker
   of another checkout (its own code on this harness's deployment, so a checkout with the
   same schemas: another commit of the same contracts), checked like vigil's;
4. events/s, CPU-µs per event (the process's user + system time over the run, by event;
   ticks are not events), and the median over the rounds of each system's events/s and of
   the ratio of vigil's to the peer's within each round;
5. in every round, also vigil's per-record path without the worker's shell: a single-process
   ``vigil replay`` of the same log (``replay_once``: the same Processor and claims join, a
   confluent-kafka consumer, no Faust, no changelog, no commits), timed from inside, its
   outputs checked against the pure Processor's like the worker's. What it reaches bounds
   what any rewrite of the worker's shell alone (its consumer, batches, state store) can give;
6. with ``--peer-floor``, also the floor on the same log: vigil's worker with its core
   replaced by a lookup of the pure Processor's outputs (``floor_run``), which bounds what any
   rewrite of the core alone can give to this shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench import harness as h
from bench import sections as sec
from bench.workload import plan, tick_times
from streams.settings import Settings

HERE = Path(__file__).resolve().parent
APP = HERE / "app.py"
VENV = HERE / ".venv"
#: The peer's pinned dependency: the version it was written and measured with.
QUIXSTREAMS = "quixstreams==3.28.1"
#: The line Quix logs once the app has subscribed and entered its poll loop.
PEER_READY = "The application started and is now processing incoming messages"

Log = sec.Log


def ensure_venv(log: Log, venv: Path = VENV) -> Path:
    """The peer's interpreter, in a virtual environment of its own with quixstreams
    installed (made on first use: about a minute)."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import quixstreams, fastavro"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    log(f"  installing the peer's virtual environment ({QUIXSTREAMS}) in {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", QUIXSTREAMS, "fastavro"], check=True
    )
    subprocess.run(probe, check=True)
    return python


def ops_plan(executions: int) -> tuple[list[Any], list[Any]]:
    """The full mix's plan (as the throughput section makes it) and its OperationEvents."""
    span_s = executions * sec.BACKFILL_SPACING.total_seconds() + 60
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=span_s + 3 * 3600)
    full = plan(
        executions, start=start, spacing=sec.BACKFILL_SPACING, step=sec.BACKFILL_STEP, seed=8
    )
    return full, [p for p in full if p.record.avro_name == "OperationEvent"]


def ops_wires(dep: h.Deployment, full: list[Any], ops: list[Any]) -> list[h.Wire]:
    """The OperationEvents on ``dep``'s topics with the full mix's tick rounds."""
    first, last = full[0].at_ms, full[-1].at_ms
    return h.encode(
        dep,
        ops,
        tick_times(first, last, sec.BACKFILL_TICK_MS),
        [last + d for d in sec.FINAL_TICK_AFTER],
    )


def expected_values(dep: h.Deployment, ops: list[Any], wires: list[h.Wire]) -> Counter[Any]:
    """What the pure Processor publishes for the log, on the topics whose records do not
    depend on how the input topics interleave (``sections._deterministic``), as the bytes a
    worker sends: (topic, value) counted."""
    proc = sec._processor(dep.settings, dep)
    det = set(sec._deterministic(dep, {t: 1 for t in dep.outputs}))
    out: Counter[Any] = Counter()
    for env in sec.envelopes(dep, ops, wires):
        for em in proc.handle(env):
            if em.topic in det:
                out[(em.topic, dep.codec.encode(em.topic, em.record))] += 1
    return out


def end_offsets(settings: Settings, topics: list[str]) -> dict[tuple[str, int], int]:
    c = Consumer(settings.confluent_conf() | {"group.id": f"bench-ends-{uuid.uuid4().hex[:6]}"})
    try:
        meta = c.list_topics(timeout=10)
        return {
            (t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
            for t in topics
            for p in meta.topics[t].partitions
        }
    finally:
        c.close()


def wait_committed(settings: Settings, group: str, ends: dict[Any, int], timeout: float) -> Any:
    """When ``group``'s committed offsets reached ``ends`` (time.time()), or None."""
    c = Consumer(settings.confluent_conf() | {"group.id": group, "enable.auto.commit": False})
    tps = [TopicPartition(t, p) for (t, p), end in ends.items() if end > 0]
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = c.committed(tps, timeout=10)
            if all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in got):
                return time.time()
            time.sleep(0.2)
        return None
    finally:
        c.close()


def _span(outs: list[h.OutRecord], start: float) -> tuple[float, float]:
    return (
        min(o.append_ms for o in outs) / 1000 - start,
        max(o.append_ms for o in outs) / 1000 - start,
    )


def vigil_run(
    base: Settings,
    dep: h.Deployment,
    n_events: int,
    expected: Counter[Any],
    log: Log,
    name: str = "vigil",
    tree: Path | None = None,
    env: dict[str, str] | None = None,
    profile_var: str = "VIGIL_BENCH_PEER_PROFILE",
) -> dict[str, Any]:
    """One vigil worker (of this checkout, or of ``tree``) over the deployment's log; ``env``
    adds to the worker's environment. The variable ``profile_var`` names a file for py-spy's
    raw stacks of this checkout's worker (none for another tree's)."""
    ends = end_offsets(base, dep.inputs)
    off = h.Offsets(base, dep.outputs)
    det_counts: Counter[str] = Counter()
    for (topic, _), n in expected.items():
        det_counts[topic] += n
    if tree is not None:
        env = {**(env or {}), "PYTHONPATH": str(tree)}
    profile = os.environ.get(profile_var) if tree is None else None
    with h.workers(dep, 1, env=env) as procs:
        start = procs[0].ready_at
        spy = sec._py_spy(procs[0].pid, Path(profile)) if profile else None
        cpu0 = h.cpu_seconds(procs[0].pid)
        _, met = h.wait_outputs(off, dict(det_counts), timeout=900)
        cpu1 = h.cpu_seconds(procs[0].pid)
        if spy is not None:
            sec._stop_py_spy(spy)
        committed = wait_committed(base, dep.settings.app_id, ends, 120)
    off.close()
    outs = h.read_all(base, dep.outputs)
    first, last = _span(outs, start)
    got = Counter((o.topic, o.value) for o in outs if o.topic in det_counts)
    r = {
        "system": name,
        "tree": str(tree) if tree is not None else "this checkout",
        "elapsed_s": last,
        "events_per_s": n_events / last,
        "first_output_after_s": first,
        "committed_end_s": None if committed is None else committed - start,
        "cpu_s": cpu1 - cpu0,
        "cpu_us_per_event": (cpu1 - cpu0) / n_events * 1e6,
        "outputs": dict(Counter(o.topic.rsplit(".", 1)[-1] for o in outs)),
        "expectation_met": met,
        # every output on the deterministic topics is what the pure Processor publishes
        # (the bytes), as many times, and nothing else
        "outputs_equal_processor": got == expected,
        "outputs_missing": sum((expected - got).values()),
        "outputs_extra": sum((got - expected).values()),
        "_outs": outs,
    }
    log(
        f"  {name}: {n_events:,} events in {last:.1f}s = {r['events_per_s']:,.0f} events/s, "
        f"{r['cpu_us_per_event']:.1f} CPU-µs per event; outputs equal to the pure Processor's: "
        f"{r['outputs_equal_processor']} (missing {r['outputs_missing']}, extra "
        f"{r['outputs_extra']})"
    )
    return r


def floor_run(
    base: Settings, dep: h.Deployment, ops: list[Any], wires: list[h.Wire], log: Log
) -> dict[str, Any]:
    """vigil's worker with a free core on the deployment's log: ``Processor.handle`` replaced
    by a lookup of what the pure Processor publishes after each input (``bench/floor_site``),
    that Processor running as the worker's does, with the join across executions on, so the
    claims and progress still go through the claims topic and the worker's claims stage. What
    it reaches bounds any worker with this shell, whatever its core costs."""
    env = sec.floor_env(dep, ops, wires)
    expected = expected_values(dep, ops, wires)
    name = "floor (the shell, core free)"
    return vigil_run(
        base, dep, len(ops), expected, log, name, None, env, "VIGIL_BENCH_FLOOR_PROFILE"
    )


def replay_run(
    dep: h.Deployment,
    n_events: int,
    expected: Counter[Any],
    log: Log,
    name: str = "replay",
    tree: Path | None = None,
) -> dict[str, Any]:
    """vigil's per-record path without the worker's shell: a single-process replay of the
    deployment's log (``replay_once``, of this checkout or of ``tree``) into outputs of its
    own, its outputs checked against the pure Processor's as the worker's are (the Avro
    payloads: the replay's output subjects have schema ids of their own)."""
    suffix = f"-replay-{uuid.uuid4().hex[:6]}"
    env = dep.env() if tree is None else dep.env(PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-m", "bench.peer.replay_once", suffix],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the replay failed: {done.stderr[-3000:]}")
    got_json = json.loads(done.stdout.strip().splitlines()[-1])
    topics = [f"{t}{suffix}" for t in dep.outputs]
    outs = h.read_all(dep.settings, topics)
    want: Counter[Any] = Counter()
    for (topic, value), n in expected.items():
        want[(f"{topic}{suffix}", value[5:])] += n
    got = Counter((o.topic, o.value[5:]) for o in outs if (o.topic, o.value[5:]) in want)
    seen = Counter(o.topic for o in outs)
    want_topics: Counter[str] = Counter()
    for (topic, _), n in want.items():
        want_topics[topic] += n
    admin = AdminClient(dep.settings.confluent_conf())
    for f in admin.delete_topics(topics, operation_timeout=30).values():
        # best effort: the deployment's prefix marks them as the bench's
        with contextlib.suppress(Exception):
            f.result(30)
    r = {
        "system": "vigil replay (one process, no Faust)"
        + (f" at {tree.name}" if tree is not None else ""),
        "elapsed_s": got_json["seconds"],
        "events_per_s": n_events / got_json["seconds"],
        "cpu_s": got_json["cpu_s"],
        "cpu_us_per_event": got_json["cpu_s"] / n_events * 1e6,
        "joined": got_json["joined"],
        "outputs": {t.rsplit(".", 1)[-1]: n for t, n in seen.items()},
        # every output on the deterministic topics is the pure Processor's (the payload), as
        # many times, and nothing else on those topics
        "outputs_equal_processor": got == want
        and all(seen[t] == n for t, n in want_topics.items()),
    }
    log(
        f"  {name}: {n_events:,} events in {r['elapsed_s']:.1f}s = {r['events_per_s']:,.0f} "
        f"events/s, {r['cpu_us_per_event']:.1f} CPU-µs per event; outputs equal to the pure "
        f"Processor's: {r['outputs_equal_processor']}"
    )
    return r


def peer_run(
    base: Settings, dep: h.Deployment, n_events: int, python: Path, log: Log
) -> dict[str, Any]:
    """The peer over the deployment's operation-events topic, its outputs on two topics of
    its own (LogAppendTime, like vigil's)."""
    name = f"peer-{uuid.uuid4().hex[:6]}"
    prefix = dep.settings.topic_prefix
    topic_in = dep.topics.operation_events.name
    state_t, work_t = f"{prefix}.{name}.operation-state", f"{prefix}.{name}.work"
    ends = end_offsets(base, [topic_in])
    admin = AdminClient(base.confluent_conf())
    futures = admin.create_topics(
        [NewTopic(t, dep.settings.partitions, 1) for t in (state_t, work_t)]
    )
    for f in futures.values():
        f.result(30)
    h._log_append_time(base, [state_t, work_t])
    group = f"{dep.settings.app_id}-{name}"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=base.bootstrap_servers,
        SCHEMA_REGISTRY_URL=base.schema_registry_url,
        PEER_INPUT=topic_in,
        PEER_STATE_TOPIC=state_t,
        PEER_WORK_TOPIC=work_t,
        PEER_GROUP=group,
        PEER_STATE_DIR=str(dep.workdir / name / "state"),
        PEER_PARTITIONS=str(dep.settings.partitions),
    )
    (dep.workdir / name).mkdir(parents=True, exist_ok=True)
    log_path = dep.workdir / f"{name}.log"
    with log_path.open("wb") as lf:
        proc = subprocess.Popen(
            [str(python), str(APP)],
            env=env,
            stdout=lf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        launched = time.time()
        while PEER_READY not in log_path.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(log_path.read_text(errors="replace")[-3000:])
            if time.time() - launched > 120:
                raise RuntimeError("the peer did not start within 120 s")
            time.sleep(0.02)
        start = time.time()
        cpu0 = h.cpu_seconds(proc.pid)
        committed = wait_committed(base, group, ends, 900)
        cpu1 = h.cpu_seconds(proc.pid)
        time.sleep(1)  # its last outputs' delivery
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    outs = h.read_all(base, [state_t, work_t])
    first, last = _span(outs, start)
    r = {
        "system": "peer (quixstreams)",
        "startup_s": start - launched,
        "elapsed_s": last,
        "events_per_s": n_events / last,
        "first_output_after_s": first,
        "committed_end_s": None if committed is None else committed - start,
        "cpu_s": cpu1 - cpu0,
        "cpu_us_per_event": (cpu1 - cpu0) / n_events * 1e6,
        "outputs": dict(Counter("state" if o.topic == state_t else "work" for o in outs)),
        "topics": [state_t, work_t],
        "_outs": outs,
    }
    log(
        f"  peer: {n_events:,} events in {last:.1f}s = {r['events_per_s']:,.0f} events/s, "
        f"{r['cpu_us_per_event']:.1f} CPU-µs per event; outputs {r['outputs']}"
    )
    return r


def compare(dep: h.Deployment, vouts: list[h.OutRecord], pouts: list[h.OutRecord]) -> dict:
    """The UNKNOWN sets and final statuses per (operation, attempt), vigil's and the peer's."""
    dec = h.FastDecoder(dep.codec)
    st_name, wk_name = dep.topics.operation_state.name, dep.topics.reconciliation_work.name
    v_unknown, v_final = set(), {}
    v_work = v_res = 0
    for o in vouts:
        if o.topic == st_name:
            r = dec(o.value)
            k = (r["operation_id"], r["attempt"])
            if r["status"] == "UNKNOWN":
                v_unknown.add(k)
            v_final[k] = r["status"]
        elif o.topic == wk_name:
            if "kind" in dec(o.value):
                v_work += 1
            else:
                v_res += 1
    p_unknown, p_final = set(), {}
    p_work = p_res = 0
    for o in pouts:
        r = json.loads(o.value)
        if r.get("_k") == "w":
            if "work_item_id" in r:
                p_work += 1
            else:
                p_res += 1
            continue
        k = (r["operation_id"], r["attempt"])
        if r["status"] == "UNKNOWN":
            p_unknown.add(k)
        p_final[k] = r["status"]
    return {
        "vigil_unknown": len(v_unknown),
        "peer_unknown": len(p_unknown),
        "unknown_sets_equal": v_unknown == p_unknown,
        "final_status_equal": v_final == p_final,
        "vigil_work_items": v_work,
        "peer_work_items": p_work,
        "vigil_resolutions": v_res,
        "peer_resolutions": p_res,
    }


def section(
    base: Settings,
    workdir: Path,
    executions: int,
    rounds: int,
    log: Log,
    against: Path | None = None,
    floor: bool = False,
) -> dict[str, Any]:
    python = ensure_venv(log)
    systems = ["vigil", "peer", "replay"] + (["against"] if against is not None else [])
    systems += ["floor"] if floor else []
    result: dict[str, Any] = {
        "executions": executions,
        "method": __doc__,
        "peer": QUIXSTREAMS,
        "against": str(against) if against is not None else None,
        "rounds": [],
    }
    for rnd in range(rounds):
        full, ops = ops_plan(executions)
        n_events = len(ops)
        order = systems if rnd % 2 == 0 else systems[::-1]
        load = os.getloadavg()
        rr: dict[str, Any] = {"events": n_events, "load_start": load}
        log(
            f"  round {rnd + 1} (load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}), order "
            f"{' → '.join(order)}: {n_events:,} OperationEvents (of the full mix's "
            f"{len(full):,} events)"
        )
        dep = h.deployment(base, workdir, "peer")
        wires = ops_wires(dep, full, ops)
        expected = expected_values(dep, ops, wires)
        rr["records"] = len(wires)
        rr["expected_outputs"] = sum(expected.values())
        h.produce_all(base, wires)
        for s in order:
            if s == "vigil":
                rr["vigil"] = vigil_run(base, dep, n_events, expected, log)
            elif s == "peer":
                rr["peer"] = peer_run(base, dep, n_events, python, log)
            elif s == "replay":
                rr["replay"] = replay_run(dep, n_events, expected, log)
            elif s == "floor":
                # a deployment of its own (topics, group), the same log
                dep3 = h.deployment(base, workdir, "peer-floor")
                wires3 = ops_wires(dep3, full, ops)
                h.produce_all(base, wires3)
                rr["floor"] = floor_run(base, dep3, ops, wires3, log)
                rr["floor"].pop("_outs")
                h.delete_deployment(dep3)
            else:
                # a deployment of its own (topics, group), the same log
                assert against is not None
                dep2 = h.deployment(base, workdir, "peer-against")
                wires2 = ops_wires(dep2, full, ops)
                expected2 = expected_values(dep2, ops, wires2)
                h.produce_all(base, wires2)
                name = f"vigil at {against.name}"
                rr["against"] = vigil_run(base, dep2, n_events, expected2, log, name, against)
                rr["against"].pop("_outs")
                rr["against_replay"] = replay_run(
                    dep2, n_events, expected2, log, f"replay at {against.name}", against
                )
                h.delete_deployment(dep2)
        rr["load_end"] = os.getloadavg()
        rr["check"] = compare(dep, rr["vigil"].pop("_outs"), rr["peer"].pop("_outs"))
        v, p = rr["vigil"], rr["peer"]
        rr["vigil_over_peer"] = v["events_per_s"] / p["events_per_s"]
        rr["peer_cpu_over_vigil"] = v["cpu_us_per_event"] / p["cpu_us_per_event"]
        rr["replay_over_peer"] = rr["replay"]["events_per_s"] / p["events_per_s"]
        if "against" in rr:
            rr["vigil_over_against"] = v["events_per_s"] / rr["against"]["events_per_s"]
        if "floor" in rr:
            rr["floor_over_peer"] = rr["floor"]["events_per_s"] / p["events_per_s"]
        log(
            f"  check: {rr['check']}; vigil ÷ peer {rr['vigil_over_peer']:.2f} in events/s, "
            f"the peer {rr['peer_cpu_over_vigil']:.2f} times less CPU per event"
        )
        result["rounds"].append(rr)
        h.delete_deployment(dep)
    rs = result["rounds"]
    measured = systems + (["against_replay"] if against is not None else [])
    result["median"] = {
        s: {
            "events_per_s": statistics.median(r[s]["events_per_s"] for r in rs),
            "cpu_us_per_event": statistics.median(r[s]["cpu_us_per_event"] for r in rs),
        }
        for s in measured
    }
    result["median"]["vigil_over_peer"] = statistics.median(r["vigil_over_peer"] for r in rs)
    result["median"]["replay_over_peer"] = statistics.median(r["replay_over_peer"] for r in rs)
    if floor:
        result["median"]["floor_over_peer"] = statistics.median(r["floor_over_peer"] for r in rs)
    result["all_checks_passed"] = all(
        r["vigil"]["outputs_equal_processor"]
        and r["replay"]["outputs_equal_processor"]
        and r["check"]["unknown_sets_equal"]
        and (r.get("against") or {}).get("outputs_equal_processor", True)
        and (r.get("against_replay") or {}).get("outputs_equal_processor", True)
        and (r.get("floor") or {}).get("outputs_equal_processor", True)
        for r in rs
    )
    log(
        f"  medians: {json.dumps(result['median'])}; every check passed: "
        f"{result['all_checks_passed']}"
    )
    return result
