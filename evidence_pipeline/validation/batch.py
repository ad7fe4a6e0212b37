"""The byte rules of what authoring is about to write (issue 28, item 4): one shared check.

The planner checks the schema and the corpus rules (ids, manifest consistency) on the very
documents it dumps; what it cannot see there is what only the bytes show. Here every file of
a batch is put through the rule ``validate`` applies when it reads that file back — a curated
file through :func:`evidence_runtime.curated.curated_text` (size limit, strict UTF-8), the
manifest through :func:`evidence_pipeline.formats.manifest.decode_manifest` — before anything
is written, so nothing authoring writes is refused by the next ``validate``.
"""

from __future__ import annotations

from collections.abc import Mapping

from evidence_pipeline.formats.manifest import MANIFEST_NAME, ManifestError, decode_manifest
from evidence_pipeline.validation.problems import Problem, Severity
from evidence_runtime.curated import curated_text
from evidence_runtime.errors import ErrorCode, UnitFormatError

__all__ = ["batch_problems"]


def batch_problems(writes: Mapping[str, bytes], *, evidence_root: str,
                   origins: Mapping[str, str] | None = None) -> list[Problem]:
    """One ``batch_invalid`` error for each file of ``writes`` (paths relative to the workspace
    root → new bytes) that ``validate`` would refuse to read; ``origins`` (same paths → the
    source file a unit comes from) names the source in the message. Empty when all is well.
    Files outside ``<evidence_root>/`` are not checked here."""
    prefix = f"{evidence_root.strip('/')}/"
    out: list[Problem] = []
    for path, raw in sorted(writes.items()):
        if not path.startswith(prefix):
            continue
        rel = path.removeprefix(prefix)
        try:
            if rel == MANIFEST_NAME:
                decode_manifest(raw, path=path)
            elif rel.startswith("curated/"):
                curated_text(raw, path=path)
        except (UnitFormatError, ManifestError) as exc:
            origin = (origins or {}).get(path)
            made = f" (made from {prefix}{origin})" if origin else ""
            out.append(Problem(ErrorCode.batch_invalid, Severity.error, path, None,
                               f"would be written{made} but validate refuses it: "
                               f"{exc.message} ({exc.code}); nothing was written"))
    return out
