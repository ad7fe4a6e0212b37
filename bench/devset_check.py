"""The hard Italian dev set (bench/devset/psd-dev.yaml) and its own checks (issue 16 item 3).

    python bench/devset_check.py       # problems, one a line, then the set's shape; exit 1 if any

Checked: the schema of evaluation.yaml plus a boolean ``holdout``; every expected id is a unit of
the demo corpus; at least 40 questions per profile and 120 in all; about a quarter kept as
holdout, in every profile; every kind expected and every purpose asked; no text copied from the
demo gate; and no semantic question sharing a content word with its notes (the title, metadata,
excerpts and body of every expected unit and the whole source note it comes from). The last
check is what a semantic question is: a failing one is fixed by writing another honest
paraphrase, never by changing ``expected``.
"""

from __future__ import annotations

import collections
import json
import re
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO

DEVSET = REPO / "bench" / "devset" / "psd-dev.yaml"
DEMO_EVIDENCE = REPO / "examples" / "psd" / "evidence"
PROFILES = ("semantic", "lexical", "mixed")
PURPOSES = ("disambiguation", "rewriting", "schema_linking", "sql_generation")
KINDS = ("glossary", "domain", "enum", "example", "mapping", "normalization", "formula",
         "reference")
MIN_PER_PROFILE, MIN_TOTAL, HOLDOUT_RANGE = 40, 120, (0.20, 0.30)

@dataclass(frozen=True)
class DevQuestion:
    query: Any  # evidence_pipeline.formats.evalset.EvalQuery
    holdout: bool

    @property
    def split(self) -> str:
        return "holdout" if self.holdout else "dev"


def load_devset(path: Path = DEVSET) -> list[DevQuestion]:
    """The dev set: evaluation.yaml's schema plus an optional boolean ``holdout``."""
    from pydantic import ValidationError

    from evidence_pipeline.formats.evalset import EvalQuery, EvaluationSet
    from evidence_runtime.yamlio import load_rt, to_plain

    data = to_plain(load_rt(path.read_text(encoding="utf-8"), path=str(path)))
    out = []
    for n, raw in enumerate(data.get("queries") or []):
        raw = dict(raw)
        holdout = raw.pop("holdout", False)
        where = f"{path.name}: queries[{n}] ({raw.get('id')})"
        if not isinstance(holdout, bool):
            raise SystemExit(f"{where}: holdout must be true or false")
        try:
            out.append(DevQuestion(EvalQuery.model_validate(raw), holdout))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            raise SystemExit(f"{where}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    try:
        EvaluationSet(queries=tuple(q.query for q in out))
    except ValidationError as exc:
        raise SystemExit(f"{path.name}: {exc.errors(include_url=False)[0]['msg']}") from None
    return out


@dataclass(frozen=True)
class CorpusUnit:
    id: str
    kind: str
    purposes: tuple[str, ...]
    text: str  # title, applies_to, excerpts, the kind block and the body
    source: str  # the whole source note the unit comes from


_NOT_TEXT = {"schema_version", "id", "kind", "purposes", "language", "source_file",
             "source_sha256", "review_items"}


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in _NOT_TEXT:
                yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def read_corpus(evidence_dir: Path = DEMO_EVIDENCE) -> dict[str, CorpusUnit]:
    from evidence_runtime.curated import read_curated

    out = {}
    for f in sorted((evidence_dir / "curated").rglob("*.md")):
        doc = read_curated(f)
        d = doc.data()
        source = evidence_dir / d["provenance"]["source_file"]
        out[d["id"]] = CorpusUnit(d["id"], d["kind"], tuple(d["purposes"]),
                                  "\n".join([*_strings(d), doc.body]),
                                  source.read_text(encoding="utf-8"))
    return out


# The Snowball Italian stop list, plus question words and a few determiners and prepositions it
# lacks (ogni, senza, entro, stesso, altro, ciascuno...); BM25's own Italian stop words are also
# dropped (a word it maps to no token). Adverbs such as prima, dopo, solo, sempre stay content.
_STOP_TEXT = """
ad al allo ai agli all agl alla alle con col coi da dal dallo dai dagli dall dagl dalla dalle di
del dello dei degli dell degl della delle in nel nello nei negli nell negl nella nelle su sul
sullo sui sugli sull sugl sulla sulle per tra contro io tu lui lei noi voi loro mio mia miei mie
tuo tua tuoi tue suo sua suoi sue nostro nostra nostri nostre vostro vostra vostri vostre mi ti
ci vi lo la li le gli ne il un uno una ma ed se perche anche come dov dove che chi cui non piu
quale quanto quanti quanta quante quello quelli quella quelle questo questi questa queste si
tutto tutti ho hai ha abbiamo avete hanno abbia abbiate abbiano avro avrai avra avremo avrete
avranno avrei avresti avrebbe avremmo avreste avrebbero avevo avevi aveva avevamo avevate
avevano ebbi avesti ebbe avemmo aveste ebbero avessi avesse avessimo avessero avendo avuto avuta
avuti avute sono sei siamo siete sia siate siano saro sarai sara saremo sarete saranno sarei
saresti sarebbe saremmo sareste sarebbero ero eri era eravamo eravate erano fui fosti fu fummo
foste furono fossi fosse fossimo fossero essendo faccio fai facciamo fanno faccia facciate
facciano faro farai fara faremo farete faranno farei faresti farebbe faremmo fareste farebbero
facevo facevi faceva facevamo facevate facevano feci facesti fece facemmo faceste fecero facessi
facesse facessimo facessero facendo sto stai sta stiamo stanno stia stiate stiano staro starai
stara staremo starete staranno starei staresti starebbe staremmo stareste starebbero stavo stavi
stava stavamo stavate stavano stetti stesti stette stemmo steste stettero stessi stesse stessimo
stessero stando essere stato stata stati state qual cosa cos quando quali ogni senza entro
stesso stessa stessi stesse altro altra altri altre qualche ciascun ciascuno ciascuna poi qui
gia
"""
STOPWORDS = frozenset(_STOP_TEXT.split())
_TOKEN = re.compile(r"[^\W_]+")


def fold(text: str) -> str:
    """Lower case without accents (è → e), as the overlap check compares words."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


class WordKeys:
    """Content words and their comparison keys: the Snowball stem BM25 itself uses (its token
    id) and a 5-letter prefix (a short word without its final vowels), which also catches
    derivations the stemmer keeps apart (ospedale/ospedaliero)."""

    def __init__(self) -> None:
        import qdrant_edge as qe

        self._bm25 = qe.Bm25(qe.Bm25Config(language="italian"))
        self._memo: dict[str, frozenset[str]] = {}

    def keys(self, word: str) -> frozenset[str]:
        hit = self._memo.get(word)
        if hit is None:
            stems = self._bm25.embed_query(word).indices
            if not stems or word in STOPWORDS:
                hit = frozenset()
            else:
                prefix = word[:5] if len(word) >= 5 else (
                    word.rstrip("aeiou") if len(word) == 4 else word)
                hit = frozenset({f"p:{prefix}", *(f"s:{i}" for i in stems)})
            self._memo[word] = hit
        return hit

    def content(self, text: str) -> dict[str, frozenset[str]]:
        words = {w for w in _TOKEN.findall(fold(text)) if len(w) >= 2}
        return {w: k for w in words if (k := self.keys(w))}


def shared_words(keys: WordKeys, question: str, notes: str) -> list[tuple[str, str]]:
    """(question word, note word) pairs with a key in common."""
    by_key: dict[str, set[str]] = collections.defaultdict(set)
    for word, ks in keys.content(notes).items():
        for k in ks:
            by_key[k].add(word)
    pairs = set()
    for word, ks in keys.content(question).items():
        for k in ks:
            pairs.update((word, other) for other in by_key.get(k, ()))
    return sorted(pairs)


def question_text(q: Any) -> str:
    c = q.context
    return "\n".join([q.text, *c.concepts, *c.tables, *c.columns])


def check_devset(questions: list[DevQuestion], corpus: dict[str, CorpusUnit],
                 gate_texts: Iterable[str] = ()) -> dict[str, Any]:
    """Problems (which make ``--check`` fail) and the set's shape."""
    problems: list[str] = []
    keys = WordKeys()
    qs = [d.query for d in questions]
    for q in qs:
        for eid in q.expected:
            if eid not in corpus:
                problems.append(f"{q.id}: expected {eid} is not a unit of the demo corpus")
    per_profile = collections.Counter(q.profile.value for q in qs)
    holdout = collections.Counter(d.query.profile.value for d in questions if d.holdout)
    for p in PROFILES:
        if per_profile[p] < MIN_PER_PROFILE:
            problems.append(f"{p}: {per_profile[p]} questions (at least {MIN_PER_PROFILE})")
        if not holdout[p]:
            problems.append(f"{p}: no holdout question")
    if len(qs) < MIN_TOTAL:
        problems.append(f"{len(qs)} questions (at least {MIN_TOTAL})")
    share = sum(holdout.values()) / max(1, len(qs))
    if not HOLDOUT_RANGE[0] <= share <= HOLDOUT_RANGE[1]:
        problems.append(f"holdout is {share:.0%} of the set (wanted about 25%)")
    kinds = {corpus[e].kind for q in qs for e in q.expected if e in corpus}
    problems += [f"no question expects a {k} unit" for k in KINDS if k not in kinds]
    purposes = collections.Counter(q.purpose.value for q in qs)
    problems += [f"no question asks with purpose {p}" for p in PURPOSES if not purposes[p]]
    folded_gate = {fold(t).strip() for t in gate_texts}
    problems += [f"{q.id}: same text as a demo gate question" for q in qs
                 if fold(q.text).strip() in folded_gate]
    overlaps = {}
    for q in qs:
        if q.profile.value != "semantic":
            continue
        notes = "\n".join(corpus[e].text + "\n" + corpus[e].source
                          for e in q.expected if e in corpus)
        pairs = shared_words(keys, question_text(q), notes)
        if pairs:
            overlaps[q.id] = pairs
            problems.append(f"{q.id}: shares content words with its notes: "
                            + ", ".join(f"{a}~{b}" for a, b in pairs))
    # a finding, not a problem: the stage's purpose is not among any expected unit's purposes
    excluded = {q.id: q.purpose.value for q in qs
                if all(q.purpose.value not in corpus[e].purposes
                       for e in q.expected if e in corpus)}
    return {
        "problems": problems,
        "questions": len(qs),
        "per_profile": dict(per_profile),
        "holdout_per_profile": dict(holdout),
        "per_purpose": dict(sorted(purposes.items())),
        "expected_kinds": sorted(kinds),
        "semantic_overlaps": {k: [list(p) for p in v] for k, v in overlaps.items()},
        "all_expected_excluded_by_purpose": excluded,
    }


def main() -> int:
    from evidence_pipeline.demo import DEMO_SOURCE
    from evidence_pipeline.formats.evalset import read_evaluation

    evidence_dir = DEMO_SOURCE / "evidence"
    checked = check_devset(load_devset(), read_corpus(evidence_dir),
                           [q.text for q in read_evaluation(evidence_dir).queries])
    for p in checked["problems"]:
        print(p)
    print(json.dumps({k: v for k, v in checked.items()
                      if k not in ("problems", "semantic_overlaps")}, ensure_ascii=False))
    return 1 if checked["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
