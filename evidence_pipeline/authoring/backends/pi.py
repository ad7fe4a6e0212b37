"""The ``pi`` backend: the Pi CLI (``@mariozechner/pi-coding-agent``) in print mode.

Each call runs ``pi -p --no-session --no-tools`` with every kind of discovery switched off
(extensions, skills, prompt templates, themes, context files), in a fresh empty temporary
directory whose ``.pi/settings.json`` disables Pi's automatic retries, with the prompt on stdin.
The process runs in its own process group; a wall-clock timeout kills the whole group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evidence_pipeline.authoring.backends.base import (
    DEFAULT_TIMEOUT_S,
    ModelBackendError,
    ModelReply,
    ModelRequest,
    bounded,
    build_prompt,
    read_settings,
    system_prompt,
)
from evidence_pipeline.authoring.backends.reply_text import (
    check_reply_size,
    decode_reply,
    read_reply,
)

# Flags that make one Pi call a plain, tool-less, stateless completion.
PI_FLAGS: tuple[str, ...] = (
    "-p",  # print mode: answer once and exit
    "--no-session",
    "--no-tools",
    "--no-extensions",  # explicit -e paths (settings "extensions") still load
    "--no-skills",
    "--no-prompt-templates",
    "--no-themes",
    "--no-context-files",  # no AGENTS.md / CLAUDE.md
    "--offline",  # no startup network operations (update checks, telemetry)
)


def pi_project_settings(timeout_s: float) -> dict[str, Any]:
    """``.pi/settings.json`` of the temporary working directory: no retries of any kind."""
    return {
        "retry": {
            "enabled": False,
            "maxRetries": 0,
            "provider": {"maxRetries": 0, "timeoutMs": int(timeout_s * 1000)},
        },
        "compaction": {"enabled": False},
        "enableInstallTelemetry": False,
        "quietStartup": True,
        "packages": [],
        "extensions": [],
        "skills": [],
        "prompts": [],
        "themes": [],
    }


class PiSettings(BaseModel):
    """Settings of the ``pi`` backend (``thoth.yaml`` ``model:``)."""

    model_config = ConfigDict(extra="forbid")

    command: str | list[str] = "pi"
    provider: str | None = None
    model: str | None = None
    thinking: Literal["off", "minimal", "low", "medium", "high", "xhigh"] | None = None
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    extensions: list[str] = Field(default_factory=list)
    agent_dir: str | None = None  # PI_CODING_AGENT_DIR: where Pi finds models.json / auth.json


class PiBackend:
    """Restructures a source with one non-interactive Pi call; no retries."""

    name = "pi"

    def __init__(self, settings: PiSettings | None = None) -> None:
        self.settings = settings or PiSettings()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> PiBackend:
        return cls(read_settings(PiSettings, settings, "pi"))

    def command_line(self) -> list[str]:
        """The argv of one call (the executable as configured, not yet resolved)."""
        s = self.settings
        argv = [s.command] if isinstance(s.command, str) else list(s.command)
        argv += list(PI_FLAGS)
        for ext in s.extensions:
            argv += ["--extension", str(Path(ext).resolve())]
        if s.provider:
            argv += ["--provider", s.provider]
        if s.model:
            argv += ["--model", s.model]
        if s.thinking:
            argv += ["--thinking", s.thinking]
        argv += ["--system-prompt", system_prompt()]
        return argv

    def restructure(self, request: ModelRequest) -> ModelReply:
        raw = self.run(build_prompt(request), source_file=request.source_file)
        return read_reply(raw, request)

    def run(self, prompt: str, *, source_file: str) -> str:
        """Run Pi once with ``prompt`` on stdin; its stdout, or :class:`ModelBackendError`."""
        s = self.settings
        argv = self.command_line()
        exe = shutil.which(argv[0])
        if exe is None:
            raise ModelBackendError(
                f"cannot find the Pi CLI {argv[0]!r} (install @mariozechner/pi-coding-agent or "
                "set model.command)", code="model_process_failed", path=source_file)
        argv[0] = os.path.abspath(exe)
        env = dict(os.environ)
        env.update(PI_OFFLINE="1", PI_SKIP_VERSION_CHECK="1", PI_TELEMETRY="0")
        if s.agent_dir:
            env["PI_CODING_AGENT_DIR"] = str(Path(s.agent_dir).resolve())
        with tempfile.TemporaryDirectory(prefix="tht-pi-") as work:
            (Path(work) / ".pi").mkdir()
            (Path(work) / ".pi" / "settings.json").write_text(
                json.dumps(pi_project_settings(s.timeout_s), indent=2) + "\n", encoding="utf-8")
            return _run_group(argv, prompt.encode("utf-8"), cwd=work, env=env,
                              timeout_s=s.timeout_s, source_file=source_file)


def _run_group(argv: list[str], stdin: bytes, *, cwd: str, env: dict[str, str],
               timeout_s: float, source_file: str) -> str:
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise ModelBackendError(f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                                code="model_process_failed", path=source_file) from None
    started = time.monotonic()
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a descendant escaped the group and holds a pipe
            proc.kill()
            proc.wait()
        raise ModelBackendError(
            f"pi did not answer within {timeout_s:g} s (wall clock); its process group was "
            "killed", code="model_timeout", path=source_file) from None
    except BaseException:
        _kill_group(proc.pid)
        proc.wait()
        raise
    finally:
        # descendants left behind by a finished pi go with it
        _kill_group(proc.pid)
    if proc.returncode != 0:
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        tail = bounded(err.decode("utf-8", errors="replace"), 1500) or "(no output on stderr)"
        raise ModelBackendError(
            f"pi {how} after {time.monotonic() - started:.1f} s: {tail}",
            code="model_process_failed", path=source_file)
    check_reply_size(len(out), "pi wrote", path=source_file)
    return decode_reply(out, path=source_file, what="pi's output")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
