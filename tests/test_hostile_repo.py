"""A hostile repository, hostile text and broken settings (issue 28, items 4, 5, 6, 8, 9).

Each test drives one attack through the surface a user meets it on (the ``tht`` CLI, or the
library for ``evidence_runtime.search``) and asserts the promised outcome: a clear refusal with
a stable code and an untouched tree (4), no command configured by the repository ever run (5),
an outcome instead of a traceback (6), invisible and look-alike text flagged for review (8),
credentials found whatever their Unicode form (9; the corpus itself is in
``tests/fixtures/credentials/``, run by ``tests/test_credentials.py``).
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from evidence_pipeline.cli import main
from evidence_pipeline.demo import git
from evidence_pipeline.gitrepo import dirty_paths
from tests.helpers import commit, new_workspace

pytestmark = pytest.mark.faults


def tht(*args: str) -> Result:
    """``tht`` in process; a crash (any exception but a clean exit) fails the test."""
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("tht crashed:\n" + "".join(
            traceback.format_exception(result.exception)))
    assert "Traceback" not in result.output
    return result


def tht_json(*args: str) -> tuple[int, dict[str, Any]]:
    """``tht ... --json``: the exit code and the one JSON document on stdout."""
    r = tht(*args, "--json")
    return r.exit_code, json.loads(r.stdout)


def tree_state(ws: Path) -> str:
    """What Git sees of the work tree (untracked files included)."""
    return git(ws, "status", "--porcelain=v1", "--untracked-files=all")


# --------------------------------------------------------------------------- 4: one batch check


def one_table_note(rows: int) -> str:
    """A note that is one table of ward codes (the structural backend makes an enum of it:
    the table in the body and again in the kind block)."""
    lines = ["| codice | descrizione |", "|---|---|"]
    lines += [f"| R{i:05d} | reparto numero {i} dell'ospedale |" for i in range(rows)]
    return ("# Codici reparto\n\nIl codice reparto è memorizzato in clinical.ward.ward_code.\n\n"
            + "\n".join(lines) + "\n")


def test_prepare_never_writes_a_unit_validate_refuses(tmp_path: Path) -> None:
    note = one_table_note(20_000)
    assert 900_000 < len(note.encode()) < 1_000_000  # the note itself is within every limit
    ws = new_workspace(tmp_path / "ws", {"source/codici.md": note})
    code, doc = tht_json("evidence", "prepare", str(ws), "--backend", "structural")
    assert code == 1 and doc["status"] == "failed", doc
    [p] = doc["problems"]
    assert p["code"] == "batch_invalid"
    assert p["path"] == "evidence/curated/enum/codici-reparto.md"
    assert "evidence/source/codici.md" in p["message"]
    assert "larger than 1000000 bytes" in p["message"]
    assert tree_state(ws) == ""  # nothing written: not the unit, not the manifest
    assert not (ws / "evidence" / "curated").exists()
    assert not (ws / "evidence" / "manifest.yaml").exists()


# --------------------------------------------------------------------------- 5: hostile Git config

NOTE = """# Paziente

Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni.

Il sesso è memorizzato in clinical.patient.sex_code con valori M e F.
"""
EVALUATION = """\
queries:
  - id: q1
    text: pazienti in fascia pediatrica con età inferiore a 18 anni
    profile: lexical
    purpose: sql_generation
    expected: [evidence:paziente]
"""


@pytest.fixture
def hostile_repo(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A prepared, committed workspace whose Git configuration names a command for everything
    that can run one (fsmonitor, hooks, a filter driver with process/clean/smudge, textconv and
    diff/merge drivers, pager, editor), each leaving a marker file; ``.gitattributes`` puts every
    file under those drivers. (The workspace, the marker directory.)"""
    ws = new_workspace(tmp_path / "ws", {"source/paziente.md": NOTE})
    assert tht("evidence", "prepare", str(ws), "--backend", "structural").exit_code == 0
    (ws / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n", encoding="utf-8")
    (ws / "evidence" / "evaluation.yaml").write_text(EVALUATION, encoding="utf-8")
    commit(ws, "prepared")
    markers = tmp_path / "markers"
    markers.mkdir()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("pre-commit", "post-checkout", "post-index-change", "reference-transaction",
                 "fsmonitor-watchman", "pre-auto-gc"):
        script = hooks / hook
        script.write_text(f"#!/bin/sh\ntouch {markers}/hook-{hook}\n", encoding="utf-8")
        script.chmod(0o755)

    def marker(name: str, then: str = "") -> str:
        return f"sh -c 'touch {markers}/{name}{then}'"

    config = {
        "core.fsmonitor": marker("fsmonitor", "; exit 1"),
        "core.hooksPath": str(hooks),
        "core.pager": marker("pager"),
        "core.editor": marker("editor"),
        "core.sshCommand": marker("ssh"),
        "filter.evil.process": marker("filter-process", "; exit 1"),
        "filter.evil.clean": marker("filter-clean", "; cat"),
        "filter.evil.smudge": marker("filter-smudge", "; cat"),
        "filter.evil.required": "true",
        "diff.evil.textconv": marker("textconv", "; cat"),
        "diff.evil.command": marker("diff-command"),
        "diff.external": marker("diff-external"),
        "merge.evil.driver": marker("merge-driver"),
    }
    for key, value in config.items():  # set last: the commits above ran without them
        git(ws, "config", key, value)
    yield ws, markers


def restat(ws: Path) -> None:
    """Touch every committed file: Git must read (and filter) them again to know they are
    unchanged."""
    for path in ws.rglob("*"):
        if path.is_file() and ".git" not in path.parts and ".tht" not in path.parts:
            os.utime(path)


def test_commands_configured_in_the_repository_never_run(
        hostile_repo: tuple[Path, Path]) -> None:
    ws, markers = hostile_repo
    runs: list[tuple[tuple[str, ...], int, str]] = []
    ran: dict[str, list[str]] = {}  # command → the markers it left
    for args in (("evidence", "validate", str(ws)),
                 ("evidence", "prepare", str(ws), "--backend", "structural"),
                 ("workspace", "activate", str(ws)),
                 ("workspace", "preprocess", "evidence", str(ws))):
        restat(ws)
        r = tht(*args)
        runs.append((args, r.exit_code, r.output[-300:]))
        ran[args[1]] = sorted(p.name for p in markers.iterdir())
        for p in markers.iterdir():
            p.unlink()
    assert ran == {"validate": [], "prepare": [], "activate": [], "preprocess": []}, ran
    # validate finds the one-query evaluation set too small (a finding, exit 1); the rest ran
    assert [code for _, code, _ in runs] == [1, 0, 0, 0], runs
    assert dirty_paths(ws) == []


# --------------------------------------------------------------------------- 8: unseen text


def prepared(tmp_path: Path, files: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    """A workspace with ``files`` under evidence/, prepared (structural) and committed; the
    ``prepare --json`` document."""
    ws = new_workspace(tmp_path / "ws", files)
    code, doc = tht_json("evidence", "prepare", str(ws), "--backend", "structural")
    assert code == 0, doc
    commit(ws, "prepared")
    return ws, doc


def front(ws: Path, rel: str) -> dict[str, Any]:
    from evidence_runtime.curated import read_curated

    return read_curated(ws / "evidence" / rel).data()


def review_items(ws: Path, rel: str, code: str) -> list[dict[str, Any]]:
    return [i for i in front(ws, rel)["review_items"] if i["code"] == code]


def test_invisible_characters_from_a_note_become_review_items(tmp_path: Path) -> None:
    note = ("# Fascia\u200b pediatrica\n\nPer fascia pediatrica si intendono i pazienti con età "
            "inferiore a 18 anni\u202e.\n")
    ws, _ = prepared(tmp_path, {"source/fascia.md": note})
    [unit] = [p.relative_to(ws / "evidence").as_posix()
              for p in (ws / "evidence" / "curated").rglob("*.md")]
    items = review_items(ws, unit, "invisible_characters")
    by_field = {i["field"]: i["message"] for i in items}
    assert "U+200B ZERO WIDTH SPACE" in by_field["title"]
    assert any("U+202E RIGHT-TO-LEFT OVERRIDE" in m for f, m in by_field.items()
               if f != "title"), by_field
    code, report = tht_json("evidence", "validate", str(ws))
    assert code == 1 and report["status"] == "blocked", report  # review items block


def test_invisible_characters_edited_into_a_unit_are_flagged_by_validate(
        tmp_path: Path) -> None:
    ws, _ = prepared(tmp_path, {"source/paziente.md": NOTE})
    file = next((ws / "evidence" / "curated").rglob("paziente.md"))
    text = file.read_text(encoding="utf-8")
    assert "title: Paziente\n" in text
    file.write_text(text.replace("title: Paziente\n", "title: \"Pazi\\u2066ente\\u2069\"\n"),
                    encoding="utf-8")
    commit(ws, "hand edit")
    code, report = tht_json("evidence", "validate", str(ws))
    assert code == 1 and report["status"] == "blocked", report
    [p] = [p for p in report["problems"] if p["code"] == "invisible_characters"]
    assert (p["severity"], p["field"], p["evidence_id"]) == ("review", "title",
                                                             "evidence:paziente")
    assert "U+2066 LEFT-TO-RIGHT ISOLATE" in p["message"]
    assert "U+2069 POP DIRECTIONAL ISOLATE" in p["message"]


def test_a_title_with_a_look_alike_letter_of_another_script_is_flagged(tmp_path: Path) -> None:
    note = ("# Fascia pedi\u0430trica\n\nPer fascia pediatrica si intendono i pazienti con età "
            "inferiore a 18 anni.\n")
    ws, _ = prepared(tmp_path, {"source/fascia.md": note})
    [unit] = [p.relative_to(ws / "evidence").as_posix()
              for p in (ws / "evidence" / "curated").rglob("*.md")]
    [item] = review_items(ws, unit, "mixed_script_title")
    assert item["field"] == "title"
    assert "U+0430 CYRILLIC SMALL LETTER A in 'pediаtrica'" in item["message"]


def test_a_title_in_one_script_or_with_a_greek_word_is_not_flagged(tmp_path: Path) -> None:
    note = ("# Terapia con β-bloccanti e α1-antitripsina\n\nI β-bloccanti sono codificati in "
            "clinical.therapy.atc_code.\n")
    ws, _ = prepared(tmp_path, {"source/terapia.md": note})
    [unit] = [p.relative_to(ws / "evidence").as_posix()
              for p in (ws / "evidence" / "curated").rglob("*.md")]
    assert review_items(ws, unit, "mixed_script_title") == []
    assert review_items(ws, unit, "invisible_characters") == []


def test_hidden_notes_are_skipped_with_a_word(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path / "ws", {"source/paziente.md": NOTE,
                                         "source/.hidden.md": NOTE.replace("Paziente", "Ombra"),
                                         "source/..md": NOTE.replace("Paziente", "Punti"),
                                         "source/.bozze/nota.md": NOTE})
    code, doc = tht_json("evidence", "prepare", str(ws), "--backend", "structural")
    assert code == 0, doc
    assert [s["path"] for s in doc["sources"]] == ["source/paziente.md"]
    notices = {(n["code"], n["path"]) for n in doc["notices"]}
    assert notices == {("source_hidden", "evidence/source/..md"),
                       ("source_hidden", "evidence/source/.hidden.md"),
                       ("source_hidden", "evidence/source/.bozze/")}, doc["notices"]
    git(ws, "checkout", "-q", ".")
    git(ws, "clean", "-fdq", "evidence/curated", "evidence/manifest.yaml")
    r = tht("evidence", "prepare", str(ws), "--backend", "structural", "--no-diff")
    assert r.exit_code == 0, r.output
    assert "info: evidence/source/.hidden.md: hidden" in r.stdout
    assert "info: evidence/source/..md: hidden" in r.stdout


@pytest.mark.parametrize("value", ["true", "1.0", "'1'", "01.0"])
def test_schema_version_is_only_the_integer_1(tmp_path: Path, value: str) -> None:
    ws, _ = prepared(tmp_path, {"source/paziente.md": NOTE})
    file = next((ws / "evidence" / "curated").rglob("paziente.md"))
    text = file.read_text(encoding="utf-8")
    file.write_text(text.replace("schema_version: 1\n", f"schema_version: {value}\n", 1),
                    encoding="utf-8")
    commit(ws, "hand edit")
    code, report = tht_json("evidence", "validate", str(ws))
    assert code == 1 and report["status"] == "invalid", report
    [p] = [p for p in report["problems"] if p["field"] == "schema_version"]
    assert p["severity"] == "error" and p["evidence_id"] == "evidence:paziente", p


# --------------------------------------------------------------------------- 6: outcomes


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A one-note workspace, prepared, committed, activated and published."""
    ws = new_workspace(tmp_path / "ws", {"source/paziente.md": NOTE})
    assert tht("evidence", "prepare", str(ws), "--backend", "structural").exit_code == 0
    (ws / "evidence" / "evaluation.yaml").write_text(EVALUATION, encoding="utf-8")
    commit(ws, "prepared")
    assert tht("workspace", "activate", str(ws)).exit_code == 0
    r = tht("workspace", "preprocess", "evidence", str(ws))
    assert r.exit_code == 0, r.output
    return ws


def test_evaluate_with_a_read_only_state_directory_is_one_clear_error(published: Path) -> None:
    from tests.test_hostile import unwritable

    state = published / ".tht"
    with unwritable(state):
        r = tht("evidence", "evaluate", str(published), "--json")
        plain = tht("evidence", "evaluate", str(published))
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    [p] = doc["problems"]
    assert (doc["status"], p["code"], p["path"]) == ("error", "state_dir_unwritable", str(state))
    assert plain.exit_code == 2 and str(state) in plain.stderr and plain.stdout == ""


def set_config(ws: Path, extra: str) -> None:
    (ws / "thoth.yaml").write_text("workspace_id: test\nlanguage: italian\n" + extra,
                                   encoding="utf-8")


@pytest.mark.parametrize(("extra", "field"), [
    ("index:\n  rrf_k: 1e30\n", "index.rrf_k"),
    ("index:\n  rrf_k: 1000000000000\n", "index.rrf_k"),
    ("index:\n  rrf_k: true\n", "index.rrf_k"),
    ("index:\n  rrf_weights:\n    dense: .inf\n", "index.rrf_weights.dense"),
    ("index:\n  rrf_weights:\n    bm25: .nan\n", "index.rrf_weights.bm25"),
    ("index:\n  bm25_avg_len: 1e300\n", "index.bm25_avg_len"),
    ("index:\n  prefetch_limit: 50.0\n", "index.prefetch_limit"),
    ("publish:\n  retention: 1e9\n", "publish.retention"),
    ("embeddings:\n  threads: 1e3\n", "embeddings.threads"),
])
def test_numeric_settings_out_of_range_are_refused_when_thoth_yaml_loads(
        published: Path, extra: str, field: str) -> None:
    set_config(published, extra)
    code, doc = tht_json("evidence", "validate", str(published))
    assert code == 2 and doc["status"] == "error", doc
    [p] = doc["problems"]
    assert p["code"] == "config_error" and p["field"].startswith(field), p
    # and search says what DESIGN promises: an outcome, unavailable / not_configured
    code, outcome = tht_json("evidence", "search", str(published), "fascia pediatrica",
                             "--purpose", "sql_generation")
    assert code == 1, outcome
    assert (outcome["status"], outcome["code"]) == ("unavailable", "not_configured"), outcome
    assert field.split(".")[-1] in outcome["message"] or "thoth.yaml" in outcome["message"]


@pytest.mark.parametrize("path", ["..", "../ws/evidence", "sub/../../evidence"])
def test_an_index_path_inside_the_work_tree_is_refused(published: Path, path: str) -> None:
    set_config(published, f"index:\n  path: {path}\n")
    code, doc = tht_json("workspace", "activate", str(published))
    assert code == 2, doc
    [p] = doc["problems"]
    assert (p["code"], p["field"]) == ("config_error", "index.path"), p
    assert "inside the work tree" in p["message"]


def test_an_index_path_in_the_state_directory_or_outside_is_accepted(
        published: Path, tmp_path: Path) -> None:
    for path in ("other-index", str(tmp_path / "elsewhere")):
        set_config(published, f"index:\n  path: {path}\n")
        code, doc = tht_json("evidence", "validate", str(published))
        assert code != 2 and doc.get("status") != "error", doc


def test_search_with_a_broken_thoth_yaml_is_unavailable_like_the_library(
        published: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evidence_runtime

    (published / "thoth.yaml").write_text("workspace_id: [unclosed\n", encoding="utf-8")
    code, outcome = tht_json("evidence", "search", str(published), "fascia pediatrica",
                             "--purpose", "sql_generation")
    assert code == 1
    assert (outcome["status"], outcome["code"]) == ("unavailable", "not_configured"), outcome
    evidence_runtime.reset()
    monkeypatch.setenv("THT_WORKSPACE", str(published))
    try:
        library = evidence_runtime.search("fascia pediatrica", "sql_generation")
    finally:
        evidence_runtime.reset()
    assert (library.status, library.code) == (outcome["status"], outcome["code"])


def test_a_lone_surrogate_is_bad_input_and_a_non_string_a_type_error(published: Path) -> None:
    from evidence_runtime.query import InvalidQueryError
    from evidence_runtime.search import EvidenceSearcher

    with EvidenceSearcher.for_workspace(published) as searcher:
        with pytest.raises(InvalidQueryError) as caught:
            searcher.search("fascia \udc80 pediatrica", "sql_generation")
        assert caught.value.code == "invalid_query" and "U+DC80" in caught.value.message
        with pytest.raises(TypeError, match="must be a str, not int"):
            searcher.search(42, "sql_generation")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be a str, not bytes"):
            searcher.search(b"fascia", "sql_generation")  # type: ignore[arg-type]
        outcome = searcher.search("fascia pediatrica", "sql_generation")  # still serves
        assert outcome.status == "available"


def test_every_invisible_character_is_known() -> None:
    """The character classes of validation/text.py hold every character of category Cf of
    the running Python's Unicode tables, and nothing else."""
    import sys
    import unicodedata

    from evidence_pipeline.validation.text import has_invisible, invisible_code_points

    cf = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert all(has_invisible(f"a{ch}b") and invisible_code_points(f"a{ch}b") for ch in cf)
    assert not any(has_invisible(f"a{chr(c)}b") for c in range(0x20, 0x3000)
                   if unicodedata.category(chr(c)) != "Cf")


def test_a_git_too_old_to_disable_repository_commands_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evidence_pipeline.gitrepo as gitrepo

    ws = new_workspace(tmp_path / "ws", {"source/paziente.md": NOTE})
    monkeypatch.setattr(gitrepo, "_git_version", lambda: (2, 30))
    code, doc = tht_json("workspace", "activate", str(ws))
    assert code == 2, doc
    [p] = doc["problems"]
    assert p["code"] == "git_error" and "Git 2.31 or newer is needed (found 2.30)" in p["message"]
