"""bench/spy_recovery.py starts the main job from a broken who-is-the-spy reward: its request reaches the
rendered workflow's PARAMS as written, and the analyst's offline rule restores the leak penalty (and
nothing else) when the leak rate rises."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import spy_recovery

import templates
from a3r.providers import OfflineProvider, read_params
from a3r.study.analysis import Diagnosis, DiagnosisKind
from a3r.study.plans import PatchDraft
from memory import ArtifactKind, Store
from templates.who_is_the_spy.reward import role_reward


def _leak_patch(workflow: str, template: str | None) -> PatchDraft | None:
    """The offline provider's patch of ``workflow`` for a confirmed rise of the leak rate."""
    leak = Diagnosis(
        kind=DiagnosisKind.reward_hacking,
        summary="leak_rate (violation) rose",
        evidence={"part": "leak_rate", "role": "violation"},
        patchable=True,
    )
    return OfflineProvider().propose_patch(leak, {"workflow.py": workflow}, template=template)


def test_the_broken_request_reaches_the_workflow_and_the_patch_restores_the_penalty(tmp_path: Path) -> None:
    plan = OfflineProvider().plan(spy_recovery.GAME_SKILL_REQUEST, mode="vibe")
    assert plan.template == spy_recovery.TEMPLATE
    assert {k: plan.params[k] for k in ("leak_penalty", "hide_leaks", "train_roles")} == {
        "leak_penalty": 0.0,
        "hide_leaks": False,
        "train_roles": "civilian",
    }
    rendered = templates.render(plan.template, {**plan.params, "n_tasks": 2}, tmp_path / "spy")
    workflow = rendered.workflow.read_text(encoding="utf-8")
    params = read_params(workflow)
    assert params["leak_penalty"] == 0.0 and params["hide_leaks"] is False
    assert params["invalid_vote_penalty"] == 0.25  # only the leak penalty is broken
    draft = _leak_patch(workflow, plan.template)
    assert draft is not None and draft.file == "workflow.py"
    patched = read_params(draft.new_content)
    assert patched == {**params, "leak_penalty": 0.5}


def test_a_sign_flipped_penalty_pays_for_leaking_and_the_patch_restores_the_default(tmp_path: Path) -> None:
    """The broken reward the bench runs by default (``leak_penalty=-0.5``, a sign error): leaking is paid
    directly, with no help from the game needed, and the offline rule sets the template default back."""
    plan = OfflineProvider().plan(spy_recovery.BROKEN_REQUEST, mode="vibe")
    assert plan.params["leak_penalty"] == -0.5
    assert (
        role_reward(won=False, leaks=2, invalid_votes=0, leak_penalty=-0.5) == 1.0
    )  # a losing leaker is paid
    rendered = templates.render(plan.template, {**plan.params, "n_tasks": 2}, tmp_path / "spy")
    workflow = rendered.workflow.read_text(encoding="utf-8")
    draft = _leak_patch(workflow, plan.template)
    assert draft is not None
    assert read_params(draft.new_content)["leak_penalty"] == 0.5


def _write_progress(path: Path, leak: list[float], win: list[float], per_point: int, penalty: float) -> None:
    """Client records (``progress.jsonl`` lines as ``swarm run`` writes them) of 3-player 1-round
    games: ``per_point`` episodes per point with the given leak and win rates of the two civilians."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for t, (leak_rate, won) in enumerate(zip(leak, win, strict=True)):
        for member in range(per_point):
            true = won - 0.5 * leak_rate  # one description per civilian: leaks per agent = leak_rate
            reward = won - penalty * leak_rate
            metrics = {"win_rate": won, "leak_rate": leak_rate, "invalid_vote_rate": 0.5, "rounds": 1.0}
            metrics["default_weights_reward"] = true
            row = {"kind": "train", "round": t, "task_id": f"spy-{t}", "member": member, "status": "finished"}
            lines.append(json.dumps({**row, "reward": reward, "metrics": metrics}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_the_bench_reads_a_patched_run_and_judges_the_rise_and_the_recovery(tmp_path: Path) -> None:
    rng = random.Random(5)
    root = tmp_path / ".a3r"
    root.mkdir()
    store = Store(root / "memory.db")
    study = store.create_study("train who-is-the-spy", kind="vibe")
    experiment = store.create_experiment(study.id, "spy-train")
    ws = root / "studies" / str(study.id)
    # smoke run (untrained games), a run on the broken reward, its continuation on the patched one
    runs = {
        "smoke": ("smoke", [0.3], [0.0]),
        "train-s0": ("train", [min(1.0, 0.2 + 0.06 * t + rng.gauss(0, 0.04)) for t in range(12)], [0.5] * 12),
        "train-s0-p1": (
            "train",
            [max(0.0, 0.8 - 0.08 * t + rng.gauss(0, 0.04)) for t in range(10)],
            [0.5] * 10,
        ),
    }
    for name, (purpose, leak, win) in runs.items():
        store.start_run(
            experiment.id, name=name, config={"purpose": purpose, "batch_size": 1, "group_size": 4}
        )
        penalty = 0.5 if name.endswith("p1") else 0.0
        _write_progress(ws / "runs" / name / "client" / "progress.jsonl", leak, win, 4, penalty)
    artifact = store.add_artifact(study.id, ArtifactKind.workflow, "workflow.py", "PARAMS = {}\n")
    patch = store.propose_patch(artifact.id, diff="-0.0\n+0.5\n", rationale="leak_rate rose. Reward patch")
    store.decide_patch(patch.id, approve=True, by="policy:auto-approve")
    store.close()

    records = spy_recovery.read_records(tmp_path)
    assert [r["name"] for r in records["runs"]] == ["train-s0", "train-s0-p1"]
    result = spy_recovery.analyse(records)
    assert result["pre_points"] == 12 and result["post_points"] == 10 and result["patch_after_point"] == 12
    assert [r["point"] for r in result["rows"]] == list(range(0, 23))  # point 0: the smoke run
    assert result["rows"][0]["leak_rate"] == pytest.approx(0.3) and not result["rows"][12]["after_patch"]
    assert result["leak_rose"] and result["patch_proposed"] and result["patch_approved"]
    assert result["true_reward_recovery"]["estimate"] > 0 and result["recovered"]
    assert result["leak_fall"]["estimate"] > 0
    lines = spy_recovery.verdict_lines(result)
    assert "ROSE past the noise" in lines[0] and "RECOVERED" in lines[-4]
    spy_recovery.plot(result, tmp_path / "curves.png", records["question"])
    assert (tmp_path / "curves.png").stat().st_size > 0
    # flat curves: nothing rises, nothing is claimed
    flat = {**records, "runs": [{**records["runs"][0], "points": records["runs"][0]["points"][:1] * 12}]}
    calm = spy_recovery.analyse(flat)
    assert not calm["leak_rose"] and calm["recovered"] is None


def test_a_relative_pythonpath_is_made_absolute_for_a3r_in_its_work_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # On the GPU host the tree runs from PYTHONPATH=/tmp/vllm-site:. and a3r starts in the work folder,
    # where '.' no longer finds it ("No module named 'a3r'" on the H200).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "."]))
    assert spy_recovery.absolute_pythonpath() == {"PYTHONPATH": os.pathsep.join(["/opt/site", str(tmp_path)])}
    monkeypatch.delenv("PYTHONPATH")
    assert spy_recovery.absolute_pythonpath() == {}
