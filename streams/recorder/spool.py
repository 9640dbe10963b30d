"""The recorder's local spool: facts the broker could not take yet, on disk, in order.

One append-only file of JSON lines per recorder (``<dir>/<name>.spool``), each line one fact
as the contract record's JSON with its record type, and a cursor file beside it
(``<name>.spool.cursor``) holding the byte offset of the first fact not yet delivered. Why
this shape:

- **JSON, not Avro bytes**: a spooled fact must not depend on the schema registry, which may
  be the part that is down; it is encoded when it is sent.
- **Append-only, read from a cursor**: the facts are replayed in the order they were
  recorded, and a fact recorded while the spool is being replayed is appended behind the
  others, so it cannot overtake an older fact of its execution.
- **fsync policy**: every write is handed to the operating system at once (a crash of the
  agent process loses no spooled fact), and the file is fsynced at most ``fsync_interval``
  apart and on close (a crash of the machine may lose the facts of the last interval). The
  cursor is replaced atomically after each delivered batch; after a crash it may point before
  facts already delivered, which are then sent again: the same event ids, one fact.
- **One process per spool**: the file is locked (``flock``); a second recorder on the same
  file is refused at start, naming it, rather than interleaving two processes' lines.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.contracts.models.base import Record
from streams.contracts.models.events import INPUT_MODELS

log = logging.getLogger("vigil.recorder")

_MODELS: dict[str, type[Record]] = {m.avro_name: m for m in INPUT_MODELS}


class SpoolInUse(RuntimeError):
    """Another process holds this spool file."""


@dataclass(frozen=True, slots=True)
class Spooled:
    """One fact read back from the spool, and the byte offset just after its line."""

    n: int
    topic: str
    record: Record
    end: int


def line_of(n: int, topic: str, record: Record) -> bytes:
    body = {
        "n": n,
        "topic": topic,
        "type": record.avro_name,
        "record": record.model_dump(mode="json"),
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def parse_line(text: bytes) -> tuple[int, str, Record]:
    body: dict[str, Any] = json.loads(text)
    model = _MODELS[body["type"]]
    return int(body["n"]), str(body["topic"]), model.model_validate(body["record"])


class Spool:
    """The spool file of one recorder, used by its delivery thread alone."""

    def __init__(self, path: Path, fsync_interval: float = 1.0) -> None:
        self.path = path
        self.cursor_path = path.with_name(path.name + ".cursor")
        self.fsync_interval = fsync_interval
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 - held open for the recorder's life
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise SpoolInUse(
                f"spool {path} is in use by another process: give each recorder process its "
                "own spool (VIGIL_RECORDER_SPOOL_DIR or VIGIL_RECORDER_NAME)"
            ) from None
        self._last_sync = time.monotonic()
        self._dirty = False
        #: lines handed to the OS and not fsynced yet
        self._unsynced = False
        #: offsets of unreadable lines already copied to the rejected file
        self._rejected: set[int] = set()
        self.cursor = self._read_cursor()
        #: facts between the cursor and the end of the file
        self.backlog = sum(1 for _ in self.read(self.cursor)) if self.size() > self.cursor else 0

    def _read_cursor(self) -> int:
        try:
            value = int(self.cursor_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            value = 0
        return max(0, min(value, self.size()))

    def size(self) -> int:
        return os.fstat(self._file.fileno()).st_size if not self._file.closed else 0

    def append(self, n: int, topic: str, record: Record) -> None:
        self._file.write(line_of(n, topic, record))
        self.backlog += 1
        self._dirty = True

    def sync(self, force: bool = False) -> None:
        """Hand the written lines to the OS at once, and fsync them once the interval since
        the last fsync has passed (called on every turn of the delivery thread)."""
        if self._dirty:
            self._file.flush()
            self._dirty = False
            self._unsynced = True
        if not (self._unsynced or force):
            return
        now = time.monotonic()
        if force or now - self._last_sync >= self.fsync_interval:
            os.fsync(self._file.fileno())
            self._last_sync = now
            self._unsynced = False

    def read(self, start: int, limit: int | None = None) -> Iterator[Spooled]:
        """The facts from byte ``start`` on (a torn last line, from a crash, is skipped)."""
        self._file.flush()
        with open(self.path, "rb") as f:
            f.seek(start)
            pos = start
            count = 0
            for text in f:
                end = pos + len(text)
                if not text.endswith(b"\n"):
                    return
                pos = end
                try:
                    n, topic, record = parse_line(text)
                except (ValueError, KeyError) as exc:
                    # not a line this version can read (a newer version's record type, a
                    # hand edit): not sent, but copied to the rejected file and said, once
                    self._unreadable(text, end - len(text), exc)
                    continue
                yield Spooled(n, topic, record, end)
                count += 1
                if limit is not None and count >= limit:
                    return

    def _unreadable(self, text: bytes, offset: int, exc: Exception) -> None:
        if offset in self._rejected:
            return
        self._rejected.add(offset)
        rejected = self.path.with_name(self.path.name + ".rejected")
        with open(rejected, "ab") as f:
            f.write(text)
        log.error(
            "recorder spool %s: the line at byte %d is unreadable (%s); copied to %s",
            self.path,
            offset,
            exc,
            rejected,
        )

    def advance(self, position: int, delivered: int) -> None:
        """The facts before ``position`` are delivered: move the cursor there (atomically)."""
        self.cursor = position
        self.backlog = max(0, self.backlog - delivered)
        tmp = self.cursor_path.with_name(self.cursor_path.name + ".tmp")
        tmp.write_text(str(position))
        os.replace(tmp, self.cursor_path)

    def drained(self) -> bool:
        self._file.flush()
        return self.cursor >= self.size()

    def reset(self) -> None:
        """Everything delivered: empty the file and the cursor."""
        self._file.flush()
        self._file.truncate(0)
        os.fsync(self._file.fileno())
        self.cursor = 0
        self.backlog = 0
        self._rejected.clear()
        self.cursor_path.unlink(missing_ok=True)

    def rewrite(self, head: list[tuple[int, str, Record]], skip: set[int]) -> None:
        """Put ``head`` (older facts not in the file) before the undelivered rest, leaving out
        the lines ending at an offset in ``skip`` (delivered past the cursor): on close, the
        file then holds exactly what is still to send, oldest first."""
        rest = [s for s in self.read(self.cursor) if s.end not in skip]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            for n, topic, record in head:
                f.write(line_of(n, topic, record))
            for s in rest:
                f.write(line_of(s.n, s.topic, s.record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        # the lock is on the old inode: take the new file, locked, before anyone else can
        old = self._file
        self._file = open(self.path, "ab")  # noqa: SIM115
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        old.close()
        self.cursor_path.unlink(missing_ok=True)
        self.cursor = 0
        self.backlog = len(head) + len(rest)

    def close(self) -> None:
        if self._file.closed:
            return
        self.sync(force=True)
        self._file.close()
