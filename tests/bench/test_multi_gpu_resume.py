"""``bench/multi_gpu.py --resume-check`` on the CPU (torch trainer, hf engine, tiny Qwen2; verl and vLLM
need CUDA: the H200 command is in bench/README.md), and its AdamW continuity test against real AdamW
states: one continued, one restarted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from multi_gpu_resume import adam_continuity

from tests.bench.test_multi_gpu_bench import CPU_SMOKE, run_bench


def _adamw_states() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """AdamW after 3 updates; after a 4th continuing it; after a 4th from a fresh AdamW (same gradient)."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(64, 32)), torch.nn.Parameter(torch.randn(32))]
    optimizer = torch.optim.AdamW(weights, lr=1e-3, weight_decay=0.01)
    grads = [[torch.randn_like(w) * (k + 1) for w in weights] for k in range(4)]

    def update(opt: torch.optim.Optimizer, step: int) -> None:
        for w, g in zip(weights, grads[step], strict=True):
            w.grad = g.clone()
        opt.step()

    for step in range(3):
        update(optimizer, step)
    before = copy.deepcopy(optimizer.state_dict())
    update(optimizer, 3)
    continued = copy.deepcopy(optimizer.state_dict())
    fresh = torch.optim.AdamW(weights, lr=1e-3, weight_decay=0.01)
    update(fresh, 3)
    return before, continued, copy.deepcopy(fresh.state_dict())


def test_adam_continuity_tells_a_continued_adamw_from_a_restarted_one() -> None:
    before, continued, restarted = _adamw_states()
    ok = adam_continuity({"optimizer": before}, {"optimizer": continued})
    assert ok["continued"] and ok["continued_rel_err"] < 1e-6 and ok["restarted_rel_err"] > 0.1
    assert ok["adam_steps_before"] == [3] and ok["adam_steps_after"] == [4] and ok["parameters"] == 2
    bad = adam_continuity({"optimizer": before}, {"optimizer": restarted})
    assert not bad["continued"] and bad["restarted_rel_err"] < 1e-6 and bad["continued_rel_err"] > 0.1
    assert bad["adam_steps_after"] == [1]
    # verl's layout (trainer_state.pt's verl_optimizer: the unsharded state by parameter name)
    named = [{**s, "state": {f"p{k}": v for k, v in s["state"].items()}} for s in (before, continued)]
    verl = adam_continuity(*({"verl_optimizer": {"optimizer": s, "lr_scheduler": {}}} for s in named))
    assert verl["continued"] and verl["adam_steps_after"] == [4]


def test_adam_continuity_reads_verl_s_optimizer_folders(tmp_path: Path) -> None:
    """verl's checkpoints since issue 37: ``verl_optimizer/`` (torch.distributed.checkpoint, as the
    actor's ranks write it), referenced from trainer_state.pt by a `StateFiles`."""
    import torch.distributed.checkpoint as dcp

    from swarm.train.state_files import StateFiles

    states = []
    for name, state in zip(("before", "after"), _adamw_states()[:2], strict=True):
        named = {**state, "state": {f"p{k}": v for k, v in state["state"].items()}}
        dcp.save({"optimizer": named}, checkpoint_id=tmp_path / name / "verl_optimizer", no_dist=True)
        files = StateFiles("verl_optimizer", ".metadata", tmp_path / name / "verl_optimizer")
        states.append({"verl_optimizer": files, "verl_lr_scheduler": {}})
    verl = adam_continuity(*states)
    assert verl["continued"] and verl["continued_rel_err"] < 1e-6 and verl["adam_steps_after"] == [4]


@pytest.mark.slow
def test_a_killed_server_resumes_its_step_counter_and_adamw(tmp_path: Path) -> None:
    """Two steps, SIGKILL to the server's session after step 2's checkpoint, a restart on the run dir,
    a third step: the step counter never went back, AdamW continued, save and load times reported."""
    r, stdout = run_bench([*CPU_SMOKE, "--resume-check"], tmp_path / "resume.json")
    assert r["complete"] and r["step_counter_continued"]
    assert (r["step_before_kill"], r["step_after_restart"], r["step_final"]) == (2, 2, 3)
    assert r["rewound_steps"] == [] and r["metrics_steps_after_restart"] == [1, 2, 3]
    adam = r["adam"]
    assert adam["continued"] and adam["adam_steps_before"] == [2] and adam["adam_steps_after"] == [3]
    assert [row["step"] for row in r["save"]] == [1, 2, 3]
    assert all(row["checkpoint_s"] > 0 and row["write_s"] > 0 for row in r["save"])
    assert [row["step"] for row in r["load"]] == [2] and r["load"][0]["load_s"] > 0
    assert r["first_ready_s"] > 0 and r["restarted_ready_s"] > 0
    assert "CONTINUED" in stdout and "PASS" in stdout
