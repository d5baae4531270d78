"""The shipped sentence encoder: meaning offline, the same vector for a text every time."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from autopersona_flows.errors import EmbedderError
from autopersona_flows.memory import Embedder
from autopersona_flows.memory.embedders import default_embedder, get_embedder
from autopersona_flows.memory.encoders import WEIGHTS, SentenceEncoder, shared_encoder


def test_it_is_the_default_embedder_and_one_object_per_process() -> None:
    encoder = shared_encoder()
    assert isinstance(encoder, Embedder)
    assert default_embedder() is encoder
    assert get_embedder("semantic") is encoder
    assert encoder.name.startswith("autopersona-minilm-int8-")
    assert encoder.dim == 384


def test_vectors_are_unit_length_and_carry_meaning() -> None:
    encoder = shared_encoder()
    diet, eat, budget = encoder.embed(
        ["dietary needs", "what I eat: pescatarian, no meat", "hotel budget per night"]
    )
    for vector in (diet, eat, budget):
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-3)
    assert diet @ eat > diet @ budget + 0.1


def test_a_text_gets_the_same_vector_whatever_it_is_embedded_with() -> None:
    """The int8 model scales each run's activations as a whole: texts run alone."""
    text = "aisle seat please, I'm up and down the whole flight"
    alone = SentenceEncoder().embed([text])[0]
    among = SentenceEncoder().embed(["x", "a much longer text " * 20, text])[2]
    assert np.array_equal(alone, among)


def test_vectors_are_cached_and_never_shared_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = SentenceEncoder(cache=2)
    session = encoder._loaded()
    encoded: list[str] = []
    run = session.encode
    monkeypatch.setattr(session, "encode", lambda texts: encoded.extend(texts) or run(texts))
    first = encoder.embed(["one"])
    assert np.array_equal(encoder.embed(["one"]), first)
    assert encoded == ["one"]
    encoder.embed(["two", "three"])  # "one" is evicted, and encoded again alike
    assert np.array_equal(encoder.embed(["one"]), first)
    assert encoded == ["one", "two", "three", "one"]
    encoder.clear_cache()
    assert np.array_equal(encoder.embed(["one"]), first)
    assert encoded[-1] == "one"
    assert len(encoded) == 5
    again = encoder.embed(["one"])
    again[0, 0] = 99.0  # the caller's copy: the cache keeps its own
    assert np.array_equal(encoder.embed(["one"]), first)
    assert encoder.embed([]).shape == (0, 384)


def test_a_missing_or_damaged_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match=r"no readable encoder\.json"):
        SentenceEncoder(tmp_path)
    for name in ("encoder.json", "tokenizer.json"):
        shutil.copy(WEIGHTS / name, tmp_path / name)
    manifest = json.loads((tmp_path / "encoder.json").read_text())
    (tmp_path / manifest["model"]).write_bytes(b"not a model")
    damaged = SentenceEncoder(tmp_path)  # the files are read on first use
    with pytest.raises(EmbedderError, match="damaged"):
        damaged.embed(["anything"])
