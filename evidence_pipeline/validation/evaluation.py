"""Rules on ``evidence/evaluation.yaml`` (spec §14): the set the publication gate runs must be able
to pass, so ``validate`` reports what would make it fail or refuse, each with a stable code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evidence_pipeline.formats.evalset import EVALUATION_NAME, EvalQuery, Profile
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_pipeline.validation.problems import Problem, Severity
from evidence_runtime.curated import decode_text
from evidence_runtime.errors import UnitFormatError
from evidence_runtime.units import EvidencePurpose
from evidence_runtime.yamlio import load_rt, to_plain

_PURPOSES = frozenset(p.value for p in EvidencePurpose)


def evaluation_problems(evidence_dir: Path, loaded: Sequence[LoadedUnit], *,
                        shown_prefix: str) -> list[Problem]:
    """Every problem of the evaluation set at once (the gate's reader stops at the first):
    ``evaluation_malformed``, ``evaluation_empty``,
    ``evaluation_duplicate_id``, ``evaluation_purpose_invalid``, ``evaluation_profile_missing``,
    ``evaluation_expected_unknown`` and ``evaluation_expected_unreachable`` (an expected unit
    whose purposes exclude the query's purpose: the purpose filter hides it, so it never hits).

    A workspace without the file is not reported: authoring goes on before the set is written,
    and the publication refuses it with its own clear line (``evaluation.yaml is missing``)."""
    shown = f"{shown_prefix}{EVALUATION_NAME}"
    file = evidence_dir / EVALUATION_NAME

    def problem(code: str, message: str, field: str | None = None,
                evidence_id: str | None = None) -> Problem:
        return Problem(code, Severity.error, shown, evidence_id, message, field)

    if not file.is_file():
        return []
    try:
        data = to_plain(load_rt(decode_text(file.read_bytes(), path=shown), path=shown))
    except UnitFormatError as exc:
        return [problem("evaluation_malformed", exc.message)]
    if not isinstance(data, Mapping) or not isinstance(data.get("queries") or [], list):
        return [problem("evaluation_malformed",
                        "evaluation.yaml must be a mapping with a list of `queries`")]
    extra = sorted(str(k) for k in data if k != "queries")
    out = [problem("evaluation_malformed", f"unknown key {k!r}", k) for k in extra]
    queries: list[Any] = data.get("queries") or []
    if not queries:
        return [*out, problem("evaluation_empty", "the evaluation set has no query", "queries")]

    units = {item.unit.id: item.unit for item in loaded if item.unit is not None}
    seen: dict[str, int] = {}
    profiles: set[str] = set()
    for i, raw in enumerate(queries):
        where = f"queries[{i}]"
        if not isinstance(raw, Mapping):
            out.append(problem("evaluation_malformed", "a query must be a mapping", where))
            continue
        qid = str(raw.get("id", ""))
        if qid in seen:
            out.append(problem("evaluation_duplicate_id",
                               f"query id {qid!r} is also queries[{seen[qid]}]", f"{where}.id"))
        else:
            seen[qid] = i
        if raw.get("profile") in {p.value for p in Profile}:
            profiles.add(raw["profile"])
        purpose = raw.get("purpose")
        if purpose not in _PURPOSES:
            out.append(problem("evaluation_purpose_invalid",
                               f"purpose {purpose!r} is not one of {', '.join(sorted(_PURPOSES))}",
                               f"{where}.purpose"))
            continue
        try:
            query = EvalQuery.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            field = ".".join([where, *(str(p) for p in err["loc"])])
            message = err["msg"].removeprefix("Value error, ")
            out.append(problem("evaluation_malformed", f"{qid or where}: {message}", field))
            continue
        for eid in query.expected:
            unit = units.get(eid)
            if unit is None:
                out.append(problem("evaluation_expected_unknown",
                                   f"query {query.id}: no curated unit has this id",
                                   f"{where}.expected", eid))
            elif query.purpose not in unit.purposes:
                have = ", ".join(p.value for p in unit.purposes)
                out.append(problem(
                    "evaluation_expected_unreachable",
                    f"query {query.id} asks for {query.purpose.value}, but the unit's purposes "
                    f"are {have}: the purpose filter hides it, so the query can never hit it",
                    f"{where}.expected", eid))
    for profile in Profile:
        if profile.value not in profiles:
            out.append(problem("evaluation_profile_missing",
                               f"no query with profile {profile.value}: the set needs at least one "
                               "lexical, one semantic and one mixed query (spec §14)", "queries"))
    return out
