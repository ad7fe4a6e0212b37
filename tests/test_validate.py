"""The validator (spec §5.4) through the CLI and through the functions, on the demo workspace."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from evidence_pipeline.cli import main
from evidence_pipeline.formats.curated_writer import dump_curated, dump_rt
from evidence_pipeline.formats.manifest import read_manifest
from evidence_pipeline.validation.rules import (
    check_example_sql,
    check_formula_sql,
    check_url,
    find_credentials,
)
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.curated import read_curated
from evidence_runtime.yamlio import load_rt
from tests.helpers import curated_files


def run_validate(ws: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["evidence", "validate", str(ws), "--json"])
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(result.stdout)


def test_demo_is_publishable(demo_ws: Path) -> None:
    code, report = run_validate(demo_ws)
    assert report["problems"] == []
    assert report["status"] == "publishable"
    assert report["units"] >= 36
    assert code == 0


def test_demo_human_output(demo_ws: Path) -> None:
    result = CliRunner().invoke(main, ["evidence", "validate", str(demo_ws)])
    assert result.exit_code == 0
    assert re.match(r"publishable: \d+ units, 0 errors, 0 review items", result.stdout.strip())


# --- faults --------------------------------------------------------------------------------


def _edit(file: Path, old: str, new: str) -> None:
    text = file.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {file}"
    file.write_text(text.replace(old, new, 1), encoding="utf-8")


def _set_front(file: Path, mutate: Callable[[dict], None]) -> None:
    doc = read_curated(file)
    mutate(doc.front)
    file.write_text(dump_curated(doc), encoding="utf-8")


def fault_excerpt(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "glossary")[0]
    _set_front(f, lambda d: d["provenance"]["supporting_excerpts"].__setitem__(
        0, "Questa frase non compare in nessun sorgente."))
    return f, "provenance.supporting_excerpts[0]"


def _formula_sql(sql: str) -> Callable[[Path], tuple[Path, str]]:
    def fault(ws: Path) -> tuple[Path, str]:
        f = curated_files(ws, "formula")[0]
        _set_front(f, lambda d: d["formula"].__setitem__("sql", sql))
        return f, "formula.sql"
    return fault


def fault_password(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "reference")[0]
    with f.open("a", encoding="utf-8") as out:
        out.write("\nConnessione: postgresql://etl_user:S3gret0!@dwh.ospedale.local:5432/psd\n")
    return f, "body"


def fault_wrong_dir(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "glossary")[0]
    target = ws / "evidence" / "curated" / "domain" / f.name
    shutil.move(f, target)
    return target, "kind"


def fault_duplicate_id(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "enum")[0]
    copy = f.with_name("copia-" + f.name)
    shutil.copy(f, copy)
    return copy, "id"


def fault_source_changed(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "mapping")[0]
    src = ws / "evidence" / read_curated(f).unit().provenance.source_file
    with src.open("a", encoding="utf-8") as out:
        out.write("\nNota aggiunta dopo la preparazione.\n")
    return f, "provenance.source_sha256"


def fault_review_item(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "domain")[0]
    _set_front(f, lambda d: d["review_items"].append(
        {"code": "ambiguous_source_statement", "message": "Non è chiaro il riferimento.",
         "field": "domain.rule"}))
    return f, "domain.rule"


def fault_orphan(ws: Path) -> tuple[Path, str]:
    manifest = ws / "evidence" / "manifest.yaml"
    data = load_rt(manifest.read_text(encoding="utf-8"))
    f = curated_files(ws, "example")[0]
    eid = read_curated(f).unit().id
    data["orphans"].append(eid)
    manifest.write_text(dump_rt(data), encoding="utf-8")
    return f, "orphans"


def fault_not_utf8(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "normalization")[0]
    f.write_bytes(f.read_bytes().replace("à".encode(), b"\xe0", 1) + b"\xff\xfe")
    return f, ""


def fault_malformed_front(ws: Path) -> tuple[Path, str]:
    f = curated_files(ws, "formula")[-1]
    _edit(f, "kind: formula", "kind: [formula")
    return f, ""


FAULTS = [
    ("excerpt", fault_excerpt, "invalid", "excerpt_not_found"),
    ("select", _formula_sql("SELECT birth_date FROM clinical.patient"), "invalid",
     "formula_not_expression"),
    ("delete", _formula_sql("DELETE FROM clinical.patient"), "invalid", "formula_not_expression"),
    ("two-statements", _formula_sql("1 + 1; DROP TABLE clinical.patient"), "invalid",
     "formula_multiple_statements"),
    ("password", fault_password, "invalid", "credentials_found"),
    ("wrong-dir", fault_wrong_dir, "invalid", "kind_directory_mismatch"),
    ("duplicate-id", fault_duplicate_id, "invalid", "id_duplicate"),
    ("source-changed", fault_source_changed, "invalid", "source_hash_mismatch"),
    ("review-item", fault_review_item, "blocked", "review_item"),
    ("orphan", fault_orphan, "blocked", "orphan"),
    ("not-utf8", fault_not_utf8, "invalid", "encoding_invalid"),
    ("malformed-front-matter", fault_malformed_front, "invalid", "front_matter_malformed"),
]


@pytest.mark.parametrize(("name", "fault", "status", "code"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_through_cli(demo_ws: Path, name: str, fault, status: str, code: str) -> None:
    file, field = fault(demo_ws)
    rel = file.relative_to(demo_ws).as_posix()
    exit_code, report = run_validate(demo_ws)
    assert exit_code != 0
    assert report["status"] == status
    hits = [p for p in report["problems"] if p["code"] == code]
    assert hits, report["problems"]
    hit = next((p for p in hits if p["path"] == rel), hits[0])
    if code != "orphan":
        assert hit["path"] == rel
    if field:
        assert hit["field"] == field
    if code not in {"encoding_invalid", "front_matter_malformed"}:
        assert hit["evidence_id"] and hit["evidence_id"].startswith("evidence:")
    assert hit["message"]


@pytest.mark.parametrize(("name", "fault", "status", "code"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_through_functions(demo_ws: Path, name: str, fault, status: str, code: str) -> None:
    fault(demo_ws)
    report = validate_workspace(demo_ws)
    assert report.status.value == status
    assert code in {p.code for p in report.problems}


def test_human_output_names_file_unit_and_field(demo_ws: Path) -> None:
    file, _ = fault_excerpt(demo_ws)
    result = CliRunner().invoke(main, ["evidence", "validate", str(demo_ws)])
    assert result.exit_code == 1
    assert "excerpt_not_found" in result.stdout
    assert file.name in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("invalid:")


def test_missing_workspace_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["evidence", "validate", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [
    ["evidence", "validate", "{ws}"],
    ["evidence", "prepare", "{ws}"],
    ["evidence", "resolve", "evidence:x", "--retire", "--workspace", "{ws}"],
    ["evidence", "evaluate", "{ws}"],
    ["evidence", "import-formulas", "{ws}", "legacy.yaml"],
    ["evidence", "import-proposals", "{ws}", "proposte.json"],
    ["workspace", "activate", "{ws}"],
    ["workspace", "preprocess", "evidence", "{ws}"],
], ids=lambda c: "-".join(c[:2]))
def test_with_json_an_error_is_one_json_document_on_stdout(tmp_path: Path,
                                                            command: list[str]) -> None:
    args = [a.replace("{ws}", str(tmp_path / "nope")) for a in command] + ["--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "error"
    [problem] = doc["problems"]
    assert problem["code"] == "config_error" and problem["severity"] == "error"
    assert "workspace root is not a directory" in problem["message"]
    assert result.stderr.strip().startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_search_without_a_workspace_is_an_unavailable_outcome(tmp_path: Path) -> None:
    """DESIGN: ``search --json`` prints the outcome; a fault is ``unavailable``, never an error
    document (issue 28, item 6), as ``evidence_runtime.search`` answers."""
    args = ["evidence", "search", str(tmp_path / "nope"), "domanda", "--purpose", "rewriting",
            "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert (doc["status"], doc["code"]) == ("unavailable", "not_configured"), doc
    assert "workspace root is not a directory" in doc["message"]


# --- round trip ----------------------------------------------------------------------------


def test_round_trip_is_byte_identical(demo_ws: Path) -> None:
    files = sorted((demo_ws / "evidence" / "curated").rglob("*.md"))
    assert len(files) >= 36
    for f in files:
        assert dump_curated(read_curated(f)) == f.read_text(encoding="utf-8"), f
    manifest = demo_ws / "evidence" / "manifest.yaml"
    text = manifest.read_text(encoding="utf-8")
    assert dump_rt(load_rt(text)) == text
    assert read_manifest(demo_ws / "evidence") is not None


# --- rules as functions --------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "CASE WHEN age(p.birth_date) < interval '18 years' THEN 'pediatrica' ELSE 'adulta' END",
    "weight_kg / ((height_cm / 100.0) ^ 2)",
    "DATE_PART('day', e.discharge_date - e.admission_date)",
    "coalesce(e.discharge_date, current_date) - e.admission_date",
])
def test_formula_accepts_composable_expressions(sql: str) -> None:
    assert check_formula_sql(sql) is None


@pytest.mark.parametrize(("sql", "code"), [
    ("SELECT 1", "formula_not_expression"),
    ("WITH a AS (SELECT 1) SELECT * FROM a", "formula_not_expression"),
    ("DELETE FROM clinical.patient", "formula_not_expression"),
    ("UPDATE t SET a = 1", "formula_not_expression"),
    ("CREATE TABLE t (a int)", "formula_not_expression"),
    ("DROP TABLE x", "formula_not_expression"),
    ("x + (SELECT max(y) FROM t)", "formula_not_expression"),
    ("a AS b", "formula_not_expression"),
    ("VACUUM", "formula_not_expression"),
    ("a + 1; b + 2", "formula_multiple_statements"),
    ("1); DROP TABLE x; --", "formula_sql_invalid"),
    ("CASE WHEN", "formula_sql_invalid"),
])
def test_formula_rejects(sql: str, code: str) -> None:
    result = check_formula_sql(sql)
    assert result is not None and result[0] == code


def test_example_sql_must_be_one_query() -> None:
    assert check_example_sql("SELECT count(*) FROM clinical.episode WHERE ward = 'PED'") is None
    assert check_example_sql("WITH a AS (SELECT 1 AS x) SELECT x FROM a") is None
    assert check_example_sql("DELETE FROM t")[0] == "example_sql_invalid"
    assert check_example_sql("SELECT 1; SELECT 2")[0] == "example_sql_invalid"
    assert check_example_sql("SELEC 1 FRM")[0] == "example_sql_invalid"


@pytest.mark.parametrize(("url", "ok"), [
    ("https://www.salute.gov.it/portale/temi/p2_6.jsp?id=1232", True),
    ("http://example.org/linea-guida", True),
    ("javascript:alert(1)", False),
    ("file:///etc/passwd", False),
    ("data:text/html,<b>x</b>", False),
    ("https:///no-host", False),
    ("https://example.org/a b", False),
    ("www.example.org", False),
])
def test_url_rule(url: str, ok: bool) -> None:
    assert (check_url(url) is None) is ok


@pytest.mark.parametrize("text", [
    "postgresql://etl:S3gret0@db.local:5432/psd",
    "password = hunter2hunter2",
    "PWD: 'abc123!'",
    "api_key=AbCdEf0123456789XyZ",
    "token: ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "AKIAIOSFODNN7EXAMPLE",
    "sk-proj-abcdefghijklmnopqrstuvwx",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345",
    "xoxb-1234567890-abcdefghij",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
])
def test_credentials_detected(text: str) -> None:
    assert find_credentials(text)


@pytest.mark.parametrize("text", [
    "La password del portale non va mai scritta nelle note.",
    "Il token ICD-10 viene normalizzato senza punto.",
    "postgresql://dwh.ospedale.local:5432/psd",
    "https://www.salute.gov.it/linea-guida",
])
def test_credentials_no_false_alarm(text: str) -> None:
    assert find_credentials(text) == []


def test_javascript_link_in_a_body_is_refused(demo_ws: Path) -> None:
    f = curated_files(demo_ws, "glossary")[0]
    with f.open("a", encoding="utf-8") as out:
        out.write("\n[dettagli](javascript:alert(document.cookie))\n")
    report = validate_workspace(demo_ws)
    hits = [p for p in report.problems if p.code == "url_invalid"]
    assert report.status.value == "invalid"
    assert hits and hits[0].field == "body" and "javascript" in hits[0].message


def test_curated_file_name_with_a_control_character_is_refused(demo_ws: Path) -> None:
    f = curated_files(demo_ws, "glossary")[0]
    f.rename(f.with_name("evil\x1b[31m.md"))
    report = validate_workspace(demo_ws)
    hits = [p for p in report.problems if p.code == "unsafe_path"]
    assert report.status.value == "invalid"
    assert hits and "\x1b" not in hits[0].path and "U+001B" in hits[0].message
