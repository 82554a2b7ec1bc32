"""bench/multi_gpu.py on the CPU: its smoke run (a real ``swarm serve`` subprocess with the torch trainer
and the hf engine, ``swarm run`` clients, a tiny random Qwen2), the step parts it derives, the scaling
efficiency, the environment check and the one-line refusals. verl and vLLM need CUDA GPUs: their run is
the H200 command of bench/README.md (``multi_gpu.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import multi_gpu
import pytest

BENCH = Path(multi_gpu.__file__)


CPU_SMOKE = [
    *("--device", "cpu", "--shape", "tiny", "--trainer", "torch", "--engine", "hf"),
    *("--steps", "2", "--groups", "2", "--group-size", "2", "--completion", "8", "--budget", "240"),
]
"""The CPU smoke run's flags."""


def run_bench(flags: list[str], out: Path) -> tuple[dict[str, Any], str]:
    """Run the bench with ``flags`` and ``--json out`` in an environment without the multicast variables
    (the bench sets them itself); returns its JSON and stdout."""
    done = subprocess.run(
        [sys.executable, str(BENCH), *flags, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k not in multi_gpu.MULTICAST_OFF},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    return run_bench(CPU_SMOKE, tmp_path_factory.mktemp("multi_gpu") / "smoke.json")


@pytest.mark.slow
def test_smoke_run_trains_and_reports_each_steps_parts(smoke: tuple[dict[str, Any], str]) -> None:
    result, stdout = smoke
    assert result["complete"] and result["model"]["vocab_size"] == 49152
    assert result["model"]["config"]["architectures"] == ["Qwen2ForCausalLM"]
    rows = result["rows"]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["tokens"] > 0 and row["episodes"] == 4 and 0 <= row["reward_mean"] <= 1
        # the parts lie inside the step: rollout + training = step; the trainer inside the training part
        assert row["rollout_s"] >= 0 and row["train_s"] > 0
        assert abs(row["rollout_s"] + row["train_s"] - row["step_s"]) < 1e-6
        assert row["update_s"] > 0 and row["trainer_s"] <= row["train_s"] + 1e-3
        assert row["gather_s"] == 0.0  # the torch trainer trains the served module itself
    assert rows[0]["rollout_tokens"] > 0 and rows[0]["rollout_tokens_per_s"] > 0
    summary = result["summary"]
    assert summary["steps_in_median"] == [2] and summary["median_step_s"] == rows[1]["step_s"]
    assert "baseline for E(N) = T(1) / (N·T(N))" in stdout
    # the bench's environment lacked the variables: it set them itself and the server has them
    assert result["environments"]["processes"] >= 1 and result["environments"]["lacking"] == []


@pytest.mark.slow
def test_scaling_efficiency_against_a_baseline_run(smoke: tuple[dict[str, Any], str]) -> None:
    result, _ = smoke
    baseline = {"summary": {"gpus": 1, "median_step_s": 3.0, "median_train_s": 2.0}}
    summary = multi_gpu.summarize(result["rows"], 2, baseline)
    assert summary["efficiency_step_s"] == pytest.approx(3.0 / (2 * summary["median_step_s"]))
    assert summary["efficiency_train_s"] == pytest.approx(2.0 / (2 * summary["median_train_s"]))


def test_a_process_without_the_multicast_variables_is_named() -> None:
    env = {k: v for k, v in os.environ.items() if k not in multi_gpu.MULTICAST_OFF}
    bare = subprocess.Popen(["sleep", "30"], env=env)
    kept = subprocess.Popen(["sleep", "30"], env={**env, **multi_gpu.MULTICAST_OFF})
    try:
        lacking = multi_gpu.check_environments(bare.pid)
        assert lacking["processes"] == 1 and len(lacking["lacking"]) == 1
        assert "NCCL_NVLS_ENABLE=None" in lacking["lacking"][0]
        assert multi_gpu.check_environments(kept.pid)["lacking"] == []
    finally:
        for proc in (bare, kept):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "cpu"], "--device cpu: verl's FSDP workers and vLLM need CUDA GPUs"),
        (["--device", "cpu", "--trainer", "torch", "--engine", "hf"], "--device cpu runs --shape tiny only"),
        (
            ["--device", "cpu", "--shape", "tiny", "--trainer", "torch", "--engine", "hf", "--gpus", "2"],
            "--gpus 2 needs --trainer verl",
        ),
        (["--shape", "2b"], "--shape '2b': one of tiny, 0.5b, 1.5b, 3b, 7b"),
        (["--rollout-gpus", "2"], "--rollout-gpus 2: 0 (vLLM on the trainer's GPU 0) or 1"),
        (
            ["--trainer", "torch", "--rollout-gpus", "1"],
            "--rollout-gpus 1 places verl's actor and vLLM apart",
        ),
        (["--weight-sync", "nccl"], "--weight-sync is gather, direct, ipc or broadcast"),
    ],
)
def test_bad_arguments_end_in_one_line(flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert message in done.stderr and done.stderr.strip().count("\n") == 0 and not done.stdout


def test_the_served_command_carries_lora_staleness_and_checkpoints() -> None:
    """The issue-37 runs (LoRA, asynchronous, optimizer-state checkpoints under verl) are flags of this
    bench: they reach ``swarm serve`` as its own flags."""
    a = {
        "trainer": "verl", "engine": "vllm", "device": "cuda", "groups": 8, "group_size": 4, "lr": 1e-6,
        "micro_batch_size": 8, "gpus": 1, "gpu_memory_utilization": 0.3,
        "checkpoint_every": 2, "lora_rank": 16, "max_staleness": 1, "weight_sync": "direct",
    }  # fmt: skip
    argv = multi_gpu.serve_argv(a, Path("/m"), Path("/r"), 8000)
    joined = " ".join(argv)
    assert "--checkpoint-every 2" in joined and "--lora-rank 16" in joined
    assert "--max-staleness 1 --tis-cap 2.0" in joined and "--trainer-gpus 1" in joined
    assert "--verl-weight-sync direct" in joined
    plain = " ".join(
        multi_gpu.serve_argv(
            {**a, "lora_rank": 0, "max_staleness": None, "weight_sync": "gather"}, Path("/m"), Path("/r"), 1
        )
    )
    assert "--lora-rank" not in plain and "--max-staleness" not in plain and "--verl-weight-sync" not in plain


def test_vllm_on_a_gpu_of_its_own_gets_the_next_gpu_and_the_actor_a_ray_head_of_its_gpus(
    tmp_path: Path,
) -> None:
    """``--trainer-gpus N --rollout-gpus 1`` (the NCCL broadcast layout): the Ray head sees GPUs 0…N−1,
    the server (vLLM) GPU N and joins that head; the summary keeps the sync time per rank count."""
    assert multi_gpu.gpu_layout(1, 0) == {"ray": None, "server": None}  # vLLM on the actor's GPU 0
    assert multi_gpu.gpu_layout(2, 1) == {"ray": "0,1", "server": "2"}
    a = {
        "trainer": "verl", "engine": "vllm", "device": "cuda", "groups": 8, "group_size": 4, "lr": 1e-6,
        "micro_batch_size": 8, "gpus": 2, "gpu_memory_utilization": 0.3, "checkpoint_every": 10,
        "lora_rank": 0, "max_staleness": None, "weight_sync": "direct",
    }  # fmt: skip
    joined = " ".join(multi_gpu.serve_argv(a, Path("/m"), Path("/r"), 8000, "127.0.0.1:6380"))
    assert "--trainer-gpus 2" in joined and "--ray-address 127.0.0.1:6380" in joined
    assert "--ray-address" not in " ".join(multi_gpu.serve_argv(a, Path("/m"), Path("/r"), 8000))
    assert multi_gpu.absolute_path_list(f"/x{os.pathsep}.") == f"/x{os.pathsep}{Path.cwd()}"
    log = tmp_path / "server.log"
    log.write_text("12:00 INFO swarm.train.verl_backend: verl weight sync: broadcast (direct)\n")
    assert multi_gpu.chosen_transport(log) == "broadcast"
    assert multi_gpu.chosen_transport(tmp_path / "none.log") is None
    rows = [
        {"step": k, "step_s": 5.0, "rollout_s": 2.0, "train_s": 3.0, "old_logprobs_s": 0.0, "update_s": 2.0,
         "gather_s": 0.0, "push_s": 0.5, "weight_sync_s": 0.5, "rollout_tokens_per_s": 100.0,
         "gpu_peak_gib": []}
        for k in (1, 2)
    ]  # fmt: skip
    one = multi_gpu.summarize(rows, 1, None, rollout_gpus=1, transport="broadcast")
    assert one["sync_by_ranks"] == {"1": {"weight_sync_s": 0.5, "rollout_gpus": 1, "transport": "broadcast"}}
    assert one["weight_sync_share"] == pytest.approx(0.1)
    two = multi_gpu.summarize(rows, 2, {"summary": one}, rollout_gpus=1, transport="broadcast")
    assert sorted(two["sync_by_ranks"]) == ["1", "2"]  # the baseline's rank count and this run's
