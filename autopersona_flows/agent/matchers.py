"""Word matchers for the judge: when two different words mean the same thing.

`LexicalJudge` compares word roots; a `WordMatcher` lets it see past spelling:
`DenseWordMatcher` calls two words the same when a sentence encoder puts them
close ("diet" / "eat", "milk" / "dairy"). It compares single words, never whole
memories: the judge's reading of heads and subjects stays in charge, the encoder
only widens what counts as the same word. Each word is embedded once per process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from autopersona_flows.memory.embedders import Embedder, check_vectors

__all__ = ["DenseWordMatcher"]


class DenseWordMatcher:
    """Two words are the same when their embeddings' cosine reaches ``threshold``.

    Args:
        embedder: Embeds single words, e.g. `MiniLMEmbedder`.
        threshold: The cosine from which two words count as the same.
        max_words: Word vectors kept in memory; the least recently used go first.
    """

    def __init__(self, embedder: Embedder, threshold: float = 0.7, max_words: int = 65536) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1], got {threshold!r}")
        if isinstance(max_words, bool) or not isinstance(max_words, int) or max_words < 1:
            raise ValueError(f"max_words must be a positive int, got {max_words!r}")
        self.embedder = embedder
        self.threshold = threshold
        self.max_words = max_words
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DenseWordMatcher({self.embedder!r}, threshold={self.threshold})"

    def same(self, a: str, b: str) -> bool:
        """Whether the cosine of ``a`` and ``b`` reaches the threshold."""
        if a == b:
            return True
        first, second = self.vectors([a, b])
        return float(first @ second) >= self.threshold

    def vectors(self, words: list[str]) -> list[np.ndarray]:
        """The unit vectors of ``words``, embedding those not seen before in one call."""
        with self._lock:
            known = {word: self._vectors[word] for word in words if word in self._vectors}
            for word in known:
                self._vectors.move_to_end(word)
        missing = [word for word in dict.fromkeys(words) if word not in known]
        if missing:
            embedded = check_vectors(self.embedder, missing, self.embedder.embed(missing))
            norms = np.linalg.norm(embedded, axis=1, keepdims=True)
            embedded = np.divide(embedded, norms, out=np.zeros_like(embedded), where=norms > 0)
            known.update(zip(missing, embedded, strict=True))
            with self._lock:
                self._vectors.update(zip(missing, embedded, strict=True))
                while len(self._vectors) > self.max_words:
                    self._vectors.popitem(last=False)
        return [known[word] for word in words]
