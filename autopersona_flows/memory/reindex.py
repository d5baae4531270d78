"""Re-embedding a store, e.g. after switching embedders."""

from __future__ import annotations

from contextlib import ExitStack

from autopersona_flows.memory.embedders import Embedder, check_vectors
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import LAYERS, Embedding
from autopersona_flows.memory.snapshots import MemorySnapshot
from autopersona_flows.memory.text import memory_text

__all__ = ["reindex_user"]


def reindex_user(store: MemoryStore, user_id: str, embedder: Embedder) -> int:
    """Give every memory of a user an embedding by ``embedder``; return how many changed.

    Memories already embedded by this embedder are left alone. The user's banks
    are locked for the duration, and each layer is replaced atomically; contents,
    ids and timestamps stay as they were.
    """
    with ExitStack() as locks:
        for layer in LAYERS:  # the fixed order every multi-bank caller uses
            locks.enter_context(store.locked(user_id, layer))
        snapshot = store.snapshot(user_id)
        stale = [
            (layer, record)
            for layer in LAYERS
            for record in snapshot.memories[layer]
            if record.embedding is None
            or (record.embedding.model, record.embedding.dim) != (embedder.name, embedder.dim)
        ]
        if not stale:
            return 0
        texts = [memory_text(record.content) for _, record in stale]
        vectors = check_vectors(embedder, texts, embedder.embed(texts))
        fresh = {
            (layer, record.id): record.model_copy(
                update={"embedding": Embedding.of(embedder.name, vector)}
            )
            for (layer, record), vector in zip(stale, vectors, strict=True)
        }
        store.restore(
            MemorySnapshot.of(
                user_id,
                {
                    layer: [fresh.get((layer, r.id), r) for r in snapshot.memories[layer]]
                    for layer in LAYERS
                },
            ),
            replace=True,
        )
        return len(stale)
