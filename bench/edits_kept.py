"""Curator edits kept by `prepare` after a small source edit (issue 27 item 1).

    python bench/edits_kept.py                 # table + bench/results/edits_kept.json
    python bench/edits_kept.py --limit 60 --json

On the demo workspace (a real Git repository), one scenario per source and kind of small edit
that applies to it: a curator first edits every unit the note yields — title, concepts, the
first enum meaning, purposes, a sentence at the end of the body — and commits; then the note gets
one small edit (``add-row`` to a table, ``fix-typo`` in a sentence, ``add-sentence`` to a
paragraph, ``reorder-list`` of two list items), committed; then ``prepare --backend structural``
(the library call the CLI makes). Each curator edit is then *kept* (still in the unit), *reported*
(lost, but a ``merge_conflict`` review item names its field) or *silently lost*.

To measure another checkout (e.g. main before the merge), put its code first on the path:
``PYTHONPATH=/tmp/main-export python bench/edits_kept.py``; the report records which code ran.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, finish, git, log, machine, table

EDITS = ("add-row", "fix-typo", "add-sentence", "reorder-list")
CURATOR_NOTE = "Nota del curatore: verificato con il referente del dato."
CURATOR_CONCEPT = "concetto curato"
ADDED = "Il dato è controllato ogni mese dal referente."
FIELDS = ("title", "concepts", "meaning", "purposes", "body")
# the merge_conflict review item field that reports a lost curator edit of each kind
REPORTED_BY = {"title": ("title",), "concepts": ("applies_to",), "meaning": ("enum", "kind"),
               "purposes": ("purposes",), "body": ("body",)}


@dataclass
class Scenario:
    source: str
    edit: str


def edit_source(text: str, edit: str) -> tuple[str, str | None] | None:
    """The note after one small edit of ``edit``'s kind and the text that edit brings (None for
    a reorder), or None when the note has no place for it."""
    lines = text.split("\n")
    fence = False
    prose: list[int] = []
    rows: list[int] = []
    items: list[int] = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("```"):
            fence = not fence
            continue
        if fence or not s:
            continue
        if s.startswith("|") and s.endswith("|") and not re.fullmatch(r"[|\s:-]+", s):
            rows.append(i)
        elif re.match(r"^[-*]\s+\S", s):
            items.append(i)
        elif not s.startswith(("#", ">", "<", "[")) and len(s.split()) >= 4:
            prose.append(i)
    if edit == "add-row" and len(rows) >= 2:
        last = rows[-1]
        cells = [c.strip() for c in lines[last].strip().strip("|").split("|")]
        new = ["ZZ"] + ["valore aggiunto"] * (len(cells) - 1)
        lines.insert(last + 1, "| " + " | ".join(new) + " |")
        return "\n".join(lines), "ZZ"
    if edit == "fix-typo" and prose:
        for i in prose:
            words = [m for m in re.finditer(r"\b[a-zà-ù]{7,}\b", lines[i])]
            if words:
                m = words[0]
                w = m.group(0)
                fixed = w[:-3] + w[-2] + w[-3] + w[-1]  # two letters swapped
                lines[i] = lines[i][:m.start()] + fixed + lines[i][m.end():]
                return "\n".join(lines), fixed
        return None
    if edit == "add-sentence" and prose:
        i = prose[0]
        lines[i] = lines[i].rstrip() + f" {ADDED}"
        return "\n".join(lines), ADDED
    if edit == "reorder-list":
        for a, b in itertools.pairwise(items):
            if b == a + 1:
                lines[a], lines[b] = lines[b], lines[a]
                return "\n".join(lines), None
    return None


def curator_edits(doc: Any) -> dict[str, Any]:
    """Edit a curated document in place as a curator would; what was set, by field."""
    front = doc.front
    done: dict[str, Any] = {}
    front["title"] = f"{front['title']} (rivisto)"
    done["title"] = str(front["title"])
    concepts = front.setdefault("applies_to", {}).setdefault("concepts", [])
    concepts.append(CURATOR_CONCEPT)
    done["concepts"] = CURATOR_CONCEPT
    if front.get("kind") == "enum":
        values = front["enum"]["values"]
        key = next(iter(values))
        values[key] = f"{values[key]} (significato curato)"
        done["meaning"] = (str(key), str(values[key]))
    purposes = list(front["purposes"])
    new = purposes[:-1] if len(purposes) > 1 else [*purposes, "disambiguation"
                                                   if "disambiguation" not in purposes
                                                   else "sql_generation"]
    front["purposes"] = new
    done["purposes"] = sorted(new)
    old_title = done["title"].removesuffix(" (rivisto)")
    body = doc.body.replace(f"# {old_title}\n", f"# {done['title']}\n", 1)
    doc.body = body.rstrip("\n") + f"\n\n{CURATOR_NOTE}\n"
    done["body"] = CURATOR_NOTE
    return done


def kept(field: str, want: Any, data: dict[str, Any], body: str) -> bool:
    if field == "title":
        return data.get("title") == want
    if field == "concepts":
        return want in (data.get("applies_to") or {}).get("concepts", [])
    if field == "meaning":
        return (data.get("enum") or {}).get("values", {}).get(want[0]) == want[1]
    if field == "purposes":
        return sorted(data.get("purposes") or []) == want
    return want in body


def run(limit: int | None) -> dict[str, Any]:
    import evidence_pipeline
    from evidence_pipeline.authoring.prepare import PrepareError, prepare
    from evidence_pipeline.demo import create_demo_repo
    from evidence_pipeline.formats.curated_writer import dump_curated
    from evidence_pipeline.formats.manifest import read_manifest
    from evidence_runtime.curated import read_curated

    tmp = Path(tempfile.mkdtemp(prefix="tht-edits-kept-"))
    try:
        ws = create_demo_repo(tmp / "demo")
        ev = ws / "evidence"
        base = git(ws, "rev-parse", "HEAD").strip()
        manifest = read_manifest(ev)
        assert manifest is not None
        files = {}
        for f in (ev / "curated").rglob("*.md"):
            doc = read_curated(f)
            files[doc.evidence_id] = f
        scenarios = []
        for path, entry in sorted(manifest.sources.items()):
            text = (ev / path).read_text(encoding="utf-8")
            for edit in EDITS:
                edited = edit_source(text, edit)
                if entry.units and edited is not None and edited[0] != text:
                    scenarios.append(Scenario(path, edit))
        if limit:
            scenarios = scenarios[:limit]
        log(f"{len(scenarios)} scenarios on {len({s.source for s in scenarios})} sources")
        outcome: Counter[str] = Counter()
        by_field: dict[str, Counter[str]] = {f: Counter() for f in FIELDS}
        by_edit: dict[str, Counter[str]] = {e: Counter() for e in EDITS}
        conflicts: Counter[str] = Counter()
        scenarios_with_conflicts = 0
        refused = 0
        lost: list[dict[str, Any]] = []
        # the text a source edit brings: in a unit (field, body or a conflict's message) or not
        source_change: Counter[str] = Counter()
        invisible: list[dict[str, Any]] = []
        started = time.perf_counter()
        for n, sc in enumerate(scenarios, 1):
            git(ws, "reset", "-q", "--hard", base)
            git(ws, "clean", "-qfdx", "-e", ".tht")
            wanted: dict[str, dict[str, Any]] = {}
            for eid in manifest.sources[sc.source].units:
                f = files[eid]
                doc = read_curated(f)
                wanted[eid] = curator_edits(doc)
                f.write_text(dump_curated(doc), encoding="utf-8")
            git(ws, "commit", "-qam", "curator edits")
            src = ev / sc.source
            edited = edit_source(src.read_text(encoding="utf-8"), sc.edit)
            assert edited is not None
            src.write_text(edited[0], encoding="utf-8")
            git(ws, "commit", "-qam", f"{sc.edit} in {sc.source}")
            try:
                prepare(ws, backend="structural")
            except PrepareError as exc:
                refused += 1
                log(f"  refused: {sc.source} {sc.edit}: {exc}")
                outcome["refused"] += sum(len(fields) for fields in wanted.values())
                continue
            found = False
            seen: list[str] = []  # what the source's units say, and what their conflicts say
            after = read_manifest(ev)
            assert after is not None
            for eid in after.sources[sc.source].units:  # new units included
                for f in (ev / "curated").glob(f"*/{eid.removeprefix('evidence:')}.md"):
                    d = read_curated(f)
                    seen.append(json.dumps(d.data(), ensure_ascii=False) + d.body)
            if edited[1] is not None:
                text_seen = "\n".join(seen)
                arrived = edited[1] in text_seen.replace('\\"', '"')
                source_change["arrived" if arrived else "not visible"] += 1
                if not arrived:
                    invisible.append({"source": sc.source, "edit": sc.edit})
            for eid, fields in wanted.items():
                doc = read_curated(files[eid]) if files[eid].exists() else None
                data = doc.data() if doc is not None else {}
                items = data.get("review_items") or []
                merge_items = [str(i.get("field", "")) for i in items
                               if i.get("code") == "merge_conflict"]
                for item in merge_items:
                    conflicts[item.split(".")[0]] += 1
                found = found or bool(merge_items)
                for field, want in fields.items():
                    if kept(field, want, data, doc.body if doc is not None else ""):
                        result = "kept"
                    elif any(m.split(".")[0] in REPORTED_BY[field] for m in merge_items):
                        result = "reported"
                    else:
                        result = "silently lost"
                        lost.append({"source": sc.source, "edit": sc.edit, "unit": eid,
                                     "field": field})
                    outcome[result] += 1
                    by_field[field][result] += 1
                    by_edit[sc.edit][result] += 1
            scenarios_with_conflicts += found
            if n % 20 == 0:
                log(f"  {n}/{len(scenarios)} scenarios")
        seconds = time.perf_counter() - started
        total = sum(outcome.values())
        return {
            "code": str(Path(evidence_pipeline.__file__).resolve().parent.parent),
            "machine": machine(),
            "scenarios": len(scenarios),
            "sources": len({s.source for s in scenarios}),
            "scenarios_by_edit": dict(Counter(s.edit for s in scenarios)),
            "curator_edits": total,
            "kept": outcome["kept"],
            "reported": outcome["reported"],
            "silently_lost": outcome["silently lost"],
            "refused": refused,
            "kept_share": round(outcome["kept"] / total, 4) if total else None,
            "merge_conflict_items": sum(conflicts.values()),
            "merge_conflicts_by_field": dict(conflicts),
            "scenarios_with_conflicts": scenarios_with_conflicts,
            "by_field": {f: dict(c) for f, c in by_field.items()},
            "by_edit": {e: dict(c) for e, c in by_edit.items()},
            "silent_losses": lost,
            "source_change_arrived": source_change["arrived"],
            "source_change_not_visible": source_change["not visible"],
            "source_changes_not_visible": invisible,
            "seconds": round(seconds, 1),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--limit", type=int, help="only the first N scenarios")
    args = parser.parse_args(argv)
    doc = run(args.limit)
    summary = {k: doc[k] for k in ("scenarios", "curator_edits", "kept", "reported",
                                   "silently_lost", "refused", "kept_share",
                                   "merge_conflict_items", "scenarios_with_conflicts",
                                   "source_change_arrived", "source_change_not_visible")}

    def human() -> str:
        rows = [[f, c.get("kept", 0), c.get("reported", 0), c.get("silently lost", 0)]
                for f, c in ((f, doc["by_field"][f]) for f in FIELDS)]
        rows += [[f"edit {e}", c.get("kept", 0), c.get("reported", 0),
                  c.get("silently lost", 0)] for e, c in doc["by_edit"].items()]
        rows.append(["all", doc["kept"], doc["reported"], doc["silently_lost"]])
        return (table(["curator edit", "kept", "reported", "silently lost"], rows,
                      f"{doc['scenarios']} scenarios on {doc['sources']} sources, "
                      f"{doc['curator_edits']} curator edits ({doc['code']})")
                + f"\nkept {doc['kept_share']:.1%}; {doc['merge_conflict_items']} merge_conflict "
                  f"item(s) in {doc['scenarios_with_conflicts']} scenario(s) "
                  f"{doc['merge_conflicts_by_field']}; prepare refused {doc['refused']}; "
                  f"the text a source edit brings (reorders aside) is in a unit or a "
                  f"conflict's message in {doc['source_change_arrived']} scenario(s), not "
                  f"visible in {doc['source_change_not_visible']}; "
                  f"{doc['seconds']} s")

    return finish("edits_kept.json", doc, summary, human, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
