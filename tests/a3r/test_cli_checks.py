"""What ``a3r vibe`` and ``a3r research`` say before running anything: where each planned value comes
from, and the one-line refusals of values they cannot honour (through the real CLI, offline)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from a3r.app.cli import app


def _invoke(tmp_path: Path, *args: str) -> tuple[int, str]:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    result = CliRunner().invoke(app, [*args, *common])
    return result.exit_code, result.output


def test_a_dry_run_says_which_parameters_the_request_gave(tmp_path: Path) -> None:
    code, output = _invoke(tmp_path, "vibe", "train who is the spy with 6 players", "--dry-run")
    assert code == 0, output
    assert "    n_players = 6  (set by the plan; template default 3)" in output
    assert "    tell_roles = False  (template default)" in output
    why = next(line for line in output.splitlines() if line.startswith("  why: "))
    assert "parameters read from the request: n_players = 6; template defaults: describe_max_tokens," in why
    assert "tell_roles" in why.split("template defaults: ")[1]
    code, output = _invoke(tmp_path, "research", "best temperature on who is the spy", "--dry-run")
    assert code == 0, output
    assert "    n_players = 3  (template default)" in output
    assert "    temperature =" not in output  # the swept knob: each run sets its own value
