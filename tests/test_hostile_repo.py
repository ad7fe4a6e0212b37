"""A hostile repository, hostile text and broken settings (issue 28, items 4, 5, 6, 8, 9).

Each test drives one attack through the surface a user meets it on (the ``tht`` CLI, or the
library for ``evidence_runtime.search``) and asserts the promised outcome: a clear refusal with
a stable code and an untouched tree (4), no command configured by the repository ever run (5),
an outcome instead of a traceback (6), invisible and look-alike text flagged for review (8),
credentials found whatever their Unicode form (9; the corpus itself is in
``tests/fixtures/credentials/``, run by ``tests/test_credentials.py``).
"""

from __future__ import annotations

import json
import os
import stat
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from evidence_pipeline.cli import main
from evidence_pipeline.demo import git
from tests.helpers import commit, new_workspace

pytestmark = pytest.mark.faults


def tht(*args: str) -> Result:
    """``tht`` in process; a crash (any exception but a clean exit) fails the test."""
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("tht crashed:\n" + "".join(traceback.format_exception(
            *result.exc_info)))
    assert "Traceback" not in result.output
    return result


def tht_json(*args: str) -> tuple[int, dict[str, Any]]:
    """``tht ... --json``: the exit code and the one JSON document on stdout."""
    r = tht(*args, "--json")
    return r.exit_code, json.loads(r.stdout)


def tree_state(ws: Path) -> str:
    """What Git sees of the work tree (untracked files included)."""
    return git(ws, "status", "--porcelain=v1", "--untracked-files=all")


# --------------------------------------------------------------------------- 4: one batch check


def one_table_note(rows: int) -> str:
    """A note that is one table of ward codes (the structural backend makes an enum of it:
    the table in the body and again in the kind block)."""
    lines = ["| codice | descrizione |", "|---|---|"]
    lines += [f"| R{i:05d} | reparto numero {i} dell'ospedale |" for i in range(rows)]
    return ("# Codici reparto\n\nIl codice reparto è memorizzato in clinical.ward.ward_code.\n\n"
            + "\n".join(lines) + "\n")


def test_prepare_never_writes_a_unit_validate_refuses(tmp_path: Path) -> None:
    note = one_table_note(20_000)
    assert 900_000 < len(note.encode()) < 1_000_000  # the note itself is within every limit
    ws = new_workspace(tmp_path / "ws", {"source/codici.md": note})
    code, doc = tht_json("evidence", "prepare", str(ws), "--backend", "structural")
    assert code == 1 and doc["status"] == "failed", doc
    [p] = doc["problems"]
    assert p["code"] == "batch_invalid"
    assert p["path"] == "evidence/curated/enum/codici-reparto.md"
    assert "evidence/source/codici.md" in p["message"]
    assert "larger than 1000000 bytes" in p["message"]
    assert tree_state(ws) == ""  # nothing written: not the unit, not the manifest
    assert not (ws / "evidence" / "curated").exists()
    assert not (ws / "evidence" / "manifest.yaml").exists()
