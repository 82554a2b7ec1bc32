"""Shared fixtures: one real tokenizer, one tiny random model of the embedded architecture, the real
embedded model (loaded once, lazily) and real uvicorn servers on loopback.

The tiny model has SmolLM2's tokenizer and vocabulary but 2 small layers, so tests exercise the real
tokenizer, chat template and engine quickly; tests that need real behaviour use ``embedded``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from swarm.config import ServerConfig, TrainingConfig
from swarm.engine import HFEngine, ModelSource, load_model, resolve_model
from swarm.server.app import create_app
from swarm.server.http_protocol import http_protocol


@pytest.fixture(scope="session")
def embedded_source() -> ModelSource:
    """The embedded default model converted to its safetensors cache (once per machine)."""
    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer(embedded_source: ModelSource) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_source.directory), local_files_only=True)


def build_tiny_model(embedded_source: ModelSource, seed: int = 0) -> Any:
    """A random 2-layer Llama with SmolLM2's config shape and vocabulary (fp32, seeded)."""
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(str(embedded_source.directory), local_files_only=True)
    config.num_hidden_layers = 2
    config.hidden_size = 64
    config.intermediate_size = 128
    config.num_attention_heads = 4
    config.num_key_value_heads = 2
    config.head_dim = 16
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture()
def tiny_model_dir(tmp_path: Path, embedded_source: ModelSource, tokenizer: Any) -> Path:
    """The tiny random model (seed 5) and the real tokenizer saved as a model folder (``swarm serve
    --model``), for tests that start real ``swarm serve`` processes."""
    folder = tmp_path / "tiny-model"
    build_tiny_model(embedded_source, seed=5).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(embedded_source: ModelSource) -> Any:
    """The shared tiny random model (never trained: the shared server runs with training disabled)."""
    return build_tiny_model(embedded_source)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model: Any, tokenizer: Any) -> Iterator[HFEngine]:
    engine = HFEngine(tiny_model, tokenizer, "tiny-smollm2")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def embedded(embedded_source: ModelSource) -> Iterator[HFEngine]:
    """The real embedded SmolLM2-135M-Instruct behind an engine (loaded once per session)."""
    model, tok = load_model(embedded_source)
    engine = HFEngine(model, tok, embedded_source.name)
    yield engine
    engine.close()


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 50 ms until it is true; AssertionError naming ``what`` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    """A real uvicorn server in a thread (encode/httpx tests/conftest.py ``TestServer`` style)."""

    config: ServerConfig
    engine: HFEngine | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    @property
    def runtime(self) -> Any:
        assert self._server is not None
        return self._server.config.app.state.runtime  # type: ignore[union-attr]

    def start(self) -> LiveServer:
        app = create_app(self.config, engine=self.engine)
        cfg = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.config.port,
            log_level="warning",
            lifespan="on",
            http=http_protocol(self.config.max_header_bytes),
        )
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 120
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server failed to start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def restart(self) -> LiveServer:
        """Stop and start again with the same run dir (resume)."""
        self.stop()
        return self.start()


def serve_process(
    model_dir: Path | None,
    run_dir: Path,
    port: int,
    *flags: str,
    output: Path | None = None,
    log_level: str = "warning",
    module: str = "swarm.cli",
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``swarm serve`` as a real child process (so a test can kill -9 it); returns once it answers.

    ``model_dir`` ``None`` serves the embedded default; ``output`` receives stdout and stderr; ``module``
    runs another entry point with the same command line (an instrumented server); ``env`` is added to
    the environment."""
    cmd = [sys.executable, "-m", module, "serve", "--port", str(port), "--run-dir", str(run_dir)]
    cmd += [] if model_dir is None else ["--model", str(model_dir)]
    sink = None if output is None else output.open("ab")
    try:
        proc = subprocess.Popen(
            [*cmd, "--log-level", log_level, *flags],
            stdout=sink,
            stderr=None if sink is None else subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )
    finally:
        if sink is not None:
            sink.close()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, "swarm serve exited"
        try:
            # 401: it answers, and wants the admin token the test started it with
            return httpx.get(f"{url}/api/v1/status", timeout=1).status_code in (200, 401)
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 300, "swarm serve")
    except BaseException:
        proc.kill()
        proc.wait(timeout=60)
        raise
    return proc


def vllm_skip_reason() -> str | None:
    """Why the ``vllm`` engine cannot run here (``None`` where it can: vLLM installed and a CUDA GPU)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'a3r[vllm]')"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def verl_skip_reason() -> str | None:
    """Why ``swarm serve --trainer verl --engine vllm`` cannot run here (``None`` where it can: verl,
    vLLM and a CUDA GPU)."""
    if importlib.util.find_spec("verl") is None:
        return "verl is not installed (pip install 'a3r[verl]')"
    return vllm_skip_reason()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the name (state, parent pid, …); ``None`` once it exited."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold ')'
    except (OSError, IndexError):
        return None


def process_table() -> dict[int, tuple[int, str]]:
    """Every process, from /proc: pid → (parent pid, state letter; ``Z`` for a zombie)."""
    table = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None:  # None: exited while listed
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendant_pids(pid: int) -> list[int]:
    """The processes below ``pid``: its children, theirs, and so on (zombies included)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in process_table().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie holds no memory: its parent, or init
    for an orphan, has not reaped it yet)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def make_server(tmp: Path, engine: HFEngine | None, **overrides: Any) -> LiveServer:
    config = ServerConfig(run_dir=tmp / "run", port=free_port(), **overrides)
    return LiveServer(config, engine).start()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_engine: HFEngine) -> Iterator[LiveServer]:
    """A server on loopback over the tiny random model (shared by the server tests)."""
    live = make_server(tmp_path_factory.mktemp("server"), tiny_engine, training=TrainingConfig(enabled=False))
    yield live
    live.stop()


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory: pytest.TempPathFactory, embedded: HFEngine) -> Iterator[LiveServer]:
    """A server on loopback over the real embedded model."""
    live = make_server(tmp_path_factory.mktemp("embedded"), embedded, training=TrainingConfig(enabled=False))
    yield live
    live.stop()
