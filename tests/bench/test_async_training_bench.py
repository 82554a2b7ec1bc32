"""bench/async_training.py's passthrough to ``swarm serve`` (the run itself: bench/README.md; its CPU smoke
run takes minutes) and its throughput comparison."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from async_training import Serving, report
from rich.console import Console


def test_the_trainer_engine_device_and_verl_flags_reach_swarm_serve() -> None:
    serving = Serving(
        model="/m", trainer="verl", engine="vllm", device="cuda", lora_rank=0, weight_sync="direct",
        trainer_gpus=2, gpu_memory_utilization=0.4,
    )  # fmt: skip
    argv = " ".join(serving.argv(Path("/r"), 8000, 1))
    for flag in ("--trainer verl", "--engine vllm", "--device cuda", "--model /m", "--lora-rank 0",
                 "--trainer-gpus 2", "--verl-weight-sync direct", "--gpu-memory-utilization 0.4",
                 "--max-staleness 1", "--tis-cap 2"):  # fmt: skip
        assert flag in argv, flag
    plain = " ".join(Serving().argv(Path("/r"), 8000, None))
    assert "--trainer torch --engine hf --device cpu --lora-rank 16" in plain
    for absent in ("--model", "--max-staleness", "--trainer-gpus", "--verl-weight-sync", "--gpu-memory"):
        assert absent not in plain


def _row(max_staleness: int | None, per_min: float) -> dict[str, Any]:
    return {
        "mode": "x", "max_staleness": max_staleness, "complete": True, "steps": 6, "wall_s": 1.0,
        "episodes_per_min": per_min, "step_s": 1.0, "drain_s": 0.0, "aborted": 0, "infra": 0,
        "staleness_mean": 0.0, "staleness_max": 0, "reward_first": 0.5, "reward_last": 0.5,
    }  # fmt: skip


def test_the_report_gives_the_throughput_ratio_of_async_to_sync() -> None:
    out = io.StringIO()
    report([_row(None, 10.0), _row(1, 25.0)], "t", Console(file=out, width=200))
    assert "throughput async / sync: 2.50×" in out.getvalue()
