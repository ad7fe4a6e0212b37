"""Small helpers shared by the benchmark scripts (not part of the product)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
THT = str(Path(sys.executable).with_name("tht"))
GIT_IDENTITY = ("-c", "user.name=thoth bench", "-c", "user.email=bench@thoth.invalid",
                "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main")


SUMMARY_JSON = "only the summary JSON on stdout"


def arguments(doc: str | None, *, json_help: str | None = SUMMARY_JSON) -> argparse.ArgumentParser:
    """A benchmark's command line: described by the first line of its docstring, with
    ``--json`` (what :func:`finish` prints in place of the tables) unless ``json_help`` is None."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    if json_help is not None:
        parser.add_argument("--json", action="store_true", help=json_help)
    return parser


def log(message: str) -> None:
    """Progress on stderr (stdout is kept for the table or the JSON summary)."""
    print(message, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and load: what the figures were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib,
            "python": platform.python_version(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, round(p / 100 * (len(s) - 1))))
    return s[k]


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def children_peak_rss_mib() -> float:
    """Peak RSS of the largest waited-for child process (e.g. a `tht` subprocess)."""
    return round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def tht(*args: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    """Run `tht ... --json`; return its JSON document and the wall time. Fails loudly."""
    started = time.perf_counter()
    proc = subprocess.run([THT, *args, "--json"], capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"tht {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-1500:]}\n{proc.stdout[-1500:]}")
    return json.loads(proc.stdout), elapsed


def write_json(name: str, document: Any) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def finish(name: str, document: Any, summary: Any, human: Callable[[], str],
           as_json: bool) -> int:
    """The end of a benchmark's run: ``document`` written to ``bench/results/<name>``, then on
    stdout either ``summary`` as one JSON document (``--json``) or the ``human`` text (its
    tables) and where the full report is. The script's exit status."""
    path = write_json(name, document)
    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(human())
        print(f"\nfull report: {path}")
    return 0


def source_workspace(dest: Path, config: str, readme: str, notes: Mapping[str, str], *,
                     message: str = "sources") -> Path:
    """A new Git workspace at ``dest`` (whatever was there removed): ``config`` as thoth.yaml,
    ``readme`` as evidence/README.md, ``.tht/`` ignored and the ``notes`` (paths under
    ``evidence/source/``), all committed with ``message``; ready for `tht evidence prepare`."""
    if dest.exists():
        shutil.rmtree(dest)
    src = dest / "evidence" / "source"
    src.mkdir(parents=True)
    (dest / "thoth.yaml").write_text(config, encoding="utf-8")
    (dest / "evidence" / "README.md").write_text(readme, encoding="utf-8")
    (dest / ".gitignore").write_text(".tht/\n", encoding="utf-8")
    for rel, text in notes.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text, encoding="utf-8")
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", message)
    return dest


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A plain aligned text table (no colour, so it can be pasted into Markdown)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [title] if title else []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if n and _num(c) else c.ljust(w)
                               for c, w in zip(r, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _num(text: str) -> bool:
    try:
        float(text.rstrip("×%"))
    except ValueError:
        return False
    return True


def run_phase(script: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measured phase in a fresh Python process (so its peak RSS is its own) and return
    the JSON document it prints as its last stdout line."""
    proc = subprocess.run([sys.executable, str(script), "--phase", *args], capture_output=True,
                          text=True, check=False, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"phase {args[:1]} failed ({proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ran_as_phase(argv: Sequence[str] | None, phase: Any) -> bool:
    """In the child process of :func:`run_phase` (``script --phase TARGET [--trace]``), run
    ``phase(TARGET, trace)`` and say so; False in the script's own run."""
    if argv is not None or len(sys.argv) < 3 or sys.argv[1] != "--phase":
        return False
    phase(sys.argv[2], "--trace" in sys.argv[3:])
    return True


def italian_sentences() -> list[str]:
    """Sentences of the demo notes (examples/psd): real Italian domain text to recombine."""
    import re

    out: list[str] = []
    for f in sorted((REPO / "examples" / "psd" / "evidence" / "source").rglob("*.md")):
        for line in f.read_text(encoding="utf-8").splitlines():
            s = line.strip()
            if len(s) > 30 and not s.startswith(("#", "|", "```", "-", "http", "=")):
                out.extend(p.strip() for p in re.split(r"(?<=[.;])\s+", s)
                           if 20 < len(p.strip()) < 400)
    return out


def measure(fn: Any, *, trace: bool = False) -> tuple[Any, dict[str, float]]:
    """Run ``fn()``; wall time, this process's peak RSS and (with ``trace``) the tracemalloc
    peak of Python allocations (C allocations, e.g. the model's, are not traced)."""
    import tracemalloc

    if trace:
        tracemalloc.start()
    t = time.perf_counter()
    value = fn()
    out = {"seconds": round(time.perf_counter() - t, 3), "peak_rss_mib": peak_rss_mib()}
    if trace:
        out["tracemalloc_peak_mib"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
        tracemalloc.stop()
    return value, out


def run_tht(*args: str, env: dict[str, str] | None = None) -> float:
    """Run a `tht` command that has no --json output (e.g. `demo init`); return its wall time.
    Fails loudly."""
    started = time.perf_counter()
    proc = subprocess.run([THT, *args], capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"tht {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-1500:]}\n{proc.stdout[-1500:]}")
    return time.perf_counter() - started
