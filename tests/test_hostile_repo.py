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
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from evidence_pipeline.cli import main
from evidence_pipeline.demo import git
from evidence_pipeline.gitrepo import dirty_paths
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


# --------------------------------------------------------------------------- 5: hostile Git config

NOTE = """# Paziente

Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni.

Il sesso è memorizzato in clinical.patient.sex_code con valori M e F.
"""
EVALUATION = """\
queries:
  - id: q1
    text: pazienti in fascia pediatrica con età inferiore a 18 anni
    profile: lexical
    purpose: sql_generation
    expected: [evidence:paziente]
"""


@pytest.fixture
def hostile_repo(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A prepared, committed workspace whose Git configuration names a command for everything
    that can run one (fsmonitor, hooks, a filter driver with process/clean/smudge, textconv and
    diff/merge drivers, pager, editor), each leaving a marker file; ``.gitattributes`` puts every
    file under those drivers. (The workspace, the marker directory.)"""
    ws = new_workspace(tmp_path / "ws", {"source/paziente.md": NOTE})
    assert tht("evidence", "prepare", str(ws), "--backend", "structural").exit_code == 0
    (ws / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n", encoding="utf-8")
    (ws / "evidence" / "evaluation.yaml").write_text(EVALUATION, encoding="utf-8")
    commit(ws, "prepared")
    markers = tmp_path / "markers"
    markers.mkdir()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("pre-commit", "post-checkout", "post-index-change", "reference-transaction",
                 "fsmonitor-watchman", "pre-auto-gc"):
        script = hooks / hook
        script.write_text(f"#!/bin/sh\ntouch {markers}/hook-{hook}\n", encoding="utf-8")
        script.chmod(0o755)

    def marker(name: str, then: str = "") -> str:
        return f"sh -c 'touch {markers}/{name}{then}'"

    config = {
        "core.fsmonitor": marker("fsmonitor", "; exit 1"),
        "core.hooksPath": str(hooks),
        "core.pager": marker("pager"),
        "core.editor": marker("editor"),
        "core.sshCommand": marker("ssh"),
        "filter.evil.process": marker("filter-process", "; exit 1"),
        "filter.evil.clean": marker("filter-clean", "; cat"),
        "filter.evil.smudge": marker("filter-smudge", "; cat"),
        "filter.evil.required": "true",
        "diff.evil.textconv": marker("textconv", "; cat"),
        "diff.evil.command": marker("diff-command"),
        "diff.external": marker("diff-external"),
        "merge.evil.driver": marker("merge-driver"),
    }
    for key, value in config.items():  # set last: the commits above ran without them
        git(ws, "config", key, value)
    yield ws, markers


def restat(ws: Path) -> None:
    """Touch every committed file: Git must read (and filter) them again to know they are
    unchanged."""
    for path in ws.rglob("*"):
        if path.is_file() and ".git" not in path.parts and ".tht" not in path.parts:
            os.utime(path)


def test_commands_configured_in_the_repository_never_run(
        hostile_repo: tuple[Path, Path]) -> None:
    ws, markers = hostile_repo
    runs: list[tuple[tuple[str, ...], int, str]] = []
    ran: dict[str, list[str]] = {}  # command → the markers it left
    for args in (("evidence", "validate", str(ws)),
                 ("evidence", "prepare", str(ws), "--backend", "structural"),
                 ("workspace", "activate", str(ws)),
                 ("workspace", "preprocess", "evidence", str(ws))):
        restat(ws)
        r = tht(*args)
        runs.append((args, r.exit_code, r.output[-300:]))
        ran[args[1]] = sorted(p.name for p in markers.iterdir())
        for p in markers.iterdir():
            p.unlink()
    assert ran == {"validate": [], "prepare": [], "activate": [], "preprocess": []}, ran
    # validate finds the one-query evaluation set too small (a finding, exit 1); the rest ran
    assert [code for _, code, _ in runs] == [1, 0, 0, 0], runs
    assert dirty_paths(ws) == []
