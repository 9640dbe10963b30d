"""Per-execution state: one table entry per execution, written behind the outputs.

Why one entry and not one table per kind of state: a changelog record is the unit Kafka
delivers atomically. Everything one input changes (the execution's slot, its operations, its
approvals) and the record of which inputs it has applied live in the same entry, so after a
crash the entry either shows an input's whole effect and says so, or shows none of it. That is
what lets the worker tell a redelivered input (skipped: its effect is there) from a producer's
duplicate (reported), see ``Entry.seen``.

Why written behind: the live worker applies a batch of inputs to this cache, sends the outputs,
waits until the broker has them, and only then writes the dirty entries to the table (hence to
its changelog) and acknowledges the inputs. A crash before the write loses nothing that was not
published: the inputs come again and give the same outputs (same ids). It also turns the many
writes one busy execution gets in a batch into one changelog record.

An entry's text is five fields separated by ASCII RS (0x1e), which JSON text never contains
unescaped: the JSON of the in-flight slot, the closed slot, the operation book, the approval
book (each empty when absent) and the applied input positions; a sixth, the trace contexts
inputs brought (``streams.core.trace``, JSON), only when there are any; a seventh, what the
execution was told of other executions' attempts under its idempotency keys
(``streams.core.cross``, JSON), only when there is any (the sixth is then empty if need be);
an eighth, the ends of alerts still firing that end at a known instant (ANOMALY alerts,
``streams.core.alerts``, JSON), only when there are any (the sixth and seventh are then empty
if need be). The table stores that text compressed (``streams/engine/compact.py``), and reads
uncompressed text as it is.

The slots and the operation book are written in format 2: JSON arrays with times in epoch
milliseconds (``executions.dump_slot``, ``operations.dump_book``). Format 1, JSON objects with
ISO times, is still read (``load_slot``, ``load_book``), so entries written before format 2 are
read as they are and each part is written in format 2 when it next changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from streams.engine import compact

SEP = "\x1e"
FIELDS = ("inflight", "closed", "operations", "approvals")
#: Applied positions kept per execution at most. Positions below the committed offset are
#: dropped anyway (Kafka never redelivers them); this bounds an execution whose inputs come
#: faster than offsets are committed.
MAX_SEEN = 64
#: What the entries kept decoded after a flush (``ExecutionStore._kept``) may weigh, by
#: default (``VIGIL_STATE_CACHE_MB``). An execution with inputs in several batches is read
#: back from the table once per batch unless it is kept. On the benchmark's operations log
#: (20,000 executions, batches of 1,000 inputs) keeping most of them (about 11,000 entries,
#: 64 MiB by the estimate below) takes the core from 65-77 CPU-µs per input to 58-63. The
#: default is about what the 1,024 entries kept before a budget took (6 to 9 MiB): a worker's
#: memory at 100,000 in flight, already above the 2 KiB per execution it is allowed, grew by
#: 250 to 500 B per execution with 16 to 32 MiB kept (BENCHMARKS.md, issue 30 step 4).
DEFAULT_KEPT_BYTES = 8 * 1024 * 1024
#: What a decoded entry weighs in memory, estimated from its text's length: Python objects for
#: the text's fields, its decoded aggregate and parts, the packed bytes, and what the allocator
#: holds around them. Twice what tracemalloc counts freed when the kept entries are dropped
#: (2.8 KiB at 346 characters of text, 4.2 KiB at 577): a worker's RSS grew by about twice the
#: budget estimated from that count.
KEPT_BASE_BYTES = 1536
KEPT_BYTES_PER_CHAR = 12

#: The key under which an entry's decoded aggregate is kept with its parts (never stored).
AGGREGATE = "execution"

Position = tuple[int, int, int]  # (input topic rank, partition, offset)
_MISSING = object()


@dataclass(slots=True)
class Entry:
    inflight: str | None = None
    closed: str | None = None
    operations: str | None = None
    approvals: str | None = None
    #: Input positions whose effect this entry holds, not yet below the committed offset.
    seen: list[Position] = field(default_factory=list)
    #: Trace contexts by what they belong to (``streams.core.trace``), JSON; carried to the
    #: outputs, never a reason to keep an entry (``empty`` ignores them).
    traces: str | None = None
    #: Other executions' attempts in conflict with this one's (``streams.core.cross``), JSON.
    links: str | None = None
    #: The ends of its alerts that end at a known instant (``streams.core.alerts.Ends``),
    #: JSON: a reason to keep the entry until they have come.
    alerts: str | None = None
    #: Decoded state by field, so that a batch parses each field once, and fields whose
    #: text is stale (the object changed) with the function that dumps it. Not stored.
    objs: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    stale: dict[str, Callable[[Any], str]] = field(default_factory=dict, compare=False, repr=False)

    def materialize(self) -> None:
        for name, dump in self.stale.items():
            obj = self.objs.get(name)
            setattr(self, name, None if obj is None else dump(obj))
        self.stale.clear()

    def empty(self) -> bool:
        self.materialize()
        return not (
            self.inflight or self.closed or self.operations or self.approvals or self.alerts
        )

    def encode(self) -> str:
        self.materialize()
        seen = ",".join(f"{r}:{p}:{o}" for r, p, o in self.seen)
        parts = [self.inflight, self.closed, self.operations, self.approvals, seen]
        if self.traces or self.links or self.alerts:
            parts.append(self.traces)
        if self.links or self.alerts:
            parts.append(self.links)
        if self.alerts:
            parts.append(self.alerts)
        return SEP.join(x or "" for x in parts)

    def pack(self) -> bytes:
        """What the table stores: the text, compressed."""
        return compact.pack(self.encode())

    def content_size(self) -> int:
        """The packed size of the entry without its applied input positions: what its
        execution's facts weigh, the same in the live worker (which keeps positions) and in
        a replay (which does not), so that both judge an entry's size alike. The alert ends
        are left out too: some come from inputs refused as they are read, in an order that
        depends on how the topics interleave, and they are bounded on their own
        (``streams.core.alerts.MAX_PENDING``)."""
        self.materialize()
        parts = [self.inflight, self.closed, self.operations, self.approvals, ""]
        if self.traces:
            parts.append(self.traces)
        return len(compact.pack(SEP.join(x or "" for x in parts)))

    @classmethod
    def decode(cls, raw: bytes | str) -> Entry:
        """From what ``pack`` or ``encode`` gave (a store may hand either back as bytes)."""
        if compact.is_packed(raw):
            data = compact.unpack(raw)  # type: ignore[arg-type]
        elif isinstance(raw, bytes | bytearray) and raw[:1] == b'"':
            # an entry's text logged as a JSON string, recovered raw
            data = json.loads(raw)
        else:
            data = raw.decode() if isinstance(raw, bytes | bytearray) else str(raw)
        parts = [p or None for p in data.split(SEP)]
        if len(parts) not in (5, 6, 7, 8):
            raise ValueError(f"an execution entry has 5 to 8 fields, not {len(parts)}")
        seen: list[Position] = []
        for item in (parts[4] or "").split(","):
            if item:
                r, p, o = item.split(":")
                seen.append((int(r), int(p), int(o)))
        traces = parts[5] if len(parts) >= 6 else None
        links = parts[6] if len(parts) >= 7 else None
        alerts = parts[7] if len(parts) == 8 else None
        return cls(parts[0], parts[1], parts[2], parts[3], seen, traces, links, alerts)


class EntryTooLarge(ValueError):
    """An entry larger than its table can store: ``last`` holds the position of the last
    input it applied, when it keeps positions (the live worker), to blame it on."""

    def __init__(self, key: str, size: int, limit: int, last: list[Position]) -> None:
        super().__init__(
            f"the entry of execution {key[:200]!r} is {size:,} bytes packed, above the "
            f"{limit:,} its changelog takes"
        )
        self.key, self.size, self.limit = key, size, limit
        self.last: Position | None = last[0] if last else None


class ExecutionStore:
    """A write-behind cache over the table of execution entries.

    Reads go through the cache; writes stay in it until ``flush``. ``discard`` forgets what
    was not flushed (after a rebalance: the inputs that made it come again)."""

    def __init__(
        self, table: MutableMapping[str, Any], kept_bytes: int = DEFAULT_KEPT_BYTES
    ) -> None:
        self.table = table
        self._cache: dict[str, Entry] = {}
        #: Entries written by ``flush``, decoded, with the very bytes written and their
        #: estimated weight: reused while the table still holds those bytes, so that an
        #: execution with inputs in many batches is unpacked and decoded once, not once per
        #: batch. Least recently written dropped first beyond ``kept_bytes``; 0 keeps none.
        self._kept: dict[str, tuple[bytes, Entry, int]] = {}
        self.kept_bytes = kept_bytes
        #: the estimated weight of what ``_kept`` holds
        self.kept_weight = 0
        #: dirty keys per partition: a Faust table writes an entry to the changelog partition
        #: of the input being processed, so the shell flushes one partition at a time.
        self._dirty: dict[int, set[str]] = {}
        #: the partition whose input is being processed (set by the processor)
        self.partition = 0
        #: per cached entry, a bound on its packed size: its size as read (or as last
        #: measured) plus what the changes since may have added (``grow``)
        self._sizes: dict[str, int] = {}
        #: per execution, the earliest instant at which advancing it can do anything, as the
        #: processor last found it (``Processor._note_quiet``), kept whether or not the entry
        #: is cached: what lets a stale due time pass without the entry being decoded. Any
        #: change to the entry forgets it until the processor tells it again, and so do
        #: ``discard`` and ``restore``; without it a due time is acted on as it comes.
        self.quiet: dict[str, int] = {}

    # -- entries ---------------------------------------------------------------------------
    def entry(self, execution_id: str) -> Entry:
        cached = self._cache.get(execution_id)
        if cached is None:
            raw = self.table.get(execution_id)
            kept = self._kept.get(execution_id)
            if kept is not None and raw is not None and (kept[0] is raw or kept[0] == raw):
                # What decoding ``raw`` would give, already decoded. It stays kept too: a
                # change to it makes it dirty, so it stays in the cache until flushed (and kept
                # anew) or discarded (and every kept entry with it).
                cached = kept[1]
            else:
                cached = Entry() if raw is None else Entry.decode(raw)
            self._cache[execution_id] = cached
            self._sizes[execution_id] = 0 if raw is None else len(raw)
        return cached

    # -- size (what the processor keeps an entry within) -----------------------------------
    def size_bound(self, execution_id: str) -> int:
        """At least the entry's packed size, as far as ``grow`` was told of its changes."""
        self.entry(execution_id)
        return self._sizes[execution_id]

    def grow(self, execution_id: str, most: int) -> None:
        """A change that adds at most ``most`` bytes to the entry's packed size."""
        self.entry(execution_id)
        self._sizes[execution_id] += most

    def room(self, execution_id: str, most: int, limit: int) -> bool:
        """Whether a change adding at most ``most`` bytes keeps the entry's bound below
        ``limit``; if so, the bound grows by it (``size_bound`` and ``grow`` in one call,
        once per input)."""
        if execution_id not in self._cache:
            self.entry(execution_id)
        sizes = self._sizes
        size = sizes[execution_id] + most
        if size >= limit:
            return False
        sizes[execution_id] = size
        return True

    def measure(self, execution_id: str) -> int:
        """The entry's packed size, exactly (``Entry.content_size``), remembered as its bound."""
        size = self.entry(execution_id).content_size()
        self._sizes[execution_id] = size
        return size

    def snapshot(self, execution_id: str) -> str:
        """The entry as it is now, to go back to (``restore``)."""
        return self.entry(execution_id).encode()

    def restore(self, execution_id: str, text: str, size: int) -> None:
        """The entry back to a ``snapshot``, with a bound on its size; the aggregate and
        parts decoded since are dropped with it (built again from the text when asked)."""
        self._forget(execution_id)
        self._cache[execution_id] = Entry.decode(text)
        self._sizes[execution_id] = size
        self.touch(execution_id)

    def touch(self, execution_id: str) -> None:
        self.quiet.pop(execution_id, None)
        keys = self._dirty.get(self.partition)
        if keys is None:
            keys = self._dirty[self.partition] = set()
        keys.add(execution_id)

    def dirty_partitions(self) -> list[int]:
        return sorted(p for p, keys in self._dirty.items() if keys)

    def flush(self, partition: int | None = None, limit: int | None = None) -> int:
        """Write the dirty entries (of one partition, or all) to the table; an empty entry is
        deleted. The cache is emptied once nothing is dirty any more. Returns how many.

        ``limit``: the largest packed entry the table can store (its changelog's record
        size); a larger one raises ``EntryTooLarge`` before it is written."""
        n = 0
        try:
            for p in [partition] if partition is not None else self.dirty_partitions():
                for key in sorted(self._dirty.pop(p, ())):
                    e = self._cache[key]
                    if e.empty():
                        self._forget(key)
                        self.quiet.pop(key, None)
                        if key in self.table:
                            del self.table[key]
                    else:
                        text = e.encode()
                        packed = compact.pack(text)
                        if limit is not None and len(packed) > limit:
                            raise EntryTooLarge(key, len(packed), limit, e.seen[-1:])
                        self.table[key] = packed
                        self._keep(key, packed, e, len(text))
                    n += 1
        except BaseException:
            self._drop_kept()  # a kept entry may hold changes the table did not take
            raise
        if not any(self._dirty.values()):
            self._dirty.clear()
            self._cache.clear()
            self._sizes.clear()
        return n

    def _keep(self, key: str, packed: bytes, e: Entry, text_length: int) -> None:
        self._forget(key)
        weight = KEPT_BASE_BYTES + KEPT_BYTES_PER_CHAR * text_length
        if weight > self.kept_bytes:
            return
        kept = self._kept
        while self.kept_weight + weight > self.kept_bytes:
            self.kept_weight -= kept.pop(next(iter(kept)))[2]
        kept[key] = (packed, e, weight)
        self.kept_weight += weight

    def _forget(self, key: str) -> None:
        was = self._kept.pop(key, None)
        if was is not None:
            self.kept_weight -= was[2]

    def _drop_kept(self) -> None:
        self._kept.clear()
        self.kept_weight = 0

    def kept(self) -> int:
        """How many entries are kept decoded."""
        return len(self._kept)

    def discard(self) -> None:
        self.quiet.clear()
        self._dirty.clear()
        self._cache.clear()
        self._drop_kept()
        self._sizes.clear()

    def pending(self) -> int:
        return sum(len(keys) for keys in self._dirty.values())

    def entries(self, only: Callable[[str], bool] | None = None) -> Iterator[tuple[str, Entry]]:
        """Every entry (or those whose key ``only`` keeps, decided before the entry is
        decoded), with what the cache holds over what the table holds."""
        cache = self._cache
        for key, raw in list(self.table.items()):
            if key not in cache and (only is None or only(key)):
                yield key, Entry.decode(raw)
        for key, e in list(cache.items()):
            if only is None or only(key):
                e.materialize()
                yield key, e

    def view(self, name: str) -> FieldView:
        return FieldView(self, name)

    # -- decoded state ---------------------------------------------------------------------
    def load(self, execution_id: str, name: str, parse: Callable[[str], Any]) -> Any:
        """The decoded value of one field (``None`` when empty), parsed once per batch.

        Several per input: the cached case is spelled out (one lookup each, no call)."""
        e = self._cache.get(execution_id)
        if e is None:
            e = self.entry(execution_id)
        objs = e.objs
        obj = objs.get(name, _MISSING)
        if obj is not _MISSING:
            return obj
        text = getattr(e, name)
        obj = None if text is None else parse(text)
        objs[name] = obj
        return obj

    def execution(self, execution_id: str, build: Callable[[str], Any]) -> Any:
        """The execution's aggregate (``streams.core.execution``), built by ``build`` once per
        batch and kept with the entry; its parts are saved through ``save``."""
        e = self._cache.get(execution_id)
        if e is None:
            e = self.entry(execution_id)
        aggregate = e.objs.get(AGGREGATE)
        if aggregate is None:
            aggregate = e.objs[AGGREGATE] = build(execution_id)
        return aggregate

    def traces(self, execution_id: str) -> dict[str, str] | None:
        """The execution's trace contexts (``Entry.traces``) decoded, once per batch: asked
        for every output."""
        e = self._cache.get(execution_id)
        if e is None:
            e = self.entry(execution_id)
        objs = e.objs
        traces = objs.get("traces", _MISSING)
        if traces is _MISSING:
            text = e.traces
            traces = objs["traces"] = None if text is None else json.loads(text)
        return traces  # type: ignore[no-any-return]

    def save(
        self, execution_id: str, name: str, obj: Any, dump: Callable[[Any], str] = str
    ) -> None:
        """Set one field to ``obj`` (``None``: empty); dumped to JSON only when written."""
        e = self.entry(execution_id)
        e.objs[name] = obj
        e.stale[name] = dump
        self.touch(execution_id)

    def save_parts(
        self,
        execution_id: str,
        source: Any,
        names: Iterable[str],
        dumps: Mapping[str, Callable[[Any], str]],
    ) -> None:
        """``save`` for several fields of one entry: each of ``names`` set to that attribute
        of ``source`` (the aggregate), dumped by ``dumps[name]`` when written."""
        e = self._cache.get(execution_id)
        if e is None:
            e = self.entry(execution_id)
        objs, stale = e.objs, e.stale
        for name in names:
            objs[name] = getattr(source, name)
            stale[name] = dumps[name]
        self.quiet.pop(execution_id, None)
        keys = self._dirty.get(self.partition)
        if keys is None:
            keys = self._dirty[self.partition] = set()
        keys.add(execution_id)

    def absent(self, execution_id: str, name: str) -> bool:
        """Whether the field is empty, told without decoding it."""
        e = self._cache.get(execution_id)
        if e is None:
            e = self.entry(execution_id)
        obj = e.objs.get(name, _MISSING)
        return getattr(e, name) is None if obj is _MISSING else obj is None

    # -- applied inputs --------------------------------------------------------------------
    def applied(self, execution_id: str, position: Position) -> bool:
        return position in self.entry(execution_id).seen

    def mark_applied(
        self,
        execution_id: str,
        position: Position,
        committed: Callable[[int, int], int | None],
    ) -> None:
        e = self.entry(execution_id)
        if not e.seen:  # the common case: nothing applied since the last commit
            e.seen = [position]
            self.touch(execution_id)
            return
        # ``committed`` (a lookup) is asked again only when the topic partition changes from
        # one position to the next: positions come in runs of the same input.
        seen: list[Position] = []
        last_rank: int | None = None
        last_partition: int | None = None
        c: int | None = None
        for s in e.seen:
            rank, partition, offset = s
            if rank != last_rank or partition != last_partition:
                c = committed(rank, partition)
                last_rank, last_partition = rank, partition
            if s != position and (c is None or offset >= c):
                seen.append(s)
        seen.append(position)
        e.seen = seen[-MAX_SEEN:]
        self.touch(execution_id)


class FieldView(MutableMapping[str, str]):
    """One kind of state (``inflight``, ``closed``, ``operations``, ``approvals``) of every
    execution, as a mapping of execution id to JSON, read and written through the cache."""

    def __init__(self, store: ExecutionStore, name: str) -> None:
        if name not in (*FIELDS, "links"):
            raise ValueError(f"no field {name!r} in an execution entry")
        self.store, self.name = store, name

    def __getitem__(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        e = self.store.entry(key)
        e.materialize()
        value = getattr(e, self.name)
        return default if value is None else value

    def __setitem__(self, key: str, value: str) -> None:
        e = self.store.entry(key)
        e.materialize()
        setattr(e, self.name, value)
        e.objs.pop(self.name, None)
        e.objs.pop(AGGREGATE, None)
        self.store.touch(key)

    def __delitem__(self, key: str) -> None:
        e = self.store.entry(key)
        e.materialize()
        if getattr(e, self.name) is None:
            raise KeyError(key)
        setattr(e, self.name, None)
        e.objs.pop(self.name, None)
        e.objs.pop(AGGREGATE, None)
        self.store.touch(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (k for k, e in self.store.entries() if getattr(e, self.name) is not None)

    def items(self) -> Any:  # type: ignore[override]
        name = self.name
        return [(k, v) for k, e in self.store.entries() if (v := getattr(e, name)) is not None]

    def values(self) -> Any:  # type: ignore[override]
        return [v for _, v in self.items()]

    def __len__(self) -> int:
        return sum(1 for _ in self)
