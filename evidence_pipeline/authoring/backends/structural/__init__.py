"""The ``structural`` backend: deterministic restructuring by the structure a note shows.

No model is called and no text is invented. A note is split along headings into sections, and
sections along their structured blocks (SQL code blocks, tables, code lists, glossary lists,
link lists). Each piece is classified by what it visibly holds, from the most structured kind to
the fallback (spec §4.2); every structured field is a verbatim slice of the note, every excerpt a
verbatim slice of the normalized text. Wherever the structure leaves doubt, the unit carries a
review item. It is for offline demos, CI and benchmarks; messy notes need a real model.

The modules follow the flow: ``blocks`` (the note in the shared Markdown grammar, in sections),
``roles`` (what each block holds, the section cut into pieces), ``anchors`` and ``prose`` with
``normalization`` and ``questions`` (one draft unit per piece), ``review`` and ``excerpts`` (what
every draft carries), ``previous`` (ids kept, retirement), ``backend`` (the backend itself).
``cues`` holds the few fixed words it reads, ``text`` the helpers that only cut.
"""

from evidence_pipeline.authoring.backends.structural.backend import StructuralBackend

__all__ = ["StructuralBackend"]
