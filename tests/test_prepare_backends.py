"""prepare through the real ``openai`` and ``pi`` backends (a local OpenAI-compatible server and
a fake ``pi`` executable run by the real subprocess code): each scripted reply ends as spec §5.4
and §13.1 say, and the work tree is untouched whenever the batch fails."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evidence_pipeline.authoring.backends.base import (
    ModelReply,
    ModelRequest,
    PreviousUnit,
    ProposedUnit,
    RetirementProposal,
)
from evidence_pipeline.authoring.relink import relink_dropped_units
from evidence_pipeline.cli import main
from evidence_pipeline.validation.validator import validate_workspace
from tests.fakes.openai_server import FakeOpenAIServer, Scripted
from tests.test_prepare import PAZIENTE, commit, make_ws, status, tree_snapshot

FAKE_PI = Path(__file__).parent / "fakes" / "fake_pi.py"
EXCERPT = "Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni."


def unit(**over: Any) -> dict[str, Any]:
    base = {"title": "Fascia pediatrica", "kind": "glossary", "purposes": ["disambiguation"],
            "applies_to": {"concepts": ["fascia pediatrica"], "tables": [], "columns": []},
            "glossary": {"term": "fascia pediatrica",
                         "definition": "Pazienti con età inferiore a 18 anni.", "synonyms": []},
            "supporting_excerpts": [EXCERPT], "review_items": [],
            "body": "Pazienti con età inferiore a 18 anni."}
    base.update(over)
    return base


def reply(*units: dict[str, Any]) -> str:
    return json.dumps({"units": list(units), "retirement_candidates": []}, ensure_ascii=False)


REPLIES: dict[str, tuple[str, str]] = {
    "malformed-json": ('{"units": [', "model_malformed_json"),
    "unknown-id": (reply(unit(id="evidence:inventato")), "model_unknown_id"),
    "excerpt-not-in-source": (reply(unit(supporting_excerpts=["Frase inventata dal modello."])),
                              "excerpt_not_found"),
    "two-sources": (reply(unit(source_file="source/altro.md")), "model_invalid_output"),
    "select-in-formula": (reply(unit(kind="formula", glossary=None, formula={
        "concept": "età", "columns": ["clinical.patient.birth_date"],
        "sql": "SELECT age(birth_date) FROM clinical.patient"})), "formula_not_expression"),
}


def _without_none(u: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in u.items() if v is not None}


def _workspace(tmp_path: Path, model_yaml: str) -> Path:
    ws = make_ws(tmp_path, {"source/paziente.md": PAZIENTE})
    (ws / "thoth.yaml").write_text(f"workspace_id: test\nlanguage: italian\n{model_yaml}",
                                   encoding="utf-8")
    commit(ws, "configure the model backend")
    return ws


def _prepare(ws: Path) -> Any:
    return CliRunner().invoke(main, ["evidence", "prepare", str(ws), "--json"])


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


def _openai_ws(tmp_path: Path, server: FakeOpenAIServer, timeout_s: float = 5) -> Path:
    return _workspace(tmp_path, f"model:\n  backend: openai\n  base_url: {server.url}\n"
                                f"  model: local-test\n  timeout_s: {timeout_s}\n")


def test_openai_valid_reply_is_applied(tmp_path: Path, server: FakeOpenAIServer) -> None:
    ws = _openai_ws(tmp_path, server)
    server.script.append(Scripted(content=reply(unit())))
    result = _prepare(ws)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "applied" and doc["model_calls"] == 1
    assert (ws / "evidence/curated/glossary/fascia-pediatrica.md").is_file()
    assert validate_workspace(ws).status.value == "publishable"
    assert len(server.received) == 1
    body = server.received[0].body
    assert body["temperature"] == 0 and body["response_format"]["type"] == "json_schema"
    commit(ws, "prepared")
    again = _prepare(ws)
    assert json.loads(again.stdout)["model_calls"] == 0 and len(server.received) == 1


def test_a_title_heading_the_model_wrote_into_the_body_is_not_doubled(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    # seen with a real 1.5B model: the body opened with the title heading despite the rule
    ws = _openai_ws(tmp_path, server)
    server.script.append(Scripted(content=reply(unit(
        body="## Fascia pediatrica\n\nPazienti con età inferiore a 18 anni."))))
    result = _prepare(ws)
    assert result.exit_code == 0, result.output
    text = (ws / "evidence/curated/glossary/fascia-pediatrica.md").read_text(encoding="utf-8")
    assert text.endswith("---\n\n# Fascia pediatrica\n\nPazienti con età inferiore a 18 anni.\n")
    assert text.count("# Fascia pediatrica") == 1


@pytest.mark.parametrize(("second", "criterion"), [
    # the unit rewritten under the same title, without its id (seen with a real 1.5B model)
    (unit(body="Sono pediatrici i pazienti sotto i 18 anni."), "title"),
    # renamed, but quoting exactly the same source text
    (unit(title="Pazienti pediatrici"), "supporting_excerpts"),
])
def test_a_previous_unit_the_model_rewrote_without_its_id_keeps_its_id(
        tmp_path: Path, server: FakeOpenAIServer, second: dict[str, Any], criterion: str) -> None:
    ws = _openai_ws(tmp_path, server)
    server.script.append(Scripted(content=reply(unit())))
    assert _prepare(ws).exit_code == 0
    commit(ws, "prepared")
    note = ws / "evidence/source/paziente.md"
    note.write_text(note.read_text(encoding="utf-8") + "\nNota aggiunta.\n", encoding="utf-8")
    commit(ws, "note edited")
    server.script.append(Scripted(content=reply(second)))
    result = _prepare(ws)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    [source] = doc["sources"]
    assert source["units"] == ["evidence:fascia-pediatrica"]
    assert source["ids_kept_by_code"] == {"evidence:fascia-pediatrica": criterion}
    assert doc["retirement_candidates"] == [] and doc["review_items"] == 0
    assert sorted(p.name for p in (ws / "evidence/curated").rglob("*.md")) == [
        "fascia-pediatrica.md"]
    assert validate_workspace(ws).status.value == "publishable"


def _relink(previous: list[dict[str, Any]], units: list[dict[str, Any]],
            retire: tuple[str, ...] = ()) -> dict[int, tuple[str, str]]:
    prev = tuple(PreviousUnit(id=f"evidence:{p['slug']}", body="", data={
        "title": p["title"], "provenance": {"supporting_excerpts": p["excerpts"]}})
        for p in previous)
    req = ModelRequest(source_file="source/paziente.md", source_sha256="sha256:" + "0" * 64,
                       normalized_text="", language="it", previous_units=prev)
    rep = ModelReply(
        units=tuple(ProposedUnit(id=u.get("id"), body="", data={
            "title": u["title"], "supporting_excerpts": u["excerpts"]}) for u in units),
        retirement_candidates=tuple(RetirementProposal(id=r, message="x") for r in retire))
    return relink_dropped_units(req, rep)


def test_relinking_is_refused_whenever_it_is_not_unmistakable() -> None:
    a = {"slug": "a", "title": "Sesso", "excerpts": ["Il sesso è in sex_code."]}
    b = {"slug": "b", "title": "Età", "excerpts": ["L'età si calcola."]}
    # spacing and case do not matter
    assert _relink([a], [{"title": " sesso ", "excerpts": ["altro"]}]) == {
        0: ("evidence:a", "title")}
    assert _relink([a], [{"title": "Genere", "excerpts": ["il  SESSO è in sex_code."]}]) == {
        0: ("evidence:a", "supporting_excerpts")}
    # two new units with that title: ambiguous
    assert _relink([a], [{"title": "Sesso", "excerpts": ["x"]},
                         {"title": "Sesso", "excerpts": ["y"]}]) == {}
    # two previous units with the same excerpts: ambiguous
    twin = dict(b, excerpts=a["excerpts"])
    assert _relink([a, twin], [{"title": "Genere", "excerpts": a["excerpts"]}]) == {}
    # the model proposed its retirement, or kept it under its id: its word stands
    assert _relink([a], [{"title": "Sesso", "excerpts": ["x"]}], retire=("evidence:a",)) == {}
    assert _relink([a], [{"id": "evidence:a", "title": "Sesso", "excerpts": ["x"]},
                         {"title": "Sesso", "excerpts": ["y"]}]) == {}
    # another set of excerpts (here one more) is not the same unit: a split keeps new ids
    assert _relink([a], [{"title": "Genere", "excerpts": [*a["excerpts"], "altro"]}]) == {}
    # each previous unit and each new unit is matched at most once
    assert _relink([a, b], [{"title": "Sesso", "excerpts": b["excerpts"]}]) == {
        0: ("evidence:a", "title")}


@pytest.mark.parametrize("case", sorted(REPLIES))
def test_openai_bad_reply_leaves_the_tree_untouched(tmp_path: Path, server: FakeOpenAIServer,
                                                    case: str) -> None:
    ws = _openai_ws(tmp_path, server)
    raw, code = REPLIES[case]
    if case == "select-in-formula":
        raw = json.dumps({"units": [_without_none(u) for u in json.loads(raw)["units"]],
                          "retirement_candidates": []})
    server.script.append(Scripted(content=raw))
    before = tree_snapshot(ws)
    result = _prepare(ws)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "failed" and doc["model_calls"] == 1
    assert code in {p["code"] for p in doc["problems"]}, doc["problems"]
    assert all(p["path"] for p in doc["problems"])
    assert result.stderr.strip().splitlines()[-1].startswith("error: prepare refused")
    assert tree_snapshot(ws) == before and status(ws) == ""
    assert len(server.received) == 1  # no automatic retry


@pytest.mark.parametrize(("scripted", "code"), [
    (Scripted(content=reply(unit()), delay_s=30), "model_timeout"),
    (Scripted(status=500, raw_body='{"error": {"message": "boom"}}'), "model_http_error"),
])
def test_openai_timeout_or_error_leaves_the_tree_untouched(
        tmp_path: Path, server: FakeOpenAIServer, scripted: Scripted, code: str) -> None:
    ws = _openai_ws(tmp_path, server, timeout_s=1)
    server.script.append(scripted)
    before = tree_snapshot(ws)
    started = time.monotonic()
    result = _prepare(ws)
    assert time.monotonic() - started < 15
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert [p["code"] for p in problems] == [code]
    assert problems[0]["path"] == "evidence/source/paziente.md"
    assert tree_snapshot(ws) == before
    assert len(server.received) == 1


# --- pi ---------------------------------------------------------------------------------------


def _pi_ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: dict[str, Any],
           timeout_s: float = 20) -> tuple[Path, Path]:
    command = tmp_path / "bin" / "pi"
    command.parent.mkdir(exist_ok=True)
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_PI}" "$@"\n',
                       encoding="utf-8")
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "script.json").write_text(json.dumps(script), encoding="utf-8")
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_PI_SCRIPT", str(tmp_path / "script.json"))
    monkeypatch.setenv("FAKE_PI_RECORD", str(record))
    ws = _workspace(tmp_path, f"model:\n  backend: pi\n  command: {command}\n  provider: local\n"
                              f"  model: qwen\n  timeout_s: {timeout_s}\n")
    return ws, record


def test_pi_valid_reply_is_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws, record = _pi_ws(tmp_path, monkeypatch, {"mode": "reply", "stdout": reply(unit())})
    result = _prepare(ws)
    assert result.exit_code == 0, result.output
    assert (ws / "evidence/curated/glossary/fascia-pediatrica.md").is_file()
    seen = json.loads(record.read_text(encoding="utf-8"))
    assert "--no-tools" in seen["argv"] and "--no-session" in seen["argv"]
    assert seen["listing"] == [".pi", ".pi/settings.json"]  # a clean working directory
    assert str(ws) not in seen["cwd"]


@pytest.mark.parametrize(("script", "code"), [
    ({"mode": "reply", "stdout": "not json at all"}, "model_malformed_json"),
    ({"mode": "reply", "stdout": reply(unit(id="evidence:inventato"))}, "model_unknown_id"),
    ({"mode": "fail", "stderr": "provider refused", "exit": 3}, "model_process_failed"),
    ({"mode": "hang"}, "model_timeout"),
])
def test_pi_failures_leave_the_tree_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              script: dict[str, Any], code: str) -> None:
    ws, _ = _pi_ws(tmp_path, monkeypatch, script, timeout_s=2)
    before = tree_snapshot(ws)
    result = _prepare(ws)
    assert result.exit_code == 1, result.output
    assert [p["code"] for p in json.loads(result.stdout)["problems"]] == [code]
    assert tree_snapshot(ws) == before and status(ws) == ""


# --- a real model, when one is configured ------------------------------------------------------


@pytest.mark.llm
@pytest.mark.skipif(not os.environ.get("THT_LLM_BASE_URL"),
                    reason="no model endpoint configured (THT_LLM_BASE_URL)")
def test_prepare_with_a_real_model_applies_all_or_nothing_and_is_then_a_no_op(
        tmp_path: Path) -> None:
    """A real model's reply is not predictable; what must hold is: the batch is applied whole
    (and then validates as publishable or blocked, never invalid) or refused with problems that
    name the source and an untouched tree; and a second run makes no model call."""
    timeout = os.environ.get("THT_LLM_TIMEOUT_S", "900")
    ws = _workspace(tmp_path, f"model:\n  backend: openai\n  timeout_s: {timeout}\n")
    before = tree_snapshot(ws)
    result = _prepare(ws)
    assert "Traceback" not in result.output
    doc = json.loads(result.stdout)
    assert doc["model_calls"] == 1
    if doc["status"] == "failed":
        assert result.exit_code == 1 and doc["problems"]
        assert all(p["path"] == "evidence/source/paziente.md" for p in doc["problems"]), doc
        assert tree_snapshot(ws) == before and status(ws) == ""
        warnings.warn(f"the model's reply was refused (the tree is untouched): "
                      f"{[p['code'] for p in doc['problems']]}", stacklevel=1)
        return
    assert result.exit_code == 0 and doc["status"] == "applied", result.output
    report = validate_workspace(ws)
    assert report.status.value in {"publishable", "blocked"}, report
    units = list((ws / "evidence/curated").rglob("*.md"))
    assert units and all("source_file: source/paziente.md" in u.read_text(encoding="utf-8")
                         for u in units)
    commit(ws, "prepared by a real model")
    again = json.loads(_prepare(ws).stdout)
    assert again["model_calls"] == 0 and status(ws) == ""
