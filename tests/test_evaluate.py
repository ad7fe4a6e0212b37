"""``tht evidence evaluate`` and the evaluation records: one function behind the CLI and the
nightly asset, the evaluation set of the evaluated revision, typed reports whose JSON is the
DESIGN.md contract (issue 13).

A small workspace (the demo's clinical domains, formulas and references: 25 units) is published
once per module through the CLI; tests that change state work on a copy of it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner, Result

from evidence_pipeline.authoring.curated_writer import dump_rt
from evidence_pipeline.cli import main
from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.orchestration.monitoring import active_index_evaluation, active_index_gate
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    WorkspaceResource,
)
from evidence_pipeline.validation.validator import validate_evidence_dir
from evidence_runtime.yamlio import load_rt

# The demo's sources kept in the small workspace (with their units and manifest entries).
KEPT_SOURCES = ("source/10-domini-clinici/", "source/60-formule/", "source/70-riferimenti/")

# Each query finds its first expected unit in the top 5, so the gate passes; the second
# expected unit of each is missed.
EVALUATION = """\
queries:
  - id: q01
    text: Quanti pazienti minorenni sono stati ricoverati l'anno scorso?
    profile: semantic
    purpose: sql_generation
    expected: [evidence:fascia-pediatrica, evidence:unita-inesistente]
  - id: q02
    text: Quali codici ICD-10 usa la diagnosi principale?
    profile: lexical
    purpose: sql_generation
    expected: [evidence:riammissione-30-giorni, evidence:icd10-oms]
  - id: q03
    text: Come si calcola la fascia pediatrica di un paziente?
    profile: mixed
    purpose: sql_generation
    context: {constraints: {kinds: [formula]}}
    expected: [evidence:classificazione-pediatrica-adulta, evidence:fascia-pediatrica]
  - id: q04
    text: Quanto tempo aspetta in media un paziente al pronto soccorso?
    profile: semantic
    purpose: sql_generation
    expected: [evidence:minuti-attesa-ps, evidence:accessi-day-hospital]
"""


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def commit(ws: Path, message: str) -> str:
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", message)
    return git(ws, "rev-parse", "HEAD").strip()


def small_workspace(dest: Path) -> Path:
    """The demo reduced to :data:`KEPT_SOURCES` (units, sources and manifest alike), with
    :data:`EVALUATION` (not committed)."""
    ws = create_demo_repo(dest)
    evidence = ws / "evidence"
    _, loaded = validate_evidence_dir(evidence, patterns=["curated/**/*.md"])
    for item in loaded:
        assert item.unit is not None
        if not item.unit.provenance.source_file.startswith(KEPT_SOURCES):
            (evidence / item.rel_path).unlink()
    manifest = load_rt((evidence / "manifest.yaml").read_text(encoding="utf-8"))
    for source in list(manifest["sources"]):
        if not source.startswith(KEPT_SOURCES):
            del manifest["sources"][source]
            (evidence / source).unlink()
    (evidence / "manifest.yaml").write_text(dump_rt(manifest), encoding="utf-8")
    (evidence / "evaluation.yaml").write_text(EVALUATION, encoding="utf-8")
    return ws


@pytest.fixture(scope="module", autouse=True)
def _state_from_the_workspace() -> Iterator[None]:
    """Each workspace keeps its state in its own .tht (no overrides from the environment)."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("THT_STATE_DIR", "THT_REGISTRY_URL", "THT_QDRANT_URL", "THT_WORKSPACE",
                    "DAGSTER_HOME"):
            mp.delenv(var, raising=False)
        yield


@dataclass
class Small:
    ws: Path
    revision: str
    preprocess_json: dict[str, Any]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Small:
    """The small workspace activated and published through the CLI (generation 1)."""
    ws = small_workspace(tmp_path_factory.mktemp("small") / "ws")
    revision = commit(ws, "A small workspace")
    assert cli("workspace", "activate", str(ws)).exit_code == 0
    pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
    assert pre.exit_code == 0, pre.output
    return Small(ws, revision, json.loads(pre.stdout))


@pytest.fixture
def clone(small: Small, tmp_path: Path) -> Path:
    """A private copy of the published small workspace (repository and state alike)."""
    return Path(shutil.copytree(small.ws, tmp_path / "ws", symlinks=True))


def resources(ws: Path) -> dict[str, Any]:
    return {"workspace": WorkspaceResource(root=str(ws)), "index": IndexResource(),
            "embedder": EmbedderResource()}


def evaluate_json(ws: Path, *args: str) -> dict[str, Any]:
    result = cli("evidence", "evaluate", str(ws), "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --------------------------------------------------------------------------- one evaluation


def test_the_cli_and_the_nightly_asset_evaluate_the_revision_s_own_questions(
        clone: Path, small: Small) -> None:
    # the work tree's evaluation.yaml is not the one the generation was published with, and
    # the materialized revision is gone: both read the revision's file from Git
    (clone / "evidence" / "evaluation.yaml").write_text(
        "queries:\n  - id: qx\n    text: zorblat quintessa vrenk\n    profile: lexical\n"
        "    purpose: sql_generation\n    expected: [evidence:icd10-oms]\n", encoding="utf-8")
    shutil.rmtree(clone / ".tht" / "revisions")

    report = evaluate_json(clone)
    assert (report["revision"], report["generation"]) == (small.revision, 1)
    assert [q["id"] for q in report["queries"]] == ["q01", "q02", "q03", "q04"]
    assert report["summary"]["gate_passed"] is True
    assert "regressions" not in report  # no baseline saved
    assert (clone / ".tht" / "revisions" / small.revision / "evidence" / "evaluation.yaml"
            ).read_text(encoding="utf-8") == EVALUATION

    result = dg.materialize([active_index_evaluation, active_index_gate],
                            instance=dg.DagsterInstance.ephemeral(), resources=resources(clone))
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["report"].value == report
    assert metadata["regressions"].value == "no baseline saved"
    (check,) = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["regressions"].value == "no baseline saved"


def test_the_human_report_says_whether_a_baseline_is_saved(clone: Path) -> None:
    before = cli("evidence", "evaluate", str(clone))
    assert before.exit_code == 0, before.output
    assert before.stdout.splitlines()[-1] == (
        "no baseline saved (tht evidence evaluate --save-baseline)")
    saved = cli("evidence", "evaluate", str(clone), "--save-baseline")
    assert saved.exit_code == 0, saved.output
    after = cli("evidence", "evaluate", str(clone))
    assert after.stdout.splitlines()[-1] == "regressions against the baseline: none"
    assert evaluate_json(clone)["regressions"] == []


def test_an_unknown_generation_is_unavailable_not_a_report(clone: Path) -> None:
    result = cli("evidence", "evaluate", str(clone), "--generation", "7", "--json")
    assert result.exit_code == 2
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["code"] == "evaluation_unavailable_generation_unknown"
    assert result.stderr.strip() == (
        "error: search unavailable (generation_unknown): generation 7 does not exist")

