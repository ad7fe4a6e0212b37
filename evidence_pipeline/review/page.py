"""The review page: one static HTML file (``templates/review.html.j2``), no script, no network,
every value escaped."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, PackageLoader
from markupsafe import Markup, escape

from evidence_pipeline.review.build import Review


def _diff_html(diff: str) -> str:
    classes = (("+++", "file"), ("---", "file"), ("@@", "hunk"), ("+", "add"), ("-", "del"))
    lines = []
    for line in diff.splitlines():
        cls = next((c for prefix, c in classes if line.startswith(prefix)), "")
        lines.append(Markup('<span class="{}">{}</span>').format(cls, escape(line))
                     if cls else escape(line))
    return Markup('<pre class="diff">{}</pre>').format(Markup("\n").join(lines))


def _rank(value: int | None) -> str:
    return "not in top 50" if value is None else str(value)


def render(review: Review) -> str:
    env = Environment(loader=PackageLoader("evidence_pipeline.review", "templates"),
                      autoescape=True)  # every value escaped
    counts = {s: sum(u.status == s for u in review.units) for s in ("new", "changed", "removed")}
    return env.get_template("review.html.j2").render(review=review, counts=counts, diff=_diff_html,
                                            rank=_rank)


def write_page(review: Review, dest: Path) -> Path:
    """The page written to ``dest`` whole (a temporary file renamed into place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(render(review), encoding="utf-8")
    tmp.replace(dest)
    return dest
