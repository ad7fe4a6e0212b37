"""Formula migration and formula proposals on real Git workspaces (spec §4.3, §12, §16).

Every test builds its own Git repository in tmp_path; imports, validation and the all-or-nothing
apply are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evidence_pipeline.authoring import apply
from evidence_pipeline.authoring.formulas import (
    LEGACY_COLUMNS_MISSING,
    LEGACY_INCOMPATIBLE,
    PROPOSAL_AWAITING_REVIEW,
    FormulaImportError,
    import_formulas,
    import_proposals,
    read_proposals,
)
from evidence_pipeline.authoring.prepare import prepare
from evidence_pipeline.cli import main
from evidence_pipeline.cli.common import stdout
from evidence_pipeline.demo import git
from evidence_pipeline.formats.curated_writer import dump_curated
from evidence_pipeline.formats.manifest import dump_manifest, read_manifest
from evidence_pipeline.gitrepo import GitError
from evidence_pipeline.lock import workspace_lock
from evidence_pipeline.validation.corpus import sha256_bytes
from evidence_pipeline.validation.problems import Severity, Status
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.curated import read_curated
from evidence_runtime.errors import EvidenceError
from tests.helpers import commit, new_workspace

ETA = """# Età al ricovero

Età in anni compiuti alla data di ricovero.

Colonne: clinical.patient.birth_date, clinical.episode.admission_date

```sql
date_part('year', age(episode.admission_date::date, patient.birth_date))
```
"""

# no columns line: the input columns are the schema.table.column references of the SQL
DEGENZA = """# Giorni di degenza

Durata della degenza in giorni (stesso giorno = 0).

```sql
clinical.episode.discharge_date::date - clinical.episode.admission_date::date
```
"""


def legacy(title: str, sql: str, text: str = "Una formula del vecchio store.") -> str:
    return (f"# {title}\n\n{text}\n\nColonne: clinical.episode.admission_date\n\n"
            f"```sql\n{sql}\n```\n")


INCOMPATIBLE = {
    "select": ("SELECT count(*) FROM clinical.episode", "formula_not_expression"),
    "with": ("WITH e AS (SELECT * FROM clinical.episode)\nSELECT count(*) FROM e",
             "formula_not_expression"),
    "delete": ("DELETE FROM clinical.episode WHERE episode_id < 0", "formula_not_expression"),
    "two-statements": ("episode.admission_date + 1; episode.admission_date - 1",
                       "formula_multiple_statements"),
    "unparsable": ("CASE WHEN (episode.admission_date", "formula_sql_invalid"),
}


def make_ws(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    return new_workspace(tmp_path / "ws", {"README.md": "# Evidence\n", **(files or {})},
                         message="workspace")



def make_store(tmp_path: Path, entries: dict[str, str | bytes], name: str = "legacy") -> Path:
    store = tmp_path / name
    (store / "formulas").mkdir(parents=True)
    for file_name, content in entries.items():
        data = content.encode("utf-8") if isinstance(content, str) else content
        (store / "formulas" / file_name).write_bytes(data)
    return store


def status(ws: Path) -> str:
    return git(ws, "status", "--porcelain", "--untracked-files=all")


def snapshot(ws: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the work tree (outside .git and .tht) with its bytes and mtime."""
    out = {}
    for f in sorted(ws.rglob("*")):
        rel = f.relative_to(ws).as_posix()
        if f.is_file() and not rel.startswith((".git/", ".tht/")):
            out[rel] = (f.read_bytes(), f.stat().st_mtime_ns)
    return out


def unit_file(ws: Path, evidence_id: str) -> Path:
    return ws / "evidence" / "curated" / "formula" / f"{evidence_id.split(':', 1)[1]}.md"


def approve(ws: Path, evidence_id: str) -> None:
    """What a curator does after review: remove the review items, commit."""
    f = unit_file(ws, evidence_id)
    doc = read_curated(f)
    doc.front["review_items"].clear()
    f.write_text(dump_curated(doc), encoding="utf-8")
    commit(ws, f"approve {evidence_id}")


def proposal(**over: Any) -> dict[str, Any]:
    base = {
        "concept": "fascia pediatrica",
        "columns": ["clinical.patient.birth_date", "clinical.episode.admission_date"],
        "sql": "CASE WHEN date_part('year', age(episode.admission_date::date, "
               "patient.birth_date)) < 18 THEN 'pediatrica' ELSE 'adulta' END",
        "question": "Quanti ricoveri pediatrici ci sono stati nel 2024?",
        "rationale": "La sessione ha classificato i pazienti per età alla data di ricovero, "
                     "con soglia a 18 anni.",
        "session_id": "s-20240611-7f3a",
    }
    base.update(over)
    return base


def write_artifact(tmp_path: Path, data: Any, name: str = "artifact.json") -> Path:
    f = tmp_path / name
    f.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return f


def problems_of(ws: Path, evidence_id: str) -> list[Any]:
    return [p for p in validate_workspace(ws).problems if p.evidence_id == evidence_id]


# ---------------------------------------------------------------------------------------------
# Legacy store
# ---------------------------------------------------------------------------------------------


def test_good_legacy_formulas_become_valid_units(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"eta.sql.md": ETA, "degenza.sql.md": DEGENZA})

    result = import_formulas(ws, store)

    assert result.status == "applied"
    assert [(e.evidence_id, e.status, e.review_codes) for e in result.entries] == [
        ("evidence:giorni-di-degenza", "imported", ()),
        ("evidence:eta-al-ricovero", "imported", ()),
    ]
    copy = ws / "evidence/source/60-formule/legacy/eta.sql.md"
    assert copy.read_bytes() == (store / "formulas/eta.sql.md").read_bytes()
    unit = read_curated(unit_file(ws, "evidence:eta-al-ricovero")).unit()
    assert unit.kind == "formula"
    assert unit.formula.concept == "Età al ricovero"
    assert unit.formula.columns == ["clinical.patient.birth_date",
                                    "clinical.episode.admission_date"]
    assert unit.formula.sql == ("date_part('year', age(episode.admission_date::date, "
                                "patient.birth_date))")
    assert unit.applies_to.tables == ["clinical.patient", "clinical.episode"]
    assert unit.provenance.source_file == "source/60-formule/legacy/eta.sql.md"
    assert unit.provenance.source_sha256 == sha256_bytes(copy.read_bytes())
    assert unit.provenance.supporting_excerpts == [
        "Età in anni compiuti alla data di ricovero.",
        "Colonne: clinical.patient.birth_date, clinical.episode.admission_date",
        "date_part('year', age(episode.admission_date::date, patient.birth_date))",
    ]
    assert unit.review_items == []
    degenza = read_curated(unit_file(ws, "evidence:giorni-di-degenza")).unit()
    assert degenza.formula.columns == ["clinical.episode.discharge_date",
                                       "clinical.episode.admission_date"]
    manifest = read_manifest(ws / "evidence")
    assert manifest is not None
    assert manifest.sources["source/60-formule/legacy/eta.sql.md"].units == [
        "evidence:eta-al-ricovero"]
    assert manifest.sources["source/60-formule/legacy/eta.sql.md"].sha256 == \
        unit.provenance.source_sha256
    report = validate_workspace(ws)
    assert report.status is Status.publishable, [p.line() for p in report.problems]
    assert report.units == 2


@pytest.mark.parametrize("case", sorted(INCOMPATIBLE))
def test_incompatible_legacy_entry_is_imported_blocked(tmp_path: Path, case: str) -> None:
    sql, check_code = INCOMPATIBLE[case]
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"a-good.sql.md": ETA,
                                  "b-bad.sql.md": legacy("Conteggio ricoveri", sql)})

    result = import_formulas(ws, store)

    by_id = {e.evidence_id: e for e in result.entries}
    assert by_id["evidence:eta-al-ricovero"].review_codes == ()
    assert by_id["evidence:conteggio-ricoveri"].review_codes == (LEGACY_INCOMPATIBLE,)
    unit = read_curated(unit_file(ws, "evidence:conteggio-ricoveri")).unit()
    assert unit.formula.sql == sql  # kept verbatim, nothing invented
    [item] = unit.review_items
    assert item.code == LEGACY_INCOMPATIBLE
    assert item.field == "formula.sql"
    assert check_code in item.message and "b-bad.sql.md" in item.message

    report = validate_workspace(ws)
    assert report.status is Status.blocked
    assert all(p.severity is Severity.review for p in report.problems)
    assert not problems_of(ws, "evidence:eta-al-ricovero")
    review = [p for p in report.problems if p.code == "review_item"]
    assert [(p.path, p.evidence_id, p.field) for p in review] == [
        ("evidence/curated/formula/conteggio-ricoveri.md", "evidence:conteggio-ricoveri",
         "formula.sql")]
    assert any(p.code == check_code and p.field == "formula.sql" for p in report.problems)

    # removing the review item without rewriting the SQL never makes it publishable
    commit(ws, "import")
    approve(ws, "evidence:conteggio-ricoveri")
    report = validate_workspace(ws)
    assert report.status is Status.invalid
    assert [p.code for p in report.problems if p.severity is Severity.error] == [check_code]


def test_review_item_on_another_field_does_not_cover_bad_sql(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"bad.sql.md": legacy("Conteggio", "SELECT 1")})
    import_formulas(ws, store)
    f = unit_file(ws, "evidence:conteggio")
    doc = read_curated(f)
    doc.front["review_items"][0]["field"] = "title"
    f.write_text(dump_curated(doc), encoding="utf-8")
    assert validate_workspace(ws).status is Status.invalid


def test_legacy_review_code_covers_nothing_outside_the_legacy_copies(tmp_path: Path) -> None:
    # e.g. a model's reply in prepare cannot launder bad SQL into a mere doubt with this code
    ws = make_ws(tmp_path)
    import_formulas(ws, make_store(tmp_path, {"bad.sql.md": legacy("Conteggio", "SELECT 1")}))
    ev = ws / "evidence"
    (ev / "source/note").mkdir()
    (ev / "source/60-formule/legacy/bad.sql.md").rename(ev / "source/note/bad.sql.md")
    f = unit_file(ws, "evidence:conteggio")
    doc = read_curated(f)
    doc.front["provenance"]["source_file"] = "source/note/bad.sql.md"
    f.write_text(dump_curated(doc), encoding="utf-8")
    manifest = read_manifest(ev)
    assert manifest is not None
    manifest.sources["source/note/bad.sql.md"] = manifest.sources.pop(
        "source/60-formule/legacy/bad.sql.md")
    (ev / "manifest.yaml").write_text(dump_manifest(manifest), encoding="utf-8")

    report = validate_workspace(ws)
    assert report.status is Status.invalid
    assert [(p.code, p.field) for p in report.problems if p.severity is Severity.error] == [
        ("formula_not_expression", "formula.sql")]


def test_second_import_is_a_no_op(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"eta.sql.md": ETA,
                                  "bad.sql.md": legacy("Conteggio", "SELECT 1")})
    import_formulas(ws, store)
    commit(ws, "import")
    before = snapshot(ws)

    again = import_formulas(ws, store)

    assert again.status == "unchanged"
    assert again.written == []
    assert [(e.status, e.review_codes) for e in again.entries] == [
        ("unchanged", (LEGACY_INCOMPATIBLE,)), ("unchanged", ())]
    assert snapshot(ws) == before
    assert status(ws) == ""


def test_imported_sources_are_unchanged_for_prepare(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    import_formulas(ws, make_store(tmp_path, {"eta.sql.md": ETA}))
    commit(ws, "import")

    def no_model(name: str, settings: dict[str, Any]) -> Any:
        raise AssertionError("prepare must not restructure an imported source")

    result = prepare(ws, backend_factory=no_model)
    assert result.status == "unchanged"
    assert status(ws) == ""


def test_ids_are_minted_once_against_existing_ids(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    import_formulas(ws, make_store(tmp_path, {"eta.sql.md": ETA}))
    commit(ws, "first store")
    other = make_store(tmp_path, {"eta-bis.sql.md": ETA.replace("compiuti", "interi")},
                       name="other")

    result = import_formulas(ws, other)

    assert [e.evidence_id for e in result.entries] == ["evidence:eta-al-ricovero-2"]
    assert validate_workspace(ws).status is Status.publishable


BAD_ENTRIES = {
    "not-utf8": (b"# Eta\n\nColonne: a.b.c\n\n```sql\n'\xff'\n```\n", "not valid UTF-8"),
    "no-sql-block": ("# Eta\n\nColonne: clinical.patient.birth_date\n\nsolo testo\n",
                     "no ```sql block"),
    "two-sql-blocks": (legacy("Eta", "a.b + 1") + "\n```sql\na.b + 2\n```\n",
                       "2 ```sql blocks"),
    "no-heading": ("Testo.\n\nColonne: a.b.c\n\n```sql\na.b + 1\n```\n", "no '# heading'"),
    "unclosed-block": ("# Eta\n\nColonne: a.b.c\n\n```sql\na.b + 1\n", "is not closed"),
    "credential": (legacy("Eta", "a.b + 1", "Connessione: postgres://etl:s3cret@dwh/psd"),
                   "looks like a credential"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_failing_entry_in_the_middle_leaves_the_tree_untouched(tmp_path: Path,
                                                               case: str) -> None:
    content, expected = BAD_ENTRIES[case]
    ws = make_ws(tmp_path, {"source/note.md": "# Nota\n"})
    store = make_store(tmp_path, {"a.sql.md": ETA, "b-bad.sql.md": content,
                                  "c.sql.md": DEGENZA})
    before = snapshot(ws)

    with pytest.raises(FormulaImportError) as info:
        import_formulas(ws, store)

    assert expected in str(info.value)
    assert "b-bad.sql.md" in str(info.value)
    assert snapshot(ws) == before
    assert status(ws) == ""
    assert not (ws / ".tht" / "staging").exists() or not any((ws / ".tht/staging").iterdir())


def test_failing_entry_cli_one_clear_line(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"a.sql.md": ETA, "b.sql.md": b"# x\n\xff\n"})
    r = CliRunner().invoke(main, ["evidence", "import-formulas", str(ws), str(store)])
    assert r.exit_code != 0
    assert r.stdout == ""
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and "b.sql.md" in line and "UTF-8" in line
    assert status(ws) == ""


def test_entry_naming_no_columns_is_imported_blocked_through_the_cli(tmp_path: Path) -> None:
    # the entry: no 'Colonne:' line and no schema.table.column anywhere; the other
    # entries of the store come in as they would without it
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"a.sql.md": ETA,
                                  "conteggio.sql.md": "# Conteggio episodi\n\nQuanti episodi."
                                  "\n\n```sql\nSELECT count(*) FROM clinical.episode\n```\n",
                                  "c.sql.md": DEGENZA})

    r = CliRunner().invoke(main, ["evidence", "import-formulas", str(ws), str(store), "--json"])

    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["status"] == "applied"
    codes = {e["evidence_id"]: e["review_items"] for e in out["entries"]}
    assert codes == {"evidence:eta-al-ricovero": [], "evidence:giorni-di-degenza": [],
                     "evidence:conteggio-episodi": [LEGACY_COLUMNS_MISSING, LEGACY_INCOMPATIBLE]}
    unit = read_curated(unit_file(ws, "evidence:conteggio-episodi")).unit()
    assert unit.formula.columns == [] and unit.applies_to.columns == []
    assert unit.formula.sql == "SELECT count(*) FROM clinical.episode"  # verbatim
    item = next(i for i in unit.review_items if i.code == LEGACY_COLUMNS_MISSING)
    assert item.field == "formula.columns" and "conteggio.sql.md" in item.message

    # blocked, not invalid: the missing columns are a doubt the curator resolves
    r = CliRunner().invoke(main, ["evidence", "validate", str(ws), "--json"])
    report = json.loads(r.stdout)
    assert r.exit_code == 1 and report["status"] == "blocked"
    missing = [p for p in report["problems"] if p["code"] == "formula_columns_missing"]
    assert [(p["severity"], p["evidence_id"], p["field"]) for p in missing] == [
        ("review", "evidence:conteggio-episodi", "formula.columns")]

    # removing the review item without naming the columns never makes it publishable
    commit(ws, "import")
    approve(ws, "evidence:conteggio-episodi")
    errors = [(p.code, p.field) for p in problems_of(ws, "evidence:conteggio-episodi")
              if p.severity is Severity.error]
    assert ("formula_columns_missing", "formula.columns") in errors


def test_changed_legacy_entry_is_refused(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"eta.sql.md": ETA})
    import_formulas(ws, store)
    commit(ws, "import")
    (store / "formulas" / "eta.sql.md").write_text(ETA + "\nNota aggiunta.\n", encoding="utf-8")
    before = snapshot(ws)
    with pytest.raises(FormulaImportError, match="already exists with different content"):
        import_formulas(ws, store)
    assert snapshot(ws) == before


def test_dirty_tree_is_refused(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, {"source/note.md": "# Nota\n"})
    (ws / "evidence/source/note.md").write_text("# Nota cambiata\n", encoding="utf-8")
    with pytest.raises(GitError, match="uncommitted"):
        import_formulas(ws, make_store(tmp_path, {"eta.sql.md": ETA}))
    assert not (ws / "evidence/curated").exists()


def test_busy_workspace_is_refused(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    with workspace_lock(ws / ".tht", what="prepare"), \
            pytest.raises(EvidenceError, match="import-formulas refused") as busy:
        import_formulas(ws, make_store(tmp_path, {"eta.sql.md": ETA}))
    assert busy.value.code == "workspace_busy"


def test_missing_legacy_store(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    with pytest.raises(FormulaImportError, match="no formulas/ directory"):
        import_formulas(ws, tmp_path / "nowhere")


def test_import_formulas_cli_table_and_json(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_ws(tmp_path)
    make_store(tmp_path, {"a.sql.md": legacy("Conteggio", "SELECT 1"), "b.sql.md": DEGENZA})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stdout, "width", 160)  # one table row per entry

    r = CliRunner().invoke(main, ["evidence", "import-formulas", "ws", "legacy"])
    assert r.exit_code == 0, r.stderr
    assert "legacy/formulas/a.sql.md" in r.stdout
    assert "evidence:conteggio" in r.stdout
    assert LEGACY_INCOMPATIBLE in r.stdout
    assert "│ ok" in r.stdout
    assert "2 unit(s) imported, 5 file(s) written" in r.stdout
    commit(ws, "import")

    r = CliRunner().invoke(main, ["evidence", "import-formulas", "ws", "legacy", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "unchanged"
    assert [(e["file"], e["evidence_id"], e["status"], e["review_items"])
            for e in doc["entries"]] == [
        ("legacy/formulas/a.sql.md", "evidence:conteggio", "unchanged", [LEGACY_INCOMPATIBLE]),
        ("legacy/formulas/b.sql.md", "evidence:giorni-di-degenza", "unchanged", []),
    ]
    assert doc["written"] == []


# ---------------------------------------------------------------------------------------------
# Proposals
# ---------------------------------------------------------------------------------------------


def test_proposal_becomes_note_and_unit_awaiting_review(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    artifact = write_artifact(tmp_path, {"formula_proposals": [proposal()]})

    result = import_proposals(ws, [artifact])

    [entry] = result.entries
    assert entry.evidence_id == "evidence:fascia-pediatrica"
    assert entry.review_codes == (PROPOSAL_AWAITING_REVIEW,)
    assert entry.source == "evidence/source/proposals/s-20240611-7f3a-fascia-pediatrica.md"
    note = (ws / entry.source).read_text(encoding="utf-8")
    assert note.startswith("# Formula proposal: fascia pediatrica\n")
    assert "Session proposal" in note and "s-20240611-7f3a" in note
    for text in (proposal()["question"], proposal()["rationale"],
                 "Columns: clinical.patient.birth_date, clinical.episode.admission_date",
                 f"```sql\n{proposal()['sql']}\n```"):
        assert text in note
    unit = read_curated(unit_file(ws, entry.evidence_id)).unit()
    assert unit.title == "Fascia pediatrica"
    assert unit.formula.concept == "fascia pediatrica"
    assert unit.formula.sql == proposal()["sql"]
    assert unit.provenance.source_file == "source/proposals/s-20240611-7f3a-fascia-pediatrica.md"
    assert unit.provenance.source_sha256 == sha256_bytes((ws / entry.source).read_bytes())
    assert [i.code for i in unit.review_items] == [PROPOSAL_AWAITING_REVIEW]

    report = validate_workspace(ws)
    assert report.status is Status.blocked
    assert [(p.code, p.evidence_id) for p in report.problems] == [
        ("review_item", "evidence:fascia-pediatrica")]

    # a person approves it by removing the review item in a reviewed commit
    commit(ws, "import proposal")
    approve(ws, "evidence:fascia-pediatrica")
    report = validate_workspace(ws)
    assert report.status is Status.publishable, [p.line() for p in report.problems]


def test_single_proposal_object_and_reimport_is_a_no_op(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    artifact = write_artifact(tmp_path, proposal())
    first = import_proposals(ws, [artifact])
    assert first.status == "applied"
    commit(ws, "import")
    before = snapshot(ws)

    again = import_proposals(ws, [artifact])

    assert again.status == "unchanged"
    assert [(e.status, e.review_codes) for e in again.entries] == [
        ("unchanged", (PROPOSAL_AWAITING_REVIEW,))]
    assert snapshot(ws) == before
    assert status(ws) == ""


def test_proposals_with_the_same_name_get_suffixed_notes(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    artifact = write_artifact(tmp_path, {"formula_proposals": [
        proposal(), proposal(sql="date_part('year', age(patient.birth_date)) < 18"),
        proposal()]})

    result = import_proposals(ws, [artifact])

    assert [(Path(e.source).name, e.evidence_id, e.status) for e in result.entries] == [
        ("s-20240611-7f3a-fascia-pediatrica.md", "evidence:fascia-pediatrica", "imported"),
        ("s-20240611-7f3a-fascia-pediatrica-2.md", "evidence:fascia-pediatrica-2",
         "imported"),
        ("s-20240611-7f3a-fascia-pediatrica.md", "evidence:fascia-pediatrica", "duplicate"),
    ]
    assert validate_workspace(ws).status is Status.blocked
    commit(ws, "import")
    assert import_proposals(ws, [artifact]).status == "unchanged"


@pytest.mark.parametrize("sql", [
    "1); DROP TABLE x; --",
    "1; DROP TABLE clinical.patient",
    "patient.birth_date IN (SELECT birth_date FROM clinical.patient)",
    "DELETE FROM clinical.patient",
])
def test_injected_sql_never_becomes_a_formula(tmp_path: Path, sql: str) -> None:
    ws = make_ws(tmp_path)
    artifact = write_artifact(tmp_path, {"formula_proposals": [
        proposal(), proposal(concept="iniezione", sql=sql)]})
    before = snapshot(ws)

    with pytest.raises(FormulaImportError) as info:
        import_proposals(ws, [artifact])

    assert info.value.path == str(artifact)
    assert info.value.field == "formula_proposals[1].sql"
    assert info.value.code == "proposal_refused"
    assert snapshot(ws) == before  # all or nothing: the good proposal is not imported either

    r = CliRunner().invoke(main, ["evidence", "import-proposals", str(ws), str(artifact)])
    assert r.exit_code != 0
    [line] = r.stderr.strip().splitlines()
    assert f"{artifact}: formula_proposals[1].sql:" in line
    assert "Traceback" not in r.output
    assert snapshot(ws) == before
    assert not list((ws / "evidence").rglob("*iniezione*"))


def test_proposal_with_a_credential_is_refused(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    artifact = write_artifact(tmp_path, proposal(
        rationale="Provata sul DWH con password=Sup3rSegreta!"))
    with pytest.raises(FormulaImportError, match="credential") as info:
        import_proposals(ws, [artifact])
    assert info.value.field == "rationale"
    assert status(ws) == ""


MALFORMED = {
    "not-json": ("{not json", "not valid JSON"),
    "array": ("[]", "must be a JSON object"),
    "extra-key": ({"formula_proposals": [proposal(author="x")]},
                  "formula_proposals[0].author: Extra inputs are not permitted"),
    "missing-field": ({"formula_proposals": [{k: v for k, v in proposal().items()
                                               if k != "question"}]},
                      "formula_proposals[0].question: Field required"),
    "wrong-type": ({"formula_proposals": [proposal(columns="clinical.patient.birth_date")]},
                   "formula_proposals[0].columns: Input should be a valid list"),
    "bad-column": (proposal(columns=["birth_date"]), "columns: "),
    "empty-list": ({"formula_proposals": []}, "formula_proposals: List should have at least"),
    "bad-session": (proposal(session_id="../../etc"), "session_id: String should match"),
    "blank-sql": (proposal(sql="   "), "sql: must not be empty"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_artifact_gives_one_clear_cli_line(tmp_path: Path, case: str) -> None:
    data, expected = MALFORMED[case]
    ws = make_ws(tmp_path)
    artifact = write_artifact(tmp_path, data, name=f"{case}.json")
    r = CliRunner().invoke(main, ["evidence", "import-proposals", str(ws), str(artifact)])
    assert r.exit_code != 0
    assert r.stdout == ""
    assert "Traceback" not in r.output
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {artifact}: ")
    assert expected in line
    assert status(ws) == ""


def test_read_proposals_accepts_both_shapes(tmp_path: Path) -> None:
    one = read_proposals(write_artifact(tmp_path, proposal(), name="one.json"))
    many = read_proposals(write_artifact(tmp_path, {"formula_proposals": [proposal()] * 2},
                                         name="many.json"))
    assert len(one) == 1 and len(many) == 2
    assert one[0] == many[0]


def test_import_proposals_cli_json(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    a1 = write_artifact(tmp_path, proposal(), name="a1.json")
    a2 = write_artifact(tmp_path, {"formula_proposals": [proposal(
        concept="età al ricovero", columns=["clinical.patient.birth_date"],
        sql="date_part('year', age(patient.birth_date))", session_id="s2")]}, name="a2.json")
    r = CliRunner().invoke(main, ["evidence", "import-proposals", str(ws), str(a1), str(a2),
                                  "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "applied"
    assert [(e["file"], e["evidence_id"], e["review_items"]) for e in doc["entries"]] == [
        (str(a1), "evidence:fascia-pediatrica", [PROPOSAL_AWAITING_REVIEW]),
        (f"{a2}#0", "evidence:eta-al-ricovero", [PROPOSAL_AWAITING_REVIEW]),
    ]
    assert "evidence/source/proposals/s2-eta-al-ricovero.md" in doc["written"]
    assert "evidence/manifest.yaml" in doc["written"]


@pytest.mark.parametrize("step", ["before_commit", "after_commit"])
def test_interrupted_import_ends_untouched_or_complete(tmp_path: Path, step: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_ws(tmp_path)
    store = make_store(tmp_path, {"eta.sql.md": ETA, "degenza.sql.md": DEGENZA})
    before = snapshot(ws)

    def crash(name: str) -> None:
        if name == step:
            raise KeyboardInterrupt  # stands in for a kill at this step

    monkeypatch.setattr(apply, "_STEP_HOOK", crash)
    with pytest.raises(KeyboardInterrupt):
        import_formulas(ws, store)
    monkeypatch.setattr(apply, "_STEP_HOOK", None)
    assert snapshot(ws) == before  # nothing swapped in yet either way

    result = import_formulas(ws, store)
    if step == "before_commit":  # discarded, then imported afresh
        assert result.status == "applied"
    else:  # rolled forward: that is the change to review
        assert result.status == "recovered"
        assert result.recovered and result.recovered[0].startswith("completed")
    assert validate_workspace(ws).status is Status.publishable
    commit(ws, "import")
    assert import_formulas(ws, store).status == "unchanged"
