"""What PostgreSQL keeps so that it can search a bank itself: columns, statistics, postings.

Every row of ``autopersona_memories`` carries what a search needs, written in the
transaction that writes the record (see `SearchColumns`):

* ``lexemes``, a ``tsvector`` of the record's own `terms` (the analyzer of the
  in-memory index, so both engines see the same words), each term's positions
  ``1..tf`` so that the vector holds its frequency, and each lexeme prefixed by a
  digest of its bank (`bank_prefix`): a plain GIN index on the column finds a
  bank's rows holding some words (`holding`), without an extension, reading that
  bank's entries only; an empty vector for a buried record, ``NULL`` for a row
  written before these columns (or by something else), which `reindex` fills;
* ``length`` (its term count; ``NULL`` for a buried record, which no search
  returns), the unit ``vector`` of its stored embedding with the embedder's
  ``model``, a 256-bit ``sketch`` of that vector (signs of a fixed projection),
  its time (``stated_at``, ``valid_until``) as POSIX seconds, its content
  ``digest`` and its ``contexts`` (GIN-indexed).

``autopersona_banks`` keeps each bank's live count and total length and
``autopersona_terms`` each term's document frequency (`count_in`, `count_out`), so
BM25 is computed with the bank's own statistics, as `BankIndex` computes it.

``autopersona_packed`` holds each term's postings (`POSTING`s in row order, in
chunks of at most `CHUNK`): a search reads a term's whole list in a few values,
however common the term. Rows written since the bank was packed wait in
``autopersona_unpacked`` (each search reads their lexemes); rows that changed or
went since are outdated (``autopersona_outdated``: their packed postings are
skipped). Once more than `UNPACKED` rows wait, the write that makes them wait packs
the bank (`pack_if_due`): only the chunks where those rows fall are rewritten. The
lookups (`find`, `learned_at`, `holding`) answer what `BankIndex` answers by id,
content and words. `autopersona_flows.memory.postgres_search` ranks.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from autopersona_flows.memory.index import content_digest
from autopersona_flows.memory.records import MemoryRecord
from autopersona_flows.memory.text import memory_text, normalise, terms

__all__ = [
    "CHUNK",
    "COLUMNS",
    "PLACEHOLDERS",
    "POSTING",
    "POSTING_SQL",
    "PREFIX_LENGTH",
    "SCHEMA",
    "STALE_SQL",
    "TABLES",
    "UNPACKED",
    "SearchColumns",
    "bank_prefix",
    "count_in",
    "count_out",
    "find",
    "holding",
    "learned_at",
    "pack",
    "pack_if_due",
    "quote",
    "reindex",
    "sketch",
    "unpack",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS autopersona_terms (
    user_id bytea NOT NULL,
    layer text NOT NULL,
    term text NOT NULL,
    df bigint NOT NULL,
    PRIMARY KEY (user_id, layer, term)
);
DO $$ BEGIN
    -- Only when missing: adding columns locks the table against running writers.
    IF NOT EXISTS (
        SELECT FROM information_schema.columns WHERE table_schema = current_schema()
        AND table_name = 'autopersona_memories' AND column_name = 'lexemes'
    ) THEN  -- rows of an older version keep NULL lexemes until a search indexes them
        ALTER TABLE autopersona_memories
            ADD COLUMN lexemes tsvector, ADD COLUMN length integer,
            ADD COLUMN vector bytea, ADD COLUMN model text, ADD COLUMN sketch bit(256),
            ADD COLUMN stated_at double precision, ADD COLUMN valid_until double precision,
            ADD COLUMN digest text, ADD COLUMN contexts text[];
        ALTER TABLE autopersona_banks
            ADD COLUMN live bigint NOT NULL DEFAULT 0,
            ADD COLUMN total_length bigint NOT NULL DEFAULT 0;
        -- fastupdate off: a pending list would be scanned by every search until vacuumed
        CREATE INDEX autopersona_memories_lexemes ON autopersona_memories
            USING gin (lexemes) WITH (fastupdate = off);
        CREATE INDEX autopersona_memories_digest ON autopersona_memories (user_id, layer, digest);
        CREATE INDEX autopersona_memories_contexts ON autopersona_memories USING gin (contexts);
        CREATE INDEX autopersona_memories_unindexed ON autopersona_memories (user_id, layer)
            WHERE lexemes IS NULL;
    END IF;
    IF NOT EXISTS (
        SELECT FROM information_schema.tables WHERE table_schema = current_schema()
        AND table_name = 'autopersona_packed'
    ) THEN
        CREATE TABLE autopersona_packed (
            user_id bytea NOT NULL,
            layer text NOT NULL,
            term text NOT NULL,
            first bigint NOT NULL,
            postings bytea NOT NULL,
            PRIMARY KEY (user_id, layer, term, first)
        );
        -- read whole by every search holding the term: kept uncompressed
        ALTER TABLE autopersona_packed ALTER COLUMN postings SET STORAGE EXTERNAL;
        CREATE TABLE autopersona_outdated (
            user_id bytea NOT NULL,
            layer text NOT NULL,
            position bigint NOT NULL,
            terms text[] NOT NULL,
            PRIMARY KEY (user_id, layer, position)
        );
        CREATE TABLE autopersona_unpacked (
            user_id bytea NOT NULL,
            layer text NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (user_id, layer, position)
        );
        ALTER TABLE autopersona_banks ADD COLUMN unpacked bigint NOT NULL DEFAULT 0;
        CREATE INDEX IF NOT EXISTS autopersona_memories_position
            ON autopersona_memories (user_id, layer, position);
        -- banks indexed before packed postings existed: indexed again at their next use
        UPDATE autopersona_banks SET unverified = true;
    END IF;
END $$;
"""

COLUMNS = "lexemes, length, vector, model, sketch, stated_at, valid_until, digest, contexts"
PLACEHOLDERS = "%s::tsvector, %s, %s, %s, %s::bit(256), %s, %s, %s, %s"

_SKETCH_BITS = 256
_MAX_POSITIONS = 256  # what a tsvector keeps per lexeme: higher frequencies count as 256
_MAX_LEXEME = 2046  # bytes; a longer "word" is left out of the tsvector

POSTING = np.dtype([("position", ">i8"), ("tf", ">i2"), ("length", ">i4")])
"""A packed posting: the row's position, the term's frequency in it, the row's length.

A term's packed postings are in row order.
"""
POSTING_SQL = (
    "int8send(m.position) || int2send(least(coalesce(array_length(u.positions, 1), 1), 32767)"
    "::int2) || int4send(m.length)"
)
"""A `POSTING` in SQL, of a row ``m`` and one of its lexemes ``u`` (``unnest(m.lexemes)``)."""
UNPACKED = 256
"""Rows written and rows outdated since a bank's last `pack` before it packs again."""
CHUNK = 1024
"""Postings a packed value holds at most: a term's list is cut in such chunks."""
TABLES = ("autopersona_terms", "autopersona_packed", "autopersona_outdated", "autopersona_unpacked")
"""The tables of a bank's search data beside its rows (each keyed by user, layer, ...)."""
STALE_SQL = (
    "b.unverified OR EXISTS (SELECT FROM autopersona_memories m"
    " WHERE m.user_id = b.user_id AND m.layer = b.layer AND m.lexemes IS NULL)"
)
"""Whether a bank ``b`` has rows no search can use yet: written elsewhere, or unindexed."""


def bank_prefix(user: bytes, layer: str) -> str:
    """What a bank's lexemes start with: 64 bits of a digest of user and layer, and ``_``.

    Each bank thus has lexemes of its own, and a search reads the GIN index's
    entries of its bank only, however many others the table holds.
    """
    return hashlib.sha256(user + b"\0" + layer.encode()).hexdigest()[:16] + "_"


PREFIX_LENGTH = 17  # characters of `bank_prefix`


def quote(lexeme: str) -> str:
    """``lexeme`` as a quoted tsvector or tsquery lexeme."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


@lru_cache(maxsize=8)
def _projection(dim: int) -> np.ndarray:
    """A fixed ±1 matrix (bits x dim), the same in every process and version."""
    needed = _SKETCH_BITS * dim
    stream = b"".join(
        hashlib.sha256(f"autopersona-sketch:{dim}:{i}".encode()).digest()
        for i in range((needed + 255) // 256)
    )
    bits = np.unpackbits(np.frombuffer(stream, dtype=np.uint8))[:needed]
    return (bits.astype(np.float32) * 2.0 - 1.0).reshape(_SKETCH_BITS, dim)


def sketch(unit: np.ndarray) -> str:
    """The sketch of a unit vector: which side of each fixed hyperplane it lies on."""
    signs = _projection(len(unit)) @ unit.astype(np.float32) > 0
    return "".join("1" if bit else "0" for bit in signs.tolist())


@dataclass(frozen=True)
class SearchColumns:
    """What a row holds for searches (see the module docstring), and its distinct terms."""

    values: tuple[Any, ...]
    terms: tuple[str, ...]
    length: int | None

    @classmethod
    def of(cls, record: MemoryRecord, prefix: str) -> SearchColumns:
        """The columns of ``record`` in the bank whose lexemes start with ``prefix``."""
        at = record.at.timestamp()
        until = record.valid_until.timestamp() if record.valid_until else None
        if record.buried_at is not None:  # indexed (not NULL), never found, never counted
            return cls(("", None, None, None, None, at, until, None, None), (), None)
        counts = Counter(terms(memory_text(record.content)))
        kept = {t: n for t, n in counts.items() if len(t.encode()) <= _MAX_LEXEME}
        lexemes = " ".join(
            f"{quote(prefix + t)}:{','.join(map(str, range(1, min(n, _MAX_POSITIONS) + 1)))}"
            for t, n in kept.items()
        )
        vector = model = signs = None
        if record.embedding is not None:
            values = record.embedding.array().astype(np.float64)  # float32 squares overflow
            norm = float(np.linalg.norm(values))
            unit = (values / norm if norm > 0 else values).astype(np.float32)
            vector, model, signs = (
                unit.astype("<f4").tobytes(),
                record.embedding.model,
                sketch(unit),
            )
        length = sum(counts.values())
        contexts = sorted({normalise(c) for c in getattr(record.content, "contexts", ())})
        digest = content_digest(record.content)
        row = (lexemes, length, vector, model, signs, at, until, digest, contexts or None)
        return cls(row, tuple(kept), length)


def count_in(conn: Any, user: bytes, layer: str, rows: Sequence[SearchColumns]) -> None:
    """Add written rows to their bank's statistics (in the transaction writing them)."""
    live = [row for row in rows if row.length is not None]
    if live:
        conn.execute(
            "INSERT INTO autopersona_terms (user_id, layer, term, df)"
            " SELECT %s, %s, term, count(*) FROM unnest(%s::text[]) AS term GROUP BY term"
            " ON CONFLICT (user_id, layer, term)"
            " DO UPDATE SET df = autopersona_terms.df + EXCLUDED.df",
            (user, layer, [term for row in live for term in row.terms]),
        )
    conn.execute(
        "UPDATE autopersona_banks SET live = live + %s, total_length = total_length + %s"
        " WHERE user_id = %s AND layer = %s",
        (len(live), sum(row.length or 0 for row in live), user, layer),
    )


def unpack(conn: Any, user: bytes, layer: str, positions: Sequence[int]) -> None:
    """List written rows (by position) as waiting to be packed (see `pack_if_due`)."""
    conn.execute(
        "WITH listed AS (INSERT INTO autopersona_unpacked (user_id, layer, position)"
        "   SELECT %(user)s, %(layer)s, unnest(%(positions)s::bigint[])"
        "   ON CONFLICT DO NOTHING RETURNING 1)"
        " UPDATE autopersona_banks SET unpacked = unpacked + (SELECT count(*) FROM listed)"
        " WHERE user_id = %(user)s AND layer = %(layer)s",
        {"user": user, "layer": layer, "positions": list(positions)},
    )


def count_out(conn: Any, user: bytes, layer: str, ids: Sequence[str]) -> None:
    """Take stored rows out of their bank's statistics (before they change or go).

    Their packed postings are outdated from then on: searches skip them, and the
    next `pack` drops them (see `pack_if_due`).
    """
    left = conn.execute(
        "WITH gone AS (SELECT position, lexemes, length FROM autopersona_memories"
        "   WHERE user_id = %(user)s AND layer = %(layer)s AND id = ANY(%(ids)s)"
        "   AND length IS NOT NULL),"
        " outdated AS (INSERT INTO autopersona_outdated (user_id, layer, position, terms)"
        "   SELECT %(user)s, %(layer)s, position, ARRAY(SELECT substr(lexeme, %(cut)s)"
        "   FROM unnest(tsvector_to_array(lexemes)) AS lexeme) FROM gone"
        "   ON CONFLICT DO NOTHING),"  # changed twice since the pack: the packed terms stay
        " counted AS (SELECT substr(lexeme, %(cut)s) AS term, count(*) AS n"
        "   FROM gone, unnest(tsvector_to_array(lexemes)) AS lexeme GROUP BY lexeme),"
        " bank AS (UPDATE autopersona_banks SET live = live - (SELECT count(*) FROM gone),"
        "   total_length = total_length - (SELECT coalesce(sum(length), 0) FROM gone),"
        "   unpacked = unpacked + (SELECT count(*) FROM gone)"
        "   WHERE user_id = %(user)s AND layer = %(layer)s)"
        " UPDATE autopersona_terms t SET df = t.df - counted.n FROM counted"
        " WHERE t.user_id = %(user)s AND t.layer = %(layer)s AND t.term = counted.term"
        " RETURNING t.term, t.df",
        {"user": user, "layer": layer, "ids": list(ids), "cut": PREFIX_LENGTH + 1},
    ).fetchall()
    unused = [term for term, df in left if df <= 0]
    if unused:  # a word no live memory holds is not kept (a deleted one's stay in its history)
        conn.execute(
            "DELETE FROM autopersona_terms WHERE user_id = %s AND layer = %s AND term = ANY(%s)",
            (user, layer, unused),
        )


def reindex(
    conn: Any, user: bytes, layer: str, records: Sequence[MemoryRecord], *, full: bool
) -> None:
    """Write the search columns of ``records`` (stored rows) and count them in.

    With ``full`` the bank's statistics start over from these records (they must
    then be the whole bank); otherwise they must be rows not indexed yet.
    """
    for table in TABLES if full else TABLES[1:]:  # the terms' frequencies are counted below
        conn.execute(
            f"DELETE FROM {table} WHERE user_id = %s AND layer = %s",  # noqa: S608 - constant SQL, values are parameters
            (user, layer),
        )
    if full:
        conn.execute(
            "UPDATE autopersona_banks SET live = 0, total_length = 0"
            " WHERE user_id = %s AND layer = %s",
            (user, layer),
        )
    prefix = bank_prefix(user, layer)
    rows = [SearchColumns.of(record, prefix) for record in records]
    with conn.cursor() as cursor:
        cursor.executemany(
            f"UPDATE autopersona_memories SET ({COLUMNS}) = ROW({PLACEHOLDERS})"  # noqa: S608 - constant SQL, values are parameters
            " WHERE user_id = %s AND layer = %s AND id = %s",
            [(*row.values, user, layer, r.id) for row, r in zip(rows, records, strict=True)],
        )
    count_in(conn, user, layer, rows)
    # Packing starts over: every row of the bank waits to be packed.
    conn.execute(
        "WITH listed AS (INSERT INTO autopersona_unpacked (user_id, layer, position)"
        "   SELECT user_id, layer, position FROM autopersona_memories"
        "   WHERE user_id = %(user)s AND layer = %(layer)s AND length IS NOT NULL RETURNING 1)"
        " UPDATE autopersona_banks SET unpacked = (SELECT count(*) FROM listed)"
        " WHERE user_id = %(user)s AND layer = %(layer)s",
        {"user": user, "layer": layer},
    )


def pack_if_due(conn: Any, user: bytes, layer: str) -> None:
    """Pack a bank (`pack`) if more than `UNPACKED` rows were written or outdated since.

    Call it when a write has rewritten every row it takes out (`count_out`): a row
    packed between the two would keep postings of its old words.
    """
    unpacked = conn.execute(
        "SELECT unpacked FROM autopersona_banks WHERE user_id = %s AND layer = %s",
        (user, layer),
        prepare=True,
    ).fetchone()
    if unpacked is not None and unpacked[0] > UNPACKED:
        pack(conn, user, layer)


def pack(conn: Any, user: bytes, layer: str) -> None:
    """Merge the rows a bank wrote since its last pack into its packed postings.

    A term's packed postings lose the rows that changed or went since (outdated)
    and gain the current rows holding it. Only the chunks (`CHUNK`) holding a row
    that changed, or the place of a new one, are rewritten: a pack costs the same
    in a bank of any size.
    """
    waiting = conn.execute(
        "DELETE FROM autopersona_unpacked WHERE user_id = %s AND layer = %s RETURNING position",
        (user, layer),
    ).fetchall()
    added = {  # each term's postings of the waiting rows, in row order
        term: np.frombuffer(postings, dtype=POSTING)
        for term, postings in conn.execute(
            f"SELECT substr(u.lexeme, %s), string_agg({POSTING_SQL}, '' ORDER BY m.position)"  # noqa: S608 - constant SQL, values are parameters
            " FROM autopersona_memories m CROSS JOIN unnest(m.lexemes) AS u"
            " WHERE m.user_id = %s AND m.layer = %s AND m.position = ANY(%s::bigint[])"
            " AND m.length IS NOT NULL GROUP BY 1",
            (PREFIX_LENGTH + 1, user, layer, [position for (position,) in waiting]),
            binary=True,
        )
    }
    removed: dict[str, list[int]] = {}
    for position, terms_then in conn.execute(
        "DELETE FROM autopersona_outdated WHERE user_id = %s AND layer = %s"
        " RETURNING position, terms",
        (user, layer),
    ):
        for term in terms_then:  # the words its packed postings hold
            removed.setdefault(term, []).append(position)
    touched = sorted(set(added) | set(removed))
    firsts: dict[str, list[int]] = {}
    for term, first in conn.execute(
        "SELECT term, first FROM autopersona_packed"
        " WHERE user_id = %s AND layer = %s AND term = ANY(%s) ORDER BY term, first",
        (user, layer, touched),
    ):
        firsts.setdefault(term, []).append(first)
    # Each change goes to the chunk whose rows it falls among (the first chunk for a
    # row before it); a term without chunks gets new ones (first: None).
    plans: list[tuple[str, int | None, np.ndarray, np.ndarray]] = []
    for term in touched:
        rows = added.get(term, np.empty(0, POSTING))
        gone = np.array(removed.get(term, []), dtype=np.int64)
        bounds = np.array(firsts.get(term, []), dtype=np.int64)
        if not len(bounds):
            plans.append((term, None, rows, gone))
            continue
        row_at = np.maximum(np.searchsorted(bounds, rows["position"], side="right") - 1, 0)
        gone_at = np.maximum(np.searchsorted(bounds, gone, side="right") - 1, 0)
        for chunk in np.union1d(row_at, gone_at).tolist():
            plans.append((term, int(bounds[chunk]), rows[row_at == chunk], gone[gone_at == chunk]))
    changed = [(term, first) for term, first, _, _ in plans if first is not None]
    old = {
        (term, first): np.frombuffer(postings, dtype=POSTING)
        for term, first, postings in conn.execute(
            "SELECT p.term, p.first, p.postings FROM autopersona_packed p"
            " JOIN unnest(%s::text[], %s::bigint[]) AS c(term, first) USING (term, first)"
            " WHERE p.user_id = %s AND p.layer = %s",
            ([term for term, _ in changed], [first for _, first in changed], user, layer),
            binary=True,
        )
    }
    pieces: list[tuple[str, int, bytes]] = []
    for term, first, rows, gone in plans:
        before = old.get((term, first), np.empty(0, POSTING)) if first is not None else rows[:0]
        merged = np.concatenate([before[~np.isin(before["position"], gone)], rows])
        # In row order, big-endian again (concatenate made it native).
        merged = merged[np.argsort(merged["position"], kind="stable")].astype(POSTING)
        for piece in np.array_split(merged, -(-len(merged) // CHUNK)) if len(merged) else []:
            pieces.append((term, int(piece["position"][0]), piece.tobytes()))
    conn.execute(
        "DELETE FROM autopersona_packed p USING unnest(%s::text[], %s::bigint[]) AS c(term, first)"
        " WHERE p.user_id = %s AND p.layer = %s AND p.term = c.term AND p.first = c.first",
        ([term for term, _ in changed], [first for _, first in changed], user, layer),
    )
    conn.execute(
        "INSERT INTO autopersona_packed (user_id, layer, term, first, postings)"
        # Sent binary (%b): a bytea array in text is escaped byte by byte.
        " SELECT %s, %s, * FROM unnest(%b::text[], %b::bigint[], %b::bytea[])",
        (
            user,
            layer,
            [term for term, _, _ in pieces],
            [first for _, first, _ in pieces],
            [postings for _, _, postings in pieces],
        ),
    )
    conn.execute(
        "UPDATE autopersona_banks SET unpacked = 0 WHERE user_id = %s AND layer = %s",
        (user, layer),
    )


_ORDERED = "m.id, m.position, m.stated_at, m.record"


def find(conn: Any, user: bytes, layer: str, content: Any) -> list[tuple[Any, ...]]:
    """The rows (id, position, stated_at, record) of unburied records equal to ``content``."""
    return conn.execute(
        f"SELECT {_ORDERED} FROM autopersona_memories m WHERE m.user_id = %s AND m.layer = %s"  # noqa: S608 - constant SQL, values are parameters
        " AND m.digest = %s ORDER BY m.position",
        (user, layer, content_digest(content)),
        prepare=True,
        binary=True,
    ).fetchall()


def learned_at(conn: Any, user: bytes, contexts: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rows of unburied persona records learned at any of ``contexts`` (normalised).

    In the order of ``contexts``, then of the bank, as `BankIndex.learned_at` lists them.
    """
    wanted = list(dict.fromkeys(normalise(context) for context in contexts))
    rows = conn.execute(
        f"SELECT {_ORDERED}, m.contexts FROM autopersona_memories m"  # noqa: S608 - constant SQL, values are parameters
        " WHERE m.contexts && %s::text[] AND m.user_id = %s AND m.layer = 'persona'",
        (wanted, user),
        prepare=True,
        binary=True,
    ).fetchall()
    order = {context: i for i, context in enumerate(wanted)}
    rank = {row[0]: min(order[c] for c in row[4] if c in order) for row in rows}
    return sorted((row[:4] for row in rows), key=lambda row: (rank[row[0]], row[1]))


def holding(conn: Any, user: bytes, layer: str, words: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rows of unburied records holding every term of any of ``words``, latest said first.

    Ordered by when each was said, then id, as `BankIndex.containing` orders them.
    """
    prefix = bank_prefix(user, layer)
    wanted = [sorted(set(terms(word))) for word in words]
    query = " | ".join(
        "(" + " & ".join(quote(prefix + term) for term in word) + ")" for word in wanted if word
    )
    if not query:
        return []
    rows = conn.execute(
        f"SELECT {_ORDERED}, m.user_id FROM autopersona_memories m"  # noqa: S608 - constant SQL, values are parameters
        " WHERE m.lexemes @@ %s::tsquery AND m.layer = %s",
        (query, layer),
        prepare=True,
        binary=True,
    ).fetchall()
    mine = [row[:4] for row in rows if bytes(row[4]) == user]  # the prefix is 64 bits only
    return sorted(mine, key=lambda row: (row[2], row[0]), reverse=True)
