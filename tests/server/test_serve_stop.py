"""``swarm serve`` as a process: its stop is prompt whatever streams are open, and it serves its run dir
alone (`swarm.server.stopping`, `swarm.server.run_dir_lock`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from a3r.swarmops.trained import trained_metrics
from swarm.client import SwarmClient
from swarm.engine import ModelSource
from swarm.server.run_dir_lock import RunDirInUse, RunDirLock, held_by
from swarm.server.shutdown import GRACEFUL_SHUTDOWN_S
from tests.conftest import free_port, serve_process, wait_for
from tests.server.test_checkpoint_skip import _events, slow_server_files
from tests.server.test_serve_cli import _children, _tiny_model_dir
from tests.server.test_training import rollout


class _Reader(threading.Thread):
    """Reads one streamed response's lines until it ends; ``outcome`` says how it ended."""

    def __init__(self, method: str, url: str, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.request = (method, url, kwargs)
        self.lines: list[str] = []
        self.outcome: str | None = None

    def run(self) -> None:
        method, url, kwargs = self.request
        try:
            with httpx.stream(method, url, timeout=httpx.Timeout(10.0, read=60.0), **kwargs) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    self.lines.append(line)
            self.outcome = "ended"
        except Exception as exc:
            self.outcome = repr(exc)

    def data(self) -> list[str]:
        return [line.removeprefix("data: ") for line in self.lines if line.startswith("data: ")]


class _Call(threading.Thread):
    """One non-streamed request; ``status`` and ``body`` are its answer's."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.request = (url, kwargs)
        self.status: int | None = None
        self.body: Any = None

    def run(self) -> None:
        url, kwargs = self.request
        response = httpx.post(url, timeout=60.0, **kwargs)
        self.status, self.body = response.status_code, response.json()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_open_streams_do_not_hold_a_stopping_server(
    tmp_path: Path, embedded_source: ModelSource, tokenizer: Any, sig: signal.Signals
) -> None:
    """Followers of ``GET /api/v1/events`` (which stream until their client leaves) and a live chat stream
    are open when the signal comes: the process exits within seconds (uvicorn waited for them forever),
    each follower's stream ends cleanly with ``server.stopping`` as its last event, and the chat stream
    ends with an error event (its call cancelled, nothing recorded)."""
    port, run_dir = free_port(), tmp_path / "run"
    url = f"http://127.0.0.1:{port}"
    proc = serve_process(_tiny_model_dir(tmp_path, embedded_source, tokenizer), run_dir, port, "--no-train")
    try:
        followers = [_Reader("GET", f"{url}/api/v1/events") for _ in range(2)]
        for follower in followers:
            follower.start()
        wait_for(lambda: all(f.data() for f in followers), 30, "the followers' first events")
        begun = httpx.post(f"{url}/api/v1/episodes", json={"task_id": "stop"}, timeout=10).json()
        body = {
            "model": begun["model"],
            "messages": [{"role": "user", "content": "Count to ten."}],
            "stream": True,
            "max_tokens": 4000,
            "temperature": 0.0,
        }
        chat = _Reader(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {begun['api_key']}"},
        )
        chat.start()
        wait_for(lambda: len(chat.data()) >= 3, 60, "the chat stream's first tokens")
        # non-streamed calls in flight too (queued behind the stream's batch): OpenAI's and Anthropic's
        waiting = []
        for route, extra in (("/v1/chat/completions", {}), ("/v1/messages", {"max_tokens": 4000})):
            begun_too = httpx.post(f"{url}/api/v1/episodes", json={"task_id": "stop"}, timeout=10).json()
            call_body = {**body, **extra, "model": begun_too["model"], "stream": False}
            headers = {"Authorization": f"Bearer {begun_too['api_key']}"}
            waiting.append(_Call(f"{url}{route}", json=call_body, headers=headers))
            waiting[-1].start()
        time.sleep(2.0)  # both requests reach their routes (a local connection) before the signal
        children = _children(proc.pid)
        start = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert code in (0, -sig)
    assert took < GRACEFUL_SHUTDOWN_S / 2, f"the stop took {took:.1f} s"  # the streams ended, not the bound
    for reader in [*followers, chat]:
        reader.join(timeout=10)
        assert reader.outcome == "ended", reader.outcome
    for follower in followers:
        assert json.loads(follower.data()[-1])["kind"] == "server.stopping"
    last = json.loads(chat.data()[-1])
    assert "[DONE]" not in chat.data() and "the server is stopping" in last["error"]["message"], last
    # the non-streamed calls were cancelled by the stop and answered 503 in their API's error shape
    for call in waiting:
        call.join(timeout=10)
        assert call.status == 503, (call.status, call.body)
        assert "the server is stopping" in call.body["error"]["message"], call.body
    assert waiting[1].body["type"] == "error"  # Anthropic's envelope
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.index("server.stopping") < kinds.index("engine.closed")
    assert "call.abandoned" not in kinds  # the stop cancelled them, not their clients


def _serve_argv(model_dir: Path, run_dir: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "swarm.cli", "serve", "--port", str(port), "--run-dir", str(run_dir),
        "--model", str(model_dir), "--no-train", "--log-level", "warning",
    ]  # fmt: skip


def test_one_server_per_run_dir(tmp_path: Path, embedded_source: ModelSource, tokenizer: Any) -> None:
    """A second ``swarm serve`` on a served run dir exits 1 with one line naming the dir and the holder,
    before it loads or writes anything; readers of the run dir need no lock; after a kill -9 of the
    holder a server starts on the run dir at once (the operating system released the lock)."""
    model_dir, run_dir, port = (
        _tiny_model_dir(tmp_path, embedded_source, tokenizer),
        tmp_path / "run",
        free_port(),
    )
    first = serve_process(model_dir, run_dir, port, "--no-train")
    second = None
    try:
        events = (run_dir / "events.jsonl").read_bytes()
        names = sorted(p.name for p in run_dir.iterdir())
        # the run dir is its owner's only: every episode's prompts and completions are in pool.db
        assert run_dir.stat().st_mode & 0o777 == 0o700
        modes = {p.name: p.stat().st_mode & 0o777 for p in run_dir.rglob("*") if p.is_file()}
        assert {"pool.db", "events.jsonl", "server.lock"} <= modes.keys()
        assert set(modes.values()) == {0o600}, modes
        refused = subprocess.run(
            _serve_argv(model_dir, run_dir, free_port()), capture_output=True, text=True, timeout=120
        )
        out = refused.stdout + refused.stderr
        assert refused.returncode == 1, out
        assert out.strip() == (
            f"error: --run-dir {run_dir} is in use by another swarm serve (pid {first.pid}, port {port})"
        )
        assert (run_dir / "events.jsonl").read_bytes() == events
        assert sorted(p.name for p in run_dir.iterdir()) == names
        assert trained_metrics(run_dir, after_step=0) == []  # a reader of pool.db, while it serves
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).is_success  # A serves on
        first.kill()
        first.wait(timeout=60)
        second = serve_process(model_dir, run_dir, free_port(), "--no-train")  # at once: no wait, no retry
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)


def test_an_open_run_dir_is_made_private(tmp_path: Path) -> None:
    """A run dir another user could read (a server before this one made it 0755) is tightened to 0700."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)
    lock = RunDirLock(run_dir)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert (run_dir / "server.lock").stat().st_mode & 0o777 == 0o600
    lock.release()


def test_the_run_dir_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    """In one process too (a lock belongs to its open file): refused while held, free once released."""
    run_dir = tmp_path / "run"
    held = RunDirLock(run_dir, 8123)
    with pytest.raises(RunDirInUse, match=r"in use by another swarm serve \(pid \d+, port 8123\)"):
        RunDirLock(run_dir)
    gone = subprocess.Popen(["true"])  # its pid, once reaped, names no process
    gone.wait()
    (run_dir / "server.lock").write_text(json.dumps({"pid": gone.pid, "port": 8123}))  # as a forked child
    with pytest.raises(RunDirInUse, match=r"which has exited: a process it forked holds the lock"):
        RunDirLock(run_dir)
    held.release()
    held.release()  # idempotent
    again = RunDirLock(run_dir)
    assert json.loads((run_dir / "server.lock").read_text())["port"] == 0
    again.release()


@pytest.mark.slow
def test_a_step_under_way_at_sigterm_gives_up_and_trains_after_the_restart(
    tmp_path: Path, embedded_source: ModelSource, tokenizer: Any
) -> None:
    """SIGTERM while a training step runs: the step gives up before its first update (the torch trainer
    checks between micro-batches), so the stop does not wait for a whole step (a fresh user's CPU server
    took 29 s); ``train.interrupted`` says so, nothing is consumed, no metrics row is written, and the
    restarted server trains those episodes as step 1, once."""
    files = slow_server_files(tmp_path, embedded_source, tokenizer)
    gate = tmp_path / "step-gate"
    gate.touch()  # the first step waits in the trainer until the test removes it
    flags = ["--batch-policy", "episodes", "--batch-size", "1", "--group-size", "2", "--lr", "1e-3"]

    def serve(env: dict[str, str]) -> subprocess.Popen[bytes]:
        return serve_process(
            files.model_dir,
            files.run_dir,
            files.port,
            *flags,
            module="tests.server.slow_checkpoint_serve",
            env=env,
        )

    proc = serve({"SWARM_TEST_STEP_GATE": str(gate)})
    try:
        with SwarmClient(files.url) as client:
            rollout(client, "a", 1.0)
            rollout(client, "a", 0.0)
        wait_for(lambda: _events(files.run_dir, "train.started") != [], 120, "the step to start")
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the stop has begun (and asked the step to give up); the step still waits
        assert proc.poll() is None
        gate.unlink()
        proc.wait(timeout=60)
    finally:
        gate.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert _events(files.run_dir, "train.step") == []
    lines = (files.run_dir / "events.jsonl").read_text().splitlines()
    [interrupted] = [e for e in map(json.loads, lines) if e["kind"] == "train.interrupted"]
    assert interrupted["data"]["step"] == 1 and interrupted["data"]["episodes"] == 2, interrupted
    assert "given up before its first update: the server is stopping" in interrupted["message"]
    metrics = files.run_dir / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text().strip() == ""
    again = serve({})
    try:
        wait_for(lambda: [e["step"] for e in _events(files.run_dir, "train.step")] == [1], 120, "step 1")
        with httpx.Client(base_url=files.url) as http:
            counts = http.get("/api/v1/status").json()["episodes"]
        assert counts["trained"] == 2 and counts["pending"] == 0, counts
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=60)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]


def test_a_port_0_holder_is_named_by_its_bound_port_and_check_refuses_its_run_dir(
    tmp_path: Path, embedded_source: ModelSource, tokenizer: Any
) -> None:
    """A server started with ``--port 0`` writes its bound port into the lock once it listens: a second
    server's refusal names that port (it named none), and ``swarm serve --check`` on the held run dir
    (it said "options are valid") exits 1 with the same one line, changing nothing."""
    model_dir, run_dir = _tiny_model_dir(tmp_path, embedded_source, tokenizer), tmp_path / "run"
    lock = run_dir / "server.lock"
    holder = subprocess.Popen(_serve_argv(model_dir, run_dir, 0))
    try:

        def bound() -> bool:
            assert holder.poll() is None, "swarm serve exited"
            return lock.exists() and json.loads(lock.read_text() or "{}").get("port", 0) != 0

        wait_for(bound, 300, "the port 0 server to listen")
        port = json.loads(lock.read_text())["port"]
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).is_success, 60, "answers")
        expected = (
            f"error: --run-dir {run_dir} is in use by another swarm serve (pid {holder.pid}, port {port})"
        )
        refused = subprocess.run(
            _serve_argv(model_dir, run_dir, free_port()), capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 1 and (refused.stdout + refused.stderr).strip() == expected
        names, lock_text = sorted(p.name for p in run_dir.iterdir()), lock.read_text()
        checked = subprocess.run(
            [*_serve_argv(model_dir, run_dir, free_port()), "--check"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 1 and (checked.stdout + checked.stderr).strip() == expected
        assert sorted(p.name for p in run_dir.iterdir()) == names and lock.read_text() == lock_text
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).is_success  # it serves on
    finally:
        holder.terminate()
        holder.wait(timeout=60)
    free = subprocess.run(
        [*_serve_argv(model_dir, run_dir, free_port()), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert free.returncode == 0 and "options are valid" in free.stderr  # released: the check passes


def test_a_holder_that_has_not_bound_its_port_0_says_so(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert held_by(run_dir) is None and not run_dir.exists()  # nothing created
    held = RunDirLock(run_dir, 0)
    with pytest.raises(RunDirInUse, match=r"\(pid \d+, port not known yet \(--port 0, still starting\)\)"):
        RunDirLock(run_dir)
    assert held_by(run_dir) == f"pid {os.getpid()}, port not known yet (--port 0, still starting)"
    held.set_port(8124)
    assert held_by(run_dir) == f"pid {os.getpid()}, port 8124"
    held.release()
    assert held_by(run_dir) is None


def test_a_body_still_arriving_does_not_hold_the_stop(
    tmp_path: Path, embedded_source: ModelSource, tokenizer: Any
) -> None:
    """A POST whose body is still arriving when SIGTERM comes (``Content-Length: 100``, one byte sent) is
    answered at once with the JSON 503 "the server is stopping" and its connection closed; the process
    exits without waiting the graceful-shutdown bound, and its log has no traceback (uvicorn waited the
    bound, cancelled the app and answered a plain-text 500)."""
    port, log = free_port(), tmp_path / "serve.log"
    model_dir = _tiny_model_dir(tmp_path, embedded_source, tokenizer)
    proc = serve_process(model_dir, tmp_path / "run", port, "--no-train", output=log)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /api/v1/episodes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 100\r\n\r\n{"
            )
            time.sleep(0.5)  # the request reaches its route, which waits for the body
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            answered = time.monotonic() - start
        code = proc.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert code in (0, -signal.SIGTERM)
    assert answered < 2.0 and took < GRACEFUL_SHUTDOWN_S / 2, (answered, took)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"content-type: application/json" in head, answer
    error = json.loads(body)["error"]
    assert error["type"] == "unavailable" and "the server is stopping" in error["message"], error
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text
