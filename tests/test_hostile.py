"""Hostile input on the authoring side (issue 8, part 2): refused clearly, nothing written.

Every scenario drives one hostile input through the public surface — the ``tht`` CLI (click's
CliRunner), ``prepare`` with a scripted model backend, ``validate_workspace``, ``intake``,
``read_curated`` — and asserts a typed error (an :class:`EvidenceError`) or a validation problem
with a stable code that names the file, unit or field; no traceback; and a work tree (with its
surroundings, where symlinks point) left byte-identical, with a clean ``git status``. Inputs kept
as files live in ``tests/hostile/``; those that cannot be committed are generated here.

The last test prints the suite summary: scenarios tried, passed, bytes of data lost (must be 0).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import evidence_pipeline.authoring.prepare as prepare_module
from evidence_pipeline.authoring.backends import reply_text
from evidence_pipeline.authoring.backends.base import (
    ModelReply,
    ModelRequest,
    ProposedUnit,
    RetirementProposal,
    parse_reply,
)
from evidence_pipeline.authoring.backends.openai import OpenAIBackend
from evidence_pipeline.authoring.backends.pi import PiBackend, PiSettings
from evidence_pipeline.authoring.prepare import prepare
from evidence_pipeline.authoring.sources import (
    MAX_SOURCE_BYTES,
    SourceError,
    intake,
)
from evidence_pipeline.cli import main
from evidence_pipeline.demo import git
from evidence_pipeline.formats.curated_writer import dump_curated, dump_rt
from evidence_pipeline.validation.unit_cache import CACHE_NAME
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime import yamlio
from evidence_runtime.curated import MAX_CURATED_BYTES, read_curated
from evidence_runtime.errors import EvidenceError, UnitFormatError
from evidence_runtime.yamlio import load_rt
from tests.fakes.openai_server import FakeOpenAIServer
from tests.helpers import Outcome, fault_outcomes, new_workspace
from tests.helpers import commit as commit_change

# the Pi CLI's stand-in (the model boundary of the pi backend)
FAKE_PI = Path(__file__).parent / "fakes" / "fake_pi.py"

pytestmark = pytest.mark.faults

CORPUS = Path(__file__).parent / "hostile"

PAZIENTE = """# Paziente

Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni.

L'età si calcola dalla data di nascita in clinical.patient.birth_date.

Il sesso è memorizzato in clinical.patient.sex_code con valori M e F.

Le linee guida sono pubblicate su https://example.org/linee-guida.
"""
RICOVERO = """# Ricovero

Il ricovero (o degenza) è il periodo in cui il paziente occupa un posto letto.
"""
EXCERPT = "Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni."
AGE_EXCERPT = "L'età si calcola dalla data di nascita in clinical.patient.birth_date."
SEX_EXCERPT = "Il sesso è memorizzato in clinical.patient.sex_code con valori M e F."
URL_EXCERPT = "Le linee guida sono pubblicate su https://example.org/linee-guida."
RICOVERO_EXCERPT = "Il ricovero (o degenza) è il periodo in cui il paziente occupa un posto letto."
SECRET = "contenuto riservato fuori dal workspace"

GLOSSARY = "evidence/curated/glossary/fascia-pediatrica.md"
FORMULA = "evidence/curated/formula/eta-del-paziente.md"
REFERENCE = "evidence/curated/reference/linee-guida.md"
EXAMPLE = "evidence/curated/example/pazienti-pediatrici.md"
ENUM = "evidence/curated/enum/codice-sesso.md"
MANIFEST = "evidence/manifest.yaml"


# ---------------------------------------------------------------------------------------------
# Model replies (the only fake: the model boundary)
# ---------------------------------------------------------------------------------------------


def proposed(kind: str, title: str, block: dict[str, Any], excerpts: list[str], *,
             uid: str | None = None, body: str = "Testo ristrutturato.",
             purposes: tuple[str, ...] = ("sql_generation",), **extra: Any) -> ProposedUnit:
    data = {"title": title, "kind": kind, "purposes": list(purposes), "applies_to": {},
            kind: block, "supporting_excerpts": excerpts, "review_items": [], **extra}
    return ProposedUnit(id=uid, data=data, body=body)


def glossary_unit(excerpt: str = EXCERPT, *, uid: str | None = "evidence:fascia-pediatrica",
                  definition: str = "Pazienti con età inferiore a 18 anni.",
                  body: str = "Pazienti con età inferiore a 18 anni.", **extra: Any,
                  ) -> ProposedUnit:
    return proposed("glossary", "Fascia pediatrica",
                    {"term": "fascia pediatrica", "definition": definition, "synonyms": []},
                    [excerpt], uid=uid, body=body, purposes=("disambiguation",), **extra)


def formula_unit(sql: str, *, uid: str | None = "evidence:eta-del-paziente") -> ProposedUnit:
    return proposed("formula", "Età del paziente",
                    {"concept": "età", "columns": ["clinical.patient.birth_date"], "sql": sql},
                    [AGE_EXCERPT], uid=uid)


def reference_unit(url: str, *, uid: str | None = "evidence:linee-guida") -> ProposedUnit:
    return proposed("reference", "Linee guida",
                    {"url": url, "label": "Linee guida", "description": "Criteri pediatrici."},
                    [URL_EXCERPT], uid=uid, purposes=("disambiguation",))


def first_replies() -> dict[str, ModelReply]:
    return {
        "source/paziente.md": ModelReply(units=(
            glossary_unit(uid=None),
            formula_unit("date_part('year', age(clinical.patient.birth_date))", uid=None),
            reference_unit("https://example.org/linee-guida", uid=None),
            proposed("example", "Pazienti pediatrici",
                     {"question": "Quali pazienti sono pediatrici?",
                      "interpretation": "Pazienti con età inferiore a 18 anni.",
                      "sql": "SELECT * FROM clinical.patient "
                             "WHERE date_part('year', age(birth_date)) < 18"}, [EXCERPT]),
            proposed("enum", "Codice sesso",
                     {"column": "clinical.patient.sex_code",
                      "values": {"M": "maschio", "F": "femmina"}}, [SEX_EXCERPT]),
        )),
        "source/ricovero.md": ModelReply(units=(
            proposed("glossary", "Ricovero",
                     {"term": "ricovero", "definition": "Periodo di degenza.", "synonyms": []},
                     [RICOVERO_EXCERPT], purposes=("disambiguation",)),
        )),
    }


Answer = ModelReply | str | Exception | Callable[[ModelRequest], Any]


class ScriptedBackend:
    """Answers every request from a table keyed by source path (or one answer for all).

    A ``str`` answer is a raw model reply and goes through the real reply contract
    (:func:`parse_reply`), as the ``pi`` and ``openai`` backends do; a :class:`ModelReply`
    is handed to ``prepare`` as is, as a backend that skipped those checks would.
    """

    name = "scripted"

    def __init__(self, script: dict[str, Answer] | Answer) -> None:
        self.script = script
        self.calls: list[ModelRequest] = []

    def restructure(self, request: ModelRequest) -> ModelReply:
        self.calls.append(request)
        answer = self.script[request.source_file] if isinstance(self.script, dict) \
            else self.script
        if callable(answer):
            answer = answer(request)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, str):
            return parse_reply(answer, request)
        return answer


def raw_unit(**over: Any) -> dict[str, Any]:
    """A unit of a raw (JSON) model reply."""
    unit = {"kind": "glossary", "title": "Fascia pediatrica", "purposes": ["disambiguation"],
            "glossary": {"term": "fascia pediatrica", "definition": "Età inferiore a 18 anni."},
            "supporting_excerpts": [EXCERPT], "body": "Età inferiore a 18 anni."}
    unit.update(over)
    return unit


def raw_reply(*units: dict[str, Any], retire: list[dict[str, Any]] | None = None) -> str:
    return json.dumps({"units": list(units), "retirement_candidates": retire or []})


# ---------------------------------------------------------------------------------------------
# Workspaces, snapshots and the scenario recorder
# ---------------------------------------------------------------------------------------------


# the commit after a refused hostile input may have nothing in it
commit = functools.partial(commit_change, allow_empty=True)


def git_status(ws: Path) -> str:
    return git(ws, "status", "--porcelain", "--untracked-files=all")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared, committed, publishable workspace: two sources, six units of five kinds."""
    ws = new_workspace(tmp_path_factory.mktemp("template") / "ws",
                       {"source/paziente.md": PAZIENTE, "source/ricovero.md": RICOVERO},
                       config="workspace_id: test\nlanguage: italian\n"
                              "model:\n  backend: structural\n")
    backend = ScriptedBackend(first_replies())
    assert prepare(ws, backend_factory=lambda name, settings: backend).status == "applied"
    commit(ws, "prepared")
    report = validate_workspace(ws)
    assert report.status.value == "publishable", report.problems
    # the state directory goes, but for the cache of parsed curated files that validate just
    # filled: every test starts warm, as a curator's second run does (a file a test changes
    # has other bytes, so it is parsed and checked again)
    for entry in (ws / ".tht").iterdir():
        if entry.name not in (CACHE_NAME, ".gitignore"):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    return ws


@pytest.fixture
def ws(template: Path, tmp_path: Path) -> Path:
    """A private copy of the template, with a directory outside it that symlinks may target."""
    dest = tmp_path / "ws"
    shutil.copytree(template, dest, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Segreto\n\n{SECRET}.\n", encoding="utf-8")
    assert git_status(dest) == ""
    return dest


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file (bytes), symlink (target) and directory under ``root``, Git's own data and
    the local state directory aside."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in {".git", ".tht"}]
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            p = here / name
            key = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[key] = f"symlink -> {os.readlink(p)}"
            elif p.is_dir():
                out[key] = "directory"
            elif p.is_file():
                out[key] = p.read_bytes()
            else:
                out[key] = "special file"
    return out


def _size(value: bytes | str) -> int:
    return len(value) if isinstance(value, bytes) else 1


def lost_bytes(before: dict[str, bytes | str], after: dict[str, bytes | str], *,
               exempt: frozenset[str] = frozenset()) -> int:
    """Bytes of what was there before and is now changed or gone."""
    return sum(_size(v) for k, v in before.items() if after.get(k) != v and k not in exempt)


OUTCOMES = fault_outcomes("hostile-input scenarios (bytes of data lost must be 0)")


@pytest.fixture
def scenario(request: pytest.FixtureRequest, ws: Path) -> Callable[..., Any]:
    """``with scenario(group):`` records one scenario and checks that nothing was written."""

    @contextmanager
    def run(group: str, *, writes_allowed: bool = False) -> Iterator[None]:
        """``writes_allowed``: a run that may add units (and so update the manifest) but must
        not change or remove anything else."""
        outcome = Outcome(group, request.node.name)
        OUTCOMES.append(outcome)
        exempt = frozenset({f"{ws.name}/{MANIFEST}"} if writes_allowed else ())
        before = snapshot(ws.parent)
        try:
            yield
        finally:
            after = snapshot(ws.parent)
            outcome.bytes_lost = lost_bytes(before, after, exempt=exempt)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if writes_allowed:
            assert outcome.bytes_lost == 0, changed
        else:
            assert changed == [], changed
            assert git_status(ws) == ""
        staging = ws / ".tht" / "staging"
        assert not staging.is_dir() or not any(staging.iterdir()), "staging leftovers"
        outcome.passed = True

    return run


@pytest.fixture
def use_backend(monkeypatch: pytest.MonkeyPatch) -> Callable[[ScriptedBackend], None]:
    """Make ``tht evidence prepare`` use a scripted backend (the CLI imports prepare lazily)."""

    def install(backend: ScriptedBackend) -> None:
        monkeypatch.setattr(prepare_module, "prepare", functools.partial(
            prepare, backend_factory=lambda name, settings: backend))

    return install


def never_called(request: ModelRequest) -> ModelReply:
    raise AssertionError(f"the model must not be called (asked about {request.source_file})")


# ---------------------------------------------------------------------------------------------
# The surface: CLI calls and what a refusal must look like
# ---------------------------------------------------------------------------------------------

_UNSAFE_OUTPUT = ("\x1b", "\x9b", "\u202e", "\x07", "\x00")


def tht(*args: str) -> Result:
    """Run ``tht``; a crash (any exception but a clean exit) or a traceback fails the test."""
    # color=True: click would otherwise strip ANSI sequences that a real terminal receives
    result = CliRunner().invoke(main, list(args), color=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("tht crashed:\n" + "".join(traceback.format_exception(
            *result.exc_info)))
    assert "Traceback" not in result.output
    for ch in _UNSAFE_OUTPUT:  # names from the input never reach a terminal raw
        assert ch not in result.output, f"raw {ch!r} in the output: {result.output!r}"
    return result


def error_line(result: Result) -> str:
    """The one ``error:`` line on stderr (progress lines may precede it)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert result.stderr.rstrip("\n").splitlines()[-1] == lines[0]
    return lines[0]


def prepare_refused(ws: Path) -> list[dict[str, Any]]:
    """``tht evidence prepare --json`` refused the batch; the problems it listed."""
    r = tht("evidence", "prepare", str(ws), "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "failed"
    assert error_line(r).startswith("error: prepare refused")
    assert doc["problems"]
    assert all(p["path"] for p in doc["problems"]), doc["problems"]
    return doc["problems"]


def validate_refused(ws: Path, status: str = "invalid") -> list[dict[str, Any]]:
    """``tht evidence validate --json`` did not find the corpus publishable; its problems."""
    r = tht("evidence", "validate", str(ws), "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == status, doc
    return doc["problems"]


def command_error(*args: str) -> str:
    """A command refused with exit 2 and one clear line on stderr (a typed error); with
    ``--json`` the same error is the one JSON document on stdout."""
    r = tht(*args)
    assert r.exit_code == 2, r.output
    line = error_line(r)
    if "--json" in args:
        doc = json.loads(r.stdout)
        assert doc["status"] == "error", doc
        [p] = doc["problems"]
        assert p["code"] and p["message"] and p["message"] in line, (p, line)
    else:
        assert r.stdout == ""
    return line


def problem(problems: list[dict[str, Any]], code: str | set[str], **where: Any,
            ) -> dict[str, Any]:
    """The first problem with this code (or one of these codes) and these fields."""
    codes = {code} if isinstance(code, str) else code
    for p in problems:
        if p["code"] in codes and all(p.get(k) == v for k, v in where.items()):
            return p
    raise AssertionError(f"no {codes} problem with {where} in {json.dumps(problems, indent=1)}")


def edit_front(ws: Path, rel: str, mutate: Callable[[Any], None], *,
               body: str | None = None) -> None:
    """Hand-edit a curated file's front matter (and body) and commit it."""
    f = ws / rel
    doc = read_curated(f)
    mutate(doc.front)
    if body is not None:
        doc.body = body
    f.write_text(dump_curated(doc), encoding="utf-8")
    commit(ws)


def touch_source(ws: Path, rel: str = "evidence/source/paziente.md") -> None:
    """Change a source so that prepare calls the model for it."""
    f = ws / rel
    f.write_text(f.read_text(encoding="utf-8") + "\nNota aggiunta in revisione.\n",
                 encoding="utf-8")
    commit(ws)


# ---------------------------------------------------------------------------------------------
# Sources: encodings, BOM, NUL
# ---------------------------------------------------------------------------------------------

BAD_SOURCES = sorted(p.name for p in (CORPUS / "sources").iterdir()
                     if not p.name.startswith("hidden-sql"))


@pytest.mark.parametrize("name", BAD_SOURCES)
def test_source_with_bad_bytes_is_refused(ws: Path, scenario, use_backend, name: str) -> None:
    shutil.copy(CORPUS / "sources" / name, ws / "evidence/source" / name)
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("source encoding"):
        sources, errors = intake(ws / "evidence")
        assert sorted(sources) == ["source/paziente.md", "source/ricovero.md"]
        [err] = errors
        assert isinstance(err, SourceError) and isinstance(err, EvidenceError)
        assert (err.code, err.path) == ("source_encoding_invalid", f"source/{name}")
        problem(prepare_refused(ws), "source_encoding_invalid", path=f"evidence/source/{name}")


@pytest.mark.parametrize("name", ["latin1.md", "mixed-encoding.md", "bom.md", "nul.md"])
def test_cited_source_rewritten_with_bad_bytes(ws: Path, scenario, use_backend,
                                               name: str) -> None:
    shutil.copy(CORPUS / "sources" / name, ws / "evidence/source/ricovero.md")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("source encoding"):
        problem(prepare_refused(ws), "source_encoding_invalid",
                path="evidence/source/ricovero.md")
        problems = validate_refused(ws)
        problem(problems, "source_missing", path="evidence/curated/glossary/ricovero.md",
                evidence_id="evidence:ricovero", field="provenance.source_file")
        problem(problems, "manifest_source_missing", path=MANIFEST)


# ---------------------------------------------------------------------------------------------
# Sources: size
# ---------------------------------------------------------------------------------------------


def _huge_file(path: Path) -> None:
    line = "Riga di una nota molto lunga sul ricovero ordinario.\n"
    path.write_text(line * (MAX_SOURCE_BYTES // len(line) + 2), encoding="utf-8")
    assert path.stat().st_size > MAX_SOURCE_BYTES


# a long line is no longer refused (issue 16: base64, minified JSON, one-line SQL); only the
# file size guards against hostile input, see tests/test_realworld.py
def test_oversized_source_is_refused(ws: Path, scenario, use_backend) -> None:
    _huge_file(ws / "evidence/source/enorme.md")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("source size"):
        _, errors = intake(ws / "evidence")
        assert [(e.code, e.path) for e in errors] == [("source_too_large", "source/enorme.md")]
        problem(prepare_refused(ws), "source_too_large", path="evidence/source/enorme.md")


def test_oversized_curated_file_is_refused(ws: Path, scenario, use_backend) -> None:
    f = ws / GLOSSARY
    f.write_text(f.read_text(encoding="utf-8") + "x" * MAX_CURATED_BYTES + "\n",
                 encoding="utf-8")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("curated size"):
        with pytest.raises(UnitFormatError, match="larger than"):
            read_curated(f, display_path=GLOSSARY)
        problem(validate_refused(ws), "unit_format", path=GLOSSARY)
        problem(prepare_refused(ws), "unit_format", path=GLOSSARY)


# ---------------------------------------------------------------------------------------------
# Sources: symlinks, unsafe and control-character names, special files
# ---------------------------------------------------------------------------------------------


# name -> (link target, link path under evidence/); {parent} is the workspace's parent folder
SOURCE_LINKS = {
    "file_relative": ("../../../outside/secret.md", "source/fuga.md"),
    "file_absolute": ("{parent}/outside/secret.md", "source/fuga.md"),
    "to_descriptor": ("../../thoth.yaml", "source/descrittore.md"),
    "directory": ("{parent}/outside", "source/esterna"),
    "loop": ("anello.md", "source/anello.md"),
    "dangling": ("non-esiste.md", "source/sospeso.md"),
}


def link_source(ws: Path, name: str) -> str:
    """Create the link ``name`` of :data:`SOURCE_LINKS`; its path under evidence/."""
    target, rel = SOURCE_LINKS[name]
    os.symlink(target.format(parent=ws.parent), ws / "evidence" / rel)
    return rel


@pytest.mark.parametrize("name", SOURCE_LINKS)
def test_symlinked_source_is_refused(ws: Path, scenario, use_backend, name: str) -> None:
    rel = link_source(ws, name)
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("source symlink"):
        sources, errors = intake(ws / "evidence")
        assert sorted(sources) == ["source/paziente.md", "source/ricovero.md"]
        assert [(e.code, e.path) for e in errors] == [("unsafe_path", rel)]
        r = tht("evidence", "prepare", str(ws), "--json")
        assert r.exit_code == 1 and SECRET not in r.output
        problem(json.loads(r.stdout)["problems"], "unsafe_path", path=f"evidence/{rel}")


CONTROL_NAMES = {
    "newline": "riga\nnuova.md",
    "carriage-return": "ritorno\rcarrello.md",
    "escape": "colore\x1b[31mrosso.md",
    "bell": "campanello\x07.txt",
    "c1-csi": "csi\x9b2J.md",
    "rtl-override": "nota\u202edm.txt",
    "zero-width": "nota\u200b.md",
    "escape-in-directory": "cartella\x1b[2J/nota.md",
    "escape-wrong-type": "allegato\x1b[31m.pdf",
    "line-separator": "riga\u2028nuova.md",
}


@pytest.mark.parametrize("name", list(CONTROL_NAMES.values()), ids=list(CONTROL_NAMES))
def test_source_name_with_control_characters(ws: Path, scenario, use_backend, name: str) -> None:
    f = ws / "evidence/source" / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("# Nota\n\nTesto della nota.\n", encoding="utf-8")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("source name"):
        _, errors = intake(ws / "evidence")
        [err] = errors
        assert err.code == "unsafe_path"
        assert name[:3] in err.path and "control character" in err.message
        assert all(ch.isprintable() for ch in err.path), err.path
        problem(prepare_refused(ws), "unsafe_path")
        # the human output (a table for people) must not carry the raw name either
        r = tht("evidence", "prepare", str(ws))
        assert r.exit_code == 1
        assert "unsafe_path" in r.stdout.replace("\n", "").replace("│", "").replace(" ", "")


def test_fifo_in_source_tree_is_refused(ws: Path, scenario, use_backend) -> None:
    os.mkfifo(ws / "evidence/source/tubo.md")  # Git does not track it: status stays clean
    use_backend(ScriptedBackend(never_called))
    with scenario("source special file"):
        _, errors = intake(ws / "evidence")
        assert [(e.code, e.path) for e in errors] == [("unsafe_path", "source/tubo.md")]
        problem(prepare_refused(ws), "unsafe_path", path="evidence/source/tubo.md")


def test_source_of_a_disallowed_type_is_refused(ws: Path, scenario, use_backend) -> None:
    (ws / "evidence/source/foglio.xlsx").write_bytes(b"PK\x03\x04binary")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("source type"):
        problem(prepare_refused(ws), "source_type_not_allowed",
                path="evidence/source/foglio.xlsx")


# ---------------------------------------------------------------------------------------------
# `..`, absolute and unsafe names: resolve --source and provenance.source_file
# ---------------------------------------------------------------------------------------------


def _plain(ws: Path) -> None:
    pass


def _make_link(ws: Path) -> None:
    link_source(ws, "file_relative")


def _make_link_dir(ws: Path) -> None:
    link_source(ws, "directory")


def _make_control(ws: Path) -> None:
    (ws / "evidence/source/a\x1bb.md").write_text(RICOVERO, encoding="utf-8")


def _make_latin1(ws: Path) -> None:
    shutil.copy(CORPUS / "sources/latin1.md", ws / "evidence/source/latin1.md")


RESOLVE_SOURCES = [
    ("parent", "../thoth.yaml", _plain),
    ("parent-inside", "source/../../thoth.yaml", _plain),
    ("parent-prefixed", "evidence/source/../../thoth.yaml", _plain),
    ("parent-to-manifest", "source/../manifest.yaml", _plain),
    ("absolute", "/etc/passwd", _plain),
    ("absolute-descriptor", "{ws}/thoth.yaml", _plain),
    ("absolute-source", "{ws}/evidence/source/ricovero.md", _plain),
    ("backslashes", "source\\..\\..\\thoth.yaml", _plain),
    ("missing", "source/non-esiste.md", _plain),
    ("symlink-out", "source/fuga.md", _make_link),
    ("symlinked-dir", "source/esterna/secret.md", _make_link_dir),
    ("control-character", "source/a\x1bb.md", _make_control),
    ("latin1", "source/latin1.md", _make_latin1),
]


@pytest.mark.parametrize(("arg", "make"), [(a, m) for _, a, m in RESOLVE_SOURCES],
                         ids=[i for i, _, _ in RESOLVE_SOURCES])
def test_resolve_source_outside_the_tree_is_refused(ws: Path, scenario, arg: str,
                                                    make) -> None:
    make(ws)
    commit(ws)
    arg = arg.format(ws=ws)
    with scenario("resolve --source"):
        line = command_error("evidence", "resolve", "evidence:ricovero", "--source", arg,
                             "--workspace", str(ws))
        assert SECRET not in line
        assert "evidence:ricovero" in line or "source" in line


@pytest.mark.parametrize("eid", ["evidence:../../thoth", "evidence:Ricovero", "../x",
                                 "evidence:ricovero\x1b[2J", "evidence:formula-x"])
def test_resolve_hostile_id_is_refused(ws: Path, scenario, eid: str) -> None:
    with scenario("resolve id"):
        command_error("evidence", "resolve", eid, "--retire", "--workspace", str(ws))


PROVENANCE_SOURCES = {
    "parent": ("../thoth.yaml", "schema_invalid"),
    "parent-inside": ("source/../../thoth.yaml", "schema_invalid"),
    "parent-to-manifest": ("source/../manifest.yaml", "schema_invalid"),
    "absolute": ("/etc/passwd", "schema_invalid"),
    "absolute-under-source": ("source//etc/passwd", "source_missing"),
    "backslashes": ("source\\..\\..\\thoth.yaml", "schema_invalid"),
    "symlink-out": ("source/fuga.md", "source_missing"),
    "symlinked-dir": ("source/esterna/secret.md", "source_missing"),
    "control-character": ("source/a\x1bb.md", "schema_invalid"),
}


@pytest.mark.parametrize(("value", "code"), list(PROVENANCE_SOURCES.values()),
                         ids=list(PROVENANCE_SOURCES))
def test_provenance_source_file_outside_the_tree(ws: Path, scenario, use_backend, value: str,
                                                 code: str) -> None:
    link_source(ws, "file_relative")
    link_source(ws, "directory")
    _make_control(ws)
    edit_front(ws, GLOSSARY, lambda d: d["provenance"].__setitem__("source_file", value))
    use_backend(ScriptedBackend(never_called))
    with scenario("provenance.source_file"):
        problems = validate_refused(ws)
        p = problem(problems, code, path=GLOSSARY, field="provenance.source_file")
        assert p["evidence_id"] == "evidence:fascia-pediatrica"
        assert SECRET not in json.dumps(problems)
        # prepare refuses too: the sources added above are unsafe, the unit may be unreadable
        prepare_refused(ws)


# ---------------------------------------------------------------------------------------------
# YAML: front matter of curated files
# ---------------------------------------------------------------------------------------------

FRONT_MATTER = {
    "billion-laughs.md": "yaml_forbidden_construct",
    "alias-value.md": "yaml_forbidden_construct",
    "merge-key.md": "yaml_forbidden_construct",
    "merge-key-no-alias.md": "yaml_forbidden_construct",
    "python-object.md": "yaml_forbidden_construct",
    "python-name.md": "yaml_forbidden_construct",
    "custom-tag.md": "yaml_forbidden_construct",
    "binary-tag.md": "yaml_forbidden_construct",
    "set-tag.md": "yaml_forbidden_construct",
    "deep-nesting.md": "yaml_forbidden_construct",
    "tag-directive.md": "front_matter_malformed",
    "duplicate-keys.md": "front_matter_malformed",
    "duplicate-nested-keys.md": "front_matter_malformed",
    "tabs.md": "front_matter_malformed",
    "two-documents.md": "front_matter_malformed",
    "unterminated-quote.md": "front_matter_malformed",
    "list.md": "front_matter_malformed",
    "scalar.md": "front_matter_malformed",
    "empty.md": "front_matter_malformed",
    "unclosed.md": "front_matter_missing",
    "no-front-matter.md": "front_matter_missing",
    "indented-delimiter.md": "front_matter_missing",
    "bom.md": "encoding_invalid",
    "nul.md": "encoding_invalid",
    "latin1.md": "encoding_invalid",
}


def test_front_matter_corpus_is_complete() -> None:
    assert sorted(FRONT_MATTER) == sorted(p.name for p in (CORPUS / "front_matter").iterdir())


def _hostile_front_matter(ws: Path, name: str, data: bytes) -> str:
    rel = f"evidence/curated/glossary/{name}"
    (ws / rel).write_bytes(data)
    commit(ws)
    return rel


@pytest.mark.parametrize("name", sorted(FRONT_MATTER))
def test_hostile_front_matter_is_refused(ws: Path, scenario, use_backend, name: str) -> None:
    rel = _hostile_front_matter(ws, name, (CORPUS / "front_matter" / name).read_bytes())
    code = FRONT_MATTER[name]
    use_backend(ScriptedBackend(never_called))
    with scenario("front matter"):
        with pytest.raises(UnitFormatError) as info:
            read_curated(ws / rel, display_path=rel)
        assert (info.value.code, info.value.path) == (code, rel)
        problem(validate_refused(ws), code, path=rel)
        problem(prepare_refused(ws), code, path=rel)


GENERATED_FRONT_MATTER = {
    "deep-block-nesting": ("schema_version: 1\n" + "".join(
        "  " * i + f"k{i}:\n" for i in range(600)) + "  " * 600 + "v: 1\n",
        "yaml_forbidden_construct"),
    "deep-flow-mapping": ("schema_version: 1\ntitle: " + "{a: " * 3000 + "b" + "}" * 3000 + "\n",
                          "yaml_forbidden_construct"),
    # ruamel's scanner is quadratic in flow depth: this one would take hours unbounded
    "deep-flow-huge": ("schema_version: 1\ntitle: " + "[" * 400_000 + "\n",
                       "yaml_forbidden_construct"),
    "huge-integer": ("schema_version: " + "9" * 50_000 + "\n", "front_matter_malformed"),
    "many-nodes": ("schema_version: 1\ntitle: [" + ", ".join(["x"] * 100_001) + "]\n",
                   "yaml_forbidden_construct"),
}


@pytest.mark.parametrize(("text", "code"), list(GENERATED_FRONT_MATTER.values()),
                         ids=list(GENERATED_FRONT_MATTER))
def test_generated_hostile_front_matter(ws: Path, scenario, text: str, code: str) -> None:
    rel = _hostile_front_matter(ws, "generata.md", f"---\n{text}---\n\nTesto.\n".encode())
    with scenario("front matter"):
        problem(validate_refused(ws), code, path=rel)


def _flow_list(n: int) -> str:
    return "title: [" + ", ".join(["x"] * n) + "]\n"


def test_too_many_nodes_are_refused_by_the_libyaml_count_before_ruamel_parses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlio, "MAX_YAML_NODES", 2_000)
    monkeypatch.setattr(yamlio, "FAST_COUNT_CHARS", 1_000)
    # the mapping, its key and the sequence are nodes too: 2,001 nodes, and 2,000 (the limit)
    too_many, fits = _flow_list(1_998), _flow_list(1_997)
    refusals = []
    for fast in (True, False):  # with libyaml's count, and with ruamel's check alone
        if not fast:
            monkeypatch.setattr(yamlio, "_FAST_LOADER", None)
        with pytest.raises(UnitFormatError) as info:
            load_rt(too_many, path="curated/x.md")
        refusals.append((info.value.code, info.value.message, info.value.path))
        assert len(load_rt(fits)["title"]) == 1_997
    assert refusals[0] == refusals[1] == (
        "yaml_forbidden_construct", "YAML document is too large", "curated/x.md")

    monkeypatch.undo()
    monkeypatch.setattr(yamlio, "MAX_YAML_NODES", 2_000)
    monkeypatch.setattr(yamlio, "FAST_COUNT_CHARS", 1_000)

    def no_ruamel() -> None:
        raise AssertionError("ruamel parsed a text libyaml had counted too large")

    monkeypatch.setattr(yamlio, "_loader", no_ruamel)
    with pytest.raises(UnitFormatError, match="too large"):
        load_rt(too_many)


@pytest.mark.parametrize(("text", "code", "says"), [
    # libyaml's count passes these; ruamel's own checks still refuse them
    ("a: &x [1]\nb: *x\n" + "c: 1\n" * 5_000, "yaml_forbidden_construct", "anchors"),
    ("a: !!python/object {}\n" + "c: 1\n" * 5_000, "yaml_forbidden_construct", "tag"),
    ("c: 1\n" * 5_000 + "a: [\n", "front_matter_malformed", "line 5002"),
    # libyaml reads UTF-8: a lone surrogate cannot even reach it
    ("a: \"\udce0\"\n" + "c: 1\n" * 5_000, "front_matter_malformed", "unacceptable character"),
], ids=["anchor", "tag", "malformed", "lone-surrogate"])
def test_a_long_text_the_count_lets_through_is_still_checked_by_ruamel(
        text: str, code: str, says: str) -> None:
    assert len(text) > yamlio.FAST_COUNT_CHARS
    with pytest.raises(UnitFormatError) as info:
        load_rt(text)
    assert info.value.code == code and says in info.value.message, info.value.message


# ---------------------------------------------------------------------------------------------
# YAML: manifest.yaml and thoth.yaml
# ---------------------------------------------------------------------------------------------

WHOLE_YAML = sorted(p.name for p in (CORPUS / "yaml").iterdir())


@pytest.mark.parametrize("name", WHOLE_YAML)
def test_hostile_manifest_is_refused(ws: Path, scenario, use_backend, name: str) -> None:
    shutil.copy(CORPUS / "yaml" / name, ws / MANIFEST)
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("manifest.yaml"):
        problem(validate_refused(ws), "manifest_malformed", path=MANIFEST)
        assert MANIFEST in command_error("evidence", "prepare", str(ws), "--json")
        assert MANIFEST in command_error("evidence", "resolve", "evidence:ricovero", "--retire",
                                         "--workspace", str(ws))


@pytest.mark.parametrize("name", WHOLE_YAML)
def test_hostile_descriptor_is_refused(ws: Path, scenario, use_backend, name: str) -> None:
    shutil.copy(CORPUS / "yaml" / name, ws / "thoth.yaml")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("thoth.yaml"):
        for args in (["validate", str(ws), "--json"], ["prepare", str(ws), "--json"],
                     ["resolve", "evidence:ricovero", "--retire", "--workspace", str(ws)]):
            assert "thoth.yaml" in command_error("evidence", *args)


MANIFEST_KEYS = {
    "parent": "../thoth.yaml",
    "parent-inside": "source/../../thoth.yaml",
    "absolute": "/etc/passwd",
    "outside-source": "curated/glossary/ricovero.md",
    "control-character": "source/a\x1bb.md",
}


@pytest.mark.parametrize("key", list(MANIFEST_KEYS.values()), ids=list(MANIFEST_KEYS))
def test_manifest_with_unsafe_source_path(ws: Path, scenario, use_backend, key: str) -> None:
    data = load_rt((ws / MANIFEST).read_text(encoding="utf-8"))
    data["sources"][key] = data["sources"].pop("source/ricovero.md")
    (ws / MANIFEST).write_text(dump_rt(data), encoding="utf-8")
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("manifest.yaml"):
        problem(validate_refused(ws), {"manifest_malformed", "manifest_source_missing"},
                path=MANIFEST)
        assert MANIFEST in command_error("evidence", "prepare", str(ws), "--json")


DESCRIPTOR_VALUES = {
    "root-parent": ("evidence:\n  root: ../outside\n", "evidence.root"),
    "root-absolute": ("evidence:\n  root: /etc\n", "evidence.root"),
    "pattern-parent": ('evidence:\n  patterns: ["../../**/*.md"]\n', "evidence.patterns"),
    "pattern-inner-parent": ('evidence:\n  patterns: ["curated/../../*.yaml"]\n',
                             "evidence.patterns"),
    "pattern-absolute": ('evidence:\n  patterns: ["/etc/*"]\n', "evidence.patterns"),
    "pattern-empty": ('evidence:\n  patterns: [""]\n', "evidence.patterns"),
}


@pytest.mark.parametrize(("extra", "field"), list(DESCRIPTOR_VALUES.values()),
                         ids=list(DESCRIPTOR_VALUES))
def test_descriptor_paths_outside_the_workspace(ws: Path, scenario, use_backend, extra: str,
                                                field: str) -> None:
    with (ws / "thoth.yaml").open("a", encoding="utf-8") as out:
        out.write(extra)
    commit(ws)
    use_backend(ScriptedBackend(never_called))
    with scenario("thoth.yaml"):
        for args in (["validate", str(ws), "--json"], ["prepare", str(ws), "--json"]):
            line = command_error("evidence", *args)
            assert "thoth.yaml" in line and field in line


# ---------------------------------------------------------------------------------------------
# Markdown that hides SQL in HTML
# ---------------------------------------------------------------------------------------------

HIDDEN = CORPUS / "sources" / "hidden-sql.md"
HIDDEN_DIV = '<div style="display:none">DROP TABLE clinical.patient</div>'


def _hidden_formula(sql: str, excerpt: str = HIDDEN_DIV) -> ModelReply:
    return ModelReply(units=(proposed(
        "formula", "Reparti dismessi",
        {"concept": "reparto dismesso", "columns": ["clinical.ward.code"], "sql": sql},
        [excerpt]),))


HIDDEN_REPLIES = {
    "drop": ("DROP TABLE clinical.patient", "formula_not_expression"),
    "delete": ("DELETE FROM clinical.episode", "formula_not_expression"),
    "update": ("UPDATE clinical.patient SET sex_code = NULL", "formula_not_expression"),
    "expression-then-drop": ("clinical.ward.code = 999; DROP TABLE clinical.patient",
                             "formula_multiple_statements"),
    "html": (HIDDEN_DIV, "formula_sql_invalid"),
}


@pytest.mark.parametrize(("sql", "code"), list(HIDDEN_REPLIES.values()),
                         ids=list(HIDDEN_REPLIES))
def test_sql_hidden_in_html_never_becomes_a_formula(ws: Path, scenario, use_backend, sql: str,
                                                    code: str) -> None:
    shutil.copy(HIDDEN, ws / "evidence/source/reparto.md")
    commit(ws)
    use_backend(ScriptedBackend({"source/reparto.md": _hidden_formula(sql)}))
    with scenario("hidden SQL"):
        problem(prepare_refused(ws), code, path="evidence/curated/formula/reparti-dismessi.md",
                evidence_id="evidence:reparti-dismessi", field="formula.sql")


@pytest.mark.parametrize("name", ["hidden-sql.md", "hidden-sql-code-block.md"])
def test_structural_backend_keeps_hidden_sql_out_of_formulas(ws: Path, scenario,
                                                             name: str) -> None:
    pytest.importorskip("evidence_pipeline.authoring.backends.structural")
    shutil.copy(CORPUS / "sources" / name, ws / "evidence/source/reparto.md")
    commit(ws)
    with scenario("hidden SQL", writes_allowed=True):
        r = tht("evidence", "prepare", str(ws), "--backend", "structural", "--json")
        if r.exit_code == 0:
            doc = json.loads(r.stdout)
            for rel in doc["written"]:
                if not rel.startswith("evidence/curated/"):
                    continue
                unit = read_curated(ws / rel).unit()
                if unit.kind.value == "formula":
                    upper = unit.formula.sql.upper()  # type: ignore[attr-defined]
                    assert not any(w in upper for w in ("DROP", "DELETE", "UPDATE")), rel
            # hidden SQL may be quoted in a unit's text, but never unreviewed: it blocks
            assert json.loads(tht("evidence", "validate", str(ws), "--json").stdout)[
                "status"] == "blocked"
        else:
            assert r.exit_code == 1 and json.loads(r.stdout)["problems"]
    # whatever was proposed, nothing that existed was touched: only new files, or none
    assert OUTCOMES[-1].bytes_lost == 0


# ---------------------------------------------------------------------------------------------
# Model replies: unknown ids, other sources, fabricated and near-miss excerpts
# ---------------------------------------------------------------------------------------------

MODEL_REPLIES: dict[str, tuple[Answer, str, dict[str, Any]]] = {
    "raw-unknown-id": (raw_reply(raw_unit(id="evidence:inventato")), "model_unknown_id",
                       {"evidence_id": "evidence:inventato"}),
    "raw-other-source-id": (raw_reply(raw_unit(id="evidence:ricovero")), "model_unknown_id",
                            {"evidence_id": "evidence:ricovero"}),
    "raw-traversal-id": (raw_reply(raw_unit(id="evidence:../../thoth")), "model_unknown_id", {}),
    "raw-unknown-retirement": (raw_reply(raw_unit(id="evidence:fascia-pediatrica"), retire=[
        {"id": "evidence:ricovero", "message": "non più sostenuta"}]), "model_unknown_id",
        {"evidence_id": "evidence:ricovero"}),
    "raw-other-source-file": (raw_reply(raw_unit(source_file="source/ricovero.md")),
                              "model_invalid_output", {}),
    "raw-absolute-source-file": (raw_reply(raw_unit(source_file="/etc/passwd")),
                                 "model_invalid_output", {}),
    "raw-provenance-smuggled": (raw_reply(raw_unit(provenance={
        "source_file": "source/ricovero.md"})), "model_invalid_output", {}),
    "raw-duplicate-id": (raw_reply(raw_unit(id="evidence:fascia-pediatrica"),
                                   raw_unit(id="evidence:fascia-pediatrica")),
                         "model_invalid_output", {}),
    "raw-not-json": ("Ecco le unità: DROP TABLE clinical.patient", "model_malformed_json", {}),
    "direct-unknown-id": (ModelReply(units=(glossary_unit(uid="evidence:inventato"),)),
                          "model_unknown_id", {"evidence_id": "evidence:inventato"}),
    "direct-other-source-id": (ModelReply(units=(glossary_unit(uid="evidence:ricovero"),)),
                               "model_unknown_id", {"evidence_id": "evidence:ricovero"}),
    "direct-unknown-retirement": (ModelReply(
        units=(glossary_unit(),), retirement_candidates=(
            RetirementProposal("evidence:ricovero", "non più sostenuta"),)),
        "model_unknown_id", {"evidence_id": "evidence:ricovero"}),
    "direct-other-source-file": (ModelReply(units=(glossary_unit(
        source_file="source/ricovero.md"),)), "model_invalid_output", {}),
    "direct-provenance-smuggled": (ModelReply(units=(glossary_unit(provenance={
        "source_file": "../thoth.yaml", "source_sha256": "sha256:" + "0" * 64,
        "supporting_excerpts": [EXCERPT]}),)), "model_invalid_output", {}),
    "fabricated-excerpt": (ModelReply(units=(glossary_unit(
        "I pazienti pediatrici hanno sempre meno di 16 anni."),)), "excerpt_not_found",
        {"field": "provenance.supporting_excerpts[0]"}),
    "excerpt-from-other-source": (ModelReply(units=(glossary_unit(RICOVERO_EXCERPT),)),
                                  "excerpt_not_found",
                                  {"field": "provenance.supporting_excerpts[0]"}),
}


@pytest.mark.parametrize(("answer", "code", "where"), list(MODEL_REPLIES.values()),
                         ids=list(MODEL_REPLIES))
def test_hostile_model_reply_is_refused(ws: Path, scenario, use_backend, answer: Answer,
                                        code: str, where: dict[str, Any]) -> None:
    touch_source(ws)
    backend = ScriptedBackend({"source/paziente.md": answer})
    use_backend(backend)
    with scenario("model reply"):
        problem(prepare_refused(ws), code, **where)
        assert [c.source_file for c in backend.calls] == ["source/paziente.md"]


# Near misses: each differs from the source by one character (or one missing space) that the
# mechanical normalization (spec §5.2) does not touch. By design, line breaks, runs of spaces,
# no-break and other Unicode spaces, and combining accents (NFC) are NOT differences: an
# excerpt re-wrapped or re-spaced is the same quote (see test_rewrapped_excerpts_are_accepted).
NEAR_MISSES = {
    "cyrillic-a": EXCERPT.replace("pazienti", "p\u0430zienti"),
    "greek-omicron": EXCERPT.replace("con", "c\u03bfn"),
    "zero-width-space": EXCERPT.replace("pediatrica", "pedia\u200btrica"),
    "zero-width-joiner": EXCERPT.replace("fascia", "fas\u200dcia"),
    "soft-hyphen": EXCERPT.replace("inferiore", "infe\u00adriore"),
    "missing-space": EXCERPT.replace("fascia pediatrica", "fasciapediatrica"),
    "fullwidth-digits": EXCERPT.replace("18", "\uff11\uff18"),
    "typographic-apostrophe": AGE_EXCERPT.replace("L'età", "L\u2019età"),
    "one-letter-changed": EXCERPT.replace("18", "16"),
    "bidi-override": EXCERPT.replace("anni", "\u202einna\u202c"),
}


@pytest.mark.parametrize("excerpt", list(NEAR_MISSES.values()), ids=list(NEAR_MISSES))
def test_near_miss_excerpt_from_the_model(ws: Path, scenario, use_backend,
                                          excerpt: str) -> None:
    touch_source(ws)
    use_backend(ScriptedBackend({"source/paziente.md": ModelReply(
        units=(glossary_unit(excerpt),))}))
    with scenario("near-miss excerpt"):
        problem(prepare_refused(ws), "excerpt_not_found", path=GLOSSARY,
                evidence_id="evidence:fascia-pediatrica",
                field="provenance.supporting_excerpts[0]")


@pytest.mark.parametrize("excerpt", list(NEAR_MISSES.values()), ids=list(NEAR_MISSES))
def test_near_miss_excerpt_in_a_curated_file(ws: Path, scenario, excerpt: str) -> None:
    edit_front(ws, GLOSSARY, lambda d: d["provenance"]["supporting_excerpts"].__setitem__(
        0, excerpt))
    with scenario("near-miss excerpt"):
        problem(validate_refused(ws), "excerpt_not_found", path=GLOSSARY,
                evidence_id="evidence:fascia-pediatrica",
                field="provenance.supporting_excerpts[0]")


REWRAPPED = {
    "line-break": EXCERPT.replace("si intendono ", "si intendono\n"),
    "crlf": EXCERPT.replace("si intendono ", "si intendono\r\n"),
    "double-spaces": EXCERPT.replace(" ", "  "),
    "tab": EXCERPT.replace("con età", "con\tetà"),
    "no-break-space": EXCERPT.replace("a 18", "a\u00a018"),
    "decomposed-accent": EXCERPT.replace("età", "eta\u0300"),
    "outer-whitespace": f"  \n{EXCERPT}\n ",
}


@pytest.mark.parametrize("excerpt", list(REWRAPPED.values()), ids=list(REWRAPPED))
def test_rewrapped_excerpts_are_accepted(ws: Path, excerpt: str) -> None:
    """Whitespace runs, line re-wrapping and NFC are equal after the normalization, by design."""
    edit_front(ws, GLOSSARY, lambda d: d["provenance"]["supporting_excerpts"].__setitem__(
        0, excerpt))
    assert validate_workspace(ws).problems == []


# ---------------------------------------------------------------------------------------------
# Units citing two sources
# ---------------------------------------------------------------------------------------------


def _cite_other_source(ws: Path) -> tuple[str, dict[str, Any]]:
    sha = load_rt((ws / MANIFEST).read_text(encoding="utf-8"))["sources"][
        "source/ricovero.md"]["sha256"]

    def mutate(d: Any) -> None:
        d["provenance"]["source_file"] = "source/ricovero.md"
        d["provenance"]["source_sha256"] = sha

    edit_front(ws, GLOSSARY, mutate)
    return "manifest_source_mismatch", {"path": GLOSSARY, "field": "provenance.source_file"}


def _listed_under_both(ws: Path) -> tuple[str, dict[str, Any]]:
    data = load_rt((ws / MANIFEST).read_text(encoding="utf-8"))
    data["sources"]["source/ricovero.md"]["units"].append("evidence:fascia-pediatrica")
    (ws / MANIFEST).write_text(dump_rt(data), encoding="utf-8")
    commit(ws)
    return "unit_in_several_sources", {"path": MANIFEST,
                                       "evidence_id": "evidence:fascia-pediatrica"}


def _excerpt_of_other_source(ws: Path) -> tuple[str, dict[str, Any]]:
    edit_front(ws, GLOSSARY, lambda d: d["provenance"]["supporting_excerpts"].append(
        RICOVERO_EXCERPT))
    return "excerpt_not_found", {"path": GLOSSARY, "field": "provenance.supporting_excerpts[1]"}


@pytest.mark.parametrize("make", [_cite_other_source, _listed_under_both,
                                  _excerpt_of_other_source],
                         ids=lambda f: f.__name__.lstrip("_"))
def test_unit_citing_two_sources_is_refused(ws: Path, scenario, make) -> None:
    code, where = make(ws)
    with scenario("two sources"):
        problem(validate_refused(ws), code, **where)


def test_model_unit_merging_two_sources_is_refused(ws: Path, scenario, use_backend) -> None:
    touch_source(ws)
    use_backend(ScriptedBackend({"source/paziente.md": ModelReply(units=(proposed(
        "glossary", "Fascia e ricovero",
        {"term": "fascia pediatrica", "definition": "Fusione di due note.", "synonyms": []},
        [EXCERPT, RICOVERO_EXCERPT]),))}))
    with scenario("two sources"):
        problem(prepare_refused(ws), "excerpt_not_found",
                field="provenance.supporting_excerpts[1]")


# ---------------------------------------------------------------------------------------------
# DDL / DML / several statements in a formula (and in an example)
# ---------------------------------------------------------------------------------------------

BAD_FORMULAS = {
    "drop": "DROP TABLE clinical.patient",
    "delete": "DELETE FROM clinical.patient",
    "update": "UPDATE clinical.patient SET birth_date = NULL",
    "insert": "INSERT INTO clinical.patient (birth_date) VALUES (now())",
    "truncate": "TRUNCATE clinical.patient",
    "create": "CREATE TABLE evil (a int)",
    "alter": "ALTER TABLE clinical.patient DROP COLUMN birth_date",
    "grant": "GRANT ALL ON clinical.patient TO public",
    "merge": "MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN DELETE",
    "copy": "COPY clinical.patient TO '/tmp/pazienti.csv'",
    "set": "SET search_path = evil",
    "do-block": "DO $$ BEGIN DELETE FROM clinical.patient; END $$",
    "call": "CALL purge()",
    "select": "SELECT age(birth_date) FROM clinical.patient",
    "with": "WITH p AS (SELECT 1) SELECT * FROM p",
    "scalar-subquery": "(SELECT max(birth_date) FROM clinical.patient)",
    "exists": "EXISTS (SELECT 1 FROM clinical.patient)",
    "two-statements": "age(birth_date); DROP TABLE clinical.patient",
    "two-expressions": "age(birth_date); age(birth_date)",
    "drop-then-expression": "DROP TABLE x; age(birth_date)",
    "alias": "age(birth_date) AS eta",
    "unparsable": "CASE WHEN age(birth_date) < 18 THEN",
    "transaction": "BEGIN",
}


@pytest.mark.parametrize("sql", list(BAD_FORMULAS.values()), ids=list(BAD_FORMULAS))
def test_formula_that_is_not_one_expression(ws: Path, scenario, use_backend, sql: str) -> None:
    codes = {"formula_not_expression", "formula_multiple_statements", "formula_sql_invalid"}
    edit_front(ws, FORMULA, lambda d: d["formula"].__setitem__("sql", sql))
    use_backend(ScriptedBackend(never_called))
    with scenario("formula SQL"):
        problem(validate_refused(ws), codes, path=FORMULA, evidence_id="evidence:eta-del-paziente",
                field="formula.sql")
    git(ws, "reset", "-q", "--hard", "HEAD~1")
    touch_source(ws)
    use_backend(ScriptedBackend({"source/paziente.md": ModelReply(units=(formula_unit(sql),))}))
    with scenario("formula SQL"):
        problem(prepare_refused(ws), codes, path=FORMULA, evidence_id="evidence:eta-del-paziente",
                field="formula.sql")


BAD_EXAMPLES = {
    "select-into": "SELECT * INTO evil FROM clinical.patient",
    "two-statements": "SELECT 1; DROP TABLE clinical.patient",
    "data-modifying-cte": "WITH d AS (DELETE FROM clinical.patient RETURNING *) SELECT * FROM d",
    "delete": "DELETE FROM clinical.patient",
    "create-table-as": "CREATE TABLE evil AS SELECT * FROM clinical.patient",
}


@pytest.mark.parametrize("sql", list(BAD_EXAMPLES.values()), ids=list(BAD_EXAMPLES))
def test_example_sql_that_modifies_data(ws: Path, scenario, sql: str) -> None:
    edit_front(ws, EXAMPLE, lambda d: d["example"].__setitem__("sql", sql))
    with scenario("example SQL"):
        problem(validate_refused(ws), "example_sql_invalid", path=EXAMPLE, field="example.sql")


# ---------------------------------------------------------------------------------------------
# Credentials in every common shape, in front-matter fields and in the body
# ---------------------------------------------------------------------------------------------

CREDENTIALS = {
    "postgres-url": "postgresql://etl_user:S3gret0!@dwh.ospedale.local:5432/psd",
    "mysql-url": "mysql://root:hunter22@db.local/app",
    "mongodb-srv": "mongodb+srv://admin:pa55word@cluster0.example.net/db",
    "redis-no-user": "redis://:s3cretpass@cache.local:6379/0",
    "jdbc-password": "jdbc:postgresql://dwh/psd?user=etl&password=S3gret0",
    "odbc-pwd": "Server=dwh;Uid=etl;Pwd=S3gret0;",
    "libpq-keywords": "host=dwh user=etl password=S3gret0 dbname=psd",
    "password-colon": 'password: "S3gret0!"',
    "env-password": "POSTGRES_PASSWORD=S3gret0x",
    "env-db-password": "DB_PASSWORD: S3gret0x",
    "parola-chiave": "parola chiave: S3gret0x",
    "api-key": "api_key = 'abcd1234efgh5678ijkl'",
    "x-api-key-header": "X-API-Key: abcd1234efgh5678ijkl",
    "env-token": "GITHUB_TOKEN=abcdefghijklmnopqrstuv",
    "client-secret": "client_secret=Zx9Yw8Vu7Ts6Rq5P",
    "aws-access-key-id": "AKIAIOSFODNN7EXAMPLE",
    "aws-secret-access-key": "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github-classic": "ghp_" + "A1b2C3d4E5" * 4,
    "github-fine-grained": "github_pat_11ABCDEFG0" + "a1B2c3D4e5" * 6,
    "slack-bot": "xoxb-1234567890-0987654321-abcdefghijklmnop",
    "slack-webhook": "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "openai": "sk-proj-" + "a1B2c3D4e5" * 3,
    "stripe": "sk_live_" + "a1B2c3D4e5" * 3,
    "google": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
           "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456",
    "basic-auth": "Authorization: Basic ZXRsOlMzZ3JldDA=",
    "rsa-private-key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEow==\n-----END RSA PRIVATE KEY-----",
    "pkcs8-private-key": "-----BEGIN PRIVATE KEY-----\nMIIEvQ==\n-----END PRIVATE KEY-----",
    "openssh-private-key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbg==\n"
                           "-----END OPENSSH PRIVATE KEY-----",
    "encrypted-private-key": "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIF==\n"
                             "-----END ENCRYPTED PRIVATE KEY-----",
    "pgp-private-key": "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQdG==\n"
                       "-----END PGP PRIVATE KEY BLOCK-----",
}

# Look-alikes of credentials that ordinary clinical notes contain and that must stay legal.
NOT_CREDENTIALS = [
    "La colonna clinical.user.password_hash conserva solo l'hash.",
    "Il token BM25 è una parola del testo.",
    "Le informazioni di base (basic information) sono nel foglio.",
    "Vedi https://example.org/linee-guida per i dettagli.",
    "Il campo max_tokens: 4000 limita la risposta.",
    "Il codice AKIA non è un prefisso di reparto.",
]


# Every shape in a front-matter field and in the body; a sample of shapes in the two places a
# scan of field values alone would miss (a mapping key, a YAML comment).
HIDDEN_PLACES = ["postgres-url", "env-password", "aws-access-key-id", "github-classic", "jwt",
                 "rsa-private-key"]
CREDENTIAL_PLACES = [
    *((s, w) for w in ("front-matter", "body") for s in CREDENTIALS),
    *((s, w) for w in ("enum-code", "yaml-comment") for s in HIDDEN_PLACES),
]


@pytest.mark.parametrize(("secret", "where"), [(CREDENTIALS[s], w) for s, w in CREDENTIAL_PLACES],
                         ids=[f"{w}-{s}" for s, w in CREDENTIAL_PLACES])
def test_credential_in_a_curated_file(ws: Path, scenario, secret: str, where: str) -> None:
    if where == "front-matter":
        edit_front(ws, GLOSSARY, lambda d: d["glossary"].__setitem__(
            "definition", f"Pazienti minorenni. {secret}"))
        rel, field = GLOSSARY, "glossary.definition"
    elif where == "body":
        edit_front(ws, GLOSSARY, lambda d: None, body=f"\n# Fascia\n\nConnessione: {secret}\n")
        rel, field = GLOSSARY, "body"
    elif where == "enum-code":
        edit_front(ws, ENUM, lambda d: d["enum"]["values"].__setitem__(
            secret.replace("\n", " "), "valore"))
        rel, field = ENUM, "enum.values"
    else:
        f = ws / GLOSSARY
        text = f.read_text(encoding="utf-8")
        comment = "".join(f"# {line}\n" for line in secret.splitlines())
        f.write_text(text.replace("---\n", "---\n" + comment, 1), encoding="utf-8")
        commit(ws)
        rel, field = GLOSSARY, None
    with scenario("credentials"):
        problems = validate_refused(ws)
        p = problem(problems, "credentials_found", path=rel)
        if field is not None:
            assert p["field"].startswith(field), p
        assert secret.splitlines()[0] not in json.dumps(problems, ensure_ascii=False)


@pytest.mark.parametrize("secret", list(CREDENTIALS.values()), ids=list(CREDENTIALS))
def test_credential_in_a_model_reply(ws: Path, scenario, use_backend, secret: str) -> None:
    touch_source(ws)
    use_backend(ScriptedBackend({"source/paziente.md": ModelReply(units=(glossary_unit(
        definition=f"Pazienti minorenni. {secret}", body=f"Connessione: {secret}"),))}))
    with scenario("credentials"):
        problems = prepare_refused(ws)
        problem(problems, "credentials_found", path=GLOSSARY, field="glossary.definition")
        problem(problems, "credentials_found", path=GLOSSARY, field="body")


@pytest.mark.parametrize("text", NOT_CREDENTIALS)
def test_ordinary_text_is_not_a_credential(ws: Path, text: str) -> None:
    edit_front(ws, GLOSSARY, lambda d: None, body=f"\n# Fascia\n\n{text}\n")
    assert validate_workspace(ws).problems == []


# ---------------------------------------------------------------------------------------------
# URLs of reference units
# ---------------------------------------------------------------------------------------------

BAD_URLS = {
    "javascript": "javascript:alert(document.cookie)",
    "javascript-mixed-case": "JaVaScRiPt:alert(1)",
    "javascript-slashes": "javascript://example.org/%0aalert(1)",
    "javascript-tab": "java\tscript:alert(1)",
    "javascript-newline": "java\nscript:alert(1)",
    "javascript-leading-space": " javascript:alert(1)",
    "file": "file:///etc/passwd",
    "file-host": "file://dwh.ospedale.local/share/pazienti.csv",
    "data": "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "vbscript": "vbscript:msgbox(1)",
    "ftp": "ftp://example.org/dump.sql",
    "no-scheme": "//evil.example/x",
    "relative": "../../thoth.yaml",
    "no-host": "http:///etc/passwd",
    "nul": "https://example.org/\x00",
    "credentials-in-url": "https://admin:hunter22@example.org/",
}


@pytest.mark.parametrize("url", list(BAD_URLS.values()), ids=list(BAD_URLS))
def test_reference_url_with_a_bad_scheme(ws: Path, scenario, use_backend, url: str) -> None:
    codes = {"url_invalid", "credentials_found"}
    if "\x00" not in url:  # a NUL cannot even be written into a curated file (encoding check)
        edit_front(ws, REFERENCE, lambda d: d["reference"].__setitem__("url", url))
        with scenario("reference URL"):
            problem(validate_refused(ws), codes, path=REFERENCE,
                    evidence_id="evidence:linee-guida", field="reference.url")
        git(ws, "reset", "-q", "--hard", "HEAD~1")
    touch_source(ws)
    use_backend(ScriptedBackend({"source/paziente.md": ModelReply(units=(reference_unit(url),))}))
    with scenario("reference URL"):
        problem(prepare_refused(ws), codes, path=REFERENCE, evidence_id="evidence:linee-guida",
                field="reference.url")


# ---------------------------------------------------------------------------------------------
# The local state directory (issue 14, items 8 and 12): unwritable, or untracked in Git
# ---------------------------------------------------------------------------------------------


@contextmanager
def unwritable(directory: Path) -> Iterator[str]:
    """Make ``directory`` really unwritable for this process, or skip; yields how.

    Permission bits bind an ordinary user (``chmod 0555``) but not root, who ignores them: as
    root the directory gets the immutable attribute instead (``chattr +i``), which binds root
    too. Where neither works (no CAP_LINUX_IMMUTABLE, a file system without the attribute) the
    test is skipped; either way creating a file there is tried first and must fail.
    """
    if os.geteuid() != 0:
        directory.chmod(0o555)
        how, undo = "chmod 0555", functools.partial(directory.chmod, 0o755)
    else:
        chattr = shutil.which("chattr")
        if chattr is None or subprocess.run([chattr, "+i", str(directory)],
                                            capture_output=True).returncode != 0:
            pytest.skip("running as root, which ignores chmod, and chattr +i is not available")
        how = "chattr +i"
        undo = functools.partial(subprocess.run, [chattr, "-i", str(directory)], check=True)
    try:
        probe = directory / "probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip(f"{how} did not make {directory} read-only for this process")
        yield how
    finally:
        undo()


STATE_COMMANDS = {
    "prepare": ("evidence", "prepare"),
    "preprocess": ("workspace", "preprocess", "evidence"),
}


def _state_read_only(ws: Path) -> contextlib.AbstractContextManager[str]:
    (ws / ".tht").mkdir()
    return unwritable(ws / ".tht")


def _state_read_only_ignored(ws: Path) -> contextlib.AbstractContextManager[str]:
    """Made by this version (its .gitignore is there), later made read-only."""
    (ws / ".tht").mkdir()
    (ws / ".tht" / ".gitignore").write_text("*\n", encoding="utf-8")
    return unwritable(ws / ".tht")


def _state_is_a_file(ws: Path) -> contextlib.AbstractContextManager[str]:
    (ws / ".tht").write_text("not a directory\n", encoding="utf-8")
    with (ws / ".git" / "info" / "exclude").open("a", encoding="utf-8") as f:
        f.write(".tht\n")  # the template ignores the directory .tht/, not a file
    return contextlib.nullcontext("a file")


@pytest.mark.parametrize("make", [_state_read_only, _state_read_only_ignored, _state_is_a_file],
                         ids=["read-only", "read-only-with-gitignore", "a-file"])
@pytest.mark.parametrize("command", list(STATE_COMMANDS))
def test_unwritable_state_directory_is_one_clear_error(ws: Path, scenario, use_backend,
                                                       command: str, make) -> None:
    """Exit 2 and one line naming the path, with and without --json; no traceback."""
    use_backend(ScriptedBackend(never_called))
    args = (*STATE_COMMANDS[command], str(ws))
    shutil.rmtree(ws / ".tht")  # each case makes its own
    with make(ws), scenario("state directory"):
        for extra in ((), ("--json",)):
            line = command_error(*args, *extra)
            assert str(ws / ".tht") in line, line


def test_state_directory_ignores_itself(ws: Path, scenario, use_backend) -> None:
    """Without a .gitignore in the workspace, the state never shows as an uncommitted change:
    activate and prepare --upgrade, which need a clean tree, run after prepare."""
    (ws / ".gitignore").unlink()
    commit(ws, "no .gitignore")
    use_backend(ScriptedBackend(first_replies()))
    with scenario("state directory", writes_allowed=True):
        r = tht("evidence", "prepare", str(ws), "--json")
        assert r.exit_code == 0, r.output
        assert (ws / ".tht" / ".gitignore").read_text(encoding="utf-8").splitlines()[-1] == "*"
        assert git_status(ws) == ""
        r = tht("workspace", "activate", str(ws), "--json")
        assert r.exit_code == 0, r.output
        r = tht("evidence", "prepare", str(ws), "--upgrade", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["status"] in {"applied", "unchanged"}, r.stdout


def test_state_directory_elsewhere_ignores_itself(ws: Path, scenario, monkeypatch) -> None:
    """THT_STATE_DIR inside the workspace (a new directory) ignores itself too; an existing
    directory that THT_STATE_DIR names gets no .gitignore (its files are not ours)."""
    (ws / ".gitignore").unlink()
    commit(ws, "no .gitignore")
    monkeypatch.setenv("THT_STATE_DIR", str(ws / "stato" / "locale"))
    with scenario("state directory", writes_allowed=True):
        for _ in range(2):  # the second one needs a clean tree after the first
            r = tht("workspace", "activate", str(ws), "--json")
            assert r.exit_code == 0, r.output
        assert git_status(ws) == ""
        assert (ws / "stato" / "locale" / ".gitignore").is_file()
    theirs = ws.parent / "theirs"
    theirs.mkdir()
    monkeypatch.setenv("THT_STATE_DIR", str(theirs))
    assert tht("workspace", "activate", str(ws), "--json").exit_code == 0
    assert not (theirs / ".gitignore").exists()
    assert (theirs / "registry.sqlite3").is_file()


# ---------------------------------------------------------------------------------------------
# The model boundary (issue 14, items 9 and 11): a wall-clock deadline, and text that is text
# ---------------------------------------------------------------------------------------------

DEADLINE_S = 1.0
MARGIN_S = 3.0  # prepare's own work around the call (intake, planning), on a loaded machine
DRIP_S = 0.1  # one byte every 0.1 s: the ~700-byte answer would take over a minute


@pytest.fixture
def openai_endpoint() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def fake_pi(tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Callable[..., PiBackend]:
    """A Pi backend that runs tests/fakes/fake_pi.py, scripted by keyword arguments. Its files
    live outside the scenario's snapshot."""
    home = tmp_path_factory.mktemp("fake-pi")
    command = home / "pi"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_PI}" "$@"\n',
                       encoding="utf-8")
    command.chmod(0o755)
    monkeypatch.setenv("FAKE_PI_SCRIPT", str(home / "script.json"))
    monkeypatch.setenv("FAKE_PI_RECORD", str(home / "record.json"))

    def backend(*, timeout_s: float = 30, **script: Any) -> PiBackend:
        (home / "script.json").write_text(json.dumps(script), encoding="utf-8")
        return PiBackend(PiSettings(command=str(command), timeout_s=timeout_s))

    return backend


def completion(content: str) -> bytes:
    """The body of a chat completion whose message content is ``content`` (UTF-8, unescaped)."""
    return json.dumps({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                       "model": "fake", "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": content}}]},
                      ensure_ascii=False).encode("utf-8")


def refused_in_time(ws: Path, code: str) -> float:
    """prepare refused with ``code`` for the touched source; the seconds it took."""
    started = time.monotonic()
    problems = prepare_refused(ws)
    elapsed = time.monotonic() - started
    problem(problems, code)
    return elapsed


def test_openai_endpoint_dripping_its_answer_hits_the_deadline(ws: Path, scenario, use_backend,
                                                               openai_endpoint) -> None:
    touch_source(ws)
    openai_endpoint.add(raw_body=completion(raw_reply(raw_unit())), drip_s=DRIP_S)
    use_backend(OpenAIBackend(base_url=openai_endpoint.url, model="m", timeout_s=DEADLINE_S))
    with scenario("model deadline"):
        elapsed = refused_in_time(ws, "model_timeout")
    assert elapsed < DEADLINE_S + MARGIN_S, elapsed


def test_pi_dripping_its_output_hits_the_deadline(ws: Path, scenario, use_backend,
                                                  fake_pi) -> None:
    touch_source(ws)
    use_backend(fake_pi(mode="drip", stdout=raw_reply(raw_unit()), drip_s=DRIP_S,
                        timeout_s=DEADLINE_S))
    with scenario("model deadline"):
        elapsed = refused_in_time(ws, "model_timeout")
    assert elapsed < DEADLINE_S + MARGIN_S, elapsed


MARK = "Età inferiore a 18 anni."
# what reaches us for the unit's body: bytes that are not UTF-8, a replacement character that a
# server or Pi put in their place, a JSON escape of a lone surrogate
BAD_TEXT: dict[str, Callable[[bytes], bytes]] = {
    "invalid-utf8": lambda raw: raw.replace(b"inferiore", b"inferi\xf2re"),
    "truncated-sequence": lambda raw: raw.replace(MARK.encode(), b"Et\xc3 inferiore a 18 anni."),
    "replacement-character": lambda raw: raw.replace("Età".encode(), "Et\ufffd".encode()),
    "lone-surrogate-escape": lambda raw: raw.replace("Età".encode(), b"Et\\\\udce0"),
}


def marked_reply() -> str:
    """A valid raw reply holding MARK in a field and the body, as UTF-8 (not JSON escapes)."""
    unit = raw_unit(body=MARK, glossary={"term": "fascia pediatrica", "definition": MARK})
    return json.dumps({"units": [unit], "retirement_candidates": []}, ensure_ascii=False)


@pytest.mark.parametrize("damage", list(BAD_TEXT.values()), ids=list(BAD_TEXT))
def test_openai_reply_that_is_not_utf8_is_refused(ws: Path, scenario, use_backend,
                                                  openai_endpoint, damage) -> None:
    touch_source(ws)
    body = completion(marked_reply())
    bad = damage(body)
    assert bad != body
    openai_endpoint.add(raw_body=bad)
    use_backend(OpenAIBackend(base_url=openai_endpoint.url, model="m", timeout_s=10))
    with scenario("model reply text"):
        refused_in_time(ws, "model_invalid_output")


@pytest.mark.parametrize("damage", list(BAD_TEXT.values()), ids=list(BAD_TEXT))
def test_pi_reply_that_is_not_utf8_is_refused(ws: Path, scenario, use_backend, fake_pi,
                                              damage) -> None:
    touch_source(ws)
    raw = marked_reply().encode("utf-8")
    # in pi's stdout the reply is the JSON itself: one backslash less than inside a completion
    bad = damage(raw).replace(b"\\\\udce0", b"\\udce0")
    assert bad != raw
    use_backend(fake_pi(mode="reply", stdout_hex=bad.hex()))
    with scenario("model reply text"):
        refused_in_time(ws, "model_invalid_output")


@pytest.mark.parametrize("backend", ["openai", "pi"])
def test_an_answer_over_the_size_bound_is_refused(ws: Path, scenario, use_backend,
                                                  openai_endpoint, fake_pi,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  backend: str) -> None:
    touch_source(ws)
    monkeypatch.setattr(reply_text, "MAX_REPLY_BYTES", 300)  # both backends read this bound
    assert len(marked_reply().encode("utf-8")) > 300
    if backend == "openai":
        openai_endpoint.add(raw_body=completion(marked_reply()))
        use_backend(OpenAIBackend(base_url=openai_endpoint.url, model="m", timeout_s=10))
        says = "the endpoint answered more than 300 bytes"
    else:
        use_backend(fake_pi(mode="reply", stdout=marked_reply()))
        says = "pi wrote more than 300 bytes"
    with scenario("model reply size"):
        found = problem(prepare_refused(ws), "model_invalid_output")
    assert says in found["message"], found


def test_intact_reply_is_accepted_by_both_backends(ws: Path, use_backend, openai_endpoint,
                                                   fake_pi) -> None:
    """The replies above differ from this one only by the damage: it is written as sent."""
    touch_source(ws)
    openai_endpoint.add(raw_body=completion(marked_reply()))
    for backend in (OpenAIBackend(base_url=openai_endpoint.url, model="m", timeout_s=10),
                    fake_pi(mode="reply", stdout=marked_reply())):
        use_backend(backend)
        r = tht("evidence", "prepare", str(ws), "--json")
        assert r.exit_code == 0, r.output
        written = [ws / rel for rel in json.loads(r.stdout)["written"]]
        assert any(MARK in f.read_text(encoding="utf-8") for f in written), written
        git(ws, "reset", "-q", "--hard")
        git(ws, "clean", "-q", "-fd")


# ---------------------------------------------------------------------------------------------
# Supporting excerpts too short to check (issue 14, item 11)
# ---------------------------------------------------------------------------------------------

# each is in the source, and locates nothing
SHORT_EXCERPTS = {"one-character": "8", "one-word": "anni", "two-words": "18 anni",
                  "punctuation": " . "}


@pytest.mark.parametrize("where", ["model-reply", "curated-file"])
@pytest.mark.parametrize("excerpt", list(SHORT_EXCERPTS.values()), ids=list(SHORT_EXCERPTS))
def test_short_excerpt_is_refused(ws: Path, scenario, use_backend, excerpt: str,
                                  where: str) -> None:
    """prepare (the model's reply) and validate (a curated file) apply the same minimum."""
    if where == "model-reply":
        touch_source(ws)
        use_backend(ScriptedBackend({"source/paziente.md": ModelReply(
            units=(glossary_unit(excerpt),))}))
        refused = prepare_refused
    else:
        edit_front(ws, GLOSSARY, lambda d: d["provenance"]["supporting_excerpts"].__setitem__(
            0, excerpt))
        refused = validate_refused
    with scenario("short excerpt"):
        problem(refused(ws), "excerpt_too_short", path=GLOSSARY,
                evidence_id="evidence:fascia-pediatrica",
                field="provenance.supporting_excerpts[0]")


def test_short_whole_line_is_a_checkable_excerpt(ws: Path, use_backend) -> None:
    """A short table row or code line, whole, locates a statement: it is accepted; the same
    characters inside a longer line, or a line of one letter, are not."""
    src = ws / "evidence/source/ricovero.md"
    src.write_text(RICOVERO + "\n| M | F |\n|---|---|\n| 1 | 2 |\n\nX\n", encoding="utf-8")
    commit(ws)

    def enum_with(excerpts: list[str]) -> ModelReply:
        return ModelReply(units=(
            proposed("glossary", "Ricovero", {"term": "ricovero", "synonyms": [],
                                              "definition": "Periodo di degenza."},
                     [RICOVERO_EXCERPT], uid="evidence:ricovero", purposes=("disambiguation",)),
            proposed("enum", "Codici", {"column": "clinical.patient.sex_code",
                                        "values": {"M": "maschio", "F": "femmina"}}, excerpts)))

    backend = ScriptedBackend({"source/ricovero.md": enum_with(["| M | F |", "| 1 | 2 |"])})
    use_backend(backend)
    r = tht("evidence", "prepare", str(ws), "--json")
    assert r.exit_code == 0, r.output
    commit(ws)
    assert validate_workspace(ws).problems == []
    backend.script = {"source/ricovero.md": enum_with(["M | F", "X"])}
    touch_source(ws, "evidence/source/ricovero.md")
    fields = {p["field"] for p in prepare_refused(ws) if p["code"] == "excerpt_too_short"}
    assert fields == {"provenance.supporting_excerpts[0]", "provenance.supporting_excerpts[1]"}
