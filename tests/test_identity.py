"""Identity and lifecycle through the CLI (issue 15 items 1, 2, 5): an id is issued once and
never carries a kind (spec §4.2), an orphan comes home when its source is restored (§6), and a
model failure ends the prepare batch (§5.3).

The model is the scripted OpenAI-compatible server of ``tests/fakes``, reached by the real
``openai`` backend; everything else (intake, ids, manifest, Git checks, apply) is real.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from evidence_pipeline.authoring.ids import slugify
from evidence_pipeline.cli import main
from evidence_pipeline.demo import git
from evidence_pipeline.formats.manifest import read_manifest
from evidence_runtime.units import check_evidence_id
from tests.fakes.openai_server import FakeOpenAIServer, Scripted
from tests.test_prepare import RICOVERO, commit, make_ws, status, tree_snapshot

RICOVERO_EXCERPT = "Il ricovero (o degenza) è il periodo in cui il paziente occupa un posto letto."
DEGENZA = "# Degenza\n\nLa degenza media si misura in giorni di ricovero.\n"
DEGENZA_EXCERPT = "La degenza media si misura in giorni di ricovero."


def glossary(title: str, excerpt: str, *, uid: str | None = None, term: str = "ricovero"
             ) -> dict[str, Any]:
    unit = {"title": title, "kind": "glossary", "purposes": ["disambiguation"],
            "applies_to": {"concepts": [term], "tables": [], "columns": []},
            "glossary": {"term": term, "definition": excerpt, "synonyms": []},
            "supporting_excerpts": [excerpt], "review_items": [], "body": excerpt}
    if uid is not None:
        unit["id"] = uid
    return unit


def answer(*units: dict[str, Any]) -> Scripted:
    return Scripted(content=json.dumps({"units": list(units), "retirement_candidates": []},
                                       ensure_ascii=False))


def tht(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def prepare(ws: Path) -> Result:
    return tht("evidence", "prepare", str(ws), "--json")


def prepared(ws: Path) -> dict[str, Any]:
    r = prepare(ws)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def validate(ws: Path) -> dict[str, Any]:
    return json.loads(tht("evidence", "validate", str(ws), "--json").stdout)


def problems(ws: Path) -> set[str]:
    """The codes of validate's problems, but for the missing evaluation set: these small
    workspaces have none (the set is checked in test_evaluation_set.py). Empty: publishable."""
    return {p["code"] for p in validate(ws)["problems"]} - {"evaluation_missing"}


def curated_ids(ws: Path) -> list[str]:
    return sorted(f"evidence:{p.stem}" for p in (ws / "evidence/curated").rglob("*.md"))


def change_id(ws: Path, kind: str, old: str, new: str) -> None:
    """A curator's hand edit: the unit evidence:<old> becomes evidence:<new> (file name, id and
    manifest entry)."""
    unit = ws / "evidence/curated" / kind / f"{old}.md"
    unit.write_text(unit.read_text(encoding="utf-8").replace(f"id: evidence:{old}\n",
                                                             f"id: evidence:{new}\n"),
                    encoding="utf-8")
    unit.rename(unit.with_name(f"{new}.md"))
    m = ws / "evidence/manifest.yaml"
    text = m.read_text(encoding="utf-8")
    assert text.count(f"- evidence:{old}\n") == 1
    m.write_text(text.replace(f"- evidence:{old}\n", f"- evidence:{new}\n"), encoding="utf-8")


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


def openai_ws(tmp_path: Path, server: FakeOpenAIServer, files: dict[str, str],
              timeout_s: float = 5) -> Path:
    ws = make_ws(tmp_path, files)
    (ws / "thoth.yaml").write_text(
        f"workspace_id: test\nlanguage: italian\nmodel:\n  backend: openai\n"
        f"  base_url: {server.url}\n  model: local-test\n  timeout_s: {timeout_s}\n",
        encoding="utf-8")
    commit(ws, "configure the model backend")
    return ws


# --- 1. an id is issued once (§4.2) --------------------------------------------------------------


def test_a_retired_id_is_never_issued_again(tmp_path: Path, server: FakeOpenAIServer) -> None:
    ws = openai_ws(tmp_path, server, {"source/ricovero.md": RICOVERO})
    server.add(answer(glossary("Ricovero", RICOVERO_EXCERPT)).content)
    assert prepared(ws)["sources"][0]["units"] == ["evidence:ricovero"]
    commit(ws, "prepared")
    r = tht("evidence", "resolve", "evidence:ricovero", "--retire", "--workspace", str(ws),
            "--json")
    assert r.exit_code == 0, r.output
    commit(ws, "retired")

    # a later note whose unit is titled the same: the retired id is not lent to other content
    (ws / "evidence/source/degenza.md").write_text(DEGENZA, encoding="utf-8")
    commit(ws, "new note")
    server.add(answer(glossary("Ricovero", DEGENZA_EXCERPT)).content)
    doc = prepared(ws)
    [new] = [s for s in doc["sources"] if s["path"] == "source/degenza.md"]
    assert new["units"] == ["evidence:ricovero-2"]
    assert curated_ids(ws) == ["evidence:ricovero-2"]
    manifest = read_manifest(ws / "evidence")
    assert manifest.retired_ids == ["evidence:ricovero"]  # kept by every later write
    text = (ws / "evidence/manifest.yaml").read_text(encoding="utf-8")
    assert "retired_ids:\n  - evidence:ricovero\n" in text
    assert problems(ws) == set()

    # a curator who puts the retired id back by hand is told so by validate
    commit(ws, "prepared again")
    change_id(ws, "glossary", "ricovero-2", "ricovero")
    report = validate(ws)
    assert report["status"] == "invalid"
    assert [(p["code"], p["evidence_id"], p["path"]) for p in report["problems"]
            if p["code"] != "evaluation_missing"] == [
        ("retired_id_reused", "evidence:ricovero", "evidence/curated/glossary/ricovero.md")]


# The rule (ids.py): a kind name is never a word of a minted slug, wherever it stands; a
# connective it leaves dangling at an edge goes with it; kind names only → "unit".
SLUGS = {
    "Formula BMI": "bmi",
    "BMI formula": "bmi",
    "Formula di Friedewald": "friedewald",
    "Calcolo della formula": "calcolo",
    "Tabella di mapping reparti": "tabella-di-reparti",
    "Reference: linee guida": "linee-guida",
    "Glossary": "unit",
    "Formula enum": "unit",
    "Fascia pediatrica": "fascia-pediatrica",  # a title without kind names is untouched
    "Età al ricovero": "eta-al-ricovero",
}


@pytest.mark.parametrize(("title", "slug"), sorted(SLUGS.items()))
def test_kind_names_are_never_words_of_a_minted_slug(title: str, slug: str) -> None:
    assert slugify(title) == slug
    check_evidence_id(f"evidence:{slug}")


@pytest.mark.parametrize("eid", ["evidence:formula-bmi", "evidence:bmi-formula",
                                 "evidence:codici-mapping-reparti", "evidence:glossary"])
def test_an_id_carrying_a_kind_name_anywhere_is_refused(eid: str) -> None:
    with pytest.raises(ValueError, match="kind"):
        check_evidence_id(eid)


def test_prepare_mints_ids_without_kind_names_and_validate_refuses_them(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    ws = openai_ws(tmp_path, server, {"source/ricovero.md": RICOVERO})
    server.add(answer(glossary("Ricovero (glossary)", RICOVERO_EXCERPT)).content)
    assert prepared(ws)["sources"][0]["units"] == ["evidence:ricovero"]
    assert problems(ws) == set()
    change_id(ws, "glossary", "ricovero", "ricovero-glossary")  # the kind written in by hand
    report = validate(ws)
    assert report["status"] == "invalid"
    found = [p for p in report["problems"] if p["code"] != "evaluation_missing"]
    assert [(p["code"], p["path"], p["field"]) for p in found] == [
        ("id_invalid", "evidence/curated/glossary/ricovero-glossary.md", "id"),
        ("manifest_malformed", "evidence/manifest.yaml", "sources.source/ricovero.md.units")]
    assert all("contains the kind name 'glossary'" in p["message"] for p in found)


def test_the_demo_ids_are_valid_and_the_demo_publishable(tmp_path: Path) -> None:
    r = tht("demo", "init", str(tmp_path / "d"))
    assert r.exit_code == 0, r.output
    for eid in read_manifest(tmp_path / "d" / "evidence").all_unit_ids():
        check_evidence_id(eid)
    assert validate(tmp_path / "d")["status"] == "publishable"


# --- 2. an orphan comes home (§6) -----------------------------------------------------------------


@pytest.fixture
def orphaned(tmp_path: Path, server: FakeOpenAIServer) -> Path:
    """ricovero.md and degenza.md prepared; ricovero.md then deleted by mistake and prepared:
    evidence:ricovero is an orphan."""
    ws = openai_ws(tmp_path, server, {"source/degenza.md": DEGENZA,
                                      "source/ricovero.md": RICOVERO})
    server.add(answer(glossary("Degenza media", DEGENZA_EXCERPT, term="degenza media")).content)
    server.add(answer(glossary("Ricovero", RICOVERO_EXCERPT)).content)
    prepared(ws)
    commit(ws, "prepared")
    (ws / "evidence/source/ricovero.md").unlink()
    commit(ws, "deleted by mistake")
    doc = prepared(ws)
    assert doc["orphans"] == ["evidence:ricovero"]
    commit(ws, "orphan")
    assert problems(ws) == {"orphan"}
    assert len(server.received) == 2
    return ws


@pytest.mark.parametrize("where", ["source/ricovero.md", "source/glossario/ricovero.md"])
def test_a_source_restored_unchanged_brings_its_orphans_home(
        orphaned: Path, server: FakeOpenAIServer, where: str) -> None:
    ws = orphaned
    target = ws / "evidence" / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(RICOVERO, encoding="utf-8")
    commit(ws, "restored")
    doc = prepared(ws)
    assert len(server.received) == 2  # no model call
    assert doc["model_calls"] == 0
    [report] = [s for s in doc["sources"] if s["path"] == where]
    assert report["units"] == ["evidence:ricovero"]
    if where == "source/ricovero.md":
        assert (report["change"], report["renamed_from"]) == ("restored", None)
    else:  # at another path: a rename
        assert (report["change"], report["renamed_from"]) == ("renamed", "source/ricovero.md")
    assert doc["orphans"] == []
    assert curated_ids(ws) == ["evidence:degenza-media", "evidence:ricovero"]  # no ricovero-2
    manifest = read_manifest(ws / "evidence")
    assert manifest.sources[where].units == ["evidence:ricovero"]
    assert manifest.orphans == [] and manifest.orphaned_sources == {}
    unit = (ws / "evidence/curated/glossary/ricovero.md").read_text(encoding="utf-8")
    assert f"source_file: {where}\n" in unit
    assert problems(ws) == set()


def test_an_orphan_made_before_the_manifest_recorded_its_source_comes_home(
        orphaned: Path, server: FakeOpenAIServer) -> None:
    ws = orphaned
    m = ws / "evidence/manifest.yaml"
    text = m.read_text(encoding="utf-8")
    # the manifest remembers where the orphan came from: its source's path and hash
    assert text.endswith("orphaned_sources:\n  source/ricovero.md:\n    sha256: sha256:"
                         f"{hashlib.sha256(RICOVERO.encode()).hexdigest()}\n    units:\n"
                         "      - evidence:ricovero\n")
    m.write_text(text[:text.index("orphaned_sources:")], encoding="utf-8")
    assert read_manifest(ws / "evidence").orphaned_sources == {}
    (ws / "evidence/source/ricovero.md").write_text(RICOVERO, encoding="utf-8")
    commit(ws, "an older manifest; the note restored")
    doc = prepared(ws)  # the orphan's own provenance names its source and hash
    assert doc["model_calls"] == 0 and doc["orphans"] == []
    assert problems(ws) == set()


def test_a_source_restored_changed_sends_its_orphans_to_the_model(
        orphaned: Path, server: FakeOpenAIServer) -> None:
    ws = orphaned
    (ws / "evidence/source/ricovero.md").write_text(
        RICOVERO + "\nUn ricovero dura almeno una notte.\n", encoding="utf-8")
    commit(ws, "restored and edited")
    server.add(answer(glossary("Ricovero", RICOVERO_EXCERPT, uid="evidence:ricovero")).content)
    doc = prepared(ws)
    assert doc["model_calls"] == 1 and len(server.received) == 3
    prompt = json.dumps(server.received[-1].body["messages"], ensure_ascii=False)
    assert "evidence:ricovero" in prompt  # given as a previous unit, its id kept
    [report] = [s for s in doc["sources"] if s["path"] == "source/ricovero.md"]
    assert report["change"] == "new" and report["units"] == ["evidence:ricovero"]
    assert doc["orphans"] == [] and doc["retirement_candidates"] == []
    assert curated_ids(ws) == ["evidence:degenza-media", "evidence:ricovero"]
    assert problems(ws) == set()


# --- 5. a model failure stops prepare (§5.3) ----------------------------------------------------


def test_the_first_model_failure_ends_the_batch(tmp_path: Path,
                                                server: FakeOpenAIServer) -> None:
    notes = {f"source/nota-{i}.md": f"# Nota {i}\n\nIl reparto {i} è chiuso.\n"
             for i in range(1, 5)}
    ws = openai_ws(tmp_path, server, notes, timeout_s=1)
    server.add(answer(glossary("Reparto 1", "Il reparto 1 è chiuso.", term="reparto 1")).content)
    server.add(status=500, raw_body='{"error": {"message": "boom"}}')
    before = tree_snapshot(ws)
    r = prepare(ws)
    assert r.exit_code == 1, r.output
    assert len(server.received) == 2  # nota-3 and nota-4 were never sent
    doc = json.loads(r.stdout)
    assert doc["status"] == "failed" and doc["model_calls"] == 2
    assert doc["not_attempted"] == ["source/nota-3.md", "source/nota-4.md"]
    assert [(p["code"], p["path"]) for p in doc["problems"]] == [
        ("model_http_error", "evidence/source/nota-2.md")]
    assert tree_snapshot(ws) == before and status(ws) == ""
    assert "Traceback" not in r.output

    text = tht("evidence", "prepare", str(ws))
    assert text.exit_code == 1
    assert len(server.received) == 3  # the first call of this run fails: nothing else is sent
    assert text.stderr.strip().splitlines()[-1] == (
        "error: prepare refused: 1 problem(s); the work tree was not changed; the model "
        "failed on source/nota-1.md, so 3 source(s) were not sent to it: source/nota-2.md, "
        "source/nota-3.md, source/nota-4.md")
    assert tree_snapshot(ws) == before and git(ws, "status", "--porcelain") == ""
