"""The review page: one static HTML file, no script, no network, every value escaped."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, select_autoescape

from evidence_pipeline.review.build import Review

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Review: {{ review.units|length }} unit(s) against {{ review.base[:12] }}</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{background:#1d2b3a;color:#fff;padding:12px 24px}
header h1{font-size:20px;margin:0 0 4px}
main{padding:12px 24px}
section{background:#fff;border:1px solid #d8dde3;border-radius:6px;margin:0 0 18px;padding:12px 16px}
h2{font-size:17px;margin:4px 0 10px}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.pair>div{min-width:0}
pre{white-space:pre-wrap;word-break:break-word;background:#f3f4f6;padding:8px;border-radius:4px;margin:4px 0}
table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #e3e6ea;padding:4px 6px;text-align:left;vertical-align:top}
td.value{white-space:pre-wrap;word-break:break-word}
mark{background:#ffe27a;padding:0 1px}
mark sup,.ex-no{font-size:10px;color:#7a5b00;font-weight:bold}
.item{background:#fff1e6;border-left:3px solid #e8590c;padding:3px 6px;margin:3px 0}
.flagged td{background:#fff8f1}
.status{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;color:#fff}
.new{background:#2b8a3e}.changed{background:#1971c2}.removed{background:#c92a2a}
.better{color:#2b8a3e}.worse{color:#c92a2a}
.missing{color:#c92a2a}
.add{color:#2b8a3e}.del{color:#c92a2a}.hunk{color:#1098ad}
.problem{color:#c92a2a}
</style></head>
<body>
<header><h1>Pending change of {{ review.root }}</h1>
<div id="summary">against {{ review.base[:12] }}: {{ review.units|length }} unit(s)
({{ counts.new }} new, {{ counts.changed }} changed, {{ counts.removed }} removed),
{{ review.other_files|length }} other file(s); the work tree is
<b id="corpus-status">{{ review.status }}</b></div></header>
<main>
<section id="evaluation"><h2>Evaluation questions the change moves</h2>
{% if review.evaluation %}{% set ev = review.evaluation %}
<p id="eval-summary">Scratch evaluation (a temporary registry, nothing published):
hit@10 {{ ev.hit_at_10_before }}/{{ ev.queries }} at the base,
{{ ev.hit_at_10_after }}/{{ ev.queries }} with the change;
{{ ev.embedded }} fragment(s) embedded anew.</p>
{% if ev.moves %}<table id="moves"><tr><th>question</th><th>purpose</th><th>expected unit</th>
<th>fused rank before</th><th>after</th></tr>
{% for m in ev.moves %}<tr class="move"><td><b>{{ m.query }}</b> {{ m.text }}</td>
<td>{{ m.purpose }}</td><td>{{ m.evidence_id }}</td><td>{{ rank(m.before) }}</td>
<td class="{{ 'better' if m.better else 'worse' }}">{{ rank(m.after) }}</td></tr>
{% endfor %}</table>{% else %}<p id="no-moves">No fused rank of an expected unit moves.</p>{% endif %}
{% elif review.evaluation_error %}<p class="problem" id="eval-error">The scratch evaluation
could not run: {{ review.evaluation_error }}</p>
{% else %}<p>No scratch evaluation (nothing changed, or --no-evaluation).</p>{% endif %}
</section>
{% if review.problems %}<section id="problems"><h2>Problems elsewhere</h2><ul>
{% for p in review.problems %}<li class="problem">{{ p }}</li>{% endfor %}</ul></section>{% endif %}
{% for u in review.units %}
<section class="unit" id="unit-{{ loop.index }}" data-evidence-id="{{ u.evidence_id }}">
<h2><span class="status {{ u.status }}">{{ u.status }}</span> {{ u.evidence_id }}
— {{ u.title }}</h2>
<div class="pair"><div class="unit-fields">
<div>{{ u.curated_path }} · kind {{ u.kind }}</div>
{% for p in u.problems %}<div class="problem">{{ p }}</div>{% endfor %}
{% for i in u.loose_items %}<div class="item loose"><b>{{ i.code }}</b>
{% if i.field %}({{ i.field }}){% endif %}: {{ i.message }}</div>{% endfor %}
<table class="fields">{% for f in u.fields %}
<tr class="field{{ ' flagged' if f.items }}" data-field="{{ f.name }}"><th>{{ f.name }}</th>
<td class="value">{{ f.value }}{% for i in f.items %}
<div class="item"><b>{{ i.code }}</b> ({{ i.field }}): {{ i.message }}</div>{% endfor %}</td>
</tr>{% endfor %}</table>
<h3>Body</h3><pre class="body">{{ u.body }}</pre></div>
<div class="source"><h3>Source note: {{ u.source_file or "(none)" }}</h3>
<pre class="note">{% for s in u.source %}{% if s.excerpt is none %}{{ s.text }}{% else %}<mark data-excerpt="{{ s.excerpt + 1 }}">{{ s.text }}<sup>{{ s.excerpt + 1 }}</sup></mark>{% endif %}{% endfor %}</pre>
<h3>Supporting excerpts</h3><ol class="excerpts">{% for e in u.excerpts %}
<li class="{{ '' if e.found else 'missing' }}">{{ e.text }}{% if not e.found %}
— not found in the source{% endif %}</li>{% endfor %}</ol></div></div>
<details open><summary>Diff</summary>{{ diff(u.diff) }}</details>
</section>{% endfor %}
{% for path, d in review.other_files %}<section class="other"><h2>{{ path }}</h2>
<details open><summary>Diff</summary>{{ diff(d) }}</details></section>{% endfor %}
</main></body></html>
"""


def _diff_html(diff: str) -> str:
    from markupsafe import Markup, escape

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
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=False)
    counts = {s: sum(u.status == s for u in review.units) for s in ("new", "changed", "removed")}
    return env.from_string(TEMPLATE).render(review=review, counts=counts, diff=_diff_html,
                                            rank=_rank)


def write_page(review: Review, dest: Path) -> Path:
    """The page written to ``dest`` whole (a temporary file renamed into place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(render(review), encoding="utf-8")
    tmp.replace(dest)
    return dest
