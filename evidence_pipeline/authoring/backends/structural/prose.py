"""Units from prose: domain rules, glossary definitions, references, mappings (and the
normalizations and documented questions that prose can hold)."""

from __future__ import annotations

import re

from evidence_pipeline.authoring.backends.structural.cues import (
    ARTICLE,
    DEF_VERB,
    DEONTIC,
    LABEL,
    NORMALIZATION_CUE,
    RULE_CUE,
    SYNONYMS,
)
from evidence_pipeline.authoring.backends.structural.draft import (
    FIELD_UNCERTAIN,
    NO_LABEL,
    UNCERTAIN,
    Draft,
    K,
    new_draft,
    piece_text,
    prose_text,
    title_of,
)
from evidence_pipeline.authoring.backends.structural.normalization import (
    arrow_examples,
    normalization_draft,
)
from evidence_pipeline.authoring.backends.structural.questions import (
    labelled_interpretation,
    question,
)
from evidence_pipeline.authoring.backends.structural.refs import Refs
from evidence_pipeline.authoring.backends.structural.roles import Piece
from evidence_pipeline.authoring.backends.structural.text import (
    MD_LINK,
    URL,
    add,
    balanced,
    first_words,
    trim,
    unemph,
    unquote,
)


def prose_draft(piece: Piece, refs: Refs) -> Draft:
    """The most specific kind the prose shows, down to domain by fallback (flagged)."""
    text = prose_text(piece)
    examples = arrow_examples(piece)
    heading = piece.heading or ""
    first = piece.prose[0] if piece.prose else None
    first_text = first.flat if first is not None else ""
    if examples and (NORMALIZATION_CUE.search(heading) or NORMALIZATION_CUE.search(text) or (
            len(examples) >= 2 and "mapping" not in heading.lower()
            and not any(refs.find(e["normalized"])[0] for e in examples))):
        return normalization_draft(piece, refs, examples=examples)
    asked = question(piece, strict=True)[0]
    labelled = labelled_interpretation(piece)
    if asked and labelled:  # a documented question without SQL
        return new_draft(K.example, piece, title_of(piece, asked), {
            "question": asked, "interpretation": labelled}, refs)
    if any(LABEL.match(line.strip()) for b in piece.prose for line in b.lines):
        return domain_draft(piece, refs)
    glossary = _glossary(piece, refs)
    if glossary is not None:
        return glossary
    reference = _reference(piece, refs)
    if reference is not None:
        return reference
    if first is not None and any(refs.find(first.text)) and not DEONTIC.search(first_text):
        return mapping_draft(piece, refs)
    if NORMALIZATION_CUE.search(heading):
        return normalization_draft(piece, refs, examples=examples)
    if RULE_CUE.search(text):
        return domain_draft(piece, refs)
    draft = domain_fallback(piece, refs)
    draft.flag(UNCERTAIN, "No structure of a more specific kind was recognized; classified "
               "as domain by fallback.", "kind")
    return draft


# --- domain -----------------------------------------------------------------------------------


def domain_draft(piece: Piece, refs: Refs) -> Draft:
    """A domain rule: the labelled rule or the first paragraph, with labelled conditions and
    exceptions."""
    paragraphs: list[str] = []
    conditions: list[str] = []
    exceptions: list[str] = []
    explicit_rule: str | None = None
    blocks = piece.prose
    n = 0
    while n < len(blocks):
        block = blocks[n]
        nxt = blocks[n + 1] if n + 1 < len(blocks) else None
        if block.type == "list":
            paragraphs.append(block.flat)
            n += 1
            continue
        plain: list[str] = []
        pending: str | None = None  # a label ("Condizioni:") whose items follow as a list
        for line in block.lines:
            m = LABEL.match(line.strip())
            if m is None:
                if line.strip():
                    plain.append(line.strip())
                continue
            target, rest = _label_target(m.group("label")), trim(m.group("rest"))
            if not rest:
                pending = target
            elif target == "rule":
                explicit_rule = explicit_rule or rest
            else:
                (conditions if target == "conditions" else exceptions).append(rest)
        if plain and not _is_aside(" ".join(plain)):
            paragraphs.append(" ".join(plain))
        if pending and nxt is not None and nxt.type == "list":
            items = [trim(t) for t, _ in nxt.items()]
            if pending == "rule":
                explicit_rule = explicit_rule or nxt.flat
            else:
                (conditions if pending == "conditions" else exceptions).extend(items)
            n += 2
            continue
        n += 1
    rule = explicit_rule or (paragraphs[0] if paragraphs else "") or \
        piece_text(piece).strip() or title_of(piece)
    return new_draft(K.domain, piece, title_of(piece), {
        "rule": rule, "conditions": conditions, "exceptions": exceptions}, refs)


def domain_fallback(piece: Piece, refs: Refs) -> Draft:
    """A domain unit for what fits no other kind (the caller flags why)."""
    draft = domain_draft(piece, refs)
    draft.title = title_of(piece)
    return draft


def _is_aside(text: str) -> bool:
    """A paragraph that is only a parenthetical remark, e.g. "(nota vecchia …)"."""
    return text.startswith("(") and text.endswith(")") and balanced(text[1:-1])


def _label_target(label: str) -> str:
    label = label.lower()
    if label.startswith(("regol", "rule")):
        return "rule"
    if label.startswith(("condizion", "condition")):
        return "conditions"
    return "exceptions"


# --- glossary ---------------------------------------------------------------------------------


def _glossary(piece: Piece, refs: Refs) -> Draft | None:
    first = next((b for b in piece.prose if b.type == "para"), None)
    if first is None:
        return None
    paragraph = first.flat
    term = _defined_term(paragraph[:300], piece.heading)
    if term is None:
        return None
    synonyms, synonyms_span = _synonyms(piece, term)
    definition = paragraph
    if synonyms_span is not None and synonyms_span[0] in paragraph:
        cut = paragraph.index(synonyms_span[0])
        # only a trailing "Sinonimi: …" sentence is cut off the definition
        if cut > 0 and paragraph[:cut].rstrip().endswith((".", ";")) and \
                paragraph[cut:].strip() == synonyms_span[0].strip():
            definition = paragraph[:cut].strip()
    return new_draft(K.glossary, piece, title_of(piece, term), {
        "term": term, "definition": definition, "synonyms": synonyms}, refs, concepts=[term])


def _defined_term(sentence: str, heading: str | None) -> str | None:
    """The term a definitional sentence defines, as written in it (or None)."""
    variants = _heading_variants(heading)
    term_alt = r"\*\*[^*]{1,60}\*\*"
    if variants:
        term_alt += "|" + "|".join(variants)
    patterns = [
        r"^(?:per|con)\s+(?P<span>.{1,120}?)\s+si\s+intend",
        rf"(?:^|[.;:]\s+|\b(?:nel dwh|in generale|in questo contesto),?\s+){ARTICLE}"
        rf"(?P<term>{term_alt})\s+{DEF_VERB}\s",
        rf"\bsi\s+parla\s+di\s+(?P<term>{term_alt})",
        rf"^(?P<term>{term_alt})\s*(?:=|:)\s",
    ]
    for pattern in patterns:
        m = re.search(pattern, sentence, re.IGNORECASE)
        if m is None:
            continue
        if "span" in m.groupdict() and m.group("span") is not None:
            span = m.group("span")
            bold = re.search(r"\*\*([^*]{1,60})\*\*", span)
            if bold:
                return bold.group(1).strip()
            for v in variants:
                found = re.search(v, span, re.IGNORECASE)
                if found:
                    return found.group(0)
            if len(span.split()) <= 6:
                return unemph(span.strip())
            continue
        return unemph(m.group("term")).strip()
    return None


def _heading_variants(heading: str | None) -> list[str]:
    """Regexes for the term(s) a heading names (split on / - — and parentheses)."""
    if not heading:
        return []
    out: list[str] = []
    for part in re.split(r"\s+[-—–]\s+|\s*/\s*|[()]|,", unemph(heading)):
        words = part.strip().split()
        if not words or len(words) > 6:
            continue
        pats = []
        for w in words:
            w_esc = re.escape(w)
            if len(w) > 4 and w[-1].lower() in "aeio":
                w_esc = re.escape(w[:-1]) + "[aeio]"
            pats.append(w_esc)
        out.append(r"\b" + r"\s+".join(pats) + r"\b")
    return out


def _synonyms(piece: Piece, term: str) -> tuple[list[str], tuple[str, ...] | None]:
    """Synonyms only where the note literally lists them ("Sinonimi: a, b")."""
    for block in piece.prose:
        m = SYNONYMS.search(block.flat)
        if m is None:
            continue
        rest = m.group("rest")
        quoted = re.findall(r"\"([^\"]{1,60})\"|“([^”]{1,60})”", rest)
        if quoted and not rest.lstrip().startswith(":"):
            items = [a or b for a, b in quoted]
        elif ":" in rest:
            items = re.split(r"\s*[,;]\s*", rest.split(":", 1)[1])
        else:
            continue
        out: list[str] = []
        for item in items:
            item = re.sub(r"\s*\([^)]*\)\s*$", "", item.strip())
            item = unquote(trim(item))
            if item and item.lower() != term.lower() and len(item.split()) <= 6:
                add(out, item)
        sentence = block.flat[m.start():]
        return out, (sentence,)
    return [], None


# --- reference, mapping -----------------------------------------------------------------------


def _reference(piece: Piece, refs: Refs) -> Draft | None:
    text = prose_text(piece)
    urls = URL.findall(text)
    if len(urls) != 1:
        return None
    alone = None
    for block in piece.prose:
        for line in block.lines:
            s = line.strip().removeprefix("- ").strip("<>")
            link = MD_LINK.fullmatch(s)
            if URL.fullmatch(s) or link:
                alone = (line, link)
    if alone is None:
        return None
    line, link = alone
    url = link.group(2) if link else trim(alone[0].strip().removeprefix("- ").strip("<>"))
    label = link.group(1) if link else (unemph(piece.heading) if piece.heading else "")
    description = " ".join(
        ln.strip() for b in piece.prose for ln in b.lines if ln is not line and ln.strip())
    draft = new_draft(K.reference, piece, "", {}, refs)
    label = draft.or_uncertain(label, url, NO_LABEL, "reference.label")
    description = draft.or_uncertain(description, label, "The note does not describe the link.",
                                     "reference.description")
    draft.title = title_of(piece, label)
    draft.block = {"url": url, "label": label, "description": description}
    return draft


def mapping_draft(piece: Piece, refs: Refs) -> Draft:
    """A mapping of the heading's concept to the tables and columns the piece names."""
    concept = _mapping_concept(piece.heading)
    draft = new_draft(K.mapping, piece, "", {}, refs, concepts=[concept or ""])
    if concept is None:
        concept = first_words(prose_text(piece) or piece_text(piece))
        draft.flag(FIELD_UNCERTAIN, "The note has no heading naming the concept; the concept "
                   "is the first words of the text.", "mapping.concept")
    draft.title = title_of(piece, concept)
    draft.block = {"concept": concept, "tables": list(draft.tables),
                   "columns": list(draft.columns)}
    return draft


def _mapping_concept(heading: str | None) -> str | None:
    if not heading:
        return None
    concept = re.sub(r"^mapping\s*:?\s*", "", unemph(heading), flags=re.IGNORECASE).strip()
    return concept or unemph(heading)
