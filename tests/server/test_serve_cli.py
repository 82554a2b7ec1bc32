"""``swarm serve``: configuration mistakes end with one readable line naming the option, before any model load."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import ServeOptions
from swarm.engine import ModelSource
from tests.conftest import (
    build_tiny_model,
    descendant_pids,
    free_port,
    process_table,
    running,
    serve_process,
    verl_skip_reason,
    vllm_skip_reason,
    wait_for,
)

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "bfloat16"], "full fine-tuning of bfloat16 weights loses AdamW updates"),
        (["--mixed-precision", "foo"], "--mixed-precision: Input should be 'no', 'bf16', 'fp16' or 'auto'"),
        (["--tis-cap", "0"], "--tis-cap: Input should be greater than 0"),
        (["--lr", "inf"], "--lr: Input should be a finite number"),
        (["--threads", "0"], "--threads: Input should be greater than or equal to 1"),
        (["--episode-timeout", "-5"], "--episode-timeout: Input should be greater than 0"),
        (["--batch-policy", "nope"], "--batch-policy: Input should be 'episodes'"),
        (["--quota", "a=0.5"], "--quota: family shares must sum to 1"),
        (["--device", "banana"], "--device banana: not a torch device"),
        (
            ["--group-size", "1"],
            "--batch-policy/--batch-size/--group-size: group_size 1 with the 'tasks' policy",
        ),
        (["--max-staleness", "-1"], "--max-staleness: Input should be greater than or equal to 0"),
        (
            ["--model", "/nonexistent/model.gguf"],
            "--model model path /nonexistent/model.gguf does not exist",
        ),
        (["--model", "/tmp"], "--model /tmp is not a Hugging Face model directory (no config.json)"),
        (["--lr", "2"], "--lr: Input should be less than or equal to 1"),
        (["--quota", "a=1", "--quota", "a=0"], "--quota 'a=0': family 'a' is given twice"),
        (["--admin-token", " "], "--admin-token: empty"),
        (["--client-token", "short"], "--client-token: expected NAME=TOKEN or TOKEN, the token at least 16"),
        (
            ["--client-token", "a=fifteen-chars!"],
            "--client-token: expected NAME=TOKEN or TOKEN, the token at least 16",
        ),
        (["--admin-token", "fifteen-chars!!"], "the admin token needs at least 16 characters"),
        (
            ["--client-token", "a=tok-1234567890ab", "--client-token", "a=tok-67890abcdefg"],
            "--client-token: the name 'a' is given twice",
        ),
        (["--client-token", "admin=tok-1234567890ab"], "client token 'admin': the name is reserved"),
        (
            ["--client-tokens-file", "/nonexistent/tokens"],
            "--client-tokens-file /nonexistent/tokens: No such file",
        ),
        (["--max-n", "17"], "--max-n: Input should be less than or equal to 16"),
        (["--run-dir", "/etc/passwd"], "--run-dir /etc/passwd: exists and is not a folder"),
        (["--engine", "vllm"], "--engine vllm: "),
        (  # before vLLM is looked for (it is not installed on CI): its LoRA kernels take no float32
            ["--tenants", "2", "--engine", "vllm", "--lora-rank", "8"],
            "--tenants on --engine vllm: vLLM serves LoRA adapters on bfloat16 or float16 weights only: "
            "add --dtype bfloat16, float16 or auto",
        ),
        (["--engine", "sglang"], "--engine: Input should be 'hf' or 'vllm'"),
        (
            ["--tenants", "2", "--lora-rank", "8", "--no-train"],
            "--no-train with --tenants: every tenant trains its adapter (the base never trains)",
        ),
        (
            ["--tenants", "2", "--lora-rank", "8", "--lr", "0"],
            "--lr 0 with --tenants: a tenant at lr 0 never",
        ),
        (
            ["--teacher", "http://127.0.0.1:9", "--distill-coef", "0.5"],
            "--distill-coef only weighs the reverse KL in mixed mode",
        ),
        (["--teacher", "http://127.0.0.1:9", "--no-train"], "--no-train: distillation (--teacher) trains"),
        (["--teacher", "ftp://teacher:8000"], "--teacher ftp://teacher:8000: not an http:// or https:// URL"),
        (["--teacher", "http://"], "--teacher http://: not an http:// or https:// URL with a host"),
    ],
)
def test_serve_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    run_dir = ["--run-dir", str(tmp_path / "run")] if "--run-dir" not in args else []
    result = runner.invoke(app, ["serve", "--port", "0", *run_dir, *args])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_negative_lora_rank_is_rejected_by_the_option(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["serve", "--port", "0", "--run-dir", str(tmp_path / "run"), "--lora-rank", "-1"]
    )
    assert result.exit_code == 2 and "--lora-rank" in result.output


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["swarm", "serve", "--lora-rank", "abc"], "error: Invalid value for '--lora-rank'"),
        (["swarm", "serve", "--bogus"], "error: No such option: --bogus"),
        (
            ["swarm", "serve", "--log-level", "verbose"],
            "error: Invalid value for '--log-level': 'verbose' is not",
        ),
        (["swarm", "status"], "error: Missing argument 'url'. (see 'swarm status --help')"),
        (["a3r", "vibe"], "error: Missing argument 'request'. (see 'a3r vibe --help')"),
    ],
)
def test_usage_mistakes_of_the_console_scripts_are_one_line(argv: list[str], message: str) -> None:
    script = Path(sys.executable).parent / argv[0]
    result = subprocess.run([str(script), *argv[1:]], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_per_token_limit_without_client_tokens_warns_and_tenant_overlap_needs_tenants(
    tmp_path: Path,
) -> None:
    """fresh-s5 #13: --max-requests-per-s on a server without client tokens limited nobody, silently;
    #10: --tenant-overlap without --tenants was "options are valid" and did nothing."""
    args = ["serve", "--port", "0", "--run-dir", str(tmp_path / "run"), "--check"]
    lone = runner.invoke(app, [*args, "--max-requests-per-s", "1"])
    assert lone.exit_code == 0, lone.output
    warning, valid = lone.output.strip().splitlines()
    assert valid == "options are valid"
    assert warning.startswith(
        "warning: --max-requests-per-s limits each client token, and this server has none"
    )
    assert "anonymous begins and completions are not limited" in warning
    both = runner.invoke(app, [*args, "--max-requests-per-s", "1", "--max-open-episodes", "2"])
    assert both.output.startswith("warning: --max-requests-per-s and --max-open-episodes limit each client")
    tokened = runner.invoke(app, [*args, "--max-requests-per-s", "1", "--client-token", "lab=" + "t" * 24])
    assert tokened.exit_code == 0 and tokened.output.strip() == "options are valid", tokened.output
    overlap = runner.invoke(app, [*args, "--tenant-overlap"])
    assert overlap.exit_code == 1 and overlap.output.strip() == (
        "error: --tenant-overlap: needs --tenants N (it keeps sampling the other tenants during a tenant's "
        "step); this server hosts no tenants"
    )


def test_check_validates_without_loading_or_writing(tmp_path: Path) -> None:
    args = ["serve", "--port", "0", "--run-dir", str(tmp_path / "run"), "--check"]
    ok = runner.invoke(app, [*args, "--max-staleness", "1", "--tis-cap", "2"])
    assert ok.exit_code == 0 and ok.output.strip() == "options are valid"
    bad = runner.invoke(app, [*args, "--tis-cap", "0"])
    assert bad.exit_code == 1 and bad.output.startswith("error: --tis-cap")
    # 0 lifts the cap, so the message says so rather than "greater than or equal to 1"
    bad = runner.invoke(app, [*args, "--max-request-tokens", "-1"])
    assert bad.exit_code == 1 and bad.output.strip() == (
        "error: --max-request-tokens: must be 0 (no cap but the context window) or a cap of at least 1, not -1"
    ), bad.output
    assert runner.invoke(app, [*args, "--max-request-tokens", "0"]).exit_code == 0
    mixed = ["--teacher", "https://teacher.example:8000/v1", "--distill", "mixed", "--distill-coef", "0.5"]
    assert runner.invoke(app, [*args, *mixed]).exit_code == 0  # --check does not call the teacher
    bad = runner.invoke(app, [*args, "--teacher", "ftp://teacher.example"])
    assert bad.exit_code == 1 and bad.output.startswith("error: --teacher ftp://teacher.example: not an http")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_serve_without_vllm_names_the_extra_verbatim(tmp_path: Path) -> None:
    result = runner.invoke(app, ["serve", "--engine", "vllm", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert "pip install 'a3r[vllm]'" in result.output  # the [vllm] is text, not rich markup


def _tiny_model_dir(tmp_path: Path, source: ModelSource, tokenizer: Any) -> Path:
    model_dir = tmp_path / "tiny"
    build_tiny_model(source).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def test_the_access_log_is_opt_in(tmp_path: Path, embedded_source: ModelSource, tokenizer: Any) -> None:
    """No line per request by default (it costs the hot path ~7 % of its CPU); ``--access-log`` logs each
    request on stdout, where a3r's run monitor counts model calls (`a3r.swarmops.processes.serve_argv`)."""
    assert ServeOptions().access_log is False
    model_dir, port, log = (
        _tiny_model_dir(tmp_path, embedded_source, tokenizer),
        free_port(),
        tmp_path / "serve.log",
    )
    proc = serve_process(
        model_dir, tmp_path / "run", port, "--no-train", "--access-log", output=log, log_level="info"
    )
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).is_success
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert '"GET /v1/models HTTP/1.1" 200' in log.read_text()


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    return [child for child, (parent, _) in process_table().items() if parent == pid]


def _names(pids: list[int]) -> set[str]:
    """The command names (``/proc/PID/comm``) of the processes among ``pids`` still listed."""
    names = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


@pytest.mark.parametrize(
    "engine",
    [
        "hf",
        pytest.param(
            "vllm", marks=pytest.mark.skipif(vllm_skip_reason() is not None, reason=str(vllm_skip_reason()))
        ),
        pytest.param(  # vLLM serves, verl's FSDP actor trains, in a local Ray the server starts
            "verl", marks=pytest.mark.skipif(verl_skip_reason() is not None, reason=str(verl_skip_reason()))
        ),
    ],
)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_server_closes_its_engine(
    tmp_path: Path, embedded_source: ModelSource, tokenizer: Any, sig: signal.Signals, engine: str
) -> None:
    """a3r stops servers with SIGTERM, which uvicorn re-raises once the app has shut down, ending the
    process at once: the engine must be closed by then, and no child process may outlive the server.
    (Closed only after ``uvicorn.run`` returned, a vLLM engine-core process outlived every server a3r
    stopped, 44 GiB of the H200 each, and the next server could not start.)

    With ``--trainer verl`` the server also starts a local Ray (its head's processes are the server's
    children, the actor holding the weights and AdamW state on the GPU is the raylet's): none of them
    may outlive the server either (an H100 run left 15 behind: Ray's SIGTERM handler aborted the server
    3 s into its shutdown, `swarm.train.ray_connection`)."""
    if engine == "hf":
        proc = serve_process(
            _tiny_model_dir(tmp_path, embedded_source, tokenizer), tmp_path / "run", free_port(), "--no-train"
        )
    elif engine == "vllm":  # the embedded model, as the engine contract runs it
        proc = serve_process(
            None, tmp_path / "run", free_port(), "--no-train", "--engine", "vllm", "--device", "cuda"
        )
    else:  # as bench/multi_gpu.py --gpus 1 serves it
        verl = ["--trainer", "verl", "--dtype", "float32", "--gpu-memory-utilization", "0.3"]
        proc = serve_process(
            None, tmp_path / "run", free_port(), "--engine", "vllm", "--device", "cuda", *verl
        )
    children, below = _children(proc.pid), descendant_pids(proc.pid)
    if engine != "hf":
        assert children, "vLLM runs its engine core as a child process"
    if engine == "verl":
        assert {"raylet", "gcs_server"} <= _names(below), _names(below)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) in (0, -sig)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    served = "vllm" if engine == "verl" else engine
    assert [e["message"] for e in events if e["kind"] == "engine.closed"] == [f"{served} engine closed"]
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []
    if engine == "verl":
        closed = [e for e in events if e["kind"] == "trainer.closed"]
        assert len(closed) == 1 and closed[0]["level"] == "info", closed
        assert closed[0]["data"]["stopped_ray"] and closed[0]["data"]["actors"] >= 1, closed
        assert [pid for pid in below if running(pid)] == []


SERVER_WITH_CHILDREN = """
import multiprocessing, subprocess, sys, time, uvicorn
from swarm.server.shutdown import reap_children, run

children = []

async def app(scope, receive, send):  # an ASGI app whose lifespan starts children of three kinds
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            spawned = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
            spawned.start()  # a spawned process also starts multiprocessing's resource tracker
            children.append(spawned)
            children.append(subprocess.Popen(["sleep", "600"]))
            deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
            children.append(subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE))
            children[-1].stdout.readline()  # it ignores SIGTERM from now on
            await send({"type": "lifespan.startup.complete"})
            print("ready", flush=True)
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

def on_exit():
    print("killed", len(reap_children(timeout_s=1.0)), flush=True)

if __name__ == "__main__":
    run(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"), on_exit)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_server_reaps_every_child_before_it_exits(tmp_path: Path, sig: signal.Signals) -> None:
    """The exit hook of `swarm serve` (`swarm.server.shutdown`) runs after the app's shutdown and before
    uvicorn re-raises the signal: a spawned process, multiprocessing's resource tracker (which ignores
    SIGTERM and lingered after vLLM servers), a plain subprocess and one that ignores SIGTERM (killed
    after the bound) are all gone, and reaped, when the server's process has exited."""
    script = tmp_path / "server_with_children.py"
    script.write_text(SERVER_WITH_CHILDREN)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        children = _children(proc.pid)
        assert len(children) == 4, children  # the three children and the resource tracker
        proc.send_signal(sig)
        assert proc.wait(timeout=30) in (0, -sig)
        assert proc.stdout.read().split() == ["killed", "1"]  # the one that ignores SIGTERM
        assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []
    finally:
        proc.kill()


SERVER_WITH_RAY = """
import asyncio, sys, uvicorn
from swarm.server.shutdown import reap_children, run
from swarm.train.ray_connection import RayConnection

ray = []

async def app(scope, receive, send):  # starts a local Ray as swarm serve --trainer verl does
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"up"})
        return
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":  # off the main thread, as the runtime is built
            ray.append(await asyncio.to_thread(
                RayConnection.open, None, num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[2]
            ))
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await asyncio.sleep(4)  # longer than the 3 s alarm Ray's SIGTERM handler arms
            print("closed", ray[0].close(timeout_s=60).stopped_ray, flush=True)
            await send({"type": "lifespan.shutdown.complete"})
            return

def on_exit():
    print("killed", len(reap_children(timeout_s=5.0)), flush=True)

if __name__ == "__main__":
    run(uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning"), on_exit)
"""


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_server_that_started_ray_shuts_down_before_it_exits(tmp_path: Path, sig: signal.Signals) -> None:
    """Ray's driver installs abseil's failure handler for SIGTERM, which aborts the process (SIGABRT) 3 s
    after the signal: a stopped verl server died in its app's shutdown, before it closed anything. The
    server re-installs its own handlers once the app has started (`swarm.server.shutdown.Server`): a
    shutdown longer than 3 s finishes, closes the Ray it started, and no Ray process outlives it."""
    script, port = tmp_path / "server_with_ray.py", free_port()
    script.write_text(SERVER_WITH_RAY)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit AF_UNIX's
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "disabled"}
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), temp], stdout=subprocess.PIPE, stderr=log, text=True, env=env
    )
    below: list[int] = []
    try:

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=1).is_success
            except httpx.TransportError:
                return False

        wait_for(up, 120, "the server with Ray")
        below = descendant_pids(proc.pid)
        assert {"raylet", "gcs_server"} <= _names(below), _names(below)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) in (0, -sig)  # not -SIGABRT
        assert proc.stdout is not None and proc.stdout.read().split() == ["closed", "True", "killed", "0"]
        assert [pid for pid in below if running(pid)] == []
        assert "SIGTERM received" not in (tmp_path / "server.log").read_text()
    finally:
        proc.kill()
        log.close()
        for pid in below:  # what a failed run left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
