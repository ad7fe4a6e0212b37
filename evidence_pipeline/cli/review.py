"""``tht evidence review``: the pending change as one static HTML page."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click
from rich.markup import escape

from evidence_pipeline.cli.common import (
    emit_json,
    json_option,
    stderr,
    stdout,
    user_errors,
    workspace_root,
)


@click.command("review")
@workspace_root
@click.option("--base", default="HEAD", show_default=True, metavar="REV",
              help="Compare the work tree's evidence/ with this Git revision.")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a web browser.")
@click.option("--no-evaluation", is_flag=True,
              help="Skip the scratch evaluation (the questions whose rank the change moves).")
@json_option
@user_errors
def review_cmd(workspace_root: Path, base: str, open_page: bool, no_evaluation: bool,
               as_json: bool) -> None:
    """Write one static HTML page for the pending change: each proposed or changed unit beside
    its source note with the supporting excerpts highlighted, review items next to the fields
    they name, the diff, and the evaluation questions whose fused rank the change would move
    (a scratch evaluation in a temporary registry: nothing is published).

    The page is written to <state>/review/index.html (the Dagster preview links to it).
    """
    from evidence_pipeline.review.build import build_review, review_path
    from evidence_pipeline.review.page import write_page
    from evidence_runtime.workspace import load_workspace

    out = stderr if as_json else stdout
    review = build_review(workspace_root, base=base, scratch_eval=not no_evaluation,
                          progress=lambda m: out.print(f"• {escape(m)}"))
    page = write_page(review, review_path(load_workspace(workspace_root)))
    ev = review.evaluation
    if as_json:
        emit_json({
            "page": str(page), "base": review.base, "status": review.status,
            "units": [{"evidence_id": u.evidence_id, "status": u.status,
                       "curated_path": u.curated_path,
                       "review_items": sum(len(f.items) for f in u.fields) + len(u.loose_items)}
                      for u in review.units],
            "other_files": [p for p, _ in review.other_files],
            "evaluation": None if ev is None else {
                "queries": ev.queries, "hit_at_10_before": ev.hit_at_10_before,
                "hit_at_10_after": ev.hit_at_10_after, "fragments_embedded": ev.embedded,
                "moves": [{"query": m.query, "evidence_id": m.evidence_id,
                           "before": m.before, "after": m.after} for m in ev.moves]},
            "evaluation_error": review.evaluation_error})
    else:
        counts = {s: sum(u.status == s for u in review.units) for s in ("new", "changed",
                                                                          "removed")}
        stdout.print(f"review of {review.base[:12]}..work tree: "
                     + ", ".join(f"{n} {s}" for s, n in counts.items()) + " unit(s), "
                     f"{len(review.other_files)} other file(s); corpus {review.status}")
        if ev is not None:
            stdout.print(f"scratch evaluation: hit@10 {ev.hit_at_10_before}/{ev.queries} → "
                         f"{ev.hit_at_10_after}/{ev.queries}; {len(ev.moves)} expected "
                         "unit rank(s) moved")
        elif review.evaluation_error:
            stdout.print(f"[yellow]scratch evaluation could not run[/]: "
                         f"{escape(review.evaluation_error)}")
        stdout.print(f"page: {page}")
    if open_page:
        webbrowser.open(page.as_uri())
