"""Patch allow-list and application; sweep scheduling, stability verdicts and the report."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from a3r.errors import PatchConflict, PatchNotAllowed
from a3r.providers import OfflineProvider
from a3r.study.analysis import Diagnosis, DiagnosisKind, RewardSummary, summarise_rewards
from a3r.study.patches import apply_patch, check_allowed, unified_diff
from a3r.study.plans import StabilityCriterion
from a3r.study.report import joined_parts, plot_rewards, write_report
from a3r.study.research import (
    fit_budget,
    initial_queue,
    judge_run,
    min_stable_value,
    non_monotone,
    refine_values,
    sweep_specs,
    verdicts,
)
from a3r.study.runs import RunOutcome
from memory import StudyPublic, StudyStatus


@pytest.mark.parametrize(
    "target",
    [
        "heldout.jsonl",
        "evaluator/workflow.py",
        "evaluator/reward.py",
        "../workflow.py",
        "/etc/passwd",
        "limits.json",
        "sub/workflow.py",
    ],
)
def test_patches_never_touch_evaluators_heldout_or_limits(tmp_path: Path, target: str) -> None:
    (tmp_path / "evaluator").mkdir()
    with pytest.raises(PatchNotAllowed):
        check_allowed(tmp_path, target)


def test_symlinked_target_is_refused(tmp_path: Path) -> None:
    (tmp_path / "heldout.jsonl").write_text("{}\n")
    (tmp_path / "tasks.jsonl").symlink_to(tmp_path / "heldout.jsonl")
    with pytest.raises(PatchNotAllowed):
        check_allowed(tmp_path, "tasks.jsonl")


def test_apply_patch_is_idempotent_and_detects_conflicts(tmp_path: Path) -> None:
    (tmp_path / "workflow.py").write_text("A = 1\n")
    diff = unified_diff("A = 1\n", "A = 2\n", "workflow.py")
    assert diff.startswith("--- a/workflow.py\n+++ b/workflow.py") and "-A = 1" in diff and "+A = 2" in diff
    assert apply_patch(tmp_path, "workflow.py", base="A = 1\n", new="A = 2\n") is True
    assert apply_patch(tmp_path, "workflow.py", base="A = 1\n", new="A = 2\n") is False  # re-run of the node
    assert (tmp_path / "workflow.py").read_text() == "A = 2\n"
    with pytest.raises(PatchConflict):
        apply_patch(tmp_path, "workflow.py", base="A = 1\n", new="A = 3\n")


TASKS = [f"t{i}" for i in range(8)]


def _heldout(level: float) -> dict[str, list[float]]:
    """Held-out rewards on the 8 tasks × 2 attempts whose mean is ``level``."""
    return {task: [level + 0.05, level - 0.05] for task in TASKS}


def _outcome(
    key: str,
    value: float,
    seed: int,
    curve: list[float],
    status: str = "finished",
    heldout: float | None = None,
    **extra: object,
) -> RunOutcome:
    """A sweep run with its train-reward curve and its held-out evaluation after training (on the
    baseline's tasks), whose mean is ``heldout`` (default: the curve's last reward)."""
    level = curve[-1] if heldout is None and curve else heldout
    return RunOutcome(
        key=key,
        run_id=seed + int(value) * 10,
        purpose="sweep",
        seed=seed,
        value=value,
        status=status,  # type: ignore[arg-type]
        reason="",
        steps=len(curve),
        curve=[(i + 1, v) for i, v in enumerate(curve)],
        eval=summarise_rewards(_heldout(level), keep_tasks=True) if level is not None else None,
        **extra,  # type: ignore[arg-type]
    )


BASELINE = RewardSummary(
    tasks=8,
    episodes=16,
    mean_reward=0.3,
    pass_at_1=0.3,
    pass_at_2=0.45,
    rewards=[r for rs in _heldout(0.3).values() for r in rs],
    task_rewards=_heldout(0.3),
)


def test_research_plan_queue_and_sweep() -> None:
    plan = OfflineProvider().plan("find min stable batch size on arithmetic", mode="research")
    assert [s.purpose for s in initial_queue(plan)] == ["preflight"]
    specs = sweep_specs(plan, plan.sweep.coarse if plan.sweep else [], "coarse")
    assert len(specs) == 4 * len(plan.training.seeds)
    assert [s.settings.batch_size for s in specs[:2]] == [1, 1] and specs[0].seed != specs[1].seed
    assert specs[0].key == "coarse-batch_size=1-s0"
    kept, dropped = fit_budget(
        specs, budget_s=3 * 60, seconds_per_episode=0.5, eval_episodes=32, goal="min_stable"
    )
    assert kept and dropped and max(s.value or 0 for s in kept) < min(dropped)
    assert len(kept) % len(plan.training.seeds) == 0  # configurations are never cut to fewer seeds
    vibe = OfflineProvider().plan("train arithmetic", mode="vibe")
    assert [s.key for s in initial_queue(vibe)] == ["smoke", "train-s0"]


def test_stability_verdicts_and_refinement() -> None:
    criterion = StabilityCriterion(last_k=2, delta=0.05, min_seeds=2)
    collapse = Diagnosis(kind=DiagnosisKind.collapse, summary="reward fell")
    outcomes = [
        _outcome("b1s0", 1, 0, [0.3, 0.1, 0.0]),
        _outcome("b1s1", 1, 1, [0.3, 0.3, 0.35]),
        _outcome("b2s0", 2, 0, [0.3, 0.3, 0.3], diagnoses=[collapse]),
        _outcome("b2s1", 2, 1, [0.3, 0.3, 0.3]),
        _outcome("b4s0", 4, 0, [0.3, 0.35, 0.4]),
        _outcome("b4s1", 4, 1, [0.3, 0.3, 0.3]),
        _outcome("b8s0", 8, 0, [0.3, 0.3, 0.3]),
    ]
    unstable = judge_run(outcomes[0], BASELINE, criterion)
    assert not unstable.stable and "below before − 0.05" in unstable.reasons[0]
    assert judge_run(_outcome("h", 4, 0, [0.5], status="hung"), BASELINE, criterion).stable is False
    configs = verdicts(outcomes, baseline=BASELINE, criterion=criterion)
    assert [(c.value, c.stable) for c in configs] == [(1, False), (2, False), (4, True), (8, None)]
    assert configs[2].stable_seeds == [0, 1]
    assert min_stable_value(configs) == 4 and non_monotone(configs) == []
    assert refine_values(configs, [c.value for c in configs]) == [3.0]
    assert refine_values(configs, [1, 2, 3, 4, 8]) == []


def test_non_monotone_verdicts_are_flagged() -> None:
    # The pattern a noisy sweep gave on arithmetic: 1 unstable, 2 stable, 4 unstable, 8 stable.
    criterion = StabilityCriterion(last_k=1, delta=0.05, min_seeds=2)
    outcomes = [
        _outcome(f"b{v}s{seed}", v, seed, [r])
        for v, r in ((1, 0.0), (2, 0.3), (4, 0.0), (8, 0.3))
        for seed in (0, 1)
    ]
    configs = verdicts(outcomes, baseline=BASELINE, criterion=criterion)
    assert [c.stable for c in configs] == [False, True, False, True]
    assert min_stable_value(configs) == 8  # every larger value must be stable too
    assert non_monotone(configs) == [2]
    assert refine_values(configs, [1, 2, 4, 8]) == [6.0]


def test_research_conclusions_are_confirmed_only_when_they_clear_the_noise() -> None:
    from a3r.graph.reporter import _min_stable_conclusion

    # The sweep: 1 unstable, 2 stable, 4 unstable, 6 and 8 stable on 2 seeds: not a finding.
    noisy = verdicts(
        [
            _outcome(f"b{v}s{seed}", v, seed, [0.3, r + 0.02 * seed])
            for v, r in ((1, 0.1), (2, 0.3), (4, 0.1), (6, 0.3), (8, 0.3))
            for seed in (0, 1)
        ],
        baseline=BASELINE,
        criterion=StabilityCriterion(last_k=1, delta=0.05, min_seeds=2),
    )
    text, status = _min_stable_conclusion(noisy, "batch_size")
    assert status.value == "unconfirmed" and text.startswith("unconfirmed: minimal stable batch_size = 6")
    assert "Caution: 2 also passed" in text
    # found by a fresh user: "≈ 1 more seeds"
    assert "≈ 1 more seed would settle it" in text and "1 more seeds" not in text
    # A crash below and a margin far above the threshold on 4 seeds (which differ: a zero-width interval
    # over identical seeds would not count): confirmed.
    clear = verdicts(
        [_outcome(f"b1s{seed}", 1, seed, [0.3], status="crashed") for seed in range(4)]
        + [
            _outcome(f"b2s{seed}", 2, seed, [0.3, 0.5 + 0.01 * seed, 0.52], heldout=0.5 + 0.01 * seed)
            for seed in range(4)
        ],
        baseline=BASELINE,
        criterion=StabilityCriterion(last_k=2, delta=0.05, min_seeds=2),
    )
    assert [c.settled for c in clear] == [True, True]
    assert clear[1].margin is not None and clear[1].margin.low > 0
    text, status = _min_stable_conclusion(clear, "batch_size")
    assert status.value == "confirmed" and text.startswith("confirmed: minimal stable batch_size = 2")


def test_training_is_sized_to_the_budget_with_time_kept_for_evaluation() -> None:
    from a3r.study.plans import TrainingSettings
    from a3r.study.research import SERVER_OVERHEAD_S, UPDATE_SHARE, eval_reserve_s, size_training
    from a3r.study.runs import RunSpec

    settings = TrainingSettings(steps=10, batch_size=2, group_size=4)
    per_step = 8 * 10.0 * (1 + UPDATE_SHARE)  # B·G episodes at 10 s each, plus the update
    fits = size_training(settings, seconds_per_episode=10.0, budget_s=1800, reserve_s=200)
    assert (fits.steps, fits.batch_size) == (10, 2) and fits.seconds_per_step == pytest.approx(per_step)
    assert "the 10 steps fit at B = 2" in fits.note
    # 10 steps at B = 2 need 1,040 s > 780 s: the game shrinks (B 2 → 1), the steps are kept.
    smaller = size_training(settings, seconds_per_episode=10.0, budget_s=1000, reserve_s=200)
    assert (smaller.steps, smaller.batch_size) == (10, 1)
    assert smaller.seconds_per_step == pytest.approx(per_step / 2)
    assert smaller.note.startswith("budget: B 2 → 1 so the 10 steps fit")
    assert "200 s kept for the held-out evaluation" in smaller.note
    # Not even B = 1 fits: steps are dropped, as many as fit at B = 1.
    tight = size_training(settings, seconds_per_episode=10.0, budget_s=500, reserve_s=200)
    assert (
        tight.batch_size == 1 and tight.steps == int((500 - 200 - SERVER_OVERHEAD_S) // (per_step / 2)) == 5
    )
    assert "do not fit even at B = 1" in tight.note and "training runs 5 of the 10 steps" in tight.note
    unmeasured = size_training(settings, seconds_per_episode=float("nan"), budget_s=10, reserve_s=0)
    assert (unmeasured.steps, unmeasured.batch_size) == (10, 2)
    assert size_training(settings, seconds_per_episode=100.0, budget_s=100, reserve_s=50).steps == 1
    train = RunSpec(key="train-s0", purpose="train")
    smoke = _outcome("smoke", 0, 0, [], eval_s=60.0)
    assert eval_reserve_s(train, [], budget_s=1000) == pytest.approx(150.0)  # 15% before any measurement
    assert eval_reserve_s(train, [smoke], budget_s=1000) == pytest.approx(1.25 * 60 + 15)
    assert eval_reserve_s(train, [smoke], budget_s=100) == 50  # never more than half the budget
    assert eval_reserve_s(RunSpec(key="smoke", purpose="smoke"), [smoke], budget_s=1000) == 0.0


def test_reward_parts_are_never_pooled_across_configurations() -> None:
    # found by a fresh user: an lr study's table read "17 points, 0.250 → 0.000" for seed 0, the lr 1e-4
    # and lr 1e-3 runs of that seed concatenated, and judged the trend of that mixture
    outcomes = [
        _outcome("a", 1e-4, 0, [0.2], parts={"correct": [0.25, 0.3, 0.35, 0.4]}),
        _outcome("b", 1e-3, 0, [0.1], parts={"correct": [0.2, 0.1, 0.05, 0.0]}),
    ]
    parts = joined_parts(outcomes, ("correct",), "lr")
    assert parts == {
        "lr = 0.0001, seed 0": {"correct": [0.25, 0.3, 0.35, 0.4]},
        "lr = 0.001, seed 0": {"correct": [0.2, 0.1, 0.05, 0.0]},
    }
    train = outcomes[0].model_copy(update={"purpose": "train", "value": None})
    same = train.model_copy(update={"parts": {"correct": [0.5]}})  # a continuation on the same reward
    assert joined_parts([train, same], ()) == {"seed 0": {"correct": [0.25, 0.3, 0.35, 0.4, 0.5]}}
    # after a reward patch the parts are another reward's: the H200's leak rate rose to 0.67 before the
    # patch and fell after it, and the joined 61 points read "no clear change"
    patched = same.model_copy(update={"reward_patch": 1})
    assert joined_parts([train, patched], ()) == {
        "seed 0": {"correct": [0.25, 0.3, 0.35, 0.4]},
        "seed 0, after patch 1": {"correct": [0.5]},
    }


def _study(question: str) -> StudyPublic:
    now = datetime.now(UTC)
    return StudyPublic(
        id=1,
        question=question,
        kind="research",
        status=StudyStatus.open,
        conclusion=None,
        created_at=now,
        updated_at=now,
    )


@pytest.mark.parametrize(
    ("question", "training", "sweep"),
    [
        (
            "is lr 1e-4 better than 1e-3 on arithmetic",
            "- training: 4 steps, batch size B=2 groups, group size G=4, lr ∈ {0.001, 0.0001} (varied), seeds",
            "- sweep: `lr` ∈ {0.001, 0.0001} (coarse), to tell whether lr = 0.0001 beats lr = 0.001",
        ),
        (
            "find min stable batch size on arithmetic",
            "- training: 4 steps, B ∈ {1, 2, 4, 8} (varied), group size G=4, lr=0.0002, seeds",
            "- sweep: `batch_size` ∈ {1, 2, 4, 8} (coarse, then refined between its values), to find the "
            "smallest stable batch_size",
        ),
    ],
)
def test_report_plan_shows_the_varied_setting_as_its_values(
    tmp_path: Path, question: str, training: str, sweep: str
) -> None:
    # found by a fresh user: an lr study's report read "training: …, lr=0.0002" (a value no run used)
    # and "(goal a_vs_b, refine False)"
    plan = OfflineProvider().plan(question, mode="research")
    text = write_report(
        tmp_path,
        study=_study(question),
        plan=plan,
        hypotheses=[],
        outcomes=[],
        baseline=None,
        configs=[],
        findings=[],
        patches=[],
        conclusion="c",
    ).read_text()
    assert training in text and sweep in text and "goal " not in text and "refine " not in text


def test_report_has_numbers_and_plots(tmp_path: Path) -> None:
    plan = OfflineProvider().plan("find min stable batch size on arithmetic", mode="research")
    outcomes = [
        _outcome(
            "b4s0",
            4,
            0,
            [0.3, 0.42],
            parts={"format_ok": [0.2, 0.3, 0.35, 0.5, 0.55, 0.7, 0.72, 0.9], "chars": [9.0]},
        ),
        _outcome("b4s1", 4, 1, [0.3, 0.36]),
    ]
    configs = verdicts(outcomes, baseline=BASELINE, criterion=StabilityCriterion(last_k=1))
    path = write_report(
        tmp_path,
        study=_study("q"),
        plan=plan,
        hypotheses=[],
        outcomes=outcomes,
        baseline=BASELINE,
        configs=configs,
        findings=[],
        patches=[],
        conclusion="B* ≤ 4",
        reward_parts=("format_ok", "correct"),
        notes=["budget: the 10 steps fit"],
    )
    text = path.read_text()
    assert text.index("**Verdict.** B* ≤ 4") < text.index("## Plan")
    assert "- budget: the 10 steps fit" in text and "| cancelled (budget) |" not in text
    assert "## Reward parts" in text and "![reward parts](reward_parts.png)" in text
    assert (
        "| format_ok | batch_size = 4, seed 0 | 8 | 0.200 → 0.900 |" in text
        and "| rose |" in text
        and "chars" not in text
    )
    assert (tmp_path / "reward_parts.png").read_bytes()[:4] == b"\x89PNG"
    assert "0.420" in text and "0.360" in text and "| 4 |" in text and "![sweep](sweep.png)" in text
    assert (tmp_path / "reward_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert plot_rewards([], tmp_path / "none.png") is None


def test_a_margin_at_the_threshold_does_not_promise_a_number_of_seeds() -> None:
    """A stability margin whose seeds straddle the threshold (mean margin 0): no number of seeds settles
    it at this effect size, and the conclusion says so instead of naming one."""
    from a3r.graph.reporter import _more_seeds

    criterion = StabilityCriterion(last_k=1, delta=0.05, min_seeds=2)  # threshold 0.3 − 0.05 = 0.25
    (flat,) = verdicts(
        [_outcome(f"b4s{seed}", 4, seed, [0.3, r]) for seed, r in ((0, 0.26), (1, 0.24))],
        baseline=BASELINE,
        criterion=criterion,
    )
    assert flat.margin is not None and flat.margin.out_of_reach and flat.margin.more_needed is None
    assert _more_seeds([flat]) == (
        "more seeds are unlikely to settle it at these margins (each one's interval is in its finding)"
    )
    assert "more seeds are unlikely to settle it at this effect size" in flat.margin.describe()
