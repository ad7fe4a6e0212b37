"""The few fixed cue words the structural backend reads (Italian and English).

Everything else it recognizes is structure; these are the only words whose meaning it relies
on: labels ("Regola:", "Domanda:"), rule and normalization cues, and words of doubt.
"""

from __future__ import annotations

import re

LABEL = re.compile(
    r"^(?:\*\*)?(?P<label>regol[ae]|condizion[ei]|eccezion[ei]|esclus[io]|esclusioni|"
    r"rule|conditions?|exceptions?)(?:\*\*)?\s*:\s*(?P<rest>.*)$", re.IGNORECASE)
QUESTION_LABEL = re.compile(
    r"^(?:\*\*)?(?:domanda|question|q)\b[^:]{0,60}:(?:\*\*)?\s*(?P<q>\S.*)$", re.IGNORECASE)
INTERP_LABEL = re.compile(
    r"^(?:\*\*)?(?:interpretazione|lettura(?: concordata)?|interpretation|significato)\b"
    r"[^:]{0,40}:(?:\*\*)?\s*(?P<i>\S.*)$", re.IGNORECASE)
SYNONYMS = re.compile(r"\b(?:sinonimi|synonyms)\b(?P<rest>[^.\n]*(?:\.(?=\S)[^.\n]*)*)",
                      re.IGNORECASE)
NORMALIZATION_CUE = re.compile(
    r"normaliz|uniform|standardiz|\bformat|\bvariant|ricondur|convertit", re.IGNORECASE)
RAW_HEADER = re.compile(r"prima|grezz|origin|\braw\b|input|come lo scriv|scritt|storico",
                        re.IGNORECASE)
RULE_CUE = re.compile(
    r"\b(?:deve|devono|va|vanno|bisogna|occorre|sempre|mai|solo|soltanto|non può|"
    r"non possono|esclus\w*|inclus\w*|si calcola|si calcolano|si usa|si usano|si conta|"
    r"si contano|non usar\w*|usare|must|always|never|only)\b", re.IGNORECASE)
DEONTIC = re.compile(
    r"\b(?:deve|devono|va|vanno|bisogna|occorre|non può|non possono|esclus\w*|regola|"
    r"non usar\w*|must|never)\b", re.IGNORECASE)
AMBIGUITY = re.compile(
    r"\b(?:forse|dipende|non (?:è|e') chiaro|non chiaro|da verificare|da chiarire|di solito|"
    r"di norma|probabilmente|non è detto|boh|TODO|TBD|maybe|unclear|it depends|"
    r"nota vecchia|obsolet[aoie]|superat[aoie]|deprecat\w*)\b|\?",
    re.IGNORECASE)
ARTICLE = r"(?:(?:il|lo|la|i|gli|le|un|uno|una|the|an|a)\s+|l'|un')?"
DEF_VERB = r"(?:è|sono|indica|indicano|significa|significano|=|is|means)"
