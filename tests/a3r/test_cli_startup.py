"""The command lines answer at once: ``a3r --help``, a typo and ``--version`` load no research layer,
and ``swarm serve --help`` is readable at 80 columns (real processes, real imports)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

import a3r
from a3r.app import commands
from a3r.app.cli import app

HEAVY = ("scipy", "matplotlib", "langgraph", "sqlalchemy", "a3r.app.commands", "torch")


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


@pytest.mark.parametrize("argv", [["--help"], ["vibee"], ["--version"], []])
def test_a3r_answers_without_the_research_layer(argv: list[str]) -> None:
    code = (
        "import sys, json\nfrom a3r.app.cli import app\n"
        "try:\n    app(sys.argv[1:], prog_name='a3r')\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)"
    )
    done = _python(code, *argv)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    if argv == ["--version"]:
        assert done.stdout == f"a3r {a3r.__version__}\n"
    if argv == ["vibee"]:
        assert "Did you mean 'vibe'?" in done.stderr


def test_the_listing_shows_each_research_commands_own_help() -> None:
    listing = _python("from a3r.app.cli import main; main()", "--help").stdout
    for name in ("vibe", "research", "resume"):
        first_line = inspect.getdoc(getattr(commands, name)).splitlines()[0]
        assert " ".join(first_line.split()[:4]) in " ".join(listing.split()), name


def test_research_commands_run_from_the_lazy_listing() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["resume", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "Continue a thread" in result.output


def test_swarm_version_and_serve_help_at_80_columns() -> None:
    version = _python("from swarm.cli import main; main()", "--version")
    assert version.stdout.startswith("swarm ") and version.returncode == 0
    done = _python("from swarm.cli import main; main()", "serve", "--help")
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in done.stdout and "<bool>" not in done.stdout
    flags = [line.split()[0] for line in lines if line.startswith("  --")]
    assert {"--max-open-episodes", "--client-tokens-file", "--max-requests-per-s"} <= set(flags)
    assert "  --train / --no-train" in done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["vibe", "--help"], ["research", "--help"], ["tui", "--help"]])
def test_a3r_help_is_plain_at_80_columns(argv: list[str]) -> None:
    """Found by a fresh user: ``--version <bool>``, ``--dry-run <bool>`` beside plain on/off flags."""
    done = _python("from a3r.app.cli import main; main()", *argv)
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout and "…" not in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    if argv == ["--help"]:
        assert "  --version  " in done.stdout
    if argv == ["tui", "--help"]:  # a token on the command line shows in `ps`: the help steers away
        assert "SWARM_ADMIN_TOKEN" in " ".join(done.stdout.split())
