"""A bounded, append-only, on-disk message spool: the store half of store-and-forward.

Layout
    A directory of segment files ``<n>.seg`` (``n`` zero-padded, increasing) and a ``cursor``
    file. A segment starts with the 8-byte magic ``DCTWSPL1`` and holds records; a record is
    ``>II`` (body length, CRC-32 of the body) then the body: ``>H`` topic length, the topic
    (UTF-8) and the payload. ``cursor`` (JSON ``{"segment": n, "offset": k}``) names the first
    record the broker has not acknowledged; everything before it is done, and a segment wholly
    before it is deleted.

Durability (fsync policy)
    :meth:`Spool.append` writes into the tail segment's buffer; :meth:`Spool.flush` (the runner
    calls it once per poll) hands the bytes to the OS and, with ``fsync=True`` (default),
    fsyncs the segment: group commit, one fsync per poll. A new segment also fsyncs the
    directory. A process crash loses nothing that was flushed; a power loss loses at most the
    poll being written. The cursor is replaced atomically (write, rename) and not fsynced: after
    a power loss it may point a little back, and those messages go out again (the ingest drops a
    repeated (kind, source, seq, ts)). A torn record at the end of the tail (crash mid-write)
    fails its length or CRC check and is cut off at open.

Bound
    At most ``max_bytes`` of not-yet-acknowledged records (header bytes included). When an
    append would pass it, the spool is full: the message is refused (**drop-newest**) and
    :meth:`append` returns False; the caller logs and counts it. Drop-newest keeps what is
    spooled contiguous and in order, never deletes data the sender may be transmitting, and
    leaves one gap per outage, visible in ``seq``. On disk the files may hold up to one more
    segment (``segment_bytes``) of acknowledged records until the tail segment rotates.

One process owns a spool directory at a time (a lock file says so); within it, one thread may
append and another read and commit.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

__all__ = ["Position", "Record", "Spool", "SpoolError"]

MAGIC = b"DCTWSPL1"
_REC = struct.Struct(">II")
_TOPIC = struct.Struct(">H")
_SUFFIX = ".seg"


class SpoolError(RuntimeError):
    """The spool directory cannot be used (locked by another process, unwritable)."""


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where a record starts: segment number and byte offset in it."""

    segment: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """One spooled message and where it lies (``end``: where the next record starts)."""

    pos: Position
    end: Position
    topic: str
    payload: bytes


def _seg_name(n: int) -> str:
    return f"{n:016d}{_SUFFIX}"


class Spool:
    """A bounded on-disk FIFO of (topic, payload) records; see the module docstring.

    Parameters
    ----------
    directory
        Spool directory (created if missing).
    max_bytes
        Bound on the unacknowledged records [bytes].
    segment_bytes
        Size at which the tail segment rotates [bytes] (default ``max_bytes / 8``, within
        64 KiB .. 8 MiB).
    fsync
        fsync the tail segment on every :meth:`flush`.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        segment_bytes: int | None = None,
        fsync: bool = True,
    ):
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or min(max(max_bytes // 8, 64 * 1024), 8 << 20)
        self.fsync = fsync
        self._lock = threading.RLock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lockfile = open(self.directory / "lock", "a+b")  # noqa: SIM115
        except OSError as e:
            raise SpoolError(f"cannot use spool directory {self.directory}: {e}") from None
        try:
            fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockfile.close()
            raise SpoolError(
                f"spool directory {self.directory} is in use by another process"
            ) from None
        self._sizes: dict[int, int] = {}
        self._tail: IO[bytes] | None = None
        self._dirty = False
        self._open()

    # -- opening ------------------------------------------------------------------------------

    def _path(self, n: int) -> Path:
        return self.directory / _seg_name(n)

    def _read_cursor(self) -> Position | None:
        try:
            d = json.loads((self.directory / "cursor").read_text())
            return Position(int(d["segment"]), int(d["offset"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            log.error(
                "spool %s: unreadable cursor (%s); resending from the oldest", self.directory, e
            )
            return None

    def _open(self) -> None:
        segments = sorted(
            int(p.name[: -len(_SUFFIX)])
            for p in self.directory.glob(f"*{_SUFFIX}")
            if p.name[: -len(_SUFFIX)].isdigit()
        )
        cursor = self._read_cursor()
        if cursor is not None:
            for n in [n for n in segments if n < cursor.segment]:
                self._path(n).unlink(missing_ok=True)
            segments = [n for n in segments if n >= cursor.segment]
            if not segments or segments[0] != cursor.segment:
                cursor = None
        for n in list(segments):
            with open(self._path(n), "rb") as f:
                ok = f.read(len(MAGIC)) == MAGIC
            if not ok:
                log.error(
                    "spool %s: %s is not a spool segment; moved aside as .damaged",
                    self.directory,
                    _seg_name(n),
                )
                self._path(n).rename(self._path(n).with_suffix(".damaged"))
                segments.remove(n)
        if cursor is not None and (not segments or segments[0] != cursor.segment):
            cursor = None
        pending = 0
        for i, n in enumerate(segments):
            start = cursor.offset if cursor is not None and n == cursor.segment else len(MAGIC)
            count, good_end = self._scan(n, start)
            size = self._path(n).stat().st_size
            if good_end < size:
                if i == len(segments) - 1:
                    log.warning(
                        "spool %s: cutting a torn record off the end of %s (%d bytes)",
                        self.directory,
                        _seg_name(n),
                        size - good_end,
                    )
                    with open(self._path(n), "r+b") as f:
                        f.truncate(good_end)
                    size = good_end
                else:
                    log.error(
                        "spool %s: %s is damaged after byte %d; its remaining %d bytes are lost",
                        self.directory,
                        _seg_name(n),
                        good_end,
                        size - good_end,
                    )
            self._sizes[n] = size
            pending += count
        if not segments:
            first = cursor.segment if cursor is not None else 1
            self._create(first)
            cursor = Position(first, len(MAGIC))
        elif cursor is None:
            cursor = Position(segments[0], len(MAGIC))
        self._cursor = cursor
        self._pending = pending
        last = max(self._sizes)
        self._tail = open(self._path(last), "ab")  # noqa: SIM115
        self._tail_n = last
        if pending:
            log.info("spool %s: %d message(s) waiting from an earlier run", self.directory, pending)

    def _scan(self, n: int, start: int) -> tuple[int, int]:
        """Count the whole, valid records of segment ``n`` from ``start``; (count, end)."""
        count = 0
        with open(self._path(n), "rb") as f:
            f.seek(start)
            pos = start
            while True:
                rec = self._read_one(f)
                if rec is None:
                    return count, pos
                pos = f.tell()
                count += 1

    @staticmethod
    def _read_one(f: IO[bytes]) -> tuple[str, bytes] | None:
        head = f.read(_REC.size)
        if len(head) < _REC.size:
            return None
        length, crc = _REC.unpack(head)
        body = f.read(length)
        if len(body) < length or zlib.crc32(body) != crc or length < _TOPIC.size:
            return None
        (tlen,) = _TOPIC.unpack_from(body)
        if _TOPIC.size + tlen > length:
            return None
        topic = body[_TOPIC.size : _TOPIC.size + tlen].decode("utf-8", errors="replace")
        return topic, body[_TOPIC.size + tlen :]

    def _create(self, n: int) -> None:
        with open(self._path(n), "xb") as f:
            f.write(MAGIC)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        if self.fsync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._sizes[n] = len(MAGIC)

    # -- state --------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Messages not yet acknowledged."""
        with self._lock:
            return self._pending

    @property
    def cursor(self) -> Position:
        """The first record not yet acknowledged (or the end)."""
        with self._lock:
            return self._cursor

    @property
    def used_bytes(self) -> int:
        """Bytes of not-yet-acknowledged records (what ``max_bytes`` bounds)."""
        with self._lock:
            return self._used()

    def _used(self) -> int:
        return (
            sum(self._sizes.values())
            - len(MAGIC) * len(self._sizes)
            - (self._cursor.offset - len(MAGIC))
        )

    # -- writing ------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes) -> bool:
        """Add one message at the end; False (nothing written) when the spool is full."""
        t = topic.encode()
        body = _TOPIC.pack(len(t)) + t + payload
        size = _REC.size + len(body)
        with self._lock:
            if self._used() + size > self.max_bytes:
                return False
            assert self._tail is not None
            if self._sizes[self._tail_n] >= self.segment_bytes:
                self._rotate()
            self._tail.write(_REC.pack(len(body), zlib.crc32(body)))
            self._tail.write(body)
            self._sizes[self._tail_n] += size
            self._pending += 1
            self._dirty = True
            return True

    def _rotate(self) -> None:
        assert self._tail is not None
        self._flush()
        self._tail.close()
        n = self._tail_n + 1
        self._create(n)
        self._tail = open(self._path(n), "ab")  # noqa: SIM115
        self._tail_n = n

    def flush(self) -> None:
        """Hand appended records to the OS and, with ``fsync``, to the disk."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._tail is None or not self._dirty:
            return
        self._tail.flush()
        if self.fsync:
            os.fsync(self._tail.fileno())
        self._dirty = False

    # -- reading and acknowledging ------------------------------------------------------------

    def read(self, after: Position | None = None, limit: int = 100) -> list[Record]:
        """Up to ``limit`` records from ``after`` (default: the cursor), in order."""
        with self._lock:
            if self._tail is not None and self._dirty:
                self._tail.flush()  # make appended bytes visible to the reader (no fsync)
            pos = after if after is not None and after >= self._cursor else self._cursor
            out: list[Record] = []
            while len(out) < limit:
                size = self._sizes.get(pos.segment)
                if size is None or pos.offset >= size:
                    later = [n for n in self._sizes if n > pos.segment]
                    if not later:
                        break
                    pos = Position(min(later), len(MAGIC))
                    continue
                with open(self._path(pos.segment), "rb") as f:
                    f.seek(pos.offset)
                    while len(out) < limit and f.tell() < size:
                        rec = self._read_one(f)
                        if rec is None:  # damaged: skip the rest of this segment
                            log.error(
                                "spool %s: unreadable record at %s; skipping the rest of it",
                                self.directory,
                                pos,
                            )
                            self._sizes[pos.segment] = pos.offset
                            break
                        end = Position(pos.segment, f.tell())
                        out.append(Record(pos, end, rec[0], rec[1]))
                        pos = end
            return out

    def commit(self, upto: Position, count: int) -> None:
        """Acknowledge ``count`` records ending at ``upto``: move the cursor there, delete the
        segments wholly before it, and save the cursor."""
        with self._lock:
            if upto <= self._cursor:
                return
            self._cursor = upto
            self._pending = max(0, self._pending - count)
            # Past the end of a finished segment: start of the next one.
            later = [n for n in self._sizes if n > upto.segment]
            if later and upto.offset >= self._sizes.get(upto.segment, 0):
                self._cursor = Position(min(later), len(MAGIC))
            for n in [n for n in self._sizes if n < self._cursor.segment]:
                del self._sizes[n]
                self._path(n).unlink(missing_ok=True)
            tmp = self.directory / "cursor.tmp"
            tmp.write_text(
                json.dumps({"segment": self._cursor.segment, "offset": self._cursor.offset})
            )
            os.replace(tmp, self.directory / "cursor")

    def close(self) -> None:
        """Flush and release the directory (idempotent)."""
        with self._lock:
            if self._tail is not None:
                self._flush()
                self._tail.close()
                self._tail = None
            if not self._lockfile.closed:
                fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
                self._lockfile.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
