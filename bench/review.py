"""`tht evidence review` on the demo: one row added to the triage note, prepared, reviewed.

    python bench/review.py            # table + bench/results/review.json
    python bench/review.py --json

The demo workspace is built, the row ``| 6 | nero | deceduto all'arrivo |`` added to
``source/20-enum/triage.md`` and committed, ``prepare --backend structural`` proposes the changed
unit; then ``tht evidence review <root> --json`` (process start included) runs three times:
cold (no vector cache: the scratch evaluation embeds the base's 80 fragments and the change's
new one, and the 31 questions), warm (the cache the cold run filled), and without the scratch
evaluation (``--no-evaluation``: the page of units, notes and diff alone).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, finish, git, log, machine, run_tht, table, tht

ROW = "| 6 | nero | deceduto all'arrivo |"


def main() -> int:
    args = arguments(__doc__).parse_args()
    with tempfile.TemporaryDirectory(prefix="tht-bench-review-") as tmp:
        ws = Path(tmp) / "ws"
        run_tht("demo", "init", str(ws))
        note = ws / "evidence" / "source" / "20-enum" / "triage.md"
        text = note.read_text(encoding="utf-8")
        last = next(line for line in reversed(text.splitlines()) if line.startswith("| 5 |"))
        note.write_text(text.replace(last, f"{last}\n{ROW}"), encoding="utf-8")
        git(ws, "commit", "-qam", "triage: nero")
        tht("evidence", "prepare", str(ws), "--backend", "structural")
        runs = []
        for name, extra in (("cold", ()), ("warm", ()), ("no evaluation", ("--no-evaluation",))):
            log(f"review, {name}…")
            doc, seconds = tht("evidence", "review", str(ws), *extra)
            ev = doc["evaluation"] or {}
            runs.append({"run": name, "seconds": round(seconds, 2),
                         "units": len(doc["units"]),
                         "fragments_embedded": ev.get("fragments_embedded"),
                         "ranks_moved": len(ev.get("moves", [])) if ev else None})
    document = {"machine": machine(), "runs": runs}

    def human() -> str:
        return table(("run", "seconds", "units", "fragments embedded", "ranks moved"),
                     [(r["run"], r["seconds"], r["units"], r["fragments_embedded"],
                       r["ranks_moved"]) for r in runs], "tht evidence review on the demo")

    return finish("review.json", document, runs, human, args.json)


if __name__ == "__main__":
    sys.exit(main())
