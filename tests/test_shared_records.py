"""The migration check of spec §16 (issue 15 item 8): ``tht workspace shared-records``.

The embedded Edge shard starts as Schema and Memory have it before the upgrade — dense vector
only, their records with their own payloads (some even tagged with this workspace and a
generation number, int and UUID ids, a type Evidence does not know). A snapshot is saved, the
demo is published into the same shard, and ``preprocess`` and ``--compare`` both say the shared
records are unchanged; a record another system removes is named by the comparison.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qdrant_edge as qe

from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.publishing.shared_records import SHARED_RECORD_KINDS
from evidence_runtime.index import EdgeIndex
from evidence_runtime.search import RECORD_KIND
from evidence_runtime.workspace import load_workspace
from tests.helpers import PublishedDemo, VectorStore, cli, commit
from tests.index_fixtures import create_dense_only_shard
from tests.test_publish import SMALL_EVALUATION

pytestmark = pytest.mark.usefixtures("own_state")

DIM = 384
PER_KIND = 7


def foreign_records() -> list[tuple[Any, list[float], dict[str, Any]]]:
    """What Schema and Memory wrote: their own payloads, int and UUID ids, some tagged with
    this workspace and generation 1 (as Evidence's own points are), two of no known type."""
    kinds = [k for k in SHARED_RECORD_KINDS for _ in range(PER_KIND)] + ["audit_log", None]
    rng = np.random.default_rng(16)
    vectors = rng.standard_normal((len(kinds), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    records = []
    for i, kind in enumerate(kinds):
        rid: Any = 1000 + i if i % 2 else str(uuid.uuid5(uuid.NAMESPACE_URL, f"shared-{i}"))
        payload: dict[str, Any] = {"name": f"clinical.t{i}", "description": f"record {i}"}
        if kind is not None:
            payload["record_kind"] = kind
        if i % 3 == 0:
            payload |= {"workspace_id": "psd", "vector_generation": 1}
        records.append((rid, vectors[i].tolist(), payload))
    return records


@pytest.fixture
def ws(tmp_path: Path, vector_store: VectorStore, published_demo_session: PublishedDemo) -> Path:
    """The demo, activated and never published, its shard holding only the shared records
    (the vector cache is warm: the session's demo was published first)."""
    root = create_demo_repo(tmp_path / "ws")
    vector_store.seed(root)
    (root / "evidence" / "evaluation.yaml").write_text(SMALL_EVALUATION, encoding="utf-8")
    commit(root, "Shorter evaluation set")
    create_dense_only_shard(load_workspace(root).index_path, dense_dim=DIM,
                            records=foreign_records())
    assert cli("workspace", "activate", str(root)).exit_code == 0
    return root


def shared(ws: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    r = cli("workspace", "shared-records", str(ws), *flags, "--json")
    return r.exit_code, json.loads(r.stdout)


def test_a_publish_leaves_the_shared_records_untouched_and_preprocess_says_so(ws: Path) -> None:
    code, saved = shared(ws, "--save")
    assert code == 0 and saved["evidence_points"] == 0
    assert {k: t["count"] for k, t in saved["types"].items()} == {
        **dict.fromkeys(SHARED_RECORD_KINDS, PER_KIND), "other": 2}
    assert all(len(t["dense"]) == 3 and len(t["dense"][0]) == PER_KIND
               for k, t in saved["types"].items() if k != "other")
    assert (ws / ".tht" / "shared-records.json").is_file()

    pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
    assert pre.exit_code == 0, pre.stderr
    published = json.loads(pre.stdout)
    assert published["generation"] == 1 and published["activated"] is True
    comparison = published["shared_records"]
    assert comparison["unchanged"] is True and comparison["saved_at"] == saved["taken_at"]
    assert {k: (t["saved"], t["now"], t["missing_sample"], t["dense_changed"])
            for k, t in comparison["types"].items()} == {
        **{k: (PER_KIND, PER_KIND, [], False) for k in SHARED_RECORD_KINDS},
        "other": (2, 2, [], False)}

    code, now = shared(ws)  # Evidence is in the shard now; the shared records are the same
    assert code == 0 and now["evidence_points"] == published["counts"]["fragments"]
    assert {k: t for k, t in now["types"].items()} == saved["types"]

    human = cli("workspace", "shared-records", str(ws), "--compare")
    assert human.exit_code == 0
    assert "shared records (Schema, Memory) unchanged since the snapshot of" in human.stdout
    assert f"schema_table: {PER_KIND} → {PER_KIND} (unchanged)" in human.stdout


def test_a_shared_record_that_changes_is_named_by_the_comparison(ws: Path) -> None:
    code, saved = shared(ws, "--save")
    assert code == 0
    gone = saved["types"]["memory"]["sample"][0]
    shard = qe.EdgeShard.load(str(load_workspace(ws).index_path))
    try:  # another system (Memory) removes one of its records
        shard.update(qe.UpdateOperation.delete_points(
            [int(gone) if gone.isdigit() else gone]))
        shard.flush()
    finally:
        shard.close()

    code, comparison = shared(ws, "--compare")
    assert code == 1 and comparison["unchanged"] is False
    memory = comparison["types"]["memory"]
    assert (memory["saved"], memory["now"], memory["missing_sample"]) == (
        PER_KIND, PER_KIND - 1, [gone])
    assert comparison["types"]["schema_table"]["unchanged"] is True

    pre = cli("workspace", "preprocess", "evidence", str(ws))
    assert pre.exit_code == 0, pre.stderr
    assert "shared records (Schema, Memory) changed since the snapshot of" in pre.stdout
    assert f"memory: {PER_KIND} → {PER_KIND - 1} (1 sampled id(s) gone: {gone}" in pre.stdout
    with EdgeIndex.open(load_workspace(ws).index_path) as index:
        assert index.count({"record_kind": RECORD_KIND}) > 0


def test_without_a_snapshot_preprocess_is_as_before_and_compare_cannot_run(
        published_demo: PublishedDemo) -> None:
    assert "shared_records" not in published_demo.preprocess_json
    code, doc = shared(published_demo.ws, "--compare")
    assert code == 2 and doc["problems"][0]["code"] == "shared_records_no_snapshot"
    r = cli("workspace", "shared-records", str(published_demo.ws), "--save", "--compare")
    assert r.exit_code == 2 and "--save and --compare exclude each other" in r.output
