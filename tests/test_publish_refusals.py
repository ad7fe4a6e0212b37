"""No refusal at publish that ``validate`` did not report first (issue 15 item 3).

A hand-edited unit that publishing would refuse is reported by ``tht evidence validate`` with
the same code, path, unit and field, and ``tht workspace preprocess evidence`` then refuses it
naming that finding. Refusals that need Git (symlinks, content outside a commit) are in
``test_trust_git.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence_pipeline.publishing.fragments import ATOMIC_TOO_LARGE
from tests.helpers import cli, commit, edit

pytestmark = pytest.mark.usefixtures("own_state")

HUGE = ("L'eccezione vale per " + "ogni reparto di neonatologia e terapia intensiva; " * 90).strip()


def findings(problems: list[dict]) -> set[tuple[str, str, str | None, str | None]]:
    return {(p["code"], p["path"], p["evidence_id"], p["field"]) for p in problems}


def validate_then_publish(ws: Path) -> tuple[dict, dict, int]:
    """``validate --json`` of the work tree, then activate and ``preprocess --json``."""
    val = cli("evidence", "validate", str(ws), "--json")
    act = cli("workspace", "activate", str(ws))
    assert act.exit_code == 0, act.output
    pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
    return json.loads(val.stdout) | {"exit": val.exit_code}, json.loads(pre.stdout), pre.exit_code


def test_an_atomic_element_too_large_is_reported_by_validate_before_publish(
        demo_ws: Path) -> None:
    unit = demo_ws / "evidence" / "curated" / "domain" / "fascia-pediatrica.md"
    edit(unit, "  exceptions:\n", f"  exceptions:\n    - {HUGE}\n")
    commit(demo_ws, "An exception longer than max_chunk_chars, edited by hand")

    validated, published, exit_code = validate_then_publish(demo_ws)

    expected = (ATOMIC_TOO_LARGE, "evidence/curated/domain/fascia-pediatrica.md",
                "evidence:fascia-pediatrica", "domain.exceptions[0]")
    assert validated["status"] == "blocked" and validated["exit"] == 1
    assert findings(validated["problems"]) == {expected}
    assert "(max_chunk_chars 4000)" in validated["problems"][0]["message"]
    # publish refuses with nothing validate did not say first
    assert exit_code == 1 and published["activated"] is False
    assert findings(published["problems"]) == {expected}


def test_the_workspace_limit_is_the_one_validate_applies(demo_ws: Path) -> None:
    """``max_chunk_chars`` comes from thoth.yaml (the one size limit): lowering it there makes
    validate find the rule that no longer fits, as publishing would."""
    descriptor = demo_ws / "thoth.yaml"
    text = descriptor.read_text(encoding="utf-8")
    assert "max_chunk_chars: 4000" in text
    descriptor.write_text(text.replace("max_chunk_chars: 4000", "max_chunk_chars: 400"),
                          encoding="utf-8")
    commit(demo_ws, "A smaller fragment limit")

    validated, published, exit_code = validate_then_publish(demo_ws)

    assert validated["status"] == "blocked"
    too_large = {f for f in findings(validated["problems"]) if f[0] == ATOMIC_TOO_LARGE}
    assert too_large and all("(max_chunk_chars 400)" in p["message"]
                             for p in validated["problems"] if p["code"] == ATOMIC_TOO_LARGE)
    assert exit_code == 1 and findings(published["problems"]) <= findings(validated["problems"])
