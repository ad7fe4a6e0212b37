"""``evaluation.yaml`` is part of what ``validate`` checks (spec §14, issue 15 item 4): every
problem that would make the publication gate refuse or fail for sure is reported at once, each
with a stable code, before anything is published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.curated import read_curated
from evidence_runtime.units import EvidencePurpose
from tests.helpers import cli, commit

QUERY = """\
  - id: {id}
    text: {text}
    profile: {profile}
    purpose: {purpose}
    expected: [{expected}]
"""


def queries(*rows: dict[str, str]) -> str:
    return "queries:\n" + "".join(QUERY.format(**row) for row in rows)


def row(qid: str, profile: str, *, purpose: str = "sql_generation",
        expected: str = "evidence:fascia-pediatrica") -> dict[str, str]:
    return {"id": qid, "text": "Quali pazienti?", "profile": profile, "purpose": purpose,
            "expected": expected}


THREE = (row("q1", "lexical"), row("q2", "semantic"), row("q3", "mixed"))


def validate(ws: Path, evaluation: str | None) -> tuple[int, list[dict[str, Any]]]:
    file = ws / "evidence" / "evaluation.yaml"
    if evaluation is None:
        file.unlink()
    else:
        file.write_text(evaluation, encoding="utf-8")
    result = cli("evidence", "validate", str(ws), "--json")
    doc = json.loads(result.stdout)
    return result.exit_code, [p for p in doc["problems"]
                              if p["path"] == "evidence/evaluation.yaml"]


def codes(problems: list[dict[str, Any]]) -> list[str]:
    return sorted(p["code"] for p in problems)


def test_the_demo_set_is_valid(demo_ws: Path) -> None:
    assert validate_workspace(demo_ws).status.value == "publishable"
    assert validate(demo_ws, queries(*THREE)) == (0, [])


def test_a_missing_set_is_left_to_the_publication(demo_ws: Path) -> None:
    # authoring goes on before the set is written; publishing refuses without it
    assert validate(demo_ws, None) == (0, [])
    commit(demo_ws, "no evaluation set")
    assert cli("workspace", "activate", str(demo_ws)).exit_code == 0
    refused = cli("workspace", "preprocess", "evidence", str(demo_ws))
    assert refused.exit_code != 0
    assert "evaluation.yaml is missing" in refused.stderr


@pytest.mark.parametrize("text", ["queries: []\n", "queries:\n", "{}\n"])
def test_an_empty_set(demo_ws: Path, text: str) -> None:
    status, problems = validate(demo_ws, text)
    assert (status, codes(problems)) == (1, ["evaluation_empty"])


def test_each_profile_needs_a_query(demo_ws: Path) -> None:
    status, problems = validate(demo_ws, queries(row("q1", "lexical"), row("q2", "lexical")))
    assert (status, codes(problems)) == (1, ["evaluation_profile_missing"] * 2)
    assert sorted(p["message"].split()[4].rstrip(":") for p in problems) == ["mixed", "semantic"]


def test_duplicate_query_ids_are_all_reported(demo_ws: Path) -> None:
    status, problems = validate(demo_ws, queries(*THREE, row("q1", "lexical"),
                                                 row("q2", "mixed")))
    assert (status, codes(problems)) == (1, ["evaluation_duplicate_id"] * 2)
    assert sorted(p["field"] for p in problems) == ["queries[3].id", "queries[4].id"]


def test_an_expected_id_no_unit_has(demo_ws: Path) -> None:
    status, problems = validate(demo_ws, queries(*THREE, row("q4", "mixed",
                                                             expected="evidence:non-esiste")))
    assert (status, codes(problems)) == (1, ["evaluation_expected_unknown"])
    assert (problems[0]["evidence_id"], problems[0]["field"]) == (
        "evidence:non-esiste", "queries[3].expected")


def test_a_purpose_outside_the_enum(demo_ws: Path) -> None:
    status, problems = validate(demo_ws, queries(*THREE, row("q4", "mixed",
                                                             purpose="generation")))
    assert (status, codes(problems)) == (1, ["evaluation_purpose_invalid"])
    assert problems[0]["field"] == "queries[3].purpose"


def test_an_expected_unit_its_purposes_hide_from_the_query(demo_ws: Path) -> None:
    # a demo unit that one stage never sees, asked for by that stage
    for file in sorted((demo_ws / "evidence" / "curated").rglob("*.md")):
        unit = read_curated(file).unit()
        hidden = [p for p in EvidencePurpose if p not in unit.purposes]
        if hidden:
            break
    else:
        pytest.fail("every demo unit has every purpose")
    status, problems = validate(demo_ws, queries(
        *THREE, row("q4", "mixed", purpose=hidden[0].value, expected=unit.id)))
    assert (status, codes(problems)) == (1, ["evaluation_expected_unreachable"])
    assert problems[0]["evidence_id"] == unit.id
    assert hidden[0].value in problems[0]["message"]


def test_a_malformed_query_names_its_field(demo_ws: Path) -> None:
    status, problems = validate(demo_ws, queries(*THREE) + "    extra: 1\n")
    assert (status, codes(problems)) == (1, ["evaluation_malformed"])
    assert problems[0]["field"] == "queries[2].extra"
