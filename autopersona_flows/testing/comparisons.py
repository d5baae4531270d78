"""Comparing what two stores hold, whatever their backends."""

from __future__ import annotations

from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import LAYERS

__all__ = ["assert_same_memories"]


def assert_same_memories(a: MemoryStore, b: MemoryStore, user_id: str) -> None:
    """Assert that two stores (of any backends) hold exactly the same memories of a user.

    Compares the snapshots record by record, then their fingerprints and what each
    store's `MemoryStore.snapshot_fingerprint` reports.

    Raises:
        AssertionError: Naming every record that differs, with both versions.
    """
    left, right = a.snapshot(user_id), b.snapshot(user_id)
    problems = []
    for layer in LAYERS:
        ours = {record.id: record for record in left.memories[layer]}
        theirs = {record.id: record for record in right.memories[layer]}
        problems += [
            f"{layer} {key}: {ours.get(key)!r} in {a!r}, {theirs.get(key)!r} in {b!r}"
            for key in sorted(ours.keys() | theirs.keys())
            if ours.get(key) != theirs.get(key)
        ]
    reported = (a.snapshot_fingerprint(user_id), b.snapshot_fingerprint(user_id))
    if not problems and len({left.fingerprint, right.fingerprint, *reported}) > 1:
        problems.append(f"fingerprints of equal records differ: {left.fingerprint}, {reported}")
    if problems:
        raise AssertionError(f"memories of {user_id!r} differ:\n" + "\n".join(problems))
