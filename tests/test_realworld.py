"""Real-world notes go through as they are (issue 16, item 5).

``tests/fixtures/realworld`` is a workspace of 24 notes as wikis, notebooks and documentation
sites export them, Italian and English: front matter, HTML blocks and tables, DokuWiki and
MediaWiki leftovers, base64 images, minified JSON, a one-line SQL statement and a table too wide
for a fragment. They run through the CLI as a curator would: prepare with the structural
backend, validate (publishable, or blocked by review items only), accept the proposals (retiring
what cannot be published as it is), validate again, activate and publish on the embedded engine.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from evidence_pipeline.authoring.sources import (
    MAX_SOURCE_BYTES,
    MAX_TEXT_CHARS,
    SourceError,
    intake,
    take_in,
)
from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.formats.normalize import drop_embedded_data, normalize_text
from evidence_pipeline.validation.rules import body_url_problems
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.curated import read_curated
from tests.helpers import VectorStore, cli, commit

FIXTURE = Path(__file__).parent / "fixtures" / "realworld"
NOTES = sorted((FIXTURE / "evidence" / "source").iterdir())
ATOMIC = "atomic_content_too_large"


def curated(ws: Path) -> dict[str, Path]:
    """Curated files by evidence id."""
    return {read_curated(p).evidence_id or "": p
            for p in sorted((ws / "evidence" / "curated").rglob("*.md"))}


def review_codes(path: Path) -> list[str]:
    return [str(r["code"]) for r in read_curated(path).data().get("review_items") or []]


def accept_review_items(path: Path) -> None:
    """What a curator does with a proposal accepted as it is: its review items are cleared."""
    text = path.read_text(encoding="utf-8")
    _, front, body = text.split("---\n", 2)
    yaml = YAML()
    data = yaml.load(front)
    data["review_items"] = []
    out = io.StringIO()
    yaml.dump(data, out)
    path.write_text(f"---\n{out.getvalue()}---\n{body}", encoding="utf-8")


def test_the_corpus_is_what_the_issue_describes() -> None:
    assert len(NOTES) >= 20
    texts = {p.name: p.read_text(encoding="utf-8") for p in NOTES}
    longest = {name: max(len(line) for line in text.split("\n")) for name, text in texts.items()}
    assert sum(n > 20_000 for n in longest.values()) >= 4  # base64, JSON, one-line SQL
    assert sum(t.startswith("---\n") for t in texts.values()) >= 4  # front matter
    assert sum("<table" in t for t in texts.values()) >= 3  # HTML tables
    assert sum(drop_embedded_data(t)[1] > 0 for t in texts.values()) >= 4  # data: images
    assert any("- activity data: analytics.activity_events" in t for t in texts.values())


@pytest.mark.slow
def test_real_world_notes_prepare_validate_and_publish(tmp_path: Path,
                                                       vector_store: VectorStore) -> None:
    ws = create_demo_repo(tmp_path / "ws", source=FIXTURE)

    # prepare: one batch, nothing refused (no url_invalid for "data:", no line too long)
    r = cli("evidence", "prepare", str(ws), "--backend", "structural", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "applied" and doc["model_calls"] == len(NOTES)
    assert all(s["units"] for s in doc["sources"]), [s["path"] for s in doc["sources"]
                                                      if not s["units"]]
    # an info line for each note whose embedded images were dropped
    notes = {s["path"]: s["notes"] for s in doc["sources"] if s["notes"]}
    assert sorted(notes) == [f"source/{n.name}" for n in NOTES if drop_embedded_data(
        n.read_text(encoding="utf-8"))[1]]
    assert all("never sent to the model" in n for lines in notes.values() for n in lines)
    files = curated(ws)
    texts = {eid: p.read_text(encoding="utf-8") for eid, p in files.items()}

    # embedded images never reach a unit; front matter is metadata, not a unit's text
    assert not [eid for eid, t in texts.items() if "data:image" in t or "base64," in t]
    assert not [eid for eid, t in texts.items() if "sidebar_position" in t or "aliases:" in t]
    assert read_curated(files["evidence:encounters-data-dictionary"]).data()["title"] == \
        "Encounters data dictionary"  # the front matter's title names the first section
    # HTML tables are tables: codes from Confluence exports
    values = {eid: read_curated(p).data()["enum"]["values"] for eid, p in files.items()
              if "/enum/" in p.as_posix()}
    assert values["evidence:regimi-di-ricovero"] == {
        "1": "Ricovero ordinario", "2": "Day hospital", "3": "Day surgery",
        "4": "Ricovero diurno di riabilitazione"}
    assert values["evidence:invoice-status"] == {"DR": "draft", "IS": "issued", "PD": "paid",
                                                 "VO": "void"}
    assert values["evidence:codici-presidio"]["030902"] == "Ospedale San Carlo"
    # exporters' heading decorations are not part of a title
    titles = {read_curated(p).data()["title"] for p in files.values()}
    assert {"Regimi di ricovero", "Query cookbook"} <= titles
    assert not [t for t in titles if "{#" in t or "<a " in t or "¶" in t]
    # a table too wide for a fragment, and minified JSON, are left out with a review item
    assert "structural_block_left_out" in review_codes(files["evidence:sdo-extract-layout"])
    assert "campo_150" not in read_curated(files["evidence:sdo-extract-layout"]).body
    assert "structural_block_left_out" in review_codes(
        files["evidence:ward-occupancy-analysis"])
    # the one-line SQL is an atomic element too large for a fragment: said at prepare
    too_large = sorted(eid for eid, p in files.items() if ATOMIC in review_codes(p))
    assert too_large == ["evidence:etl-the-encounter-summary-view"]

    # validate: blocked by review items only, never by an error
    v = cli("evidence", "validate", str(ws), "--json")
    report = json.loads(v.stdout)
    assert report["status"] == "blocked", report
    assert {(p["severity"], p["code"]) for p in report["problems"]} == {("review", "review_item")}
    commit(ws, "prepare")

    # the curator: what cannot be published as it is goes; every other proposal is accepted
    for eid in too_large:
        res = cli("evidence", "resolve", eid, "--retire", "--workspace", str(ws))
        assert res.exit_code == 0, res.output
    for path in curated(ws).values():
        accept_review_items(path)
    commit(ws, "curator review")
    v = cli("evidence", "validate", str(ws), "--json")
    assert v.exit_code == 0, v.stdout
    assert json.loads(v.stdout)["status"] == "publishable"

    # publish on the embedded engine, gated by the corpus' own evaluation.yaml
    act = cli("workspace", "activate", str(ws))
    assert act.exit_code == 0, act.output
    vector_store.seed(ws)  # the shipped vectors hold these notes' fragments too
    pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
    assert pre.exit_code == 0, pre.output
    published = json.loads(pre.stdout)
    assert published["activated"] is True and published["evaluation"]["gate_passed"] is True


def test_validate_finds_an_oversized_unit_whose_review_item_was_cleared(tmp_path: Path) -> None:
    ws = create_demo_repo(tmp_path / "ws", source=FIXTURE)
    for note in NOTES:
        if not note.name.startswith("07-"):
            (ws / "evidence" / "source" / note.name).unlink()
    (ws / "evidence" / "evaluation.yaml").unlink()  # its questions need the removed notes
    commit(ws, "only the one-line SQL")
    assert cli("evidence", "prepare", str(ws), "--backend", "structural").exit_code == 0
    path = curated(ws)["evidence:etl-the-encounter-summary-view"]
    assert ATOMIC in review_codes(path)
    accept_review_items(path)  # a curator clears the item without shortening the unit
    report = validate_workspace(ws)
    assert report.status.value == "blocked"
    [found] = [p for p in report.problems if p.code == ATOMIC]
    assert (found.severity.value, found.evidence_id, found.field) == (
        "review", "evidence:etl-the-encounter-summary-view", "example.sql")


def test_long_lines_are_taken_in_and_only_hostile_sizes_are_refused(tmp_path: Path) -> None:
    line = "x" * 300_000  # far beyond the 20,000 characters that used to refuse a batch
    src = take_in(f"# Nota\n\n{line}\n".encode(), "source/lunga.md")
    assert line in src.normalized
    image = f"![foto](data:image/png;base64,{'A' * (MAX_SOURCE_BYTES - 1000)})"
    assert take_in(f"Foto del reparto: {image}\n".encode(), "source/foto.md").normalized == \
        "Foto del reparto:\n"  # megabytes of image, a line of text
    for hostile in (b"a" * (MAX_SOURCE_BYTES + 1), b"parola " * (MAX_TEXT_CHARS // 7 + 1)):
        with pytest.raises(SourceError) as info:
            take_in(hostile, "source/enorme.md")
        assert (info.value.code, info.value.path) == ("source_too_large", "source/enorme.md")
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "lunga.md").write_text(f"# Nota\n\n{line}\n", encoding="utf-8")
    sources, errors = intake(tmp_path)
    assert list(sources) == ["source/lunga.md"] and errors == []


@pytest.mark.parametrize(("text", "dropped"), [
    ("Vedi ![schema ER](data:image/png;base64,iVBORw0KGgo=) qui.", "Vedi qui.\n"),
    ('<p>Grafico: <img alt="g" src="data:image/jpeg;base64,/9j/4AAQ"/></p>',
     "<p>Grafico: </p>\n"),
    ("![][image1]\n\nTesto.\n\n[image1]: <data:image/png;base64,iVBORw0KGgo=>\n", "Testo.\n"),
    ("[scarica il CSV](data:text/csv;base64,YSxiCjEsMg==) per i dettagli.",
     "scarica il CSV per i dettagli.\n"),
])
def test_embedded_data_is_dropped_when_a_note_is_read(text: str, dropped: str) -> None:
    src = take_in(text.encode(), "source/nota.md")
    assert src.normalized == dropped
    assert src.notes and "never sent to the model" in src.notes[0]
    assert normalize_text(dropped) == dropped


@pytest.mark.parametrize(("text", "refused"), [
    ("- activity data: analytics.activity_events", False),
    ("Data:15/03/2024, ricovero del paziente", False),
    ("nome file: report.csv; JavaScript: linguaggio del portale", False),
    ("[x](data:text/html;base64,PHNjcmlwdD4=)", True),
    ('<a href="javascript:alert(1)">x</a>', True),
    ("file:///etc/passwd", True),
])
def test_a_word_and_a_colon_in_prose_is_not_a_url(text: str, refused: bool) -> None:
    assert (body_url_problems(text) is not None) == refused
