"""The benchmark's sections. Each returns a JSON-able dict of figures and the method used."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.workload import Planned, from_ms, plan, shapes, tick_times
from streams.contracts.codec import AvroCodec, DecodeError, RegistryConfig
from streams.contracts.envelope import Envelope
from streams.contracts.models.events import ClockTick
from streams.engine.processor import Processor, Stores
from streams.settings import Settings

Log = Callable[[str], None]

#: Event time between two events of one execution, and between two execution starts, in
#: the pre-produced (backfill) workload: ~1,200 events per second of event time.
BACKFILL_STEP = timedelta(milliseconds=300)
BACKFILL_SPACING = timedelta(milliseconds=10)
#: Ticks every second of event time in the pre-produced workload (what a 1 s ticker leaves in
#: the log), then one round a second after the last event and one two hours later, which
#: fires every deadline and change point left (verdicts, orphans).
BACKFILL_TICK_MS = 1000
FINAL_TICK_AFTER = (1_000, 2 * 3600 * 1000)
PYINSTRUMENT_RECORDS = 40_000


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def dist(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
        "mean": statistics.fmean(values) if values else None,
    }


# -- the pre-produced workload -----------------------------------------------------------------
class Backfill:
    """``executions`` executions of the mix, encoded for one deployment, with the outputs the
    pure Processor publishes for the same records in the same per-partition order."""

    def __init__(self, dep: h.Deployment, executions: int, log: Log, seed: int = 8) -> None:
        span_s = executions * BACKFILL_SPACING.total_seconds() + 60
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=span_s + 3 * 3600)
        t0 = time.perf_counter()
        self.planned = plan(
            executions, start=start, spacing=BACKFILL_SPACING, step=BACKFILL_STEP, seed=seed
        )
        first, last = self.planned[0].at_ms, self.planned[-1].at_ms
        self.wires = h.encode(
            dep,
            self.planned,
            tick_times(first, last, BACKFILL_TICK_MS),
            [last + d for d in FINAL_TICK_AFTER],
        )
        self.encode_s = time.perf_counter() - t0
        self.events = len(self.planned)
        self.records = len(self.wires)
        self.ticks = self.records - self.events
        log(
            f"  workload: {executions:,} executions, {self.events:,} events + {self.ticks:,} "
            f"ticks, encoded in {self.encode_s:.1f}s"
        )
        t0 = time.perf_counter()
        self.expected, self.inprocess_s = expected_outputs(dep, self.planned, self.wires)
        log(
            f"  in-process expectation: {sum(self.expected.values()):,} outputs in "
            f"{self.inprocess_s:.1f}s"
        )
        self.mix = shapes(self.planned)


def envelopes(dep: h.Deployment, planned: list[Planned], wires: list[h.Wire]) -> list[Envelope]:
    offsets: Counter[tuple[str, int]] = Counter()
    out = []
    for w in wires:
        off = offsets[(w.topic, w.partition)]
        offsets[(w.topic, w.partition)] += 1
        rec = (
            planned[w.index].record
            if w.index >= 0
            else ClockTick(
                ticker_id="bench-ticker", partition=w.partition, occurred_at=from_ms(w.ts_ms)
            )
        )
        out.append(Envelope(w.topic, w.partition, off, w.ts_ms, w.key, w.value, rec, None))
    return out


def expected_outputs(
    dep: h.Deployment, planned: list[Planned], wires: list[h.Wire]
) -> tuple[dict[str, int], float]:
    proc = _processor(dep.settings, dep)
    counts: Counter[str] = Counter()
    t0 = time.perf_counter()
    for env in envelopes(dep, planned, wires):
        for em in proc.handle(env):
            counts[em.topic] += 1
    return dict(counts), time.perf_counter() - t0


def outputs_by_input(
    processor: Processor, envs: list[Envelope]
) -> dict[tuple[str, int, int], list[Any]]:
    """What the pure Processor publishes after each input, by (topic, partition, offset): the
    floor section's worker publishes exactly these instead of computing them."""
    out: dict[tuple[str, int, int], list[Any]] = {}
    for env in envs:
        ems = processor.handle(env)
        if ems:
            out[(env.topic, env.partition, env.offset)] = ems
    return out


def floor_env(dep: h.Deployment, planned: list[Planned], wires: list[h.Wire]) -> dict[str, str]:
    """What a worker's environment needs to run as the floor (``bench/floor_site``) on
    ``wires``: the pure Processor's outputs after each input, pickled into the deployment's
    work dir. That Processor runs the join across executions as the worker does, so the
    claims and progress still go through the claims topic and the worker's claims stage."""
    import pickle

    table = dep.workdir / "floor-outputs.pickle"
    proc = _processor(dep.settings, dep, cross_execution=True)
    with table.open("wb") as f:
        pickle.dump(outputs_by_input(proc, envelopes(dep, planned, wires)), f, protocol=5)
    return {
        "VIGIL_BENCH_FLOOR": str(table),
        "PYTHONPATH": f"{h.ROOT / 'bench' / 'floor_site'}{os.pathsep}{h.ROOT}",
    }


def _processor(
    settings: Settings,
    dep: h.Deployment,
    *,
    write_behind: bool = False,
    cross_execution: bool = False,
) -> Processor:
    """The pure Processor of ``dep``; ``cross_execution``: as the live worker runs it, also
    publishing the claims and progress its claims join takes."""
    pol = settings.policies()
    return Processor(
        dep.topics,
        Stores(),
        write_behind=write_behind,
        cross_execution=cross_execution,
        max_future_skew=settings.max_future_skew,
        allowed_lateness=settings.allowed_lateness,
        operation_config=pol.operations,
        thresholds=pol.thresholds,
        policies=pol.approval_policies,
        closed_retention=settings.closed_retention,
        orphan_after=settings.orphan_after,
    )


def _deterministic(dep: h.Deployment, expected: dict[str, int]) -> dict[str, int]:
    """Every output topic but execution-state, whose open-id snapshots depend on how the
    input topics interleave (topology.md): those must match the pure Processor exactly."""
    return {t: n for t, n in expected.items() if t != dep.topics.execution_state.name}


# -- throughput ----------------------------------------------------------------------------------
def throughput(
    base: Settings,
    workdir: Path,
    executions: int,
    workers: int,
    log: Log,
    profile: Path | None = None,
    floor: bool = False,
) -> tuple[dict[str, Any], h.Deployment, Backfill]:
    """``floor``: the worker's core replaced by the pure Processor's outputs, looked up
    (``bench/floor_site``): the shell's own ceiling, same records, same outputs."""
    dep = h.deployment(base, workdir, f"floor{workers}" if floor else f"tput{workers}")
    bf = Backfill(dep, executions, log)
    extra_env: dict[str, str] = {}
    if floor:
        t0 = time.perf_counter()
        extra_env = floor_env(dep, bf.planned, bf.wires)
        log(f"  floor: outputs by input written in {time.perf_counter() - t0:.1f}s")
    off = h.Offsets(base, dep.outputs)
    det = _deterministic(dep, bf.expected)
    result: dict[str, Any] = {
        "workers": workers,
        "executions": executions,
        "events": bf.events,
        "ticks": bf.ticks,
        "records": bf.records,
        "event_mix": bf.mix,
        "expected_outputs": bf.expected,
    }
    spy = None
    if workers == 1:
        result["produce_s"] = h.produce_all(base, bf.wires)
        result["method"] = (
            "all records pre-produced, then one worker started; time from the worker's Ready "
            "log line to the LogAppendTime of its last output record"
        )
        log(f"  pre-produced {bf.records:,} records in {result['produce_s']:.1f}s")
        ctx = h.workers(dep, 1, env=extra_env)
        procs = ctx.__enter__()
        start = procs[0].ready_at
    else:
        result["method"] = (
            f"{workers} workers started on empty topics; once the consumer group is stable "
            "with every worker assigned, all records are produced (pre-encoded, librdkafka as "
            "fast as it goes); time from the first produce call to the LogAppendTime of the "
            "last output record"
        )
        ctx = h.workers(dep, workers, env=extra_env)
        procs = ctx.__enter__()
        h.wait_group_stable(dep, workers)
        start = time.time()
        result["produce_s"] = h.produce_all(base, bf.wires)
    try:
        if profile is not None:
            spy = _py_spy(procs[0].pid, profile)
        cpu0 = [h.cpu_seconds(p.pid) for p in procs]
        _, met = h.wait_outputs(
            off, det, progress=lambda n: None, timeout=max(600.0, bf.records / 200)
        )
        cpu1 = [h.cpu_seconds(p.pid) for p in procs]
        rss = [h.rss_bytes(p.pid) for p in procs]
    finally:
        if spy is not None:
            _stop_py_spy(spy)
        ctx.__exit__(None, None, None)
        off.close()
    outs = h.read_all(base, dep.outputs)
    distinct = {(o.topic, o.value) for o in outs}
    first = min(o.append_ms for o in outs) / 1000
    last = max(o.append_ms for o in outs) / 1000
    elapsed = last - start
    per_topic = Counter(o.topic for o in outs)
    result.update(
        expectation_met=met,
        outputs=dict(per_topic),
        outputs_total=len(outs),
        outputs_distinct=len(distinct),
        duplicates=len(outs) - len(distinct),
        elapsed_s=elapsed,
        first_output_after_s=first - start,
        events_per_s=bf.events / elapsed,
        records_per_s=bf.records / elapsed,
        records_per_s_from_first_output=bf.records / max(1e-9, last - first),
        worker_cpu_s=[b - a for a, b in zip(cpu0, cpu1, strict=True)],
        worker_rss_mib=[r / 2**20 for r in rss],
        log_append_time=all(o.ts_type == 2 for o in outs),
    )
    result["records_per_cpu_s"] = bf.records / max(1e-9, sum(result["worker_cpu_s"]))
    mismatch = {t: (per_topic.get(t, 0), n) for t, n in det.items() if per_topic.get(t, 0) < n}
    result["short_of_expected"] = mismatch
    log(
        f"  {workers} worker(s): {bf.events:,} events + {bf.ticks:,} ticks in {elapsed:.1f}s = "
        f"{result['events_per_s']:,.0f} events/s ({result['records_per_s']:,.0f} records/s), "
        f"outputs {len(outs):,} (expected ≥{sum(det.values()):,} deterministic), met={met}"
    )
    return result, dep, bf


def _py_spy(pid: int, out: Path) -> Any:
    import shutil
    import subprocess
    import sys

    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "100",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def _stop_py_spy(proc: Any) -> None:
    import signal

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except Exception:
        proc.kill()


def collapsed_top(path: Path, n: int = 20) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_s)
        total += count
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1] if " (" in f else f
            for f in stack.split(";")
        ]
        frames = [_short(f) for f in frames]
        self_c[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    return {
        "samples": total,
        "self": [(f, round(100 * c / total, 1)) for f, c in self_c.most_common(n)],
        "inclusive": [(f, round(100 * c / total, 1)) for f, c in incl.most_common(n * 3)],
    }


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)" with package context
    name, _, rest = frame.partition(" (")
    path = rest.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


# -- ceiling -------------------------------------------------------------------------------------
def ceiling(base: Settings, dep: h.Deployment, records: int, log: Log) -> dict[str, Any]:
    """Plain consumers reading the same input topics from the beginning, decoding every record
    with vigil's codec (AvroCodec.decode: registry lookup of the writer + fastavro + pydantic)
    or with fastavro alone (schemaless_reader on the payload after the 5-byte header)."""
    out: dict[str, Any] = {"records": records}
    codec = AvroCodec.connect(RegistryConfig(base.schema_registry_url))
    fast = h.FastDecoder(codec)

    def warm(topic: str, value: bytes) -> None:
        fast(value)
        codec.decode(topic, value)

    # untimed: fills both decoders' registry caches (writer schemas by id) before any timing
    out["warmup"] = dict(
        zip(("records", "seconds"), _confluent_pass(base, dep.inputs, warm), strict=True)
    )
    for mode in ("none", "fastavro", "avrocodec"):
        decode = _decoder(mode, codec, fast)
        n, s = _confluent_pass(base, dep.inputs, decode)
        out[f"confluent_{mode}"] = {"records": n, "seconds": s, "records_per_s": n / s}
        log(f"  confluent-kafka + {mode}: {n / s:,.0f} records/s")
        n, s = asyncio.run(_aiokafka_pass(base, dep.inputs, dep.settings.partitions, decode))
        out[f"aiokafka_{mode}"] = {"records": n, "seconds": s, "records_per_s": n / s}
        log(f"  aiokafka + {mode}: {n / s:,.0f} records/s")
    return out


def _decoder(mode: str, codec: AvroCodec, fast: h.FastDecoder) -> Callable[[str, bytes], Any]:
    if mode == "none":
        return lambda topic, value: None
    if mode == "fastavro":
        return lambda topic, value: fast(value)

    def full(topic: str, value: bytes) -> Any:
        try:
            return codec.decode(topic, value)
        except DecodeError:
            return None

    return full


def _confluent_pass(
    base: Settings, topics: list[str], decode: Callable[[str, bytes], Any]
) -> tuple[int, float]:
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        base.confluent_conf()
        | {
            "group.id": f"bench-ceiling-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    try:
        meta = c.list_topics(timeout=10)
        want = {}
        tps = []
        for t in topics:
            for p in meta.topics[t].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if high > low:
                    want[(t, p)] = high
                    tps.append(TopicPartition(t, p, low))
        n = 0
        t0 = 0.0
        c.assign(tps)
        poll = c.poll
        while want:
            # poll, not consume(n, timeout): consume waits for a full batch or the timeout
            msg = poll(0.05)
            if msg is None or msg.error():
                continue
            if not n:
                t0 = time.perf_counter()  # from the first record, as for aiokafka
            decode(msg.topic(), msg.value())
            n += 1
            if msg.offset() + 1 >= want.get((msg.topic(), msg.partition()), 1 << 62):
                del want[(msg.topic(), msg.partition())]
        return n, time.perf_counter() - t0
    finally:
        c.close()


async def _aiokafka_pass(
    base: Settings, topics: list[str], partitions: int, decode: Callable[[str, bytes], Any]
) -> tuple[int, float]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(
        bootstrap_servers=base.bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1048576,
        fetch_max_bytes=52_428_800,
    )
    await c.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        ends = await c.end_offsets(tps)
        begins = await c.beginning_offsets(tps)
        want = {tp: ends[tp] for tp in tps if ends[tp] > begins[tp]}
        c.assign(list(want))
        await c.seek_to_beginning(*want)
        n = 0
        t0 = 0.0
        while want:
            batch = await c.getmany(timeout_ms=50, max_records=5000)
            for tp, msgs in batch.items():
                for msg in msgs:
                    if not n:
                        t0 = time.perf_counter()  # from the first record
                    decode(msg.topic, msg.value)
                    n += 1
                if msgs and msgs[-1].offset + 1 >= want.get(tp, 1 << 62):
                    want.pop(tp, None)
        return n, time.perf_counter() - t0
    finally:
        await c.stop()


# -- replay --------------------------------------------------------------------------------------
def replay(
    base: Settings, dep: h.Deployment, bf: Backfill, log: Log, profile_out: Path | None
) -> dict[str, Any]:
    """What ``vigil replay`` does (``streams/replay.py``): the pure Processor with dict stores,
    written behind and flushed every ``REPLAY_FLUSH_EVERY`` records, fed Envelopes decoded
    (AvroCodec, as the worker does) from a plain confluent-kafka consumer reading the input
    topics from the beginning; outputs are encoded with the codec but not sent. The garbage
    collector is tuned as ``vigil replay`` tunes it (``streams.app.tune_gc``)."""
    from confluent_kafka import Consumer, TopicPartition

    from streams.app import tune_gc
    from streams.replay import REPLAY_FLUSH_EVERY

    tune_gc()  # as ``vigil replay`` does
    codec = AvroCodec.connect(RegistryConfig(base.schema_registry_url))
    proc = _processor(base, dep, write_behind=True)
    allowed = {t.name: t.value_types for t in dep.topics.inputs()}
    c = Consumer(
        base.confluent_conf()
        | {"group.id": "bench-replay", "enable.auto.commit": False, "fetch.max.bytes": 52_428_800}
    )
    meta = c.list_topics(timeout=10)
    want = {}
    tps = []
    for t in dep.inputs:
        for p in meta.topics[t].partitions:
            low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
            if high > low:
                want[(t, p)] = high
                tps.append(TopicPartition(t, p, low))
    outputs: Counter[str] = Counter()
    n = handled = 0
    dec_s = handle_s = enc_s = 0.0
    pc = time.perf_counter
    t0 = pc()
    c.assign(tps)
    while want:
        for msg in (c.poll(0.05),):
            if msg is None or msg.error():
                continue
            a = pc()
            topic, value = msg.topic(), msg.value()
            ts = msg.timestamp()[1]
            try:
                env = Envelope(
                    topic,
                    msg.partition(),
                    msg.offset(),
                    ts,
                    msg.key(),
                    value,
                    codec.decode(topic, value, allowed.get(topic)),
                    None,
                )
            except DecodeError as exc:
                env = Envelope(
                    topic, msg.partition(), msg.offset(), ts, msg.key(), value, None, str(exc)
                )
            b = pc()
            ems = proc.handle(env)
            handled += 1
            if handled % REPLAY_FLUSH_EVERY == 0:
                proc.flush()
                proc.flush_clocks()
            cpt = pc()
            for em in ems:
                codec.encode(em.topic, em.record)
                outputs[em.topic] += 1
            d = pc()
            dec_s += b - a
            handle_s += cpt - b
            enc_s += d - cpt
            n += 1
            if msg.offset() + 1 >= want.get((topic, msg.partition()), 1 << 62):
                del want[(topic, msg.partition())]
    total = pc() - t0
    c.close()
    result = {
        "method": replay.__doc__.split("\n\n")[0].replace("\n   ", "").strip(),  # type: ignore[union-attr]
        "records": n,
        "events": bf.events,
        "seconds": total,
        "records_per_s": n / total,
        "events_per_s": bf.events / total,
        "split_s": {
            "consume_other": total - dec_s - handle_s - enc_s,
            "decode": dec_s,
            "processor_handle": handle_s,
            "encode_outputs": enc_s,
        },
        "handle_only_records_per_s": n / handle_s,
        "outputs": dict(outputs),
        "outputs_match_expected": dict(outputs) == bf.expected,
    }
    log(
        f"  replay: {n:,} records in {total:.1f}s = {n / total:,.0f} records/s "
        f"({bf.events / total:,.0f} events/s); decode {dec_s:.1f}s, handle {handle_s:.1f}s, "
        f"encode {enc_s:.1f}s"
    )
    if profile_out is not None:
        result["pyinstrument"] = _pyinstrument_handle(dep, bf, profile_out)
    return result


def replay_cli(base: Settings, dep: h.Deployment, bf: Backfill, log: Log) -> dict[str, Any]:
    """``vigil replay`` itself (``streams.replay.run_replay``) over the whole input topics, with
    its default number of processes (one per core): read, decoded, processed, and every output
    encoded and sent to the replay's own output topics, delivered before it returns."""
    from streams.replay import default_processes, run_replay

    codec = AvroCodec.connect(RegistryConfig(base.schema_registry_url))
    processes = default_processes(dep.settings)
    suffix = "-bench-replay"
    t0 = time.perf_counter()
    summary = run_replay(
        dep.settings,
        codec,
        datetime(1971, 1, 1, tzinfo=UTC),
        output_suffix=suffix,
        show_progress=False,
        processes=processes,
    )
    total = time.perf_counter() - t0
    outputs = {t.removesuffix(suffix): n for t, n in summary.outputs_by_topic.items()}
    result = {
        "method": replay_cli.__doc__.split("\n\n")[0].replace("\n   ", "").strip(),  # type: ignore[union-attr]
        "processes": processes,
        "records": summary.records_read,
        "events": bf.events,
        "seconds": total,
        "records_per_s": summary.records_read / total,
        "events_per_s": bf.events / total,
        "outputs": outputs,
        "outputs_match_expected": outputs == bf.expected,
    }
    log(
        f"  vigil replay, {processes} processes: {summary.records_read:,} records in "
        f"{total:.1f}s = {summary.records_read / total:,.0f} records/s "
        f"({bf.events / total:,.0f} events/s); outputs match: {result['outputs_match_expected']}"
    )
    return result  # its topics go with the deployment's (same prefix)


def _pyinstrument_handle(dep: h.Deployment, bf: Backfill, out: Path) -> str:
    """pyinstrument around Processor.handle over the first records of the same workload (in
    memory, already decoded)."""
    from pyinstrument import Profiler

    envs = envelopes(dep, bf.planned, bf.wires)[:PYINSTRUMENT_RECORDS]
    proc = _processor(dep.settings, dep)
    prof = Profiler(interval=0.0005)
    prof.start()
    for env in envs:
        proc.handle(env)
    prof.stop()
    out.write_text(prof.output_text(unicode=False, color=False, show_all=False))
    return str(out)


# -- latency, deadline lag -------------------------------------------------------------------------
def latency(
    base: Settings,
    workdir: Path,
    events: int,
    rate: float,
    tick_interval: str,
    log: Log,
) -> dict[str, Any]:
    """Live: one worker, the real ticker at ``tick_interval``, inputs offered at ``rate`` events/s
    with event time = scheduled send time; output LogAppendTime minus input append time."""
    dep = h.deployment(base, workdir, "lat")
    deadline = timedelta(seconds=2)
    step = timedelta(milliseconds=100)
    per_exec = 11.8  # mean events per execution of the mix
    executions = max(1, int(events / per_exec))
    spacing = timedelta(seconds=per_exec / rate)
    # Encode before the clock starts: times are the schedule, so pick a start far enough ahead.
    lead = 10.0 + executions * per_exec * 60e-6
    start = datetime.now(UTC) + timedelta(seconds=lead)
    planned = plan(executions, start=start, spacing=spacing, step=step, deadline=deadline, run="l")
    wires = h.encode(dep, planned, ())
    n = len(wires)
    sent_at = [0.0] * n
    acked_at = [0.0] * n
    errors: list[str] = []
    log(
        f"  live: {n:,} events over {planned[-1].at_ms / 1000 - start.timestamp():.0f}s "
        f"at {rate:,.0f}/s"
    )
    with h.workers(dep, 1) as procs, h.ticker(dep, tick_interval):
        h.wait_group_stable(dep, 1)
        p = h.producer(base, **{"linger.ms": 1})
        cpu0 = h.cpu_seconds(procs[0].pid)
        wait = start.timestamp() - time.time()
        if wait > 0:
            time.sleep(wait)
        else:
            log(f"  ! encoding overran the lead by {-wait:.1f}s")
        behind: list[float] = []
        for i, w in enumerate(wires):
            due = w.ts_ms / 1000
            now = time.time()
            if due > now:
                time.sleep(due - now)
                now = time.time()
            behind.append(now - due)

            def report(err: Any, _msg: Any, i: int = i) -> None:
                acked_at[i] = time.time()
                if err is not None:
                    errors.append(str(err))

            sent_at[i] = time.time()
            p.produce(
                w.topic,
                value=w.value,
                key=w.key,
                partition=w.partition,
                timestamp=w.ts_ms,
                on_delivery=report,
            )
            p.poll(0)
        p.flush(30)
        sent_s = time.time() - start.timestamp()
        # the last deadlines (+ grace) pass and are judged; a worker behind drains its backlog
        time.sleep(deadline.total_seconds() * 2 + 3)
        off = h.Offsets(base, dep.outputs)
        h.wait_outputs(off, {}, settle=4.0, timeout=900.0)
        off.close()
        cpu1 = h.cpu_seconds(procs[0].pid)
        rss = h.rss_bytes(procs[0].pid)
    outs = h.read_all(base, dep.outputs)
    dec = h.FastDecoder(dep.codec)
    t = dep.topics
    # index inputs
    status_in: dict[tuple[str, int], int] = {}
    op_in: dict[tuple[str, int, str, int], int] = {}
    appr_in: dict[tuple[str, int], int] = {}
    for i, w in enumerate(wires):
        r = planned[w.index].record
        name = r.avro_name
        if name == "ExecutionStatusChanged":
            status_in[(r.execution_id, r.sequence)] = i  # type: ignore[attr-defined]
        elif name == "OperationEvent":
            op_in[(r.operation_id, r.attempt, str(r.kind), w.ts_ms)] = i  # type: ignore[attr-defined]
        elif hasattr(r, "request_id"):
            appr_in.setdefault((r.request_id, w.ts_ms), i)  # type: ignore[attr-defined]
    lat_ack: dict[str, list[float]] = {"status": [], "operation": [], "approval": []}
    lat_send: dict[str, list[float]] = {"status": [], "operation": [], "approval": []}
    unknown_lag: list[float] = []
    unknown_alert_lag: list[float] = []
    stuck_lag: list[float] = []
    seen: set[tuple[Any, ...]] = set()
    for o in sorted(outs, key=lambda o: o.append_ms):
        rec = dec(o.value)
        kind = None
        i = None
        if o.topic == t.execution_state.name:
            key = ("s", rec["execution_id"], rec["last_sequence"])
            if key in seen:
                continue
            seen.add(key)
            i = status_in.get(key[1:])
            kind = "status"
        elif o.topic == t.operation_state.name:
            since = h.ms(rec["since"])
            if rec["status"] == "UNKNOWN":
                unknown_lag.append(o.append_ms - since)
                continue
            i = op_in.get((rec["operation_id"], rec["attempt"], rec["status"], since))
            kind = "operation"
        elif o.topic == t.approval_verdicts.name:
            at = h.ms(rec["evaluated_at"])
            if rec["verdict"] == "STUCK_AFTER_DECISION":
                stuck_lag.append(o.append_ms - at)
                continue
            key = ("v", rec["request_id"], at)
            if key in seen:
                continue
            seen.add(key)
            i = appr_in.get(key[1:])
            kind = "approval"
        elif (
            o.topic == t.alerts.name
            and rec["kind"] == "OPERATION_UNKNOWN"
            and rec["status"] != "RESOLVED"
        ):
            unknown_alert_lag.append(o.append_ms - h.ms(rec["occurred_at"]))
        if kind is not None and i is not None and acked_at[i]:
            lat_ack[kind].append(o.append_ms - acked_at[i] * 1000)
            lat_send[kind].append(o.append_ms - sent_at[i] * 1000)
    all_ack = [x for v in lat_ack.values() for x in v]
    all_send = [x for v in lat_send.values() for x in v]
    expected_unknown = sum(
        1
        for p in planned
        if p.shape == "lost_reply"
        and p.record.avro_name == "OperationEvent"
        and str(p.record.kind) == "SENT"
    )  # type: ignore[attr-defined]
    expected_stuck = sum(
        1 for p in planned if p.shape == "stuck" and p.record.avro_name == "ApprovalDecision"
    )
    result = {
        "method": (
            "one worker, the real `vigil ticker --interval " + tick_interval + "`, inputs "
            f"offered at {rate:,.0f} events/s on a fixed schedule (pre-encoded, event time = "
            "scheduled send time, CreateTime = event time); input time = wall clock in the "
            "producer's delivery callback (broker ack; input topics keep CreateTime, so their "
            "append time is not readable), also reported from the produce() call; output time "
            "= LogAppendTime of the output record (output topics set to LogAppendTime). Matched: "
            "ExecutionState by (execution_id, last_sequence) to its status event (first output), "
            "OperationState by (operation, attempt, status, since) to its event, ApprovalVerdict "
            "by (request, evaluated_at) to the fact at that time"
        ),
        "rate": rate,
        "tick_interval": tick_interval,
        "events": n,
        "executions": executions,
        "offered_s": (wires[-1].ts_ms - wires[0].ts_ms) / 1000,
        "sender_behind_ms": dist([b * 1000 for b in behind]),
        "delivery_errors": len(errors),
        "latency_ms_from_ack": dist(all_ack),
        "latency_ms_from_send": dist(all_send),
        "by_kind_from_ack": {k: dist(v) for k, v in lat_ack.items()},
        "outputs": len(outs),
        "worker_rss_mib": rss / 2**20,
        "worker_cpu_s": cpu1 - cpu0,
        "worker_cpu_s_per_offered_s": (cpu1 - cpu0) / max(1e-9, sent_s),
        "drained_after_s": max(o.append_ms for o in outs) / 1000 - start.timestamp(),
        "deadline_s": deadline.total_seconds(),
        "unknown_lag_ms": dist(unknown_lag) | {"expected": expected_unknown},
        "unknown_alert_lag_ms": dist(unknown_alert_lag),
        "stuck_lag_ms": dist(stuck_lag) | {"expected": expected_stuck},
        "lag_method": (
            "deadline lag = LogAppendTime of the UNKNOWN OperationState (resp. the "
            "STUCK_AFTER_DECISION ApprovalVerdict) minus its stamp, which is the deadline "
            "(reply_due_at, resp. decision + grace) in event time = wall time, since event "
            "time is the schedule and the ticker ticks wall time; it includes the wait for "
            "the first tick past the deadline (≤ one interval)"
        ),
    }
    a = result["latency_ms_from_ack"]
    log(
        f"  latency (ack→output): p50 {a['p50']} ms, p99 {a['p99']} ms over {a['n']:,}; "
        f"UNKNOWN lag p50 {result['unknown_lag_ms']['p50']} "
        f"p99 {result['unknown_lag_ms']['p99']} ms "
        f"({len(unknown_lag)}/{expected_unknown}); STUCK lag p50 {result['stuck_lag_ms']['p50']} "
        f"p99 {result['stuck_lag_ms']['p99']} ms ({len(stuck_lag)}/{expected_stuck})"
    )
    h.delete_deployment(dep)
    return result


# -- memory -------------------------------------------------------------------------------------
def memory(base: Settings, workdir: Path, inflight: int, store: str, log: Log) -> dict[str, Any]:
    """RSS growth of one worker from idle (Ready, empty tables) to ``inflight`` executions in
    flight (RUNNING, WAITING_FOR_TOOL and an operation SENT whose reply is due in an hour: 3 events
    each, all processed: a tick a second after the last event passes the watermark over them)."""
    dep = h.deployment(base, workdir, "mem", store=store)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    spacing = timedelta(milliseconds=2)
    planned = plan(
        inflight,
        start=start,
        spacing=spacing,
        step=timedelta(milliseconds=100),
        inflight_only=True,
        run="m",
    )
    first, last = planned[0].at_ms, planned[-1].at_ms
    t0 = time.perf_counter()
    wires = h.encode(dep, planned, tick_times(first, last, 1000), [last + 1000])
    log(
        f"  {inflight:,} in-flight executions: {len(wires):,} records, "
        f"encoded in {time.perf_counter() - t0:.1f}s"
    )
    states = sum(1 for p in planned if p.record.avro_name == "ExecutionStatusChanged")
    off = h.Offsets(base, [dep.topics.execution_state.name])
    with h.workers(dep, 1) as procs:
        pid = procs[0].pid
        time.sleep(5)
        idle = [h.rss_bytes(pid)]
        time.sleep(1)
        idle.append(h.rss_bytes(pid))
        rss0 = max(idle)
        wall0 = time.time()
        h.produce_all(base, wires)
        peak = rss0
        _, met = h.wait_outputs(
            off,
            {dep.topics.execution_state.name: states},
            settle=5.0,
            timeout=max(900.0, len(wires) / 200),
        )
        time.sleep(3)
        rss1 = h.rss_bytes(pid)
        elapsed = time.time() - wall0
        peak = max(peak, rss1)
    off.close()
    per = (rss1 - rss0) / inflight
    result = {
        "store": store,
        "inflight": inflight,
        "records": len(wires),
        "expectation_met": met,
        "rss_idle_mib": rss0 / 2**20,
        "rss_loaded_mib": rss1 / 2**20,
        "bytes_per_inflight_execution": per,
        "elapsed_s": elapsed,
        "method": memory.__doc__.replace("\n   ", "").strip(),  # type: ignore[union-attr]
    }
    log(
        f"  {store}: RSS {rss0 / 2**20:,.0f} → {rss1 / 2**20:,.0f} MiB = {per:,.0f} B "
        "per in-flight "
        f"execution (met={met}, {elapsed:.0f}s)"
    )
    h.delete_deployment(dep)
    return result


def table_bytes(base: Settings, workdir: Path, inflight: int) -> dict[str, Any]:
    """The same in-flight executions through the pure Processor with dict stores, in this
    process: what the four tables hold per execution (key + JSON value bytes), i.e. the payload
    a memory:// store keeps, before Python object and Faust overheads."""
    from streams.kafka.partitioning import partition_of
    from streams.kafka.topics import Topics

    topics = Topics.from_settings(base)
    dep = h.Deployment(base, None, topics, workdir)  # type: ignore[arg-type]
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    planned = plan(
        inflight,
        start=start,
        spacing=timedelta(milliseconds=2),
        step=timedelta(milliseconds=100),
        inflight_only=True,
        run="m",
    )
    proc = _processor(base, dep)
    offs: Counter[tuple[str, int]] = Counter()
    topic_of = {m: sp.name for sp in topics.inputs() for m in sp.value_types}
    for pl in planned:
        r = pl.record
        part = partition_of(r.execution_id, base.partitions)  # type: ignore[attr-defined]
        tp = topic_of[type(r)]
        offs[(tp, part)] += 1
        env = Envelope(tp, part, offs[(tp, part)], pl.at_ms, r.execution_id.encode(), None, r, None)  # type: ignore[attr-defined]
        proc.handle(env)
    last = planned[-1].at_ms + 1000
    for p in range(base.partitions):
        for tp in dep.inputs:
            tick = ClockTick(ticker_id="m", partition=p, occurred_at=from_ms(last))
            proc.handle(Envelope(tp, p, 0, last, None, None, tick, None))
    st = proc
    per_table = {
        name: sum(len(k) + len(v) for k, v in d.items()) / inflight
        for name, d in (
            ("inflight", st.inflight),
            ("closed", st.closed),
            ("operations", st.operations),
            ("approvals", st.approvals),
        )
    }
    stored = sum(len(k) + len(v) for k, v in proc.stores.executions.items()) / inflight
    return {
        "executions": inflight,
        "in_flight_after": len(st.inflight),
        "held_after": proc.held(),
        "key_plus_value_bytes_per_execution": per_table,
        # one entry per execution holds every field (plus separators and applied positions)
        "total": stored,
    }


__all__ = ["ceiling", "latency", "memory", "replay", "table_bytes", "throughput"]
