"""The README's command list and the CLI agree, both ways (spec §17.33): every command and option
that exists is documented, and everything documented exists."""

from __future__ import annotations

import re
from pathlib import Path

import click

from evidence_pipeline.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def readme_commands(text: str) -> dict[str, set[str]]:
    """``{"evidence prepare": {"--upgrade", …}}`` from the fenced block under ``## Commands``."""
    section = text.split("\n## Commands", 1)[1]
    block = section.split("```", 2)[1]
    lines: list[str] = []
    for raw in block.splitlines():
        if raw.startswith("tht "):
            lines.append(raw)
        elif raw[:1].isspace() and raw.strip() and lines:  # a usage continued on the next line
            lines[-1] = f"{lines[-1].rstrip()} {raw.strip()}"
    out: dict[str, set[str]] = {}
    for line in lines:
        # columns are aligned with runs of spaces; the description is the first run that is
        # not an argument or option
        segments = re.split(r"\s{2,}", line.strip())
        usage = segments[0]
        for segment in segments[1:]:
            if segment[0] not in "<[(-":
                break
            usage += " " + segment
        words = usage.split()[1:]
        path = []
        for word in words:
            if word[0] in "<[(-":
                break
            path.append(word)
        name = " ".join(path)
        assert name not in out, f"README lists {name!r} twice"
        out[name] = set(_OPTION.findall(usage))
    return out


def cli_commands(group: click.Group, prefix: str = "") -> dict[str, set[str]]:
    """Every leaf command of the CLI with its long options (``--help`` aside)."""
    out: dict[str, set[str]] = {}
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out.update(cli_commands(cmd, f"{path} "))
            continue
        opts = {o for p in cmd.params if isinstance(p, click.Option)
                for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
        out[path] = opts - {"--help"}
    return out


def test_readme_parser_reads_usage_lines() -> None:
    text = ("x\n## Commands\n\n```\n"
            "tht evidence resolve  <id> (--retire | --source <p>) [--json]   retire or relink\n"
            "tht workspace preprocess evidence <root> [--json]\n"
            "tht evidence search <root> <q> [--kind …]\n"
            "                    [--limit <n>]   search\n```\n")
    assert readme_commands(text) == {
        "evidence resolve": {"--retire", "--source", "--json"},
        "workspace preprocess evidence": {"--json"},
        "evidence search": {"--kind", "--limit"},
    }


def test_readme_documents_exactly_the_cli() -> None:
    documented = readme_commands(README.read_text(encoding="utf-8"))
    actual = cli_commands(main)
    assert sorted(set(actual) - set(documented)) == [], "commands missing from the README"
    assert sorted(set(documented) - set(actual)) == [], "README lists commands that do not exist"
    mismatched = {name: {"missing from README": sorted(actual[name] - documented[name]),
                         "not in the CLI": sorted(documented[name] - actual[name])}
                  for name in actual if actual[name] != documented[name]}
    assert mismatched == {}
