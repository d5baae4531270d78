"""The shipped sentence encoder: meaning, offline, in a few milliseconds a text.

`SentenceEncoder` runs the int8 ONNX sentence encoder that ships inside this
package (``autopersona_flows/weights``) with onnxruntime: WordPiece tokens (up to
128), a 6-layer MiniLM, mean pooling and L2 normalisation, all inside the graph.
Its weights start from all-MiniLM-L6-v2 (Apache-2.0) and were fine-tuned on this
project's own synthetic answerhood data (``training/``); nothing is downloaded and
torch is never imported. It is an `Embedder`, the default one: memories are
embedded once when written, and the judge reads those vectors back instead of
encoding the bank again.

One encoder object serves a process (`shared_encoder`): the ONNX session is loaded
on first use and shared by every thread, and each text's vector is kept in a small
LRU cache, since requirement names, node instructions and queries repeat.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autopersona_flows.errors import EmbedderError

__all__ = ["SentenceEncoder", "shared_encoder"]

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
"""The folder of the shipped model files."""

_CACHE = 8192


class _Session:
    """The loaded model: a tokenizer and an onnxruntime session, both thread-safe."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.dim = int(manifest["dim"])
        try:  # imported on first use: `import autopersona_flows` stays light
            import onnxruntime  # noqa: PLC0415
            from tokenizers import Tokenizer  # noqa: PLC0415
        except ImportError as exc:  # pragma: no cover - both are dependencies
            raise EmbedderError(f"the sentence encoder needs {exc.name}: pip install it") from exc
        model = folder / manifest["model"]
        data = model.read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise EmbedderError(
                f"{model} does not match its manifest's digest: the package is damaged; "
                "reinstall autopersona-flows"
            )
        options = onnxruntime.SessionOptions()
        # One thread: a short text runs in 1.3 ms on one core against 2.0 ms on two
        # (waking a second thread costs more than it saves), and the other core stays
        # with the flow's own threads.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            data, options, providers=["CPUExecutionProvider"]
        )
        self.tokenizer = Tokenizer.from_file(str(folder / manifest["tokenizer"]))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(manifest["max_tokens"]))

    def encode(self, texts: list[str]) -> np.ndarray:
        """One vector per text, each text run alone.

        The int8 model quantises each run's activations with one scale for the whole
        run, so a text's vector would depend on the texts batched with it: run alone,
        a text always gets the same vector, in any process (the `Embedder` contract).
        """
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            ids = np.asarray([self.tokenizer.encode(text).ids], dtype=np.int64)
            (vector,) = self.session.run(
                ["sentence_embedding"], {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            )
            out[i] = vector[0]
        return out


class SentenceEncoder:
    """The shipped sentence encoder as an `Embedder` (unit vectors, 384 dimensions).

    Args:
        folder: A folder holding ``encoder.json`` and the files it names; the
            package's own by default.
        cache: Vectors kept in memory, one per distinct text, least recently used
            dropped first.

    Raises:
        EmbedderError: If the folder lacks the manifest, or it is unreadable.
    """

    dense_weight = 0.5
    """The dense share of retrieval scores with this embedder (see `Scoring`)."""
    dense_floor = 0.3
    """The cosine unrelated texts mostly stay under (of requirements against other people's
    memories, 75% stay under 0.16, 95% under 0.28; a one-word query against an unrelated
    memory reaches 0.26): below it, meaning adds nothing to a retrieval score."""
    local = True
    """It runs in-process: an index may embed a bank again with it (see `BankIndex`)."""

    def __init__(self, folder: str | Path | None = None, *, cache: int = _CACHE) -> None:
        self.folder = Path(folder) if folder is not None else WEIGHTS
        try:
            manifest = json.loads((self.folder / "encoder.json").read_text(encoding="utf-8"))
            self.name: str = manifest["name"]
            self.dim: int = int(manifest["dim"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EmbedderError(
                f"{self.folder} holds no readable encoder.json ({exc}); reinstall autopersona-flows"
            ) from exc
        self._manifest = manifest
        self._session: _Session | None = None
        self._lock = threading.Lock()
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._size = cache

    def __repr__(self) -> str:
        return f"SentenceEncoder({self.name!r})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return one unit vector per text, shape ``(len(texts), dim)``.

        Raises:
            EmbedderError: If the model files are missing or damaged.
        """
        texts = list(texts)
        with self._lock:
            known = {text: self._vectors[text] for text in texts if text in self._vectors}
            for text in known:
                self._vectors.move_to_end(text)
        missing = [text for text in dict.fromkeys(texts) if text not in known]
        if missing:
            encoded = self._loaded().encode(missing)
            encoded.setflags(write=False)
            known.update(zip(missing, encoded, strict=True))
            with self._lock:
                self._vectors.update(zip(missing, encoded, strict=True))
                while len(self._vectors) > self._size:
                    self._vectors.popitem(last=False)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([known[text] for text in texts])

    def clear_cache(self) -> None:
        """Forget the vectors kept in memory (the model stays loaded)."""
        with self._lock:
            self._vectors.clear()

    def _loaded(self) -> _Session:
        session = self._session
        if session is None:
            with self._lock:
                if self._session is None:
                    try:
                        self._session = _Session(self.folder, self._manifest)
                    except OSError as exc:
                        raise EmbedderError(
                            f"cannot read the encoder's files in {self.folder} ({exc}); "
                            "reinstall autopersona-flows"
                        ) from exc
                session = self._session
        return session


_SHARED: SentenceEncoder | None = None
_SHARED_LOCK = threading.Lock()


def shared_encoder() -> SentenceEncoder:
    """The process's one `SentenceEncoder` over the shipped model (made on first call)."""
    global _SHARED  # noqa: PLW0603 - one model per process, loaded lazily
    if _SHARED is None:
        with _SHARED_LOCK:
            if _SHARED is None:
                _SHARED = SentenceEncoder()
    return _SHARED
