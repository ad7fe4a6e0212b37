"""Where the test suite's CPU goes: per module and per test, user and system seconds.

Runs pytest as ``scripts/test.sh`` does (one worker per core and one more, modules whole on a
worker, slowest first) with the plugin ``suite_cpu_plugin`` (this folder) in every worker: each
test's CPU is the worker's own (all its threads) plus that of the processes it started and
waited for (CLI runs, kill trials, Chromium, Dagster's processes), from ``getrusage``. What is
left of the whole run's CPU (the pytest process tree's) is start-up, collection and processes no
test waited for. On 2 cores the run cannot take less than about half its CPU time: the report
says how busy the cores were (the tree's CPU over wall × cores) and when each worker ran its
last test, which shows whether the end of the run waited on one worker.

    .venv/bin/python bench/suite_cpu.py                  # the whole suite (~5 min)
    .venv/bin/python bench/suite_cpu.py tests/test_hostile.py --workers 1
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, finish, log, machine, table

HERE = Path(__file__).resolve().parent


def run_suite(pytest_args: Sequence[str], workers: int, out: Path) -> dict[str, Any]:
    """pytest with the plugin; the whole tree's wall and CPU seconds, and its exit status."""
    env = {**os.environ, "SUITE_CPU_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", "-q",
            "-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder", *pytest_args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    started_at = time.time()
    done = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tail = [line for line in done.stdout.splitlines() if line.strip()][-1:]
    return {"exit_status": done.returncode, "wall_s": round(wall, 1),
            "user_s": round(after.ru_utime - before.ru_utime, 1),
            "sys_s": round(after.ru_stime - before.ru_stime, 1),
            "pytest_said": tail[0] if tail else "", "started_at": started_at}


def per_module(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    modules: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tests": 0, "user_s": 0.0, "sys_s": 0.0, "wall_s": 0.0})
    for t in tests:
        m = modules[t["id"].split("::")[0]]
        m["tests"] += 1
        for key in ("user_s", "sys_s", "wall_s"):
            m[key] += t[key]
    rows = [{"module": name, **{k: round(v, 1) if isinstance(v, float) else v
                                for k, v in m.items()},
             "cpu_s": round(m["user_s"] + m["sys_s"], 1)} for name, m in modules.items()]
    return sorted(rows, key=lambda r: -r["cpu_s"])


def per_worker(tests: list[dict[str, Any]], started_at: float) -> list[dict[str, Any]]:
    """Per worker: its tests, their CPU and wall seconds, and when (seconds after pytest
    started) its last test ended."""
    workers: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tests": 0, "cpu_s": 0.0, "wall_s": 0.0, "last_ended_s": 0.0})
    for t in tests:
        w = workers[t["worker"]]
        w["tests"] += 1
        w["cpu_s"] += t["user_s"] + t["sys_s"]
        w["wall_s"] += t["wall_s"]
        w["last_ended_s"] = max(w["last_ended_s"], t["ended"] - started_at)
    return [{"worker": name, **{k: round(v, 1) if isinstance(v, float) else v
                                for k, v in w.items()}} for name, w in sorted(workers.items())]


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__)
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (default: the suite)")
    ap.add_argument("--workers", type=int, default=(os.cpu_count() or 1) + 1,
                    help="pytest-xdist workers (scripts/test.sh: cores + 1)")
    ap.add_argument("--top", type=int, default=15, help="tests listed by CPU")
    args = ap.parse_args(argv)
    info = machine()
    with tempfile.TemporaryDirectory(prefix="tht-suite-cpu-") as tmp:
        out = Path(tmp) / "tests.jsonl"
        log(f"[suite_cpu] pytest with {args.workers} worker(s) {' '.join(args.pytest_args)}")
        whole = run_suite(args.pytest_args, args.workers, out)
        tests = ([json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
                 if out.is_file() else [])
    in_tests = round(sum(t["user_s"] + t["sys_s"] for t in tests), 1)
    whole_cpu = round(whole["user_s"] + whole["sys_s"], 1)
    modules = per_module(tests)
    workers = per_worker(tests, whole["started_at"])
    busy = round(whole_cpu / (whole["wall_s"] * info["cores"]), 2)
    top = sorted(tests, key=lambda t: -(t["user_s"] + t["sys_s"]))[:args.top]
    report = {"benchmark": "suite cpu", "machine": info, "workers": args.workers,
              "pytest_args": args.pytest_args, "run": whole, "cpu_in_tests_s": in_tests,
              "cpu_whole_tree_s": whole_cpu, "cores_busy": busy, "workers_ran": workers,
              "modules": modules, "tests": tests}
    summary = {"wall_s": whole["wall_s"], "cpu_whole_tree_s": whole_cpu,
               "cpu_in_tests_s": in_tests, "cores_busy": busy,
               "last_test_ended_s": {w["worker"]: w["last_ended_s"] for w in workers},
               "exit_status": whole["exit_status"],
               "modules": {m["module"]: m["cpu_s"] for m in modules}}

    def human() -> str:
        head = (f"{whole['pytest_said']}\nwall {whole['wall_s']} s; CPU of the whole tree "
                f"{whole_cpu} s (user {whole['user_s']}, sys {whole['sys_s']}), of which in "
                f"tests {in_tests} s; {info['cores']} cores, busy {busy:.0%} of the wall time; "
                f"load {info['load_avg_1m_at_start']} at the start")
        mod_rows = [[m["module"], m["tests"], m["cpu_s"], m["user_s"], m["sys_s"], m["wall_s"]]
                    for m in modules]
        worker_rows = [[w["worker"], w["tests"], w["cpu_s"], w["wall_s"], w["last_ended_s"]]
                       for w in workers]
        test_rows = [[t["id"][:100], round(t["user_s"] + t["sys_s"], 2), round(t["sys_s"], 2),
                      round(t["wall_s"], 2)] for t in top]
        return "\n\n".join([
            head,
            table(["worker", "tests", "CPU s", "wall s in tests", "last test ended at s"],
                  worker_rows, "per worker (seconds after pytest started)"),
            table(["module", "tests", "CPU s", "user s", "sys s", "wall s"], mod_rows,
                  "per module (setup, call and teardown of its tests)"),
            table(["test", "CPU s", "sys s", "wall s"], test_rows, f"the {args.top} costliest")])

    finish("suite_cpu.json", report, summary, human, args.json)
    return whole["exit_status"]


if __name__ == "__main__":
    raise SystemExit(main())
