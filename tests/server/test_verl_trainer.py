"""``swarm serve --trainer verl`` on the CPU: options, the one-line refusal without verl, and the live
config a server with verl's backend accepts (its Ray worker group only starts with the first step, which
needs GPUs: bench/verl_step.py runs that on the H200)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from swarm.batch import BatchConfig, BatchPolicy
from swarm.cli import app
from swarm.client import ServeOptions, ServeOptionsError
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from tests.conftest import build_tiny_model, make_server

runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"trainer": "banana"}, "--trainer: Input should be 'torch' or 'verl'"),
        (
            {"trainer": "verl", "trainer-gpus": "0"},
            "--trainer-gpus: Input should be greater than or equal to 1",
        ),
    ],
)
def test_trainer_options_are_refused_in_one_line(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ServeOptionsError) as caught:
        ServeOptions.from_flags(flags).to_server_config()
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).count("--") <= 2


def test_verl_takes_lora_without_dropout() -> None:
    """verl 0.9.1's FSDP LoRA (``lora_rank``) has no adapter dropout: LoRA is taken, dropout refused."""
    from swarm.train import LoraSettings, TrainerConfig

    training = ServeOptions.from_flags({"trainer": "verl", "lora-rank": "8"}).to_server_config().training
    assert training.backend == "verl" and training.trainer.lora is not None and training.trainer.lora.r == 8
    with pytest.raises(ValueError, match="LoRA adapters have no dropout"):
        TrainingConfig(backend="verl", trainer=TrainerConfig(lora=LoraSettings(dropout=0.1)))


def test_the_direct_weight_path_needs_vllm_and_full_weights() -> None:
    flags = {"trainer": "verl", "verl-weight-sync": "direct"}
    for extra in ({}, {"engine": "vllm", "lora-rank": "8"}):
        with pytest.raises(ServeOptionsError) as caught:
            ServeOptions.from_flags({**flags, **extra}).to_server_config()
        assert "--verl-weight-sync direct sends full weights into vLLM's workers" in str(caught.value)
        assert "\n" not in str(caught.value)
    config = ServeOptions.from_flags({**flags, "engine": "vllm"}).to_server_config()
    assert config.training.verl.weight_sync == "direct"


@pytest.mark.parametrize("sync", ["ipc", "broadcast"])
def test_a_forced_transport_is_a_direct_sync_with_the_same_needs(sync: str) -> None:
    """``ipc`` and ``broadcast`` force the direct path's transport; like ``direct`` they need vLLM and full
    weights, and the refusal names the value given."""
    flags = {"trainer": "verl", "verl-weight-sync": sync}
    with pytest.raises(ServeOptionsError, match=f"--verl-weight-sync {sync} sends full weights into vLLM"):
        ServeOptions.from_flags(flags).to_server_config()
    assert (
        ServeOptions.from_flags({**flags, "engine": "vllm"}).to_server_config().training.verl.weight_sync
        == sync
    )
    with pytest.raises(ServeOptionsError):
        ServeOptions.from_flags({**flags, "verl-weight-sync": "nccl", "engine": "vllm"}).to_server_config()


def test_an_unreachable_ray_head_is_refused_in_one_line_instead_of_hanging() -> None:
    """ray.init retries an unreachable GCS for ever (and ignores SIGTERM off the main thread): the
    address is tried first, with a bounded TCP connect."""
    import socket
    import time

    from swarm.train import TrainerError
    from swarm.train.verl_backend import check_ray_address

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(TrainerError, match=rf"--ray-address 127.0.0.1:{port}: no Ray head answers") as caught:
        check_ray_address(f"127.0.0.1:{port}", timeout_s=2.0)
    assert time.monotonic() - started < 10 and "\n" not in str(caught.value)
    with pytest.raises(TrainerError, match="expected auto, host:port or ray://host:port"):
        check_ray_address("nowhere")


def test_trainer_flags_build_the_verl_settings(tmp_path: Path) -> None:
    options = ServeOptions.from_flags(
        {"trainer": "verl", "trainer-gpus": "8", "trainer-nodes": "2", "ray-address": "auto"}
    )
    training = options.to_server_config().training
    assert training.backend == "verl"
    assert (training.verl.n_gpus_per_node, training.verl.nnodes, training.verl.world_size) == (8, 2, 16)
    assert training.verl.ray_address == "auto"
    assert options.argv() == [
        "--trainer",
        "verl",
        "--trainer-gpus",
        "8",
        "--trainer-nodes",
        "2",
        "--ray-address",
        "auto",
    ]


def test_serve_without_verl_ends_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verl", None)  # import verl raises ImportError, as when absent
    result = runner.invoke(app, ["serve", "--trainer", "verl", "--check", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert (
        len(lines) == 1 and "--trainer verl:" in lines[0] and "pip install --no-deps verl==0.9.1" in lines[0]
    )
    assert "Traceback" not in result.output


needs_verl = pytest.mark.skipif(
    os.environ.get("A3R_REQUIRE_VERL") != "1" and not __import__("importlib").util.find_spec("verl"),
    reason="verl is an optional extra",
)


@needs_verl
def test_serve_check_with_verl_needs_gpus_or_a_ray_cluster(tmp_path: Path) -> None:
    import torch

    argv = ["serve", "--trainer", "verl", "--check", "--run-dir", str(tmp_path / "r")]
    result = runner.invoke(app, argv)
    if torch.cuda.is_available():
        assert result.exit_code == 0 and "options are valid" in result.output, result.output
    else:
        assert result.exit_code != 0
        assert result.output.strip() == (
            "error: --trainer verl: verl's FSDP actor needs CUDA GPUs and this machine has none "
            "(or give --ray-address of a Ray cluster that has them)"
        )
    # --check tries the Ray address too: no cluster here, so "auto" is refused in one line …
    result = runner.invoke(app, [*argv, "--ray-address", "auto"], env={"RAY_ADDRESS": ""})
    assert result.exit_code != 0
    assert (
        result.output.strip().startswith("error: --ray-address auto: no ")
        and len(result.output.strip().splitlines()) == 1
    )
    # … and an address where something answers passes (a plain listener stands in for the Ray head)
    import socket

    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        result = runner.invoke(app, [*argv, "--ray-address", address])
    assert result.exit_code == 0 and "options are valid" in result.output, result.output


@needs_verl
def test_a_verl_server_takes_only_the_live_fields_verl_can(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    engine = HFEngine(build_tiny_model(embedded_source, seed=2), tokenizer, "tiny-verl")
    training = TrainingConfig(
        backend="verl", batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2)
    )
    live = make_server(tmp_path, engine, training=training)
    try:
        refused = httpx.patch(f"{live.url}/api/v1/config", json={"lr": 1e-4})
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["param"] == "lr" and "verl trainer fixes it at start" in error["message"]
        taken = httpx.patch(f"{live.url}/api/v1/config", json={"ppo_epochs": 2, "temperature": 0.7})
        assert taken.status_code == 200, taken.text
        config = httpx.get(f"{live.url}/api/v1/config").json()
        assert config["training"]["trainer"]["ppo_epochs"] == 2
        assert config["training"]["backend"] == "verl"
    finally:
        live.stop()
        engine.close()


DRIVER = """
import os, sys, ray
from torch import nn
from swarm.train import TrainerConfig, TrainerError, VerlSettings
from swarm.train.verl_backend import VerlTrainer

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")  # NVSHMEM_DISABLE_NVLS unset
settings = VerlSettings(ray_address=sys.argv[1])
try:
    VerlTrainer(nn.Linear(2, 2), sys.argv[2], TrainerConfig(), 0, settings=settings, start=True)
except TrainerError as exc:  # the cluster has no GPU: refused after ray.init joined it
    print("refused:", exc)

@ray.remote(num_cpus=0)
def worker_env():
    return {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}

assert ray.is_initialized()  # joined by VerlTrainer, not started here by ray.remote
print("gcs:", ray.get_runtime_context().gcs_address)
print("worker:", ray.get(worker_env.remote()))
"""


@needs_verl
@pytest.mark.slow
def test_the_ray_job_passes_the_multicast_variables_to_workers_of_a_cluster(tmp_path: Path) -> None:
    """A cluster started elsewhere (`ray start`) does not have the server's environment: VerlTrainer hands
    the NVLink-multicast variables that are set to its Ray job's runtime_env, so its workers get them."""
    import contextlib
    import json
    import shutil
    import signal
    import socket
    import subprocess
    import tempfile
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    off = {"NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"}
    env = {k: v for k, v in os.environ.items() if k not in off and k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    ray_cli = Path(sys.executable).parent / "ray"
    temp = tempfile.mkdtemp(
        prefix="ray-", dir="/tmp"
    )  # short: Ray's socket paths must fit AF_UNIX's 107 bytes
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
         "--num-cpus", "1", "--num-gpus", "0",
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the head listens once it is up
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, f"127.0.0.1:{port}", str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:  # the head and what it started, by process id (they may ignore SIGTERM for a while)
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        for proc in Path("/proc").iterdir():  # Ray's workers make their own process groups: by session
            with contextlib.suppress(OSError, ValueError, IndexError):
                session = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3])
                if proc.name.isdigit() and (
                    session == head.pid or temp.encode() in (proc / "cmdline").read_bytes()
                ):
                    os.kill(int(proc.name), signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    out = done.stdout
    assert "refused: --trainer verl: the Ray cluster has 0 GPU(s)" in out, out + done.stderr[-2000:]
    assert "gcs: " in out and f":{port}\n" in out.split("gcs: ", 1)[1]
    worker = json.loads(out.split("worker:", 1)[1].strip().replace("'", '"').replace("None", "null"))
    assert worker == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": None,
    }
