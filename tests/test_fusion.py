"""The fusion of the two prefetch lists (issue 26 item 2), computed by the module itself:
RRF as ``w / (k + rank)``, min-max convex combinations, DBSF, and the adaptive fusion whose
dense weight follows the BM25 branch's strength."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence_runtime.errors import ConfigError
from evidence_runtime.index.base import Hit
from evidence_runtime.index.fusion import Fusion, adaptive_dense_weight, fuse
from evidence_runtime.workspace import IndexSection, load_workspace


def hits(*pairs: tuple[str, float]) -> list[Hit]:
    return [Hit(pid, score, {"evidence_id": f"evidence:{pid}"}) for pid, score in pairs]


# dense finds "para" first (a paraphrase); BM25 matches other units weakly, never "para"
DENSE = hits(("para", 0.90), ("a", 0.85), ("b", 0.84), ("c", 0.80))
WEAK_BM25 = hits(("a", 1.6), ("b", 1.2), ("c", 0.9), ("d", 0.5))


def test_rrf_is_weight_over_k_plus_rank() -> None:
    fused = fuse(DENSE, WEAK_BM25, Fusion("rrf", rrf_k=5, weights=(2.0, 1.0)), limit=10)
    scores = {h.id: h.score for h in fused}
    assert scores["para"] == pytest.approx(2 / 6)
    assert scores["a"] == pytest.approx(2 / 7 + 1 / 6)
    assert scores["d"] == pytest.approx(1 / 9)
    # units found by both branches bury the dense branch's first hit: what adaptive avoids
    assert [h.id for h in fused] == ["a", "b", "c", "para", "d"]
    assert fused[0].payload == {"evidence_id": "evidence:a"}


def test_convex_combines_min_max_normalised_scores() -> None:
    fused = fuse(DENSE, WEAK_BM25, Fusion("convex", dense_weight=0.5), limit=3)
    scores = {h.id: h.score for h in fused}
    assert len(fused) == 3
    assert scores["para"] == pytest.approx(0.5 * 1.0)  # best dense, absent from BM25
    assert scores["a"] == pytest.approx(0.5 * (0.05 / 0.10) + 0.5 * 1.0)
    dense_only = fuse(DENSE, WEAK_BM25, Fusion("convex", dense_weight=1.0), limit=10)
    assert [h.id for h in dense_only][:4] == ["para", "a", "b", "c"]


def test_dbsf_maps_three_sigma_to_the_unit_interval() -> None:
    fused = fuse(DENSE, [], Fusion("dbsf"), limit=10)
    assert [h.id for h in fused] == ["para", "a", "b", "c"]
    assert all(0.0 < h.score < 1.0 for h in fused)
    same = fuse(hits(("x", 1.0), ("y", 1.0)), [], Fusion("dbsf"), limit=10)
    assert [h.score for h in same] == [0.5, 0.5]


def test_adaptive_weight_follows_the_bm25_strength_per_query_term() -> None:
    f = Fusion("adaptive", dense_weight=0.4, weak_dense_weight=0.9, bm25_strength=(1.0, 2.0))
    assert adaptive_dense_weight(f, None, 3) == 0.9  # BM25 found nothing
    assert adaptive_dense_weight(f, 2.0, 4) == pytest.approx(0.9)  # 0.5 a term: weak
    assert adaptive_dense_weight(f, 4.5, 3) == pytest.approx(0.65)  # 1.5: halfway
    assert adaptive_dense_weight(f, 9.0, 3) == pytest.approx(0.4)  # 3.0: strong


def test_adaptive_keeps_what_only_the_dense_branch_finds_on_a_paraphrase() -> None:
    # BM25's best is 1.6 over 4 terms (0.4 a term): weak, so the dense branch leads
    fused = fuse(DENSE, WEAK_BM25, Fusion("adaptive"), limit=10, terms=4)
    assert fused[0].id == "para"


def test_adaptive_trusts_a_strong_lexical_match() -> None:
    # a code matched strongly (3.0 a term) by BM25 alone: it comes first
    strong = hits(("code", 6.0), ("a", 2.0))
    dense = hits(("x", 0.86), ("a", 0.85), ("y", 0.84), ("code", 0.80))
    assert fuse(dense, strong, Fusion("adaptive"), limit=10, terms=2)[0].id == "code"
    # the same lists seen as a paraphrase (many terms, each weak): the dense branch leads
    assert fuse(dense, strong, Fusion("adaptive"), limit=10, terms=12)[0].id == "x"


def test_ties_are_broken_by_id_whatever_order_the_engine_gave() -> None:
    a = fuse(hits(("b", 0.5), ("a", 0.5)), hits(("c", 1.0)), Fusion("rrf"), limit=10)
    b = fuse(hits(("a", 0.5), ("b", 0.5)), hits(("c", 1.0)), Fusion("rrf"), limit=10)
    assert [h.id for h in a] == [h.id for h in b]
    assert [(h.id, h.score) for h in a] == [(h.id, h.score) for h in b]


def test_fusion_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown fusion"):
        Fusion("max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dense_weight"):
        Fusion("convex", dense_weight=1.5)
    with pytest.raises(ValueError, match="bm25_strength"):
        Fusion("adaptive", bm25_strength=(2.0, 1.0))
    with pytest.raises(ValueError, match="RRF weights"):
        Fusion("rrf", weights=(1.0, 0.0))


def test_the_index_section_gives_the_measured_fusion_defaults() -> None:
    default = IndexSection().fusion_settings()
    assert default == Fusion("adaptive", rrf_k=5, weights=(2.0, 1.0), dense_weight=0.4,
                             weak_dense_weight=0.9, bm25_strength=(1.0, 2.0))
    section = IndexSection.model_validate({"fusion": "convex", "dense_weight": 0.7})
    assert section.fusion_settings().method == "convex"
    assert section.fusion_settings().dense_weight == 0.7
    for bad in ({"fusion": "max"}, {"dense_weight": 1.2}, {"weak_dense_weight": -0.1},
                {"bm25_strength": [2.0, 1.0]}, {"bm25_strength": [1.0]}):
        with pytest.raises(ValueError):
            IndexSection.model_validate(bad)


def test_a_wrong_fusion_in_thoth_yaml_names_its_field(tmp_path: Path) -> None:
    (tmp_path / "thoth.yaml").write_text(
        "workspace_id: psd\nindex:\n  engine: edge\n  fusion: maximum\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_workspace(tmp_path)
    assert err.value.field == "index.fusion"
    (tmp_path / "thoth.yaml").write_text(
        "workspace_id: psd\nindex:\n  fusion: convex\n  dense_weight: 0.6\n",
        encoding="utf-8")
    assert load_workspace(tmp_path).config.index.fusion_settings().dense_weight == 0.6
