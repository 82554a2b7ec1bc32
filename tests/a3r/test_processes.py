"""Subprocess bookkeeping: pid files, ending what a killed a3r left behind (only if it is still ours),
and option rendering for ``swarm serve``."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from a3r.swarmops.processes import end_stale, launch, serve_argv
from swarm.client import ServeOptions


def test_end_stale_kills_only_the_recorded_command(tmp_path: Path) -> None:
    sleeper = launch(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "s.log"
    )
    pid_file = tmp_path / "s.pid"
    assert json.loads(pid_file.read_text())["pid"] == sleeper.pid
    other = launch(
        "other", [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "o.log"
    )
    record = json.loads((tmp_path / "o.pid").read_text())
    (tmp_path / "o.pid").write_text(json.dumps({**record, "cmd": ["something", "else"]}))  # a reused pid
    try:
        assert end_stale(pid_file) is True
        assert sleeper.popen.wait(timeout=10) == -signal.SIGKILL
        assert not pid_file.exists()
        assert end_stale(tmp_path / "o.pid") is False
        time.sleep(0.2)
        assert other.poll() is None  # not ours any more: left alone
        assert end_stale(tmp_path / "missing.pid") is False
    finally:
        other.stop(sig=signal.SIGKILL)
        sleeper.close()


def test_log_and_stop(tmp_path: Path) -> None:
    proc = launch(
        "echo", [sys.executable, "-c", "print('hello from the child')"], log_path=tmp_path / "e.log"
    )
    assert proc.wait(30) == 0
    assert "hello from the child" in proc.log_text()
    assert not (tmp_path / "e.pid").exists()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_stop_ends_what_the_process_left_running(tmp_path: Path) -> None:
    """A server killed before it stopped its vLLM engine core leaves that child holding its GPU share;
    ``stop`` ends the whole process group, here a child that outlives its parent's SIGTERM."""
    child_pid = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(child_pid)!r}, 'w').write(str(c.pid)); time.sleep(600)"
    )
    proc = launch("server", [sys.executable, "-c", script], log_path=tmp_path / "s.log")
    deadline = time.monotonic() + 30
    while not child_pid.exists() or not child_pid.read_text():
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    pid = int(child_pid.read_text())
    assert _alive(pid)
    assert proc.stop(sig=signal.SIGTERM, grace_s=10) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the child outlived stop()"


def test_server_options_render_flags() -> None:
    options = ServeOptions.from_flags({"train": False, "batch-size": 4, "lr": 1e-5, "max-steps": None})
    assert options.argv() == ["--no-train", "--batch-size", "4", "--lr", "1e-05"]


def test_started_servers_keep_the_access_log_the_monitor_counts_calls_in(tmp_path: Path) -> None:
    """`swarm serve` has no access log by default; a3r's servers turn it on (`_LogCounter` reads it),
    whatever the user's options say."""
    assert "--access-log" not in ServeOptions().argv()
    user = ServeOptions.from_flags({"train": False, "access-log": False})
    argv = serve_argv(tmp_path / "run", 8123, model=None, options=user)
    assert argv[argv.index("serve") + 1 :] == [
        "--port", "8123", "--run-dir", str(tmp_path / "run"), "--no-train", "--access-log"
    ]  # fmt: skip


def test_log_counter_reads_only_what_was_appended(tmp_path: Path) -> None:
    from a3r.swarmops.execution import _LogCounter

    log = tmp_path / "server.log"
    log.write_bytes(b'INFO: "POST /v1/chat/completions HTTP/1.1" 200\nINFO: "GET /api/v1/status HTTP/1.1"\n')
    counter = _LogCounter(log)
    assert counter.update() == 1
    with log.open("ab") as f:
        f.write(b'INFO: "POST /v1/chat/comp')  # a line cut in the middle of the marker
    assert counter.update() == 1
    with log.open("ab") as f:
        f.write(b'letions HTTP/1.1" 200\n')
    assert counter.update() == 2
    assert _LogCounter(None).update() == 0


def test_held_out_evaluation_is_sized_to_the_budget(tmp_path: Path) -> None:
    from a3r.graph import RunContext
    from a3r.graph.context import Ledger
    from a3r.providers import OfflineProvider
    from a3r.swarmops.execution import eval_tasks_within

    ctx = RunContext(
        store=None, provider=OfflineProvider(), ledger=Ledger(tmp_path / "l.db"), thread_id="t", root=tmp_path
    )  # type: ignore[arg-type]
    assert eval_tasks_within(ctx, 3600, float("nan")) == 16  # nothing measured yet: as configured
    assert eval_tasks_within(ctx, 3600, 1.0) == 16  # cheap episodes: as configured
    assert eval_tasks_within(ctx, 1800, 60.0) == 2  # one-minute games: 15% of 30 min buys 2 tasks × 2
    assert eval_tasks_within(ctx, 3600, 30.0) == 9
    # A run the budget stopped: the 540 s it kept for its evaluation pay for 540 / 1.25 / 60 = 7 tasks
    # (15% of them paid for 1 task: the floor of 2 was evaluated)
    assert eval_tasks_within(ctx, 540, 30.0, reserve_s=540) == 7
    assert eval_tasks_within(ctx, 540, 30.0) == 2


def test_cpu_seconds_of_a_busy_and_an_idle_process(tmp_path: Path) -> None:
    from a3r.swarmops.execution import cpu_seconds

    busy = launch("busy", [sys.executable, "-c", "while True: pass"], log_path=tmp_path / "b.log")
    idle = launch("idle", [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "i.log")
    try:
        time.sleep(1.0)
        b0, i0 = cpu_seconds(busy.pid), cpu_seconds(idle.pid)
        time.sleep(2.0)
        b1, i1 = cpu_seconds(busy.pid), cpu_seconds(idle.pid)
        assert b0 is not None and b1 is not None and i0 is not None and i1 is not None
        assert b1 - b0 > 0.2 * 2.0  # even on a loaded machine a spinning process gets its share
        assert i1 - i0 < 0.1
    finally:
        busy.stop(sig=signal.SIGKILL)
        idle.stop(sig=signal.SIGKILL)
    assert cpu_seconds(2**22 + 12345) is None
