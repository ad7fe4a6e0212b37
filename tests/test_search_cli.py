"""``tht evidence search``'s binding constraints (spec §10, issue 15 item 6): ``--require-table``,
``--require-column`` and ``--require-concept`` filter on a unit's ``applies_to`` (any of the given
values), while ``--table/--column/--concept`` only add to the query text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evidence_runtime.curated import read_curated
from tests.helpers import PublishedDemo, cli

QUESTION = "Quanti pazienti minorenni sono stati ricoverati l'anno scorso?"


def applies_to(ws: Path) -> dict[str, dict[str, set[str]]]:
    """Every demo unit's ``applies_to`` by id."""
    out: dict[str, dict[str, set[str]]] = {}
    for file in sorted((ws / "evidence" / "curated").rglob("*.md")):
        unit = read_curated(file).unit()
        a = unit.applies_to
        out[unit.id] = {"tables": set(a.tables), "columns": set(a.columns),
                        "concepts": set(a.concepts)}
    return out


def search(ws: Path, *args: str) -> dict[str, Any]:
    result = cli("evidence", "search", str(ws), QUESTION, "--purpose", "sql_generation",
                 "--limit", "50", "--json", *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "available"
    return doc


@pytest.mark.parametrize(("option", "field", "value"), [
    ("--require-table", "tables", "clinical.patient"),
    ("--require-column", "columns", "clinical.episode.admission_date"),
    ("--require-concept", "concepts", "ricovero"),
])
def test_a_required_value_binds_applies_to_and_a_hint_does_not(
        published_demo: PublishedDemo, option: str, field: str, value: str) -> None:
    units = applies_to(published_demo.ws)
    carrying = {eid for eid, a in units.items() if value in a[field]}
    assert carrying, f"the demo has no unit whose applies_to.{field} holds {value}"

    bound = [r["evidence_id"] for r in search(published_demo.ws, option, value)["results"]]
    assert bound, "the constraint left nothing, although units carry the value"
    assert set(bound) <= carrying

    hint = option.replace("require-", "")
    hinted = [r["evidence_id"] for r in search(published_demo.ws, hint, value)["results"]]
    assert set(hinted) - carrying, "a context hint must not filter"


def test_required_values_of_one_field_are_alternatives(published_demo: PublishedDemo) -> None:
    units = applies_to(published_demo.ws)
    either = {"clinical.patient", "clinical.ed_visit"}
    results = search(published_demo.ws, "--require-table", "clinical.patient",
                     "--require-table", "clinical.ed_visit")["results"]
    found = {r["evidence_id"] for r in results}
    assert found and all(units[eid]["tables"] & either for eid in found)
    assert any("clinical.ed_visit" in units[eid]["tables"]
               and "clinical.patient" not in units[eid]["tables"] for eid in found)


def test_a_required_value_no_unit_carries_is_an_available_empty_answer(
        published_demo: PublishedDemo) -> None:
    doc = search(published_demo.ws, "--require-table", "clinical.nowhere")
    assert doc["results"] == []


def test_a_question_past_the_bound_is_refused_before_any_work(
        published_demo: PublishedDemo) -> None:
    # issue 14 item 11: a 40,000-character question took 34 s to embed; now it is a usage error
    from evidence_runtime.query import MAX_QUERY_CHARS, InvalidQueryError, render_query

    huge = "pazienti ricoverati " * 2000
    result = cli("evidence", "search", str(published_demo.ws), huge, "--purpose",
                 "sql_generation", "--json")
    assert result.exit_code == 2
    assert f"a search takes at most {MAX_QUERY_CHARS}" in result.stderr
    assert result.stdout == ""
    longest = "x" * (MAX_QUERY_CHARS - len("Domanda: "))
    assert len(render_query(longest)) == MAX_QUERY_CHARS  # the bound itself is searchable
    with pytest.raises(InvalidQueryError) as exc:
        render_query(longest + "y")
    assert exc.value.code == "invalid_query"
