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

A3R = [sys.executable, "-c", "from a3r.app.cli import main; main()"]


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
        # Kill the moment the store shows a training run in progress with its client started. Which run
        # that is depends on the machine's speed: a fast machine may already have stopped ``train-s0``
        # early (zero-signal groups) and be training its continuation.
        interrupted = _wait_for_training_run(store_path, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    thread = re.search(r"thread (t-[0-9a-f]+)", (tmp_path / "vibe.log").read_text()).group(1)  # type: ignore[union-attr]
    # Servers are started with PR_SET_PDEATHSIG: they die with a3r.
    for pid_file in (root / "studies" / "1" / "servers").glob("*.server.pid"):
        server_pid = int(re.search(r'"pid": (\d+)', pid_file.read_text()).group(1))  # type: ignore[union-attr]
        _wait_for(lambda pid=server_pid: _ended(pid), 30, f"the orphan server {pid_file.name} to end")
    with Store(store_path) as store:
        running = [r for r in store.runs() if r.status is RunStatus.running]
        # Nothing ends a run but a3r, so the run seen in progress just before the kill still is.
        assert [r.id for r in running] == [interrupted], running
        before = running[0]

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
        assert len(names) == len(set(names)), names  # the killed run was continued, not duplicated
        after = store.get_run(before.id)
        assert after.name == before.name and after.status is not RunStatus.running
        assert len(store.experiments(study.id)) == 1
        assert any("continuing after an interruption" in e.message for e in store.events(run_id=after.id))
        assert store.get_study(study.id).status is StudyStatus.concluded
    assert (root / "studies" / "1" / "report.md").exists()


def _wait_for_training_run(store_path: Path, proc: subprocess.Popen[bytes]) -> int:
    """Id of the first training run the store shows running with its client started."""
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        if store_path.exists():
            with Store(store_path) as store:
                for run in store.runs():
                    training = run.name.startswith("train") and run.status is RunStatus.running
                    if training and any("client started" in e.message for e in store.events(run_id=run.id)):
                        return run.id
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for a training run to start")
        time.sleep(0.1)
    raise AssertionError(f"a3r ended before training started (exit code {proc.returncode})")


def _ended(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return True
