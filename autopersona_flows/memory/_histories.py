"""One bank's change history: ``<layer>.history.jsonl``, one `MemoryChange` a line.

`autopersona_flows.memory._banks.Bank` owns one `History` and calls it with the
bank's lock held; `JsonlMemoryStore` is the public face of both.
"""

from __future__ import annotations

import builtins
import logging
import os
from collections import deque
from pathlib import Path

from pydantic import ValidationError

from autopersona_flows import _json
from autopersona_flows.errors import MemoryStoreCorruptionError
from autopersona_flows.memory._files import (
    StoreRoot,
    fsync_dir,
    keep_as_corrupt,
    stat_key,
    write_all,
)
from autopersona_flows.memory.records import MemoryLayer
from autopersona_flows.memory.snapshots import MemoryChange

__all__ = ["History", "diagnose", "same_change"]

_log = logging.getLogger(__name__)


def diagnose(raw: bytes, error: ValidationError) -> str:
    """Say in plain words why a line of a bank or a history failed to parse."""
    try:
        value = _json.loads(raw)
    except _json.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return f"a line must be a JSON object, found {type(value).__name__}"
    return f"invalid entry: {error}"


def same_change(a: MemoryChange, b: MemoryChange) -> bool:
    """Whether two entries record the same change; reason and provenance aside.

    A change recovered from the bank's log has neither: they were never written there.
    """
    return (a.operation, a.at, a.before, a.after) == (b.operation, b.at, b.before, b.after)


class History:
    """The change history of one bank, and what this process has checked of it.

    A change is appended here after the bank entry that makes it, so the history
    never holds a change the bank does not have (see `Bank.settle` for the other
    way round). A torn last line (a writer killed mid-append) is not part of the
    history: reads skip it and the next append cuts it off. Any other bad line is
    corruption, and `check` refuses the bank's writes until a person repairs the
    file or a restore sets it aside (`set_aside`).
    """

    def __init__(self, path: Path, layer: MemoryLayer, *, root: StoreRoot) -> None:
        self.path = path
        self.layer: MemoryLayer = layer
        self.root = root
        self._forget()

    def forget(self) -> None:
        """Drop what this process knows of the file (e.g. after an erase)."""
        self._forget()

    def _forget(self) -> None:
        self._key: tuple[int, ...] | None = None  # the file as last checked
        self._checked = 0  # end of the last complete line checked
        self._lines = 0  # complete lines up to _checked
        self._recent: deque[MemoryChange] = deque(maxlen=2)  # the last two of those lines

    def _parse(self, raw: bytes, line_no: int) -> MemoryChange:
        try:
            change = MemoryChange.model_validate_json(raw)
        except ValidationError as exc:
            raise MemoryStoreCorruptionError(self.path, line_no, diagnose(raw, exc)) from None
        after = change.after
        others = {record.layer for record in (change.before, after) if record} - {self.layer}
        if others:
            raise MemoryStoreCorruptionError(
                self.path,
                line_no,
                f"a change of a {others.pop()} record in the {self.layer} history",
            )
        if after is not None and after.id != change.before.id:
            raise MemoryStoreCorruptionError(
                self.path, line_no, f"an update of {change.before.id!r} to another record"
            )
        return change

    def read(self, *, landed: MemoryChange | None = None) -> builtins.list[MemoryChange]:
        """Every change, oldest first, ending with ``landed`` if it is not there yet.

        Args:
            landed: The change the bank's last entry made (see `recover`).
        """
        try:
            file = self.root.reader(self.path)
        except FileNotFoundError:
            return []
        with file:
            data = file.read()
        lines = data.split(b"\n")[:-1]  # whatever follows the last newline is torn
        changes = [self._parse(raw, line_no) for line_no, raw in enumerate(lines, start=1)]
        if landed is not None and not any(same_change(landed, c) for c in changes[-2:]):
            changes.append(landed)  # in the bank already: `recover` writes its entry
        return changes

    def check(self) -> None:
        """Make sure every complete line is a valid change, before a write to the bank.

        Only what was appended since the last check of the same file is read, so a
        bank's writes cost one ``lstat`` here while its history does not change.

        Raises:
            MemoryStoreCorruptionError: Naming the first bad line.
        """
        try:
            if stat_key(os.lstat(self.path)) == self._key:
                return
            file = self.root.reader(self.path)
        except FileNotFoundError:  # no history yet (or a link to one not made yet)
            self._forget()
            return
        with file:
            key = stat_key(os.fstat(file.fileno()))
            if self._key is None or key[:2] != self._key[:2] or key[2] <= self._checked:
                # Another file, or one changed without growing (edited in place): start over.
                self._forget()
            self._key = None  # until this check succeeds
            file.seek(self._checked)
            data = file.read()
        pos = 0
        while (end := data.find(b"\n", pos)) >= 0:
            self._recent.append(self._parse(data[pos:end], self._lines + 1))
            self._lines += 1
            self._checked += end + 1 - pos
            pos = end + 1
        self._key = key

    def append(self, change: MemoryChange) -> None:
        """Append one change durably, cutting a torn last line first."""
        fd = self.root.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            stat = os.fstat(fd)
            size = stat.st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                size = _after_last_newline(fd, size)
                os.ftruncate(fd, size)
            write_all(fd, change.model_dump_json().encode() + b"\n")
            os.fsync(fd)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.st_size:
            fsync_dir(self.path.parent)  # the file may be new: make its name durable too
        self._recent.append(change)
        if self._key is not None and self._key[:2] == stat_key(after)[:2] and size == self._checked:
            # Nothing unchecked came before this line: the next check need not read it.
            self._checked = after.st_size
            self._lines += 1
            self._key = stat_key(after)

    def recover(self, landed: MemoryChange) -> None:
        """Append the entry of a change in the bank, unless the history ends with it.

        Call after `check`. A writer killed between its bank entry and this entry
        leaves it out; recovered from the bank's log, it has no reason (that was
        never written anywhere). The last two entries are looked at, not one: a
        history from before entries followed their bank entry may end with one for
        a change that never landed.
        """
        if not any(same_change(landed, recorded) for recorded in self._recent):
            self.append(landed)
            _log.warning(
                "%s: recorded the %s of %s, left out by an interrupted write",
                self.path,
                landed.operation,
                landed.before.id,
            )

    def set_aside(self) -> Path:
        """Move a corrupt history out of the way; the bank starts a fresh, empty one.

        Nothing is deleted: the file is kept beside the bank under a timestamped
        ``.corrupt`` name, for a person to read.

        Returns:
            Where the corrupt history now is.
        """
        kept = keep_as_corrupt(self.path)
        self.path.unlink(missing_ok=True)  # a folder in its place was moved, not linked
        fsync_dir(self.path.parent)
        self._forget()
        _log.warning("%s was corrupt; kept it as %s and started a fresh history", self.path, kept)
        return kept


def _after_last_newline(fd: int, size: int, chunk: int = 1 << 20) -> int:
    """The offset just past the last newline before ``size`` (0 if there is none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0
