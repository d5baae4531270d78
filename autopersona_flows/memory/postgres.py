"""A memory store in PostgreSQL, for many workers on many machines.

Needs the ``postgres`` extra (psycopg 3): ``pip install 'autopersona-flows[postgres]'``.

Three tables, created on first use (idempotently, under an advisory lock, so several
processes may start at once):

* ``autopersona_banks``: one row per (user, layer): its ``generation`` (replaced when
  the bank is restored wholesale), ``last_seq``, the change sequence of its last
  write, and ``unverified``, set by a trigger when a row of the bank was written by
  anything but this store;
* ``autopersona_memories``: the live records, as the exact JSON bytes the JSONL
  store writes (``bytea``: PostgreSQL text cannot hold NUL, JSON strings can), with
  ``position`` (insertion order) and ``seq`` (the change that last wrote it);
* ``autopersona_history``: superseded and deleted versions, which also feed the
  ``deleted`` part of `changes`.

User ids are stored as their UTF-8 bytes, and every statement filters on them: no
code path reads across users. Every write runs in one transaction that first takes
a transaction-level advisory lock on its (user, layer), so writers from any number
of processes are serialised per bank and change sequences commit in order within a
bank; `locked` holds the same lock at session level across several calls. Reads that
must agree with each other (`changes`, `snapshot`) run in one repeatable-read
transaction.

A corrupt row refuses every write to its bank, as a corrupt line does in the JSONL
store: rows come only from this store unless someone writes them by hand (or with
another tool), and a trigger marks the bank of every row written that way; the next
write to a marked bank reads and checks all its rows and history first, and raises
`MemoryStoreCorruptionError` naming the row, changing nothing, if one is not a sound
record of its layer. Writes to unmarked banks pay nothing for this. Every read
checks the rows it returns.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from autopersona_flows.errors import (
    DuplicateMemoryError,
    MemoriesExistError,
    MemoryNotFoundError,
    MemoryStoreCorruptionError,
    MemoryStoreError,
    StoreUnavailableError,
)
from autopersona_flows.memory.protocol import BankSearch, ChangeSet, Erasure, Found
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import (
    LAYERS,
    Embedding,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    as_content,
    as_record,
    content_type,
)
from autopersona_flows.memory.snapshots import MemoryChange, MemorySnapshot
from autopersona_flows.memory.users import check_user_id

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "PostgresMemoryStore needs psycopg 3: pip install 'autopersona-flows[postgres]'"
    ) from exc

from autopersona_flows.memory import postgres_index, postgres_search  # after psycopg's message

__all__ = ["PostgresMemoryStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS autopersona_banks (
    user_id bytea NOT NULL,
    layer text NOT NULL,
    generation text NOT NULL,
    last_seq bigint NOT NULL DEFAULT 0,
    unverified boolean NOT NULL DEFAULT false,
    PRIMARY KEY (user_id, layer)
);
CREATE SEQUENCE IF NOT EXISTS autopersona_seq;
CREATE TABLE IF NOT EXISTS autopersona_memories (
    user_id bytea NOT NULL,
    layer text NOT NULL,
    id text NOT NULL,
    position bigint NOT NULL,
    seq bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (user_id, layer, id)
);
CREATE INDEX IF NOT EXISTS autopersona_memories_seq
    ON autopersona_memories (user_id, layer, seq);
CREATE TABLE IF NOT EXISTS autopersona_history (
    user_id bytea NOT NULL,
    layer text NOT NULL,
    seq bigint NOT NULL,
    id text NOT NULL,
    operation text NOT NULL,
    change bytea NOT NULL,
    PRIMARY KEY (user_id, layer, seq)
);
DO $$ BEGIN
    -- Only when missing: replacing a trigger locks its table against running writers.
    IF NOT EXISTS (
        SELECT FROM information_schema.columns WHERE table_schema = current_schema()
        AND table_name = 'autopersona_banks' AND column_name = 'unverified'
    ) THEN  -- tables of an older version: each bank is checked once, at its next write
        ALTER TABLE autopersona_banks ADD COLUMN unverified boolean NOT NULL DEFAULT true;
        ALTER TABLE autopersona_banks ALTER COLUMN unverified SET DEFAULT false;
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_trigger WHERE tgname = 'autopersona_history_written_elsewhere'
        AND tgrelid = 'autopersona_history'::regclass
    ) THEN
        CREATE OR REPLACE FUNCTION autopersona_written_elsewhere() RETURNS trigger
        LANGUAGE plpgsql SET search_path FROM CURRENT AS $f$ BEGIN
            INSERT INTO autopersona_banks (user_id, layer, generation, unverified)
            VALUES (NEW.user_id, NEW.layer, substr(md5(random()::text), 1, 16), true)
            ON CONFLICT (user_id, layer) DO UPDATE SET unverified = true;
            RETURN NULL;
        END $f$;
        CREATE OR REPLACE TRIGGER autopersona_memories_written_elsewhere
            AFTER INSERT OR UPDATE ON autopersona_memories FOR EACH ROW
            WHEN (current_setting('autopersona.writer', true) IS DISTINCT FROM 'store')
            EXECUTE FUNCTION autopersona_written_elsewhere();
        CREATE OR REPLACE TRIGGER autopersona_history_written_elsewhere
            AFTER INSERT OR UPDATE ON autopersona_history FOR EACH ROW
            WHEN (current_setting('autopersona.writer', true) IS DISTINCT FROM 'store')
            EXECUTE FUNCTION autopersona_written_elsewhere();
    END IF;
END $$;
"""
_REPAIR_ROW = (
    "fix or delete the row; restoring a snapshot with replace (`autopersona import --replace`) "
    "replaces the user's memory rows, not their history"
)
_SCHEMA_LOCK = 0x6175_746F_7065  # "autope": serialises concurrent first uses


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _reachable(
    method: Callable[Concatenate[PostgresMemoryStore, _P], _R],
) -> Callable[Concatenate[PostgresMemoryStore, _P], _R]:
    """Raise a lost or refused connection as `StoreUnavailableError`, worth a retry.

    psycopg raises ``OperationalError`` for what the server or the network did (a
    refused or dropped connection, a shutdown, a cancelled statement), not for
    what the call asked; the transaction it interrupted was rolled back.
    """

    @functools.wraps(method)
    def call(self: PostgresMemoryStore, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except psycopg.OperationalError as exc:
            self._discard()  # psycopg may not mark a dropped connection closed
            raise StoreUnavailableError(f"{self!r} is unavailable: {exc}") from exc

    return call


def _lock_key(user: bytes, layer: str) -> int:
    """The advisory-lock key of a bank: 64 bits of a digest of (user, layer)."""
    digest = hashlib.sha256(user + b"\0" + layer.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _aggregate(cursor: psycopg.Cursor[Any]) -> Any:
    """The value of a query that always returns one row.

    An aggregate (``max``, ``count``), or what an update of a row known to be there
    returns.
    """
    row = cursor.fetchone()
    if row is None:  # pragma: no cover - only a broken server or driver returns no row
        raise MemoryStoreError("an aggregate query returned no row")
    return row[0]


def _record(raw: bytes, where: str, layer: str) -> MemoryRecord:
    try:
        record = MemoryRecord.model_validate_json(raw)
    except ValueError as exc:
        raise MemoryStoreCorruptionError(
            where, None, f"not a valid memory record: {exc}", advice=_REPAIR_ROW
        ) from None
    if record.layer != layer:
        raise MemoryStoreCorruptionError(
            where, None, f"a {record.layer} record in the {layer} bank", advice=_REPAIR_ROW
        )
    return record


class PostgresMemoryStore:
    """A `MemoryStore` in a PostgreSQL database, shared by every worker that can reach it.

    Args:
        dsn: A libpq connection string or URL, e.g.
            ``postgresql://user:password@127.0.0.1:5432/memory``.
        search: Where `MemoryRetriever` searches this store's banks. ``"memory"``
            (the default): each worker keeps an index of every bank it serves,
            following the change feed, and ranks exactly as the JSONL store does.
            ``"database"``: the postings PostgreSQL keeps rank the candidates and the
            worker scores only those (`autopersona_flows.memory.postgres_search`):
            workers share one index and hold nothing per bank, within the tolerance
            ``docs/retrieval.md`` states. Needs PostgreSQL 14 or later, no extension.

    Each thread uses its own connection, opened on its first call; a connection of a
    thread that has ended is closed when another is opened. `close` closes them all.

    Raises:
        MemoryStoreError: If ``dsn`` is not a valid address (the message never quotes
            it) or ``search`` is neither ``"memory"`` nor ``"database"``, or, on first
            use, the database cannot be reached or set up.
    """

    def __init__(self, dsn: str, *, search: Literal["memory", "database"] = "memory") -> None:
        if search not in ("memory", "database"):
            raise MemoryStoreError(
                f"search must be 'memory' (an index per worker) or 'database' (the index "
                f"PostgreSQL keeps), got {search!r}"
            )
        self.search = search
        self._searcher = postgres_search.DatabaseSearch(self._checked, self._refresh)
        try:
            info = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.Error:
            # libpq's message may quote the password; say what is wrong without it.
            raise MemoryStoreError("invalid PostgreSQL address (check its syntax)") from None
        self._dsn = dsn
        self._where = f"host={info.get('host')!r}, dbname={info.get('dbname')!r}"
        self._local = threading.local()
        self._connections: dict[threading.Thread, psycopg.Connection[Any]] = {}
        self._lock = threading.Lock()
        self._ready = False
        # A store dropped without close() still closes what it opened.
        weakref.finalize(self, _close_all, self._connections)

    def __repr__(self) -> str:
        return f"PostgresMemoryStore({self._where})"  # where, never the password

    # -- connections and transactions ------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed:
            return conn
        if any(getattr(self._local, "held", {}).values()):
            # A new session would not hold the `locked` block's lock: going on would
            # break the promise of the block.
            raise StoreUnavailableError(
                f"{self!r} lost the connection holding a bank's lock: leave the locked "
                "block and try again"
            )
        try:
            conn = psycopg.connect(self._dsn, autocommit=True)
            self._setup(conn)
            # What this session writes is the store's own: the trigger marks the rest.
            conn.execute("SELECT set_config('autopersona.writer', 'store', false)")
        except psycopg.Error as exc:
            if conn is not None:
                conn.close()
            kind = (
                StoreUnavailableError
                if isinstance(exc, psycopg.OperationalError)
                else MemoryStoreError
            )
            raise kind(f"cannot use {self!r}: {exc}") from exc
        self._local.conn, self._local.held = conn, {}
        with self._lock:
            # Threads come and go (Prefect starts new ones for each run): close the
            # connections of those that ended, so only live threads hold one.
            for thread in [t for t in self._connections if not t.is_alive()]:
                self._connections.pop(thread).close()
            self._connections[threading.current_thread()] = conn
        return conn

    def _setup(self, conn: psycopg.Connection[Any]) -> None:
        if self._ready:
            return
        if self.search == "database" and conn.info.server_version < 140000:
            raise MemoryStoreError(
                f"search='database' needs PostgreSQL 14 or later (bit_count); this server is "
                f"{conn.info.server_version // 10000}: upgrade it or use search='memory'"
            )
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_SCHEMA)
            conn.execute(postgres_index.SCHEMA)
        self._ready = True

    def _discard(self) -> None:
        """Close this thread's connection, if it has one: the next call opens another."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every connection this store opened (a later call opens new ones)."""
        with self._lock:
            _close_all(self._connections)

    def __enter__(self) -> PostgresMemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self, user: bytes, layer: str) -> Iterator[psycopg.Connection[Any]]:
        """A transaction holding the bank's lock, with its bank row in place."""
        conn = self._conn()
        with conn.transaction():
            if not self._local.held.get((user, layer)):
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(user, layer),))
            conn.execute(
                "INSERT INTO autopersona_banks (user_id, layer, generation) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (user, layer, secrets.token_hex(8)),
            )
            unverified = _aggregate(
                conn.execute(
                    "SELECT unverified FROM autopersona_banks WHERE user_id = %s AND layer = %s",
                    (user, layer),
                )
            )
            if unverified:
                self._verify(conn, user, layer)
            yield conn
            postgres_index.pack_if_due(conn, user, layer)

    def _verify(self, conn: psycopg.Connection[Any], user: bytes, layer: str) -> None:
        """Check every row and change of a bank written elsewhere; unmark it if sound.

        Its search columns and statistics are then written again from the records:
        what wrote the rows did not keep them.

        Raises:
            MemoryStoreCorruptionError: Naming the first row that is not a sound record
                (or change) of the layer.
        """
        records = [
            _record(raw, f"{self!r} {layer} memory {memory_id!r}", layer)
            for memory_id, raw in conn.execute(
                "SELECT id, record FROM autopersona_memories WHERE user_id = %s AND layer = %s",
                (user, layer),
            ).fetchall()
        ]
        for seq, raw in conn.execute(
            "SELECT seq, change FROM autopersona_history WHERE user_id = %s AND layer = %s",
            (user, layer),
        ):
            _change(raw, f"{self!r} {layer} change {seq}", layer)
        postgres_index.reindex(conn, user, layer, records, full=True)
        conn.execute(
            "UPDATE autopersona_banks SET unverified = false WHERE user_id = %s AND layer = %s",
            (user, layer),
        )

    @contextmanager
    def _consistent(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self._conn()
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield conn

    @staticmethod
    def _next_seq(conn: psycopg.Connection[Any], user: bytes, layer: str, count: int = 1) -> int:
        """Take ``count`` change numbers (the last one is returned) and record them."""
        last = _aggregate(
            conn.execute(
                "SELECT max(n) FROM (SELECT nextval('autopersona_seq') AS n"
                " FROM generate_series(1, %s)) AS taken",
                (count,),
            )
        )
        conn.execute(
            "UPDATE autopersona_banks SET last_seq = %s WHERE user_id = %s AND layer = %s",
            (last, user, layer),
        )
        return int(last)

    @staticmethod
    def _key(user_id: str, layer: MemoryLayer) -> tuple[bytes, MemoryLayer]:
        content_type(layer)  # validates the layer
        return check_user_id(user_id).encode("utf-8"), layer

    # -- MemoryStore -----------------------------------------------------------------------

    def add(self, user_id: str, item: MemoryRecord | LayerContent) -> MemoryRecord:
        """Store one record; see `MemoryStore.add`."""
        record = as_record(item)
        (stored,) = self.add_many(user_id, record.layer, [record])
        return stored

    @_reachable
    def add_many(
        self, user_id: str, layer: MemoryLayer, items: Iterable[MemoryRecord | LayerContent]
    ) -> builtins.list[MemoryRecord]:
        """Store records of one layer in one transaction; see `MemoryStore.add_many`."""
        user, layer = self._key(user_id, layer)
        records = [as_record(item, layer=layer, index=i) for i, item in enumerate(items)]
        if not records:
            return []
        ids = [record.id for record in records]
        if len(set(ids)) != len(ids):
            repeated = next(i for i in ids if ids.count(i) > 1)
            raise DuplicateMemoryError(f"memory id {repeated!r} appears twice in the batch")
        with self._write(user, layer) as conn:
            stored = self._insert(conn, user, layer, records)
            taken = next((i for i in ids if i not in stored), None)
            if taken is not None:  # raising rolls the whole batch back
                raise DuplicateMemoryError(
                    f"{layer} memory id {taken!r} is already stored for user {user_id!r}"
                )
        return records

    def _insert(
        self,
        conn: psycopg.Connection[Any],
        user: bytes,
        layer: str,
        records: builtins.list[MemoryRecord],
    ) -> set[str]:
        """Insert new records at the end of the bank; return the ids that were not taken.

        The primary key finds duplicates: a SELECT first would scan a young bank whose
        statistics the planner does not have yet.
        """
        last = self._next_seq(conn, user, layer, len(records))
        first = last - len(records) + 1
        prefix = postgres_index.bank_prefix(user, layer)
        columns = [postgres_index.SearchColumns.of(r, prefix) for r in records]
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO autopersona_memories (user_id, layer, id, position, seq, record,"  # noqa: S608 - constant SQL, values are parameters
                f" {postgres_index.COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s,"
                f" {postgres_index.PLACEHOLDERS}) ON CONFLICT DO NOTHING RETURNING id",
                [
                    (
                        user,
                        layer,
                        r.id,
                        first + i,
                        first + i,
                        r.model_dump_json().encode(),
                        *c.values,
                    )
                    for i, (r, c) in enumerate(zip(records, columns, strict=True))
                ],
                returning=True,
            )
            stored = {row[0] for _ in cursor.results() for row in cursor.fetchall()}
        postgres_index.count_in(
            conn, user, layer, [c for r, c in zip(records, columns, strict=True) if r.id in stored]
        )
        postgres_index.unpack(
            conn, user, layer, [first + i for i, r in enumerate(records) if r.id in stored]
        )
        return stored

    def _all(
        self, conn: psycopg.Connection[Any], user: bytes, layer: str
    ) -> builtins.list[MemoryRecord]:
        rows = conn.execute(
            "SELECT record FROM autopersona_memories WHERE user_id = %s AND layer = %s"
            " ORDER BY position",
            (user, layer),
        )
        return [_record(raw, f"{self!r} {layer}", layer) for (raw,) in rows]

    def _require(
        self, conn: psycopg.Connection[Any], user: bytes, layer: str, memory_id: str
    ) -> MemoryRecord:
        row = conn.execute(
            "SELECT record FROM autopersona_memories WHERE user_id = %s AND layer = %s AND id = %s",
            (user, layer, memory_id),
        ).fetchone()
        if row is None:
            raise MemoryNotFoundError(user.decode(), layer, memory_id)
        return _record(row[0], f"{self!r} {layer} {memory_id}", layer)

    @_reachable
    def get(self, user_id: str, layer: MemoryLayer, memory_id: str) -> MemoryRecord:
        """Return one record; see `MemoryStore.get`."""
        user, layer = self._key(user_id, layer)
        return self._require(self._conn(), user, layer, memory_id)

    @_reachable
    def list(self, user_id: str, layer: MemoryLayer) -> builtins.list[MemoryRecord]:
        """Return a layer's records, oldest first; see `MemoryStore.list`."""
        user, layer = self._key(user_id, layer)
        return self._all(self._conn(), user, layer)

    @_reachable
    def update(
        self,
        user_id: str,
        layer: MemoryLayer,
        memory_id: str,
        content: LayerContent,
        *,
        embedding: Embedding | None = None,
        at: datetime | None = None,
        valid_until: datetime | None = None,
        reason: str = "",
        buried: bool | None = None,
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Replace a record's content; see `MemoryStore.update`."""
        user, layer = self._key(user_id, layer)
        content = as_content(content, layer)
        with self._write(user, layer) as conn:
            before = self._require(conn, user, layer, memory_id)
            after = before.revised(
                content,
                embedding=embedding,
                at=at,
                valid_until=valid_until,
                buried=buried,
                provenance=provenance,
            )
            seq = self._next_seq(conn, user, layer)
            change = MemoryChange(
                operation="update",
                at=after.updated_at,
                before=before,
                after=after,
                reason=reason,
                provenance=provenance,
            )
            self._remember(conn, user, layer, seq, change)
            postgres_index.count_out(conn, user, layer, [memory_id])
            columns = postgres_index.SearchColumns.of(
                after, postgres_index.bank_prefix(user, layer)
            )
            position = _aggregate(
                conn.execute(
                    f"UPDATE autopersona_memories SET (record, seq, {postgres_index.COLUMNS})"  # noqa: S608 - constant SQL, values are parameters
                    f" = ROW(%s, %s, {postgres_index.PLACEHOLDERS})"
                    " WHERE user_id = %s AND layer = %s AND id = %s RETURNING position",
                    (
                        after.model_dump_json().encode(),
                        seq,
                        *columns.values,
                        user,
                        layer,
                        memory_id,
                    ),
                )
            )
            postgres_index.count_in(conn, user, layer, [columns])
            postgres_index.unpack(conn, user, layer, [position])
        return after

    @_reachable
    def delete(
        self,
        user_id: str,
        layer: MemoryLayer,
        memory_id: str,
        *,
        reason: str = "",
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Remove a record, keeping it in the history; see `MemoryStore.delete`."""
        user, layer = self._key(user_id, layer)
        with self._write(user, layer) as conn:
            before = self._require(conn, user, layer, memory_id)
            seq = self._next_seq(conn, user, layer)
            change = MemoryChange(
                operation="delete",
                at=datetime.now(UTC),
                before=before,
                reason=reason,
                provenance=provenance,
            )
            self._remember(conn, user, layer, seq, change)
            postgres_index.count_out(conn, user, layer, [memory_id])
            conn.execute(
                "DELETE FROM autopersona_memories WHERE user_id = %s AND layer = %s AND id = %s",
                (user, layer, memory_id),
            )
        return before

    @staticmethod
    def _remember(
        conn: psycopg.Connection[Any], user: bytes, layer: str, seq: int, change: MemoryChange
    ) -> None:
        conn.execute(
            "INSERT INTO autopersona_history (user_id, layer, seq, id, operation, change)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (
                user,
                layer,
                seq,
                change.before.id,
                change.operation,
                change.model_dump_json().encode(),
            ),
        )

    @_reachable
    def history(
        self, user_id: str, layer: MemoryLayer, memory_id: str | None = None
    ) -> builtins.list[MemoryChange]:
        """Return a record's superseded and deleted versions; see `MemoryStore.history`."""
        user, layer = self._key(user_id, layer)
        rows = self._conn().execute(
            "SELECT change FROM autopersona_history WHERE user_id = %s AND layer = %s"
            " AND (%s::text IS NULL OR id = %s) ORDER BY seq",
            (user, layer, memory_id, memory_id),
        )
        return [_change(raw, f"{self!r} {layer} history", layer) for (raw,) in rows]

    @_reachable
    def changes(self, user_id: str, layer: MemoryLayer, since: str | None = None) -> ChangeSet:
        """Return what changed in a bank since ``since``; see `MemoryStore.changes`.

        A cursor is ``pg:<generation>:<seq>``: a restore gives the bank a new
        generation, so older cursors read the whole bank again.
        """
        user, layer = self._key(user_id, layer)
        state = (
            "SELECT generation, last_seq FROM autopersona_banks WHERE user_id = %s AND layer = %s"
        )
        # The common case, a bank unchanged since the cursor, in one round trip: a write
        # moves last_seq in the transaction that makes it.
        bank = self._conn().execute(state, (user, layer)).fetchone()
        if bank is not None and since == f"pg:{bank[0]}:{bank[1]}":
            return ChangeSet(cursor=since, full=False, records=[])
        with self._consistent() as conn:
            bank = conn.execute(state, (user, layer)).fetchone()
            generation, last = bank if bank else ("none", 0)
            cursor = f"pg:{generation}:{last}"
            prefix, _, seq_text = (since or "").rpartition(":")
            known = seq_text.isascii() and seq_text.isdigit()
            if prefix != f"pg:{generation}" or not known or int(seq_text) > last:
                return ChangeSet(cursor=cursor, full=True, records=self._all(conn, user, layer))
            after = int(seq_text)
            rows = conn.execute(
                "SELECT record FROM autopersona_memories"
                " WHERE user_id = %s AND layer = %s AND seq > %s ORDER BY seq",
                (user, layer, after),
            )
            records = [_record(raw, f"{self!r} {layer}", layer) for (raw,) in rows]
            deleted = conn.execute(
                "SELECT id FROM autopersona_history WHERE user_id = %s AND layer = %s"
                " AND seq > %s AND operation = 'delete' ORDER BY seq",
                (user, layer, after),
            ).fetchall()
        live = {record.id for record in records}
        gone = list(dict.fromkeys(memory_id for (memory_id,) in deleted if memory_id not in live))
        return ChangeSet(cursor=cursor, full=False, records=records, deleted=gone)

    @_reachable
    def search_bank(
        self, user_id: str, layer: MemoryLayer, search: BankSearch
    ) -> builtins.list[builtins.list[Found]] | None:
        """Search a bank in the database; see `SearchableStore.search_bank`.

        ``None`` unless the store was made with ``search="database"``.
        """
        if self.search != "database":
            return None
        user, layer = self._key(user_id, layer)
        return self._searcher.run(self._conn(), user, layer, search)

    @_reachable
    def prepare_bank(self, user_id: str, layer: MemoryLayer) -> bool:
        """Index the rows a search could not use yet; see `SearchableStore.prepare_bank`.

        ``False`` unless the store was made with ``search="database"``.
        """
        if self.search != "database":
            return False
        self._ensure_indexed(*self._key(user_id, layer))
        return True

    @_reachable
    def find_in_bank(
        self, user_id: str, layer: MemoryLayer, content: LayerContent
    ) -> builtins.list[MemoryRecord] | None:
        """Records equal to ``content``; see `SearchableStore.find_in_bank`."""
        if self.search != "database":
            return None
        user, layer = self._key(user_id, layer)
        self._ensure_indexed(user, layer)
        rows = postgres_index.find(self._conn(), user, layer, as_content(content, layer))
        return [self._checked(bytes(row[3]), layer) for row in rows]

    @_reachable
    def learned_in_bank(
        self, user_id: str, contexts: Sequence[str]
    ) -> builtins.list[MemoryRecord] | None:
        """Persona records learned at ``contexts``; see `SearchableStore.learned_in_bank`."""
        if self.search != "database":
            return None
        user, layer = self._key(user_id, "persona")
        self._ensure_indexed(user, layer)
        rows = postgres_index.learned_at(self._conn(), user, contexts)
        return [self._checked(bytes(row[3]), layer) for row in rows]

    @_reachable
    def holding_in_bank(
        self, user_id: str, layer: MemoryLayer, words: Sequence[str]
    ) -> builtins.list[MemoryRecord] | None:
        """Records holding any of ``words``; see `SearchableStore.holding_in_bank`."""
        if self.search != "database":
            return None
        user, layer = self._key(user_id, layer)
        self._ensure_indexed(user, layer)
        rows = postgres_index.holding(self._conn(), user, layer, words)
        return [self._checked(bytes(row[3]), layer) for row in rows]

    def _ensure_indexed(self, user: bytes, layer: str) -> None:
        """Index a bank's rows written without their search columns, if it has any."""
        state = (
            self._conn()
            .execute(
                f"SELECT {postgres_index.STALE_SQL} FROM autopersona_banks b"  # noqa: S608 - constant SQL, values are parameters
                " WHERE b.user_id = %s AND b.layer = %s",
                (user, layer),
                prepare=True,
            )
            .fetchone()
        )
        if state is not None and state[0]:
            self._refresh(user, layer)

    def _checked(self, raw: bytes, layer: str) -> MemoryRecord:
        return _record(raw, f"{self!r} {layer}", layer)

    def _refresh(self, user: bytes, layer: str) -> None:
        """Index the rows of a bank a search cannot use yet, under the bank's lock.

        Rows written elsewhere are checked and indexed whole (`_verify`); rows from
        before the search columns existed get them, and count in the statistics.
        """
        with self._write(user, layer) as conn:
            rows = conn.execute(
                "SELECT record FROM autopersona_memories"
                " WHERE user_id = %s AND layer = %s AND lexemes IS NULL",
                (user, layer),
            ).fetchall()
            records = [self._checked(raw, layer) for (raw,) in rows]
            if records:
                postgres_index.reindex(conn, user, layer, records, full=False)

    @contextmanager
    def locked(self, user_id: str, layer: MemoryLayer) -> Iterator[None]:
        """Hold a bank's write lock across several calls; see `MemoryStore.locked`."""
        user, layer = self._key(user_id, layer)
        conn = self._conn()
        held: dict[tuple[bytes, str], int] = self._local.held
        if not held.get((user, layer)):
            self._advisory(conn, "pg_advisory_lock", user, layer)
        held[(user, layer)] = held.get((user, layer), 0) + 1
        try:
            yield
        finally:
            held[(user, layer)] -= 1
            if not held[(user, layer)]:
                # A lost connection took its session locks with it: nothing to unlock.
                with suppress(StoreUnavailableError):
                    self._advisory(conn, "pg_advisory_unlock", user, layer)

    @_reachable
    def _advisory(self, conn: psycopg.Connection[Any], call: str, user: bytes, layer: str) -> None:
        conn.execute(f"SELECT {call}(%s)", (_lock_key(user, layer),))

    @_reachable
    def users(self) -> builtins.list[str]:
        """Return every user with a bank here, sorted; see `MemoryStore.users`."""
        rows = self._conn().execute("SELECT DISTINCT user_id FROM autopersona_banks")
        found = []
        for (user,) in rows:
            try:
                found.append(bytes(user).decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise MemoryStoreCorruptionError(
                    f"{self!r} autopersona_banks",
                    None,
                    f"user id {bytes(user)!r} is not UTF-8 ({exc.reason} at byte {exc.start})",
                    advice=_REPAIR_ROW,
                ) from None
        return sorted(found)

    @_reachable
    def snapshot(self, user_id: str) -> MemorySnapshot:
        """Read all layers in one repeatable-read transaction; see `MemoryStore.snapshot`."""
        user = check_user_id(user_id).encode("utf-8")
        with self._consistent() as conn:
            rows = conn.execute(
                "SELECT layer, record FROM autopersona_memories WHERE user_id = %s"
                " ORDER BY position",
                (user,),
            ).fetchall()
        memories: dict[MemoryLayer, builtins.list[MemoryRecord]] = {layer: [] for layer in LAYERS}
        for layer, raw in rows:
            if layer not in memories:
                raise MemoryStoreCorruptionError(
                    f"{self!r}", None, f"a record of layer {layer!r}", advice=_REPAIR_ROW
                )
            memories[layer].append(_record(raw, f"{self!r} {layer}", layer))
        return MemorySnapshot.of(user_id, memories)

    def snapshot_fingerprint(self, user_id: str) -> str:
        """Return the snapshot's fingerprint; see `MemoryStore.snapshot_fingerprint`."""
        return self.snapshot(user_id).fingerprint

    @_reachable
    def restore(self, snapshot: MemorySnapshot, *, replace: bool = False) -> None:
        """Load a snapshot in one transaction; see `MemoryStore.restore`.

        With ``replace`` the records it drops are not added to the change history
        (as in the JSONL store); every layer gets a new generation, so indexes built
        from the old bank start over.
        """
        user = check_user_id(snapshot.user_id).encode("utf-8")
        conn = self._conn()
        with conn.transaction():
            for layer in LAYERS:  # the same order everywhere: no deadlock between restores
                if not self._local.held.get((user, layer)):
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(user, layer),))
            existing = _aggregate(
                conn.execute(
                    "SELECT count(*) FROM autopersona_memories WHERE user_id = %s", (user,)
                )
            )
            if existing and not replace:
                raise MemoriesExistError(snapshot.user_id, existing)
            conn.execute("DELETE FROM autopersona_memories WHERE user_id = %s", (user,))
            for table in postgres_index.TABLES:
                conn.execute(f"DELETE FROM {table} WHERE user_id = %s", (user,))  # noqa: S608 - constant SQL, values are parameters
            conn.execute(
                "UPDATE autopersona_banks SET live = 0, total_length = 0, unpacked = 0"
                " WHERE user_id = %s",
                (user,),
            )
            for layer in LAYERS:
                records = snapshot.memories[layer]
                generation = secrets.token_hex(8)
                if not records:  # a new generation for a bank that exists; none created
                    conn.execute(
                        "UPDATE autopersona_banks SET generation = %s"
                        " WHERE user_id = %s AND layer = %s",
                        (generation, user, layer),
                    )
                    continue
                conn.execute(
                    "INSERT INTO autopersona_banks (user_id, layer, generation) VALUES (%s, %s, %s)"
                    " ON CONFLICT (user_id, layer) DO UPDATE SET generation = EXCLUDED.generation",
                    (user, layer, generation),
                )
                self._insert(conn, user, layer, records)  # the bank is empty: none taken
                postgres_index.pack_if_due(conn, user, layer)

    @_reachable
    def erase(self, user_id: str) -> Erasure:
        """Delete every row of the user, in one transaction; see `MemoryStore.erase`.

        The user's memories, their history and their bank rows (generation and
        change sequence) go together, under the user's three bank locks. A bank's
        next write starts a new generation, so any index built from the old one
        starts over. PostgreSQL keeps deleted row versions in the table files until
        VACUUM reclaims their space, and in its write-ahead log and backups: see
        the README on what erasure cannot reach.
        """
        user = check_user_id(user_id).encode("utf-8")
        conn = self._conn()
        with conn.transaction():
            for layer in LAYERS:  # the order every multi-bank caller takes them in
                if not self._local.held.get((user, layer)):
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(user, layer),))
            counts = [
                conn.execute(delete, (user,)).rowcount
                for delete in (
                    "DELETE FROM autopersona_memories WHERE user_id = %s",
                    "DELETE FROM autopersona_history WHERE user_id = %s",
                    "DELETE FROM autopersona_banks WHERE user_id = %s",
                    # the words of its memories, their postings
                    *(f"DELETE FROM {table} WHERE user_id = %s" for table in postgres_index.TABLES),  # noqa: S608 - constant SQL, values are parameters
                )
            ]
        memories, changes, *_ = counts
        return Erasure(user_id, found=any(counts), memories=memories, changes=changes)


def _close_all(connections: dict[threading.Thread, psycopg.Connection[Any]]) -> None:
    for conn in connections.values():
        conn.close()
    connections.clear()


def _change(raw: bytes, where: str, layer: str) -> MemoryChange:
    try:
        change = MemoryChange.model_validate_json(raw)
    except ValueError as exc:
        raise MemoryStoreCorruptionError(
            where, None, f"not a valid change: {exc}", advice=_REPAIR_ROW
        ) from None
    others = {record.layer for record in (change.before, change.after) if record} - {layer}
    if others:
        raise MemoryStoreCorruptionError(
            where, None, f"a change of a {others.pop()} record", advice=_REPAIR_ROW
        )
    return change
