"""``a3r tui``: user mistakes end in one line and exit code 1; the real command runs in a real 80×24
pseudo-terminal, draws the studies and quits on ``q``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from memory import Store
from tests.tui.conftest import Seeded

runner = CliRunner()
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[PX^_].*?\x1b\\|\x1b\][^\x07]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def test_missing_store_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["tui", "--store", str(tmp_path / "absent.db")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert "Traceback" not in result.output


def test_tui_in_a_folder_without_a_store_says_what_creates_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a fresh user: ``a3r tui`` in a new folder printed "Error: store … not found", exit 1."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["tui"])
    assert result.exit_code == 0 and "nothing recorded yet" in result.output and "a3r vibe" in result.output
    assert not (tmp_path / ".a3r").exists()


def test_bad_options_are_one_line(store: Store, seeded: Seeded) -> None:
    result = runner.invoke(app, ["tui", "--store", str(seeded.path), "--refresh", "0"])
    assert result.exit_code == 1
    assert result.output == "error: invalid --refresh: Input should be greater than 0\n"
    result = runner.invoke(app, ["tui", "--store", str(seeded.path), "--study", "999"])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "999" in result.output
    assert result.output.count("\n") == 1


def _read_until(fd: int, needle: str, timeout_s: float) -> str:
    """Read the terminal until ``needle`` shows in its text (escape sequences removed)."""
    raw = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                raw += os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if needle in _ANSI.sub("", raw.decode("utf-8", "replace")):
                return _ANSI.sub("", raw.decode("utf-8", "replace"))
    raise AssertionError(
        f"{needle!r} not drawn within {timeout_s}s; saw {_ANSI.sub('', raw.decode(errors='replace'))[-500:]!r}"
    )


def test_runs_in_a_real_80x24_terminal(store: Store, seeded: Seeded) -> None:
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    process = subprocess.Popen(
        [sys.executable, "-m", "a3r.app.cli", "tui", "--store", str(seeded.path), "--reviewer", "ada"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
    )
    os.close(terminal)
    try:
        screen = _read_until(controller, "Does a KL penalty", timeout_s=60)
        assert "studies" in screen and "Approvals" in screen
        os.write(controller, b"q")
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        os.close(controller)
