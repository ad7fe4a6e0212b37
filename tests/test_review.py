"""``tht evidence review``: the pending change as one static HTML page, looked at in headless
Chromium as a reviewer would (a screenshot under tests/artifacts, the text read from the DOM),
and the Dagster preview's link to the same page."""

from __future__ import annotations

import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import dagster as dg
import pytest

from evidence_pipeline.formats.normalize import excerpt_in_source, excerpt_span, normalize_text
from evidence_pipeline.orchestration.partitions import sync_source_partitions
from evidence_pipeline.orchestration.resources import ModelBackendResource
from evidence_pipeline.review.build import (
    FieldView,
    Review,
    ReviewItemView,
    Segment,
    UnitView,
    fields_of,
    review_path,
)
from evidence_pipeline.review.page import render
from tests.helpers import VectorStore, chromium, cli, git
from tests.test_dagster import SOURCE_ASSETS, resources

pytestmark = pytest.mark.usefixtures("own_state")

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
TRIAGE = "source/20-enum/triage.md"
TRIAGE_UNIT = "evidence:codice-colore-triage"
ROW = "| 6 | nero | deceduto all'arrivo |"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1400,2400", "--virtual-time-budget=5000"]


# --- the DOM, read back --------------------------------------------------------------------------


class Dom(HTMLParser):
    """The text inside each element carrying a given attribute or tag, as Chromium dumped it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str | None], list[str]]] = []
        self.open: list[tuple[str, dict[str, str | None], list[str]]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("meta", "br", "link"):
            return
        entry: tuple[str, dict[str, str | None], list[str]] = (tag, dict(attrs), [])
        self.found.append(entry)
        self.open.append(entry)

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            if self.open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for entry in self.open:
            entry[2].append(data)

    def text(self, tag: str, **attrs: str) -> list[str]:
        return [" ".join("".join(parts).split()) for t, a, parts in self.found
                if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def _render(page: Path, tmp: Path, name: str) -> Dom:
    """The page as headless Chromium renders it: its DOM parsed, a screenshot kept."""
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        shots = ARTIFACTS
    except OSError:
        shots = tmp
    shot = shots / f"review-{name}.png"
    proc = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium'}",
         f"--screenshot={shot}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000
    dom = Dom()
    dom.feed(proc.stdout)
    return dom


def _edit_triage(ws: Path) -> None:
    """A curator adds a row to the triage table and commits it; prepare proposes the unit."""
    note = ws / "evidence" / TRIAGE
    text = note.read_text(encoding="utf-8")
    last = next(line for line in reversed(text.splitlines()) if line.startswith("| 5 |"))
    note.write_text(text.replace(last, f"{last}\n{ROW}"), encoding="utf-8")
    git(ws, "commit", "-qam", "triage: nero")
    prep = cli("evidence", "prepare", str(ws), "--backend", "structural", "--json")
    assert prep.exit_code == 0, prep.output


@pytest.fixture
def pending(demo_ws: Path, vector_store: VectorStore) -> Path:
    vector_store.seed(demo_ws)  # the demo's vectors: the scratch evaluation embeds the new row
    _edit_triage(demo_ws)
    return demo_ws


# --- the page through the CLI, in Chromium -------------------------------------------------------


@pytest.mark.browser
@pytest.mark.slow
def test_review_page_shows_the_changed_unit_beside_its_note_in_chromium(
        pending: Path, tmp_path: Path) -> None:
    status_before = git(pending, "status", "--porcelain")
    result = cli("evidence", "review", str(pending), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    page = Path(doc["page"])
    assert page == review_path_of(pending) and page.is_file()
    assert [(u["evidence_id"], u["status"]) for u in doc["units"]] == [(TRIAGE_UNIT, "changed")]
    assert doc["other_files"] == ["evidence/manifest.yaml"]
    ev = doc["evaluation"]
    assert ev is not None and doc["evaluation_error"] is None, doc
    assert ev["queries"] == 31 and ev["hit_at_10_before"] == 31
    assert 1 <= ev["fragments_embedded"] <= 3  # only the changed unit's fragment(s)
    # nothing published, nothing written to the tree: the registry of the workspace does not
    # exist (the demo was never published), the status is what prepare left
    assert not (pending / ".tht" / "registry.sqlite3").exists()
    assert git(pending, "status", "--porcelain") == status_before

    dom = _render(page, tmp_path, "triage")
    assert "script" not in dom.tags
    units = [a.get("data-evidence-id") for t, a, _ in dom.found if t == "section"
             and a.get("class") == "unit"]
    assert units == [TRIAGE_UNIT]
    # prepare merged the new row into the curated unit: the new meaning is in the values; the
    # curated body (a rewrite of the note's table) is kept, and the review item that says so
    # (merge_conflict on body, no field row of its own) stands at the top of the unit
    row = dom.text("tr", data_field="enum.values")
    assert len(row) == 1 and "nero" in row[0] and "merge_conflict" not in row[0], row
    loose = [" ".join(t.split()) for t in dom.text("div", **{"class": "item loose"})]
    assert len(loose) == 1 and loose[0].startswith("merge_conflict (body):"), loose
    assert "deceduto all'arrivo" in loose[0]
    assert not any("merge_conflict" in r for r in dom.text("tr", data_field="title"))
    # the supporting excerpts, highlighted in the source note: the new row among them
    marks = dom.text("mark")
    assert marks and any("nero | deceduto all'arrivo" in m for m in marks), marks
    assert dom.text("h3")[1] == f"Source note: evidence/{TRIAGE}"
    # the diff and the scratch evaluation
    diff = " ".join(dom.text("pre", **{"class": "diff"}))
    assert "+++ b/evidence/curated/enum/codice-colore-triage.md" in diff
    assert "deceduto all'arrivo" in diff
    summary = dom.text("p", id="eval-summary")
    assert summary and "hit@10 31/31 at the base" in summary[0], summary
    moves = [" ".join(m.split()) for m in dom.text("tr", **{"class": "move"})]
    assert len(moves) == len(ev["moves"])
    for move, shown in zip(ev["moves"], moves, strict=True):
        assert shown.startswith(move["query"]) and move["evidence_id"] in shown


def review_path_of(ws: Path) -> Path:
    from evidence_runtime.workspace import load_workspace

    return review_path(load_workspace(ws))


def test_review_text_output_names_the_page_and_an_unknown_base_is_one_line(
        demo_ws: Path) -> None:
    nothing = cli("evidence", "review", str(demo_ws))
    assert nothing.exit_code == 0, nothing.output
    assert "0 new, 0 changed, 0 removed unit(s), 0 other file(s); corpus publishable" \
        in nothing.stdout
    assert f"page: {review_path_of(demo_ws)}" in nothing.stdout
    # a change already committed: reviewed against the revision before it
    note = demo_ws / "evidence" / TRIAGE
    note.write_text(note.read_text(encoding="utf-8") + f"\n{ROW}\n", encoding="utf-8")
    assert cli("evidence", "prepare", str(demo_ws), "--json").exit_code == 0
    git(demo_ws, "add", "-A")
    git(demo_ws, "commit", "-qm", "triage: nero, prepared")
    assert cli("evidence", "review", str(demo_ws), "--json",
               "--no-evaluation").stdout.count('"status": "changed"') == 0
    committed = cli("evidence", "review", str(demo_ws), "--base", "HEAD~1", "--json",
                    "--no-evaluation")
    assert committed.exit_code == 0, committed.output
    doc = json.loads(committed.stdout)
    assert [(u["evidence_id"], u["status"]) for u in doc["units"]] == [(TRIAGE_UNIT, "changed")]
    assert doc["evaluation"] is None and doc["evaluation_error"] is None
    wrong = cli("evidence", "review", str(demo_ws), "--base", "no-such-branch")
    assert wrong.exit_code != 0
    assert "unknown Git revision 'no-such-branch'" in wrong.stderr
    assert "Traceback" not in wrong.output


def test_the_dagster_preview_links_to_the_review_page(demo_ws: Path) -> None:
    note = demo_ws / "evidence" / TRIAGE
    note.write_text(note.read_text(encoding="utf-8") + f"\n{ROW}\n", encoding="utf-8")
    instance = dg.DagsterInstance.ephemeral()
    sync_source_partitions(instance, demo_ws / "evidence")
    preview = dg.materialize(SOURCE_ASSETS, partition_key=TRIAGE, instance=instance,
                             resources=resources(demo_ws, ModelBackendResource()))
    assert preview.success
    event = instance.get_latest_materialization_event(dg.AssetKey("validated_units"))
    assert event is not None and event.asset_materialization is not None
    meta = event.asset_materialization.metadata
    page = review_path_of(demo_ws)
    assert meta["review_page"] == dg.MetadataValue.url(page.as_uri())
    assert meta["review_page_path"] == dg.MetadataValue.path(str(page))
    assert "tht evidence review" in str(meta["review_page_how"].value)


# --- pieces --------------------------------------------------------------------------------------


def test_excerpt_span_finds_what_the_validator_finds_across_line_breaks() -> None:
    source = normalize_text("# Triage\n\nIl codice  rosso\nsignifica   emergenza.\n| 1 | a |\n")
    for excerpt in ("rosso significa emergenza", "| 1 | a |", "codice rosso"):
        span = excerpt_span(excerpt, source)
        assert span is not None and excerpt_in_source(excerpt, source)
        assert " ".join(source[span[0]:span[1]].split()) == excerpt
    assert excerpt_span("rosso emergenza", source) is None
    assert not excerpt_in_source("rosso emergenza", source)


def test_review_items_sit_by_the_field_they_name() -> None:
    data = {"title": "T", "enum": {"column": "c", "values": [{"code": "1", "meaning": "a"}]}}
    items = [ReviewItemView("x", "on a value", "enum.values[0].meaning"),
             ReviewItemView("y", "on the title", "title"),
             ReviewItemView("z", "on nothing shown", "formula.sql"),
             ReviewItemView("w", "no field", None)]
    fields, loose = fields_of(data, items)
    by = {f.name: [i.code for i in f.items] for f in fields}
    assert by == {"title": ["y"], "enum.column": [], "enum.values": ["x"]}
    assert [i.code for i in loose] == ["z", "w"]


def test_the_page_escapes_what_notes_and_units_say() -> None:
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    unit = UnitView(evidence_id="evidence:x", status="new", curated_path="evidence/curated/x.md",
                    kind="glossary", title=hostile,
                    fields=[FieldView("title", hostile, [ReviewItemView("c", hostile, "title")])],
                    loose_items=[], body=hostile, source_file="evidence/source/x.md",
                    source=[Segment("a "), Segment(hostile, 0)], excerpts=[], diff=f"+{hostile}\n",
                    problems=[hostile])
    html = render(Review(root=hostile, base="0" * 40, units=[unit], other_files=[],
                         status="blocked", problems=[hostile], evaluation=None,
                         evaluation_error=hostile))
    assert "<script" not in html and "<img" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8


def test_open_hands_the_page_to_the_browser_and_a_broken_evaluation_set_is_said(
        demo_ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import webbrowser

    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url) or True)
    note = demo_ws / "evidence" / TRIAGE
    note.write_text(note.read_text(encoding="utf-8") + f"\n{ROW}\n", encoding="utf-8")
    (demo_ws / "evidence" / "evaluation.yaml").write_text("queries: [", encoding="utf-8")
    result = cli("evidence", "review", str(demo_ws), "--open")
    assert result.exit_code == 0, result.output
    assert opened == [review_path_of(demo_ws).as_uri()]
    assert "scratch evaluation could not run" in result.stdout
    assert "evaluation.yaml" in result.stdout
    page = review_path_of(demo_ws).read_text(encoding="utf-8")
    assert 'id="eval-error"' in page and "evaluation.yaml" in page
    # a note edited and not prepared yet is a changed file of its own, with its diff
    assert "evidence/source/20-enum/triage.md" in page
