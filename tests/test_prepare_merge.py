"""A source change keeps the curator's edits: prepare merges three ways (issue 27 item 1).

Through the CLI on real Git repositories: the demo with the structural backend (base: the
derivation of the old note, recomputed from its Git blob) and a workspace with the ``openai``
backend against a local fake endpoint (base: the proposal recorded at the last prepare).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.authoring.merge import LAST_PROPOSALS, MERGE_CONFLICT, Side, merge_unit
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.curated import read_curated
from tests.fakes.openai_server import FakeOpenAIServer, Scripted
from tests.helpers import cli, commit
from tests.test_prepare_backends import EXCERPT, reply, unit
from tests.test_prepare_backends import _openai_ws as openai_ws

TRIAGE = "evidence/source/20-enum/triage.md"
TRIAGE_UNIT = "evidence/curated/enum/codice-colore-triage.md"
NEW_ROW = "| 6 | nero | deceduto |"


def edit(ws: Path, rel: str, old: str, new: str) -> None:
    f = ws / rel
    text = f.read_text(encoding="utf-8")
    assert old in text, old
    f.write_text(text.replace(old, new, 1), encoding="utf-8")


def merge_items(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in data.get("review_items") or [] if i.get("code") == MERGE_CONFLICT]


def test_a_row_added_to_the_triage_table_keeps_the_curated_unit(demo_ws: Path) -> None:
    """The issue's case: one row added to the note; title, concepts, meanings, purposes and
    body as the curator wrote them stay, the new value comes in, the body (the curator rewrote
    the table) is a conflict named on ``body`` with the row to add."""
    before = read_curated(demo_ws / TRIAGE_UNIT)
    edit(demo_ws, TRIAGE, "| 5 | bianco | non urgenza |\n",
         f"| 5 | bianco | non urgenza |\n{NEW_ROW}\n")
    commit(demo_ws, "a row for the new code")

    r = cli("evidence", "prepare", str(demo_ws), "--backend", "structural")

    assert r.exit_code == 0, r.output
    # one summary line for the 53 unchanged sources, the changed one by name
    assert "unchanged " not in r.stdout and "53 unchanged, 1 changed" in r.stdout
    assert "changed   source/20-enum/triage.md" in r.stdout
    # the manifest's diff is the hash of the changed source, no empty keys added
    assert "retired_ids" not in r.stdout and "orphaned_sources" not in r.stdout
    after = read_curated(demo_ws / TRIAGE_UNIT)
    old, new = before.data(), after.data()
    assert new["title"] == old["title"] == "Codice colore di triage"
    assert new["applies_to"] == old["applies_to"]
    assert new["applies_to"]["concepts"] == ["codice colore triage", "codice rosso", "triage"]
    assert new["purposes"] == old["purposes"] == ["sql_generation", "disambiguation",
                                                  "schema_linking"]
    assert new["enum"]["values"] == {**old["enum"]["values"], "6": "nero"}
    assert new["enum"]["values"]["1"] == "rosso - emergenza"
    assert after.body == before.body
    [item] = new["review_items"]  # the structural backend's doubts the curator resolved stay so
    assert item["code"] == MERGE_CONFLICT and item["field"] == "body"
    assert NEW_ROW in item["message"]
    assert new["provenance"]["source_sha256"] != old["provenance"]["source_sha256"]
    report = validate_workspace(demo_ws)
    assert report.status.value == "blocked"  # the conflict waits for the curator, nothing else
    assert [(p.code, p.evidence_id, p.field) for p in report.problems] == [
        ("review_item", "evidence:codice-colore-triage", "body")]


def test_the_uis_prepare_source_merges_the_same_way(demo_ws: Path, tmp_path: Path) -> None:
    """The Dagster job a curator launches from the UI for one source (``prepare_source``)
    takes in the change through the same planner: the curated unit is kept the same way."""
    import dagster as dg

    from evidence_pipeline.orchestration.partitions import sync_source_partitions
    from tests.helpers import dagster_home
    from tests.test_operations import run

    before = read_curated(demo_ws / TRIAGE_UNIT)
    edit(demo_ws, TRIAGE, "| 5 | bianco | non urgenza |\n",
         f"| 5 | bianco | non urgenza |\n{NEW_ROW}\n")
    commit(demo_ws, "a row for the new code")
    with dg.DagsterInstance.from_config(str(dagster_home(tmp_path))) as instance:
        sync_source_partitions(instance, demo_ws / "evidence")
        result = run("prepare_source", demo_ws, instance,
                     partition_key="source/20-enum/triage.md")
    assert result.success
    after = read_curated(demo_ws / TRIAGE_UNIT)
    new = after.data()
    assert (new["title"], new["applies_to"], new["purposes"], after.body) == (
        before.data()["title"], before.data()["applies_to"], before.data()["purposes"],
        before.body)
    assert new["enum"]["values"] == {**before.data()["enum"]["values"], "6": "nero"}
    assert [(i["code"], i["field"]) for i in new["review_items"]] == [(MERGE_CONFLICT, "body")]


def test_a_conflicting_change_is_a_review_item_naming_the_field(demo_ws: Path) -> None:
    """The note's heading and the meaning of code 1 change where the curator changed them
    too: the curated values stay, each conflict is a review item naming its field and what the
    source change proposes; what the curator did not touch follows the source."""
    edit(demo_ws, TRIAGE, "# Codici colore triage (", "# Codici colore del triage (")
    edit(demo_ws, TRIAGE, "| 1 | rosso | emergenza |", "| 1 | rosso vivo | emergenza |")
    commit(demo_ws, "heading and code 1 reworded")

    r = cli("evidence", "prepare", str(demo_ws), "--backend", "structural", "--json")

    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["written"] == ["evidence/curated/enum/codice-colore-triage.md",
                                               "evidence/manifest.yaml"]
    data = read_curated(demo_ws / TRIAGE_UNIT).data()
    assert data["title"] == "Codice colore di triage"
    assert data["enum"]["values"]["1"] == "rosso - emergenza"
    assert data["enum"]["values"]["2"] == "arancione - urgenza"
    by_field = {i["field"]: i["message"] for i in merge_items(data)}
    assert set(by_field) >= {"title", "enum.values.1"}
    assert "added “del” after “Codici colore”" in by_field["title"]
    assert "added “vivo” after “rosso”" in by_field["enum.values.1"]
    blocked = {(p.evidence_id, p.field) for p in validate_workspace(demo_ws).problems}
    assert ("evidence:codice-colore-triage", "title") in blocked


def test_the_model_backend_merges_against_its_recorded_proposal(
        tmp_path: Path) -> None:
    """openai backend (a local fake endpoint): the proposal written at the first prepare is
    recorded; after the curator's edits and a note change, the model's new answer changes only
    what it changed since that proposal, and the curator's title and concept stay."""
    with FakeOpenAIServer() as server:
        ws = openai_ws(tmp_path, server)
        server.script.append(Scripted(content=reply(unit())))
        assert cli("evidence", "prepare", str(ws), "--json").exit_code == 0
        assert (ws / ".tht" / LAST_PROPOSALS).is_file()
        commit(ws, "prepared")
        f = ws / "evidence/curated/glossary/fascia-pediatrica.md"
        edit(ws, "evidence/curated/glossary/fascia-pediatrica.md",
             "title: Fascia pediatrica\n", "title: Pazienti in età pediatrica\n")
        edit(ws, "evidence/curated/glossary/fascia-pediatrica.md",
             "    - fascia pediatrica\n", "    - fascia pediatrica\n    - pediatria\n")
        edit(ws, "evidence/curated/glossary/fascia-pediatrica.md",
             "# Fascia pediatrica\n", "# Pazienti in età pediatrica\n")
        commit(ws, "curator")
        edit(ws, "evidence/source/paziente.md", EXCERPT,
             EXCERPT + " Il limite vale alla data del ricovero.")
        commit(ws, "note")
        # the model keeps its own title (it never saw the curator's) and adds the sentence
        definition = "Pazienti con età inferiore a 18 anni alla data del ricovero."
        server.script.append(Scripted(content=reply(unit(
            id="evidence:fascia-pediatrica",
            glossary={"term": "fascia pediatrica", "definition": definition, "synonyms": []},
            body=definition))))

        r = cli("evidence", "prepare", str(ws), "--json")

        assert r.exit_code == 0, r.output
        sent = json.dumps(server.received[-1].body, ensure_ascii=False)
        assert "Pazienti in età pediatrica" in sent  # the curated unit went to the model
        data = read_curated(f).data()
        assert data["title"] == "Pazienti in età pediatrica"
        assert data["applies_to"]["concepts"] == ["fascia pediatrica", "pediatria"]
        assert data["glossary"]["definition"] == definition
        assert read_curated(f).body == f"\n# Pazienti in età pediatrica\n\n{definition}\n"
        assert merge_items(data) == []
        assert validate_workspace(ws).status.value == "publishable"


@pytest.mark.parametrize("recorded", [True, False])
def test_a_model_change_of_a_curated_field_is_a_conflict_only_with_a_base(
        tmp_path: Path, recorded: bool) -> None:
    """The model renames the unit the curator renamed: a merge_conflict on ``title`` (curated
    title kept); without a recorded proposal there is no base, and the reply is taken as it
    is (the behaviour before the merge)."""
    with FakeOpenAIServer() as server:
        ws = openai_ws(tmp_path, server)
        server.script.append(Scripted(content=reply(unit())))
        assert cli("evidence", "prepare", str(ws)).exit_code == 0
        commit(ws, "prepared")
        if not recorded:
            (ws / ".tht" / LAST_PROPOSALS).unlink()
        f = ws / "evidence/curated/glossary/fascia-pediatrica.md"
        edit(ws, "evidence/curated/glossary/fascia-pediatrica.md",
             "title: Fascia pediatrica\n", "title: Pazienti in età pediatrica\n")
        commit(ws, "curator")
        edit(ws, "evidence/source/paziente.md", "## Sesso", "## Sesso del paziente")
        commit(ws, "note")
        server.script.append(Scripted(content=reply(unit(id="evidence:fascia-pediatrica",
                                                         title="Età pediatrica"))))

        assert cli("evidence", "prepare", str(ws)).exit_code == 0

        data = read_curated(f).data()
        if recorded:
            assert data["title"] == "Pazienti in età pediatrica"
            [item] = merge_items(data)
            assert item["field"] == "title"
            assert "“Fascia” became “Età”" in item["message"]
        else:
            assert data["title"] == "Età pediatrica" and merge_items(data) == []


def test_merge_rules_field_by_field() -> None:
    """The rules on one enum unit: maps key by key (a value the note dropped goes unless the
    curator changed it), lists as sets in the curated order, excerpts as the note has them
    now, the body line by line; each conflict named once."""
    text = "| A | uno |\n| B | due |\n| C | tre |\nNota nuova.\n"

    def side(title: str, values: dict[str, str], purposes: list[str], excerpts: list[str],
             body: str) -> Side:
        return Side({"title": title, "kind": "enum", "purposes": purposes,
                     "applies_to": {"concepts": ["x"], "tables": [], "columns": []},
                     "enum": {"column": "s.t.c", "values": values},
                     "supporting_excerpts": excerpts, "review_items": []}, body)

    base = side("Codici", {"A": "uno", "B": "due", "D": "quattro", "E": "cinque"},
                ["sql_generation", "disambiguation"], ["| A | uno |"], "riga 1\nriga 2\nriga 3")
    ours = side("Codici curati", {"A": "uno (curato)", "B": "due", "D": "quattro",
                                  "E": "cinque (curato)"},
                ["disambiguation", "sql_generation"], ["| A | uno |", "| B | due |"],
                "riga 1 curata\nriga 2\nriga 3")
    theirs = side("Codici", {"A": "uno", "B": "bis", "C": "tre", "E": "cinque nuovo"},
                  ["sql_generation", "disambiguation", "schema_linking"],
                  ["| A | uno |", "| C | tre |"], "riga 1\nriga 2\nriga 3\nNota nuova.")

    merged = merge_unit(base, ours, theirs, normalized_text=text)

    assert merged.data["title"] == "Codici curati"
    # A curated, B from the note, C new, D dropped by the note, E both: curated kept, reported
    assert merged.data["enum"]["values"] == {"A": "uno (curato)", "B": "bis",
                                             "E": "cinque (curato)", "C": "tre"}
    assert merged.data["purposes"] == ["disambiguation", "sql_generation", "schema_linking"]
    assert merged.data["supporting_excerpts"] == ["| A | uno |", "| B | due |", "| C | tre |"]
    assert merged.body == "riga 1 curata\nriga 2\nriga 3\nNota nuova."
    assert [(i["field"], i["code"]) for i in merged.conflicts] == [
        ("enum.values.E", MERGE_CONFLICT)]
    assert "added “nuovo” after “cinque”" in merged.conflicts[0]["message"]
    assert merged.data["review_items"] == merged.conflicts
    # the curator left the excerpts as derived: they follow the note
    same = merge_unit(base, side("Codici curati", ours.data["enum"]["values"], [],
                                 ["| A | uno |"], ours.body), theirs, normalized_text=text)
    assert same.data["supporting_excerpts"] == ["| A | uno |", "| C | tre |"]
