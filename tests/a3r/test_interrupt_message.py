"""Ctrl-C during ``a3r vibe``/``research``: one line naming the thread to resume (a fresh user found
"continue with `a3r resume THREAD` (the thread id is printed above)")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from a3r.app import session as session_module
from a3r.app.cli import app


def test_an_interrupted_thread_names_the_thread_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        started.append(self.thread_id)
        raise KeyboardInterrupt

    monkeypatch.setattr(session_module.Session, "start", interrupted)
    root = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    result = CliRunner().invoke(app, ["vibe", "train arithmetic", "--steps", "4", *root])
    assert result.exit_code == 1 and len(started) == 1
    assert f"error: interrupted; continue with `a3r resume {started[0]}`" in result.output
    assert "Traceback" not in result.output
