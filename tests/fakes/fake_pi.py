"""A stand-in for the Pi CLI, run by the real subprocess code of the ``pi`` backend.

Scripted by the JSON file named in ``FAKE_PI_SCRIPT``: ``{"mode": "reply", "stdout": "..."}``
(or ``"stdout_hex"`` for bytes that are not UTF-8), ``{"mode": "fail", "stderr": "...",
"exit": 3}``, ``{"mode": "hang"}`` (starts a child that sleeps too, then sleeps: both must be
killed by the wall clock) or ``{"mode": "drip", "stdout": "...", "drip_s": 0.1}`` (writes its
reply one byte every ``drip_s`` seconds: output keeps coming, the call must still end). Every
run records its argv, working directory and what it holds, its settings file, process ids and
the prompt it read on stdin into the JSON file named in ``FAKE_PI_RECORD``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    script = json.loads(Path(os.environ["FAKE_PI_SCRIPT"]).read_text(encoding="utf-8"))
    prompt = sys.stdin.read()
    cwd = Path.cwd()
    listing = sorted(p.relative_to(cwd).as_posix() for p in cwd.rglob("*"))
    settings_file = cwd / ".pi" / "settings.json"
    record = {
        "argv": sys.argv[1:],
        "cwd": str(cwd),
        "listing": listing,
        "settings": json.loads(settings_file.read_text()) if settings_file.is_file() else None,
        "prompt": prompt,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "env": {k: os.environ.get(k) for k in ("PI_OFFLINE", "PI_SKIP_VERSION_CHECK")},
    }
    mode = script["mode"]
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        record["child_pid"] = child.pid
    Path(os.environ["FAKE_PI_RECORD"]).write_text(json.dumps(record), encoding="utf-8")
    if mode == "hang":
        time.sleep(600)
        return 0
    if mode == "fail":
        sys.stderr.write(script.get("stderr", "fake pi failed"))
        return int(script.get("exit", 3))
    out = bytes.fromhex(script["stdout_hex"]) if "stdout_hex" in script \
        else script["stdout"].encode("utf-8")
    if mode == "drip":
        for i in range(len(out)):
            sys.stdout.buffer.write(out[i:i + 1])
            sys.stdout.buffer.flush()
            time.sleep(script["drip_s"])
        return 0
    sys.stdout.buffer.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
