"""``a3r vibe`` killed with SIGKILL in the middle of training, then ``a3r resume THREAD``: the thread
continues from its last checkpoint, the killed run is continued (not duplicated), the training server
died with a3r (no orphan), and the study concludes with a report."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memory import RunStatus, Store, StudyStatus

pytestmark = pytest.mark.slow

A3R = [sys.executable, "-c", "from a3r.cli import main; main()"]


def _wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_resume_after_kill_9(tmp_path: Path) -> None:
    root, store_path = tmp_path / ".a3r", tmp_path / "memory.db"
    common = ["--root", str(root), "--store", str(store_path)]
    out = (tmp_path / "vibe.log").open("wb")
    proc = subprocess.Popen(
        [
            *A3R,
            "vibe",
            "train arithmetic",
            "--steps",
            "2",
            "--batch-size",
            "1",
            "--group-size",
            "2",
            "--auto-approve",
            *common,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        client_log = root / "studies" / "1" / "runs" / "train-s0" / "client.log"
        _wait_for(lambda: client_log.exists() or proc.poll() is not None, 300, "the training client to start")
        assert proc.poll() is None, (tmp_path / "vibe.log").read_text()
        server_pid_file = root / "studies" / "1" / "servers" / "main-s0.server.pid"
        server_pid = int(re.search(r'"pid": (\d+)', server_pid_file.read_text()).group(1))  # type: ignore[union-attr]
        time.sleep(3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    thread = re.search(r"thread (t-[0-9a-f]+)", (tmp_path / "vibe.log").read_text()).group(1)  # type: ignore[union-attr]
    # The server was started with PR_SET_PDEATHSIG: it dies with a3r.
    _wait_for(
        lambda: not Path(f"/proc/{server_pid}").exists() or "zombie" in _state(server_pid),
        30,
        "the orphan server to end",
    )
    with Store(store_path) as store:
        (before,) = [r for r in store.runs() if r.name == "train-s0"]
        assert before.status is RunStatus.running

    resumed = subprocess.run(
        [*A3R, "resume", thread, "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"thread {thread} done" in resumed.stdout
    with Store(store_path) as store:
        (study,) = store.studies()
        names = [r.name for r in store.study_runs(study.id)]
        assert names.count("smoke") == 1 and names.count("train-s0") == 1
        (after,) = [r for r in store.runs() if r.name == "train-s0"]
        assert after.id == before.id and after.status is not RunStatus.running
        assert len(store.experiments(study.id)) == 1
        assert any("continuing after an interruption" in e.message for e in store.events(run_id=after.id))
        assert store.get_study(study.id).status is StudyStatus.concluded
    assert (root / "studies" / "1" / "report.md").exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"
