"""The vector cache, with a tiny deterministic embedder that counts what it is asked."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from evidence_pipeline.publishing.embedding_cache import (
    CacheStats,
    VectorCache,
    VectorCacheError,
    cache_key,
    embed_with_cache,
)
from evidence_runtime.errors import EmbedderError


class CountingEmbedder:
    """Deterministic vectors from the text's hash; records every batch it embeds."""

    def __init__(self, model_id: str = "fake-e5", dim: int = 8) -> None:
        self.model_id = model_id
        self.dim = dim
        self.batches: list[list[str]] = []

    def vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(f"{self.model_id}|{text}".encode()).digest()[:8])
        return np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        self.batches.append(list(texts))
        return np.stack([self.vector(t) for t in texts]) if texts else np.empty((0, self.dim))

    @property
    def embedded(self) -> list[str]:
        return [t for batch in self.batches for t in batch]


@pytest.fixture
def cache(tmp_path: Path):  # type: ignore[no-untyped-def]
    with VectorCache(tmp_path / "cache" / "vectors.db") as c:
        yield c


def test_cache_key_derives_from_model_and_text() -> None:
    key = cache_key("m", "testo")
    assert key == hashlib.sha256(b"m\0testo").hexdigest()
    assert cache_key("m", "testo") == key
    assert cache_key("m2", "testo") != key
    assert cache_key("m", "testo ") != key


def test_put_then_get_round_trips_float32(cache: VectorCache) -> None:
    vectors = np.array([[0.1, -2.5, 3.0], [1e-8, 0.0, 7.25]], dtype=np.float64)
    cache.put_many("m", ["uno", "due"], vectors)
    got = cache.get_many("m", ["due", "tre", "uno", "due"])
    assert sorted(got) == [0, 2, 3]
    assert got[0].dtype == np.float32 and got[0].shape == (3,)
    np.testing.assert_array_equal(got[0], vectors[1].astype(np.float32))
    np.testing.assert_array_equal(got[2], vectors[0].astype(np.float32))
    np.testing.assert_array_equal(got[3], got[0])
    assert cache.get_many("other-model", ["uno"]) == {}
    assert cache.stats() == CacheStats(hits=3, misses=2)


def test_cache_persists_across_objects(tmp_path: Path) -> None:
    path = tmp_path / "vectors.db"
    with VectorCache(path) as first:
        first.put_many("m", ["a"], np.ones((1, 4), dtype=np.float32))
    with VectorCache(path) as second:
        assert list(second.get_many("m", ["a"])) == [0]
        assert second.stats() == CacheStats(hits=1, misses=0)  # counters are per object


def test_put_many_validates_its_input(cache: VectorCache) -> None:
    with pytest.raises(VectorCacheError, match="expected 2 vectors"):
        cache.put_many("m", ["a", "b"], np.ones((3, 4)))
    with pytest.raises(VectorCacheError, match="non-finite"):
        cache.put_many("m", ["a"], np.array([[np.nan, 1.0]]))
    cache.put_many("m", [], np.empty((0, 4)))
    assert cache.get_many("m", ["a", "b"]) == {}


def test_many_keys_are_looked_up_in_chunks(cache: VectorCache) -> None:
    texts = [f"frammento {i}" for i in range(1234)]
    cache.put_many("m", texts, np.arange(1234 * 2, dtype=np.float32).reshape(1234, 2))
    got = cache.get_many("m", texts)
    assert len(got) == 1234
    np.testing.assert_array_equal(got[1000], [2000.0, 2001.0])


def test_embed_with_cache_embeds_only_distinct_misses(cache: VectorCache) -> None:
    embedder = CountingEmbedder()
    vectors, computed = embed_with_cache(embedder, ["a", "b", "a"], cache)
    assert computed == 2 and embedder.embedded == ["a", "b"]
    assert vectors.shape == (3, 8) and vectors.dtype == np.float32
    np.testing.assert_array_equal(vectors[0], embedder.vector("a"))
    np.testing.assert_array_equal(vectors[2], embedder.vector("a"))

    again, computed = embed_with_cache(embedder, ["b", "c", "a"], cache)
    assert computed == 1 and embedder.embedded == ["a", "b", "c"]
    np.testing.assert_array_equal(again, np.stack([embedder.vector(t) for t in "bca"]))

    other = CountingEmbedder(model_id="other-model")
    _, computed = embed_with_cache(other, ["a"], cache)
    assert computed == 1  # the same text under another model is a miss


def test_embed_with_cache_batches_and_keeps_progress(cache: VectorCache) -> None:
    class FailsOnThirdBatch(CountingEmbedder):
        def embed_passages(self, texts: list[str]) -> np.ndarray:
            if len(self.batches) == 2:
                raise RuntimeError("model crashed")
            return super().embed_passages(texts)

    texts = [f"t{i}" for i in range(10)]
    flaky = FailsOnThirdBatch()
    with pytest.raises(RuntimeError, match="model crashed"):
        embed_with_cache(flaky, texts, cache, batch_size=4)
    assert [len(b) for b in flaky.batches] == [4, 4]

    embedder = CountingEmbedder()
    vectors, computed = embed_with_cache(embedder, texts, cache, batch_size=4)
    assert computed == 2 and embedder.embedded == ["t8", "t9"]
    np.testing.assert_array_equal(vectors, np.stack([embedder.vector(t) for t in texts]))


def test_embed_with_cache_with_nothing_to_embed(cache: VectorCache) -> None:
    embedder = CountingEmbedder()
    vectors, computed = embed_with_cache(embedder, [], cache)
    assert vectors.shape == (0, 8) and computed == 0 and embedder.batches == []


def test_embed_with_cache_rejects_bad_embedder_output(cache: VectorCache) -> None:
    class WrongDim(CountingEmbedder):
        def embed_passages(self, texts: list[str]) -> np.ndarray:
            return np.ones((len(texts), self.dim + 1), dtype=np.float32)

    with pytest.raises(EmbedderError, match=r"returned shape \(1, 9\) for 1 passages"):
        embed_with_cache(WrongDim(), ["a"], cache)
    assert cache.get_many("fake-e5", ["a"]) == {}  # nothing wrong was cached


def test_a_stored_vector_of_another_dimension_is_recomputed(cache: VectorCache) -> None:
    cache.put_many("fake-e5", ["a"], np.ones((1, 3), dtype=np.float32))
    embedder = CountingEmbedder()
    vectors, computed = embed_with_cache(embedder, ["a"], cache)
    assert computed == 1
    np.testing.assert_array_equal(vectors[0], embedder.vector("a"))
    assert cache.get_many("fake-e5", ["a"])[0].shape == (8,)  # overwritten


def test_a_damaged_entry_is_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "vectors.db"
    with VectorCache(path) as c:
        c.put_many("m", ["a"], np.ones((1, 4), dtype=np.float32))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE vectors SET vector = x'0000'")
    with VectorCache(path) as c:
        assert c.get_many("m", ["a"]) == {}


def test_unopenable_cache_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite " * 100)
    with pytest.raises(VectorCacheError, match="cannot open the vector cache") as exc:
        VectorCache(junk)
    assert exc.value.path == str(junk)
