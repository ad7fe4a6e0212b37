"""No refusal at publish that ``validate`` did not report first (issue 15 item 3).

A hand-edited unit that publishing would refuse is reported by ``tht evidence validate`` with
the same code, path, unit and field, and ``tht workspace preprocess evidence`` then refuses it
naming that finding (or, where the work tree and the commit differ, validate reports the cause
first). Symbolic links and content outside a commit are in ``test_trust_git.py``.

Other publish-time refusals, and where validate stands on them: ``evaluation_malformed`` and a
gate that cannot pass because an expected id has no unit (issue 15 item 4, evaluation.yaml in
validate). A work tree whose bytes differ from the blobs (core.autocrlf, smudge filters) errs the
other way: validate refuses source hashes that publish, reading the blobs, accepts. Index faults
(schema, locks) are not about the corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence_pipeline.demo import git
from evidence_pipeline.formats.fragments import ATOMIC_TOO_LARGE
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


def test_a_file_git_ignores_is_reported_by_validate_before_publish(demo_ws: Path) -> None:
    """The work tree has it, so the rules pass; the commit does not, so publishing would refuse
    (the manifest lists a unit no committed file has)."""
    rel = "evidence/curated/domain/fascia-pediatrica.md"
    git(demo_ws, "rm", "-q", "--cached", rel)
    with (demo_ws / ".gitignore").open("a", encoding="utf-8") as out:
        out.write(f"{rel}\n")
    commit(demo_ws, "A unit ignored by Git")

    validated, published, exit_code = validate_then_publish(demo_ws)

    assert validated["status"] == "invalid" and validated["exit"] == 1
    assert findings(validated["problems"]) == {("ignored_by_git", rel, None, None)}
    assert exit_code == 1 and findings(published["problems"]) == {
        ("manifest_unit_unknown", "evidence/manifest.yaml", "evidence:fascia-pediatrica",
         "sources")}
