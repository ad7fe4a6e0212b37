"""Paper cuts a newcomer met (issue 27 item 6), each where they met it: the path of ``tht``, the
asked enum value in search's text output, ``search --help`` on the purposes, the evaluation
table at 80 columns."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.cli import app
from evidence_pipeline.cli.excerpts import excerpt_lines
from evidence_runtime.units import EvidencePurpose
from tests.helpers import PublishedDemo, cli

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("own_state")


def test_setup_prints_where_tht_is_and_the_readme_says_how_to_reach_it() -> None:
    script = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    last = script.rstrip().splitlines()[-1]
    assert last.startswith("echo ")
    said = subprocess.run(["bash", "-c", last], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    path = Path(said.split()[1])
    assert said.startswith("tht: ") and path == ROOT / ".venv" / "bin" / "tht"
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                             check=False)
    assert version.returncode == 0 and "version" in version.stdout
    assert "source .venv/bin/activate" in said
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = readme.split("\n## Commands", 1)[1].split("```", 1)[0]
    assert "source .venv/bin/activate" in commands and ".venv/bin/tht" in commands


def test_search_shows_the_enum_value_the_question_asks_about(
        published_demo: PublishedDemo) -> None:
    result = cli("evidence", "search", str(published_demo.ws),
                 "Cosa significa il codice di dimissione T?", "--purpose", "disambiguation",
                 "--kind", "enum", "--limit", "1")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[2].startswith("1. Esito della dimissione  evidence:esito-dimissione · enum")
    # before: the excerpt was cut after its third value (D, P, R), T never shown
    assert "T = trasferito ad altro istituto per acuti" in lines, result.stdout
    assert any(line.startswith("… (") and "--json shows the whole excerpt" in line
               for line in lines)


def test_excerpt_lines_keep_the_head_and_every_asked_key() -> None:
    excerpt = "\n\n".join(["Colonna: x"] + [f"{c} = valore {c}" for c in "ABCDEFGHIJ"]
                          + ["| 0 | zero |", "| 10 | dieci |"])
    shown = excerpt_lines(excerpt, "Cosa vuol dire 0? e la J?")
    assert shown == ["Colonna: x", "A = valore A", "B = valore B", "C = valore C",
                     "D = valore D", "E = valore E", "J = valore J", "| 0 | zero |",
                     "… (5 more line(s); --json shows the whole excerpt)"]
    # a short key counts only as written: "a" in a question is not the code A
    assert "A = valore A" not in excerpt_lines(excerpt, "una domanda", head=1)
    assert excerpt_lines("uno\n\ndue", "x") == ["uno", "due"]


def test_search_help_explains_every_purpose() -> None:
    result = cli("evidence", "search", "--help")
    assert result.exit_code == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    for purpose in EvidencePurpose:
        explained = [line for line in lines if line.startswith(f"{purpose.value} ")]
        assert len(explained) == 1, (purpose, result.stdout)
        assert len(explained[0].split()) >= 5  # the stage and what it needs, not a bare name


def test_the_evaluation_table_is_readable_at_80_columns(
        published_demo: PublishedDemo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.stdout, "_width", 80)
    result = cli("evidence", "evaluate", str(published_demo.ws))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = lines[:next(i for i, line in enumerate(lines)
                        if line.startswith(("missed ", "gate ")))]
    assert table[1].split() == ["query", "purpose", "@5", "@10", "expected", "evidence:…",
                                "rank", "d/b/f"]
    assert max(len(line.rstrip()) for line in table) <= 80
    # one row per expected unit, each id whole on its line (not folded), ranks beside it
    rows = [line.split() for line in table[2:]]
    queries = evaluate_json(published_demo)["queries"]
    assert len(rows) == sum(len(q["ranks"]) for q in queries)
    for q in queries:
        for eid, ranks in q["ranks"].items():
            short = eid.removeprefix("evidence:")
            assert any(row[-2] == short and row[-1] == "/".join(
                "–" if ranks[m] is None else str(ranks[m]) for m in ("dense", "bm25", "fused"))
                for row in rows), (eid, table)


def evaluate_json(demo: PublishedDemo) -> dict[str, Any]:
    result = cli("evidence", "evaluate", str(demo.ws), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
