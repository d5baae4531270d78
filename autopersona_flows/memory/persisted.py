"""Persisted indexes of a JSONL store's banks: what a fresh process loads instead of a bank.

A process that searches a bank of the JSONL store reads it by byte offsets
(`BankLog`): what its index does not cover yet, from the offset it covers to the
end of the file. Each row of the index keeps where its record's line lies, and a
search reads back only the records it returns. Beside the bank, for each embedder,
two files hold the index of a bank of `BankLog.min_rows` records or more::

    users/<key>/persona.<tag>.index             the index (atomically replaced)
    users/<key>/persona.<tag>.<token>.vectors   unit vectors, float32 rows, appended

The ``.index`` file starts with a JSON stamp: the user, layer and embedder, the
bank's generation, the offset the index covers and a digest of the bank's bytes
just before that offset, the vectors file's token and row count, and where each
array lies in the file, which ends with the token again. A fresh process loads it
(memory-mapped), checks every part of the stamp against the bank and the files,
and reads the bank from the covered offset on. A stale index (another generation
after a compaction or restore, other bytes before the offset), a torn one (cut
short, a vectors file shorter than its rows) or a foreign one (another user,
layer or embedder) is never served: the bank is read whole and the index saved
anew. A record read back must have the id its row says, or the read fails
(`MemoryStoreCorruptionError`) and the index file is removed.

Index files are written by searches, not by writes to the bank: after reading
`BankLog.save_every` entries or more that the saved index does not cover. The
vectors file grows by the new rows only (vectors of a row never change), then the
``.index`` file is replaced (temporary file, fsync, rename); a crash between the
two leaves rows past the count, cut at the next save. One process saves at a time
(an advisory lock, not waited for); removing every index file loses only time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from autopersona_flows.errors import MemoryStoreCorruptionError
from autopersona_flows.memory._banks import Bank, LogEntry, scan_entries
from autopersona_flows.memory._files import atomic_write, fsync_dir, stat_key, write_all
from autopersona_flows.memory.embedders import Embedder
from autopersona_flows.memory.index import BankIndex
from autopersona_flows.memory.protocol import ChangeSet
from autopersona_flows.memory.records import MemoryRecord

__all__ = ["BankLog", "LogRead", "index_tag"]

_log = logging.getLogger(__name__)

_MAGIC = b"autopersona-bank-index\n"
_VERSION = 1
_CHECKED = 512  # bytes of the bank before the covered offset whose digest is stamped
_ALIGN = 64


def index_tag(embedder: Embedder) -> str:
    """The part of an index file's name that tells embedders apart."""
    return hashlib.sha256(f"{embedder.name}\0{embedder.dim}".encode()).hexdigest()[:16]


class _LogFile:
    """An open bank file, read by offsets; closed once no index reads from it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass
class LogRead:
    """What a `BankLog` read of a bank since a cursor found.

    Attributes:
        cursor: Pass it to the next read (``generation:offset``).
        full: The index must start over: from ``saved`` if given, else empty.
        entries: The complete entries past the cursor (or ``saved``), in file order.
        saved: A saved index's arrays and values to load first (see `BankIndex.load`).
        file: The bank file the entries and rows lie in (``None``: no bank file).
    """

    cursor: str
    full: bool
    entries: list[LogEntry] = field(default_factory=list)
    saved: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None
    file: _LogFile | None = None


class BankLog:
    """Reads one bank of a JSONL store by byte offsets, and saves and loads its indexes.

    Args:
        bank: The bank.
    """

    min_rows: ClassVar[int] = 1000
    """An index of fewer live records is not saved: reading such a bank is quick."""
    save_every: ClassVar[int] = 64
    """An index is saved once it has read this many entries the saved one does not cover."""

    def __init__(self, bank: Bank) -> None:
        self.bank = bank
        self._lock = threading.Lock()
        # The file state last read, its cursor, and the file itself: an unchanged file
        # is answered from these after one `stat`.
        self._seen: tuple[tuple[int, ...], str, _LogFile | None] | None = None

    # -- reading -----------------------------------------------------------------------

    def read(self, cursor: str | None, embedder: Embedder) -> LogRead:
        """What changed in the bank since ``cursor`` (``None``: a new index).

        Raises:
            MemoryStoreCorruptionError: If the bank's header or an entry past what
                the index covers is malformed.
        """
        with self._lock:
            seen = self._seen
        if seen is not None and cursor == seen[1] and self._stat() == seen[0]:
            return LogRead(cursor, full=False, file=seen[2])
        bank = self.bank
        with bank.hold(exclusive=False):
            opened = bank.open_log()
            if opened is None:
                return LogRead("none", full=cursor != "none")
            file, header, start = opened
            with file:
                log = _LogFile(os.dup(file.fileno()))
                key = stat_key(os.fstat(file.fileno()))
            generation = header.generation
            known, _, offset_text = (cursor or "").partition(":")
            if known == generation and offset_text.isdigit() and int(offset_text) <= key[2]:
                read = self._tail(log, generation, int(offset_text), key[2], full=False)
            else:
                saved = self._load(log, generation, start, key[2], embedder)
                offset = start if saved is None else int(saved[1]["offset"])
                read = self._tail(log, generation, offset, key[2], full=True)
                read.saved = saved
        if read.cursor.endswith(f":{key[2]}"):  # no torn tail: an unchanged file needs no read
            with self._lock:
                self._seen = (key, read.cursor, log)
        return read

    def _stat(self) -> tuple[int, ...] | None:
        try:
            return stat_key(self.bank.path.stat())
        except OSError:
            return None

    def _tail(
        self, log: _LogFile, generation: str, offset: int, size: int, *, full: bool
    ) -> LogRead:
        data = log.read(offset, size - offset) if size > offset else b""
        entries, end = scan_entries(data, offset, self.bank.path, self.bank.layer)
        return LogRead(f"{generation}:{end}", full=full, entries=entries, file=log)

    def reader(self, log: _LogFile) -> Callable[[int, int, str], MemoryRecord]:
        """A `BankIndex.reader` reading records back from ``log``."""
        path, layer = self.bank.path, self.bank.layer

        def read(offset: int, length: int, memory_id: str) -> MemoryRecord:
            line = log.read(offset, length)
            try:
                record = MemoryRecord.model_validate_json(line)
            except ValueError:
                record = None
            if record is None or record.id != memory_id or record.layer != layer:
                self._drop_indexes()
                raise MemoryStoreCorruptionError(
                    path,
                    None,
                    f"the line at byte {offset} is not memory {memory_id!r}, which the index "
                    "says it is: the bank changed in place; its index files were removed",
                )
            return record

        return read

    def apply(self, index: BankIndex, read: LogRead) -> None:
        """Bring ``index`` up to date with ``read``, and save it if it is time to.

        Entries apply as the store's change feed would give them: each changed id
        once, where it first changed, at its last version (a full read keeps a
        bank's order: a deleted id that comes back comes back at the end).
        """
        if read.full:
            index.cursor = None  # until the whole read is applied: a failure reads it again
            if read.saved is not None:
                index.load(*read.saved)
                index.unsaved = 0
            else:
                index.apply(ChangeSet(cursor="", full=True, records=[]))
                index.cursor = None
                index.unsaved = self.save_every  # read whole: save it
        index.reader = None if read.file is None else self.reader(read.file)
        latest: dict[str, LogEntry] = {}
        for entry in read.entries:
            if entry.record is None:
                assert entry.deleted is not None
                if read.full and read.saved is None:
                    latest.pop(entry.deleted, None)
                else:
                    latest[entry.deleted] = entry
            else:
                latest[entry.record.id] = entry
        index.remove(memory_id for memory_id, entry in latest.items() if entry.record is None)
        added = [entry for entry in latest.values() if entry.record is not None]
        index.add_records(
            [entry.record for entry in added if entry.record is not None],
            [(entry.offset, entry.length) for entry in added],
        )
        index.cursor = read.cursor
        index.unsaved += len(read.entries)
        if (
            read.file is not None
            and len(index) >= self.min_rows
            and index.unsaved >= self.save_every
        ):
            self.save(index, read.file)
            index.unsaved = 0  # saved, or failed: tried again after as many entries

    # -- the index files ---------------------------------------------------------------

    def _paths(self, embedder: Embedder) -> tuple[Path, Path]:
        tag = index_tag(embedder)
        base = self.bank.folder / f"{self.bank.layer}.{tag}"
        return base.with_name(f"{base.name}.index"), base.with_name(f"{base.name}.index.lock")

    def _vectors_path(self, embedder: Embedder, token: str) -> Path:
        return self.bank.folder / f"{self.bank.layer}.{index_tag(embedder)}.{token}.vectors"

    def _drop_indexes(self) -> None:
        for path in self.bank.folder.glob(f"{self.bank.layer}.*.index"):
            with contextlib.suppress(OSError):
                path.unlink()

    def _check(self, log: _LogFile, start: int, offset: int) -> str:
        """The digest stamped for a bank covered up to ``offset``."""
        begin = max(start, offset - _CHECKED)
        return hashlib.sha256(log.read(begin, offset - begin)).hexdigest()

    def _load(
        self, log: _LogFile, generation: str, start: int, size: int, embedder: Embedder
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The saved index of the bank for ``embedder``, if it is whole and current."""
        path, _ = self._paths(embedder)
        try:
            with self.bank.root.reader(path) as file:
                length = os.fstat(file.fileno()).st_size
                data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if length else b""
        except (FileNotFoundError, MemoryStoreCorruptionError):
            return None
        except OSError as exc:
            _log.warning("cannot read %s (%s); the bank is read whole", path, exc)
            return None
        try:
            return self._parse(
                data, log, generation=generation, start=start, size=size, embedder=embedder
            )
        except (KeyError, TypeError, ValueError) as exc:  # a stamp that lies about its parts
            _log.warning("%s is malformed (%r); the bank is read whole", path, exc)
            return None
        except _UnusableError as exc:
            _log.info("%s is not used (%s); the bank is read whole", path, exc)
            return None

    def _parse(
        self,
        data: Any,
        log: _LogFile,
        *,
        generation: str,
        start: int,
        size: int,
        embedder: Embedder,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if data[: len(_MAGIC)] != _MAGIC:
            raise _UnusableError("not an index file")
        end = data.find(b"\n", len(_MAGIC))
        try:
            stamp = json.loads(bytes(data[len(_MAGIC) : end]))
        except ValueError:
            raise _UnusableError("torn: its stamp does not parse") from None
        if not isinstance(stamp, dict) or stamp.get("version") != _VERSION:
            raise _UnusableError("another version")
        token = stamp["token"]
        if len(data) != stamp["length"] or data[-len(token) :] != token.encode():
            raise _UnusableError("torn: it is cut short")
        bank = self.bank
        owner = (stamp["user_id"], stamp["layer"], stamp["embedder"], stamp["dim"])
        if owner != (bank.user_id, bank.layer, embedder.name, embedder.dim):
            raise _UnusableError(f"foreign: it indexes {owner}")
        offset = stamp["offset"]
        if stamp["generation"] != generation or not start <= offset <= size:
            raise _UnusableError("stale: the bank was rewritten since")
        if self._check(log, start, offset) != stamp["check"]:
            raise _UnusableError("stale: the bank's bytes before the covered offset differ")
        arrays = {
            name: np.frombuffer(data, dtype=dtype, count=count, offset=at).reshape(shape)
            for name, (dtype, shape, count, at) in stamp["arrays"].items()
        }
        rows = stamp["rows"]
        arrays["vectors"] = self._vectors(embedder, token, rows)
        if any(len(arrays[name]) != rows for name in ("live", "where", "at", "ids", "digests")):
            raise _UnusableError("torn: its arrays disagree on the row count")
        values = {name: stamp[name] for name in ("layout", "total_length", "offset")}
        for name in ("terms", "contexts"):
            at, count = stamp["texts"][name]
            values[name] = bytes(data[at : at + count]).decode()
        return arrays, values

    def _vectors(self, embedder: Embedder, token: str, rows: int) -> np.ndarray:
        if not rows:
            return np.zeros((0, embedder.dim), dtype=np.float32)
        path = self._vectors_path(embedder, token)
        need = rows * embedder.dim * 4
        try:
            with self.bank.root.reader(path) as file:
                if os.fstat(file.fileno()).st_size < need:
                    raise _UnusableError("torn: its vectors file is shorter than its rows")
                # Populated now: one call faults in what the first search reads anyway.
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapped = mmap.mmap(file.fileno(), need, flags=flags, prot=mmap.PROT_READ)
        except (FileNotFoundError, MemoryStoreCorruptionError):
            raise _UnusableError("its vectors file is missing") from None
        return np.frombuffer(mapped, dtype="<f4").reshape(rows, embedder.dim)

    def save(self, index: BankIndex, log: _LogFile) -> bool:
        """Save ``index`` (up to date with ``log``) beside the bank; whether it was saved.

        Skipped, not waited for, while another thread or process saves this index.
        """
        generation, _, offset_text = (index.cursor or "").partition(":")
        if not offset_text.isdigit():
            return False
        path, lock_path = self._paths(index.embedder)
        bank = self.bank
        try:
            fd = bank.root.open(lock_path, os.O_RDWR | os.O_CREAT)
        except (FileNotFoundError, MemoryStoreCorruptionError):
            return False  # the user was erased meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            self._write(index, log, path, generation, int(offset_text))
        except OSError as exc:
            _log.warning("saving the index %s failed (%s); it is saved later", path, exc)
            return False
        finally:
            os.close(fd)
        return True

    def _write(
        self, index: BankIndex, log: _LogFile, path: Path, generation: str, offset: int
    ) -> None:
        # Only the holder of the index lock writes these: any left over are a crash's.
        for stale in self.bank.folder.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        header = log.read(0, 4096)
        start = header.find(b"\n") + 1
        token, done = self._previous(path, index.layout, index.embedder)
        if token is None:
            token, done = secrets.token_hex(8), 0
        arrays, values = index.state(since=done)
        vectors = arrays.pop("vectors")  # rows from ``done`` on: what the file lacks
        rows = len(arrays["live"])
        target = self._vectors_path(index.embedder, token)
        fd = self.bank.root.open(target, os.O_WRONLY | os.O_CREAT)
        try:
            os.ftruncate(fd, done * index.embedder.dim * 4)  # rows past the count: a crash
            os.lseek(fd, 0, os.SEEK_END)
            write_all(fd, np.ascontiguousarray(vectors, dtype="<f4").tobytes())
            os.fsync(fd)
        finally:
            os.close(fd)
        if not done:
            fsync_dir(target.parent)
        stamp: dict[str, Any] = {
            "version": _VERSION,
            "user_id": self.bank.user_id,
            "layer": self.bank.layer,
            "embedder": index.embedder.name,
            "dim": index.embedder.dim,
            "generation": generation,
            "offset": offset,
            "check": self._check(log, start, offset),
            "token": token,
            "rows": rows,
            "layout": values["layout"],
            "total_length": values["total_length"],
        }
        atomic_write(path, _container(stamp, arrays, values), make_parents=False)
        pattern = f"{self.bank.layer}.{index_tag(index.embedder)}.*.vectors"
        for old in self.bank.folder.glob(pattern):
            if old.name != target.name:
                with contextlib.suppress(OSError):
                    old.unlink()

    def _previous(self, path: Path, layout: str, embedder: Embedder) -> tuple[str | None, int]:
        """The saved vectors file to append to: its token and row count, if it fits."""
        try:
            with self.bank.root.reader(path) as file:
                line = file.read(len(_MAGIC) + 65536)
        except (FileNotFoundError, MemoryStoreCorruptionError):
            return None, 0
        end = line.find(b"\n", len(_MAGIC))
        try:
            stamp = json.loads(line[len(_MAGIC) : end])
        except ValueError:
            return None, 0
        if not isinstance(stamp, dict) or stamp.get("layout") != layout:
            return None, 0
        if stamp.get("embedder") != embedder.name or stamp.get("dim") != embedder.dim:
            return None, 0
        return str(stamp["token"]), int(stamp["rows"])


class _UnusableError(Exception):
    """A saved index that must not be served: the reason."""


def _container(
    stamp: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]
) -> bytes:
    """The bytes of an ``.index`` file: magic, stamp line, aligned arrays and texts, token."""
    texts = {name: values[name].encode() for name in ("terms", "contexts")}
    # Where each part lies depends on the stamp's length, which holds those places:
    # lay the parts out after a generous fixed-size stamp line.
    parts: list[tuple[str, bytes]] = [
        (n, np.ascontiguousarray(a).tobytes()) for n, a in arrays.items()
    ]
    parts += [(f"text:{n}", t) for n, t in texts.items()]
    layout: dict[str, int] = {}
    stamp_room = 1024 + 128 * len(parts)
    position = len(_MAGIC) + stamp_room
    for name, blob in parts:
        position += -position % _ALIGN
        layout[name] = position
        position += len(blob)
    token = stamp["token"].encode()
    stamp = dict(stamp)
    stamp["arrays"] = {
        name: (array.dtype.str, list(array.shape), int(array.size), layout[name])
        for name, array in arrays.items()
    }
    stamp["texts"] = {name: (layout[f"text:{name}"], len(text)) for name, text in texts.items()}
    stamp["length"] = position + len(token)
    line = json.dumps(stamp, separators=(",", ":")).encode()
    if len(line) + 1 > stamp_room:
        raise ValueError("the index stamp outgrew its room")
    out = bytearray(_MAGIC + line.ljust(stamp_room - 1) + b"\n")
    for name, blob in parts:
        out += bytes(layout[name] - len(out))
        out += blob
    out += token
    return bytes(out)
