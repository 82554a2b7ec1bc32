"""Research questions over any setting: the settings registry, the offline planner's questions and
refusals, the power rule and the staged design."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import templates
from a3r.errors import OfflineUnsupported, PlanError
from a3r.graph.runner import variant_workspace
from a3r.providers import OfflineProvider
from a3r.providers.offline import read_params
from a3r.study.design import coarse_values, design_study, seeds_per_arm
from a3r.study.plans import PlanDraft, SweepSpec, TrainingSettings, check_plan
from a3r.study.research import SERVER_OVERHEAD_S, fit_budget, sweep_specs, token_cap
from a3r.study.settings import SETTINGS, resolve_setting, serve_flags
from a3r.swarmops.execution import Workspace
from swarm.client import ServeOptions


def test_every_training_setting_reaches_swarm_serve() -> None:
    settings = TrainingSettings(
        lr=3e-4, batch_size=3, kl_coef=0.05, clip_eps=0.28, ppo_epochs=2, minibatches=2
    )
    flags = serve_flags(settings)
    assert {s.flag for s in SETTINGS.values() if s.target == "training"} == set(flags)
    trainer = ServeOptions.from_flags({**flags, "train": True}).to_server_config().training.trainer
    assert (trainer.lr, trainer.kl_coef, trainer.clip_eps_low, trainer.clip_eps_high) == (
        3e-4,
        0.05,
        0.28,
        0.28,
    )
    assert (trainer.ppo_epochs, trainer.minibatches) == (2, 2)


def test_settings_refuse_what_the_engine_cannot_change() -> None:
    with pytest.raises(PlanError, match="unknown setting 'dropout'"):
        resolve_setting("dropout", "arithmetic")
    with pytest.raises(PlanError, match="changes the task data"):
        resolve_setting("level", "arithmetic")
    with pytest.raises(PlanError, match="unknown setting 'leak_penalty'"):
        resolve_setting("leak_penalty", "arithmetic")
    with pytest.raises(PlanError, match="who_is_the_spy template has no max_tokens parameter"):
        resolve_setting("max_tokens", "who_is_the_spy")
    assert resolve_setting("leak_penalty", "who_is_the_spy").target == "template"
    with pytest.raises(PlanError, match="generated code"):
        resolve_setting("temperature", None)
    assert resolve_setting("max_tokens", "arithmetic").maximum == 4096  # the template's own range
    with pytest.raises(PlanError, match=r"outside its range \[0.01, 1\)"):
        SETTINGS["clip_eps"].check(1.0)
    with pytest.raises(OfflineUnsupported, match="weight decay: swarm serve has no flag"):
        OfflineProvider().plan("find the best weight decay on arithmetic", mode="research")
    draft = PlanDraft(
        kind="research",
        template="arithmetic",
        objective="x",
        sweep=SweepSpec(variable="lr", coarse=[1e-4, 1e-3, 1e-2], goal="a_vs_b"),
    )
    with pytest.raises(PlanError, match="compares two different values"):
        check_plan(draft)
    # found by a fresh user: "find the best lr on arithmetic lr=1e-3" planned a sweep over one value
    one = draft.model_copy(update={"sweep": SweepSpec(variable="lr", coarse=[1e-3], goal="best")})
    with pytest.raises(PlanError, match="needs at least two different values of"):
        check_plan(one)


@pytest.mark.parametrize(
    ("question", "variable", "winner", "loser"),
    [
        ("is lr 1e-4 better than 3e-4 on arithmetic", "lr", 1e-4, 3e-4),
        ("does a group size of 4 beat 8 on countdown", "group_size", 4, 8),
        ("does batch size 8 beat batch size 2 on arithmetic", "batch_size", 8, 2),
        ("does a group size of 8 lose to 4 on arithmetic", "group_size", 4, 8),
        ("is a learning rate of 1e-3 worse than 1e-4 on arithmetic", "lr", 1e-4, 1e-3),
        ("does a learning rate of 1e-4 outperform 3e-4 on arithmetic", "lr", 1e-4, 3e-4),
    ],
)
def test_a_question_that_names_a_winner_tests_that_winner(
    question: str, variable: str, winner: float, loser: float
) -> None:
    """The A-vs-B hypothesis is "B beats A": the value the question expects to win is B, whichever
    order the question names them in."""
    plan = OfflineProvider().plan(question, mode="research")
    assert plan.sweep is not None and plan.sweep.goal == "a_vs_b" and plan.sweep.variable == variable
    assert plan.sweep.coarse == [loser, winner]
    assert plan.hypotheses[0].statement.split("=")[1].strip().startswith(f"{winner:g} gives a higher")


@pytest.mark.parametrize(
    ("question", "refusal"),
    [
        ("compare lr 1e-4 vs 3e-4 and kl 0.1 vs 0.2 on arithmetic", "one setting per study"),
        ("find the best lr on countdown with level 3 and temperature 0.5", ""),
    ],
)
def test_a_second_setting_is_fixed_or_refused_never_dropped(question: str, refusal: str) -> None:
    if refusal:
        with pytest.raises(OfflineUnsupported, match=refusal):
            OfflineProvider().plan(question, mode="research")
        return
    plan = OfflineProvider().plan(question, mode="research")
    assert plan.params.get("temperature") == 0.5


def test_a_second_training_setting_with_one_value_is_fixed() -> None:
    plan = OfflineProvider().plan("effect of lr 1e-4 and kl 0.1 on arithmetic", mode="research")
    assert plan.sweep is not None and plan.sweep.variable == "lr" and plan.training.kl_coef == 0.1


@pytest.mark.parametrize(
    ("question", "variable", "goal", "coarse"),
    [
        ("find the best KL coefficient on arithmetic", "kl_coef", "best", [0.0, 0.01, 0.1, 1.0]),
        ("find min stable batch size on arithmetic", "batch_size", "min_stable", [1, 2, 4, 8]),
        ("minimal stable max response tokens on arithmetic", "max_tokens", "min_stable", [64, 256, 1024]),
        ("arithmetic: lr 1e-4 vs 1e-3", "lr", "a_vs_b", [1e-4, 1e-3]),
        ("effect of temperature 1.4 on arithmetic", "temperature", "effect_of", [1.0, 1.4]),
        ("best clip range on countdown", "clip_eps", "best", [0.1, 0.2, 0.3]),
        ("best ppo epochs on arithmetic", "ppo_epochs", "best", [1, 2, 4]),
        # Numbers glued to letters name a dataset, not a value: the default grid.
        ("find the best kl on gsm8k", "kl_coef", "best", [0.0, 0.01, 0.1, 1.0]),
        ("find the best temperature on aime25", "temperature", "best", [0.6, 1.0, 1.4]),
        # Counts of other things are not the setting's values.
        (
            "find min stable batch size on arithmetic with lr 1e-4 and 20 steps",
            "batch_size",
            "min_stable",
            [1, 2, 4, 8],
        ),
        # The reference of an effect-of question is the plan's default; the value given is the one changed to.
        ("effect of lr 1e-3 on arithmetic", "lr", "effect_of", [2e-4, 1e-3]),
        ("effect of batch size 8 on arithmetic", "batch_size", "effect_of", [2, 8]),
        ("effect of group size 8 on arithmetic", "group_size", "effect_of", [4, 8]),
        ("effect of kl 0.1 on arithmetic", "kl_coef", "effect_of", [0.0, 0.1]),
        # More than two values compared: the best of them.
        ("lr 1e-4 vs 1e-3 vs 1e-2 on arithmetic", "lr", "best", [1e-4, 1e-3, 1e-2]),
        # Values written before the setting's name, and comparisons in words.
        ("compare 1e-4 and 3e-4 learning rates on arithmetic", "lr", "a_vs_b", [1e-4, 3e-4]),
        ("best of 0.01, 0.1 and 1 kl on arithmetic", "kl_coef", "best", [0.01, 0.1, 1.0]),
    ],
)
def test_offline_plans_questions_over_any_setting(
    question: str, variable: str, goal: str, coarse: list[float]
) -> None:
    plan = OfflineProvider().plan(question, mode="research")
    assert plan.sweep is not None
    assert (plan.sweep.variable, plan.sweep.goal, plan.sweep.coarse) == (variable, goal, coarse)
    assert len(plan.training.seeds) >= 2 and "power rule" in plan.hypotheses[0].decision_rule
    if variable == "lr":  # the varied setting's value never becomes the plan's fixed training value
        assert plan.training.lr == 2e-4
    if "20 steps" in question:
        assert (plan.training.steps, plan.training.lr) == (20, 1e-4)
    specs = sweep_specs(plan, plan.sweep.coarse, "coarse")
    if resolve_setting(variable, plan.template).target == "training":
        assert [getattr(s.settings, variable) for s in specs[:: len(plan.training.seeds)]] == coarse
    else:  # a template knob: the run's params, the plan's workflow keeps the template default
        assert [s.params[variable] for s in specs[:: len(plan.training.seeds)]] == coarse
        default = next(
            p.default
            for p in templates.get_template(plan.template or "").meta.parameters
            if p.name == variable
        )
        assert plan.params[variable] == default


@pytest.mark.parametrize(
    ("question", "error", "match"),
    [
        ("lr -1 vs 1e-3 on arithmetic", PlanError, r"learning rate \(lr\) = -1 is outside its range"),
        ("effect of kl -0.5 on arithmetic", PlanError, r"\(kl_coef\) = -0.5 is outside its range"),
        (
            "effect of clip 5 on arithmetic",
            PlanError,
            r"clip range ε \(clip_eps\) = 5 is outside its range \[0.01, 1\)",
        ),
        (
            "effect of lr 0.0002 on arithmetic",
            OfflineUnsupported,
            r"other than the reference 0.0002, e.g. 'effect of lr 0.001'",
        ),
        (
            "effect of batch size 2 on arithmetic",
            OfflineUnsupported,
            r"reference 2, e.g. 'effect of batch_size 8'",
        ),
        ("effect of kl 0.1 and 1 on arithmetic", OfflineUnsupported, r"to one value, not 0.1, 1"),
        (
            "find the best batch size and lr on arithmetic",
            OfflineUnsupported,
            r"also names learning rate without a value",
        ),
    ],
)
def test_offline_refuses_what_it_would_misread(question: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        OfflineProvider().plan(question, mode="research")
    assert "\n" not in str(info.value)
    if "e.g." in match:  # the suggested form plans
        suggested = str(info.value).split("e.g. '")[1].rstrip("'")
        plan = OfflineProvider().plan(f"{suggested} on arithmetic", mode="research")
        assert plan.sweep is not None and plan.sweep.goal == "effect_of"


def test_research_dry_run_refuses_a_negative_value_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    refused = CliRunner().invoke(app, ["research", "lr -1 vs 1e-3 on arithmetic", *common])
    assert refused.exit_code != 0 and refused.output.count("\n") == 1 and "= -1 is outside" in refused.output
    assert not (tmp_path / ".a3r").exists() or not any((tmp_path / ".a3r").rglob("workflow.py"))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--seeds", "50"], "the plan's training settings: seeds: List should have at most 16 items"),
        (["--provider", "anthropic"], "the anthropic provider needs ANTHROPIC_API_KEY"),
    ],
)
def test_dry_run_mistakes_end_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], expected: str
) -> None:
    """Found by a fresh user: an out-of-range --seeds printed pydantic's four-line dump, and a missing
    provider key a traceback, under --dry-run only."""
    from typer.testing import CliRunner

    from a3r.app.cli import app

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    result = CliRunner().invoke(app, ["research", "find the best lr on arithmetic", *extra, *common])
    assert result.exception is None or isinstance(result.exception, SystemExit)  # not a traceback
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: ") and expected in result.output, result.output


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [("train werewolf", "werewolves"), ("train the undercover party game", "who_is_the_spy")],
)
def test_offline_maps_specific_names(request_text: str, expected: str) -> None:
    assert OfflineProvider().plan(request_text, mode="vibe").template == expected


@pytest.mark.parametrize("request_text", ["train a game", "multi-agent training", "a social deduction game"])
def test_offline_refuses_loose_matches_in_one_line(request_text: str) -> None:
    with pytest.raises(OfflineUnsupported) as info:
        OfflineProvider().plan(request_text, mode="vibe")
    message = str(info.value)
    assert "\n" not in message and "kind of task" in message and "LLM provider" in message


def test_power_rule() -> None:
    # Two arms, σ = 0.05, δ = 0.1, minimum effect 0.5 σ: (t + z)·σ·√(2/n) <= 0.075 first holds at n = 8.
    assert seeds_per_arm(0.05, 0.1, min_effect=0.025, cap=16) == 8
    assert seeds_per_arm(0.05, 0.1, min_effect=0.025, cap=6) == 6  # the cap
    assert seeds_per_arm(0.01, 0.1, min_effect=0.005) == 2  # little noise: the floor
    assert seeds_per_arm(0.05, 0.02, min_effect=0.025) == 6  # δ below the minimum effect: cap
    # One arm against a threshold, σ = 0.05, δ = 0.1: n = 4 gives (3.18 + 0.84)·0.05/2 = 0.1006 > 0.1, n = 5 fits.
    assert seeds_per_arm(0.05, 0.1, two_sample=False) == 5
    assert seeds_per_arm(float("nan"), 0.1) == 2


def test_dry_run_design_is_staged_with_seeds() -> None:
    plan = OfflineProvider().plan("find the best KL coefficient on arithmetic", mode="research")
    design = design_study(
        plan, seconds_per_episode=1.0, speed_source="assumed", eval_episodes=32, preflight_episodes=64
    )
    assert [s.name for s in design.stages] == ["preflight", "coarse", "refine", "replicate"]
    assert design.stages[1].values == [0.0, 0.01, 0.1, 1.0] and design.stages[1].seeds == 2
    assert design.stages[3].seeds == seeds_per_arm(0.05, 0.1, min_effect=0.025, cap=6)
    assert design.estimated_s > 0 and design.runs == 1 + 8 + 4 + 2 * (design.stages[3].seeds - 2)
    assert coarse_values(plan, []) == plan.sweep.coarse if plan.sweep else False


def test_template_knob_runs_in_a_variant_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    templates.render("arithmetic", {"n_tasks": 4}, ws)
    (ws / "heldout.jsonl").write_text((ws / "tasks.jsonl").read_text())
    (ws / "evaluator").mkdir()
    (ws / "evaluator" / "workflow.py").write_text((ws / "workflow.py").read_text())
    variant = variant_workspace(Workspace(ws), {"max_tokens": 64})
    assert read_params(variant.workflow.read_text())["max_tokens"] == 64
    assert read_params((ws / "workflow.py").read_text())["max_tokens"] == 16  # the study's own is untouched
    # found by a fresh user: the variant's params.json still said the study's value
    assert json.loads((variant.root / "params.json").read_text())["params"]["max_tokens"] == 64
    assert json.loads((ws / "params.json").read_text())["params"]["max_tokens"] == 16
    assert variant.evaluator.resolve() == (ws / "evaluator" / "workflow.py").resolve()
    assert variant.tasks.read_text() == (ws / "tasks.jsonl").read_text()
    assert variant_workspace(Workspace(ws), {"max_tokens": 64}).root == variant.root


def test_research_dry_run_prints_a_staged_plan_and_writes_nothing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    result = CliRunner().invoke(
        app, ["research", "find the best KL coefficient on arithmetic", "--dry-run", *common]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    for line in (
        "varied: KL coefficient β (kl_coef, training setting)",
        "coarse: kl_coef ∈ {0, 0.01, 0.1, 1}; 2 seeds per configuration; 8 run(s)",
        "replicate: 6 seeds per configuration",
        "decision rule: staged",
        "prior findings: no knowledge store",
        "estimated time: ≈",
    ):
        assert line in out, line
    assert not any(tmp_path.iterdir())  # nothing started, written or stored
    refused = CliRunner().invoke(
        app, ["research", "find the best weight decay on arithmetic", "--dry-run", *common]
    )
    assert refused.exit_code == 1 and refused.output.count("\n") == 1 and "weight decay" in refused.output


def test_trainer_serve_options_become_training_settings(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    result = CliRunner().invoke(
        app,
        [
            "vibe",
            "train arithmetic",
            "--serve-option",
            "kl-coef=0.05",
            "--serve-option",
            "ppo-epochs=2",
            *common,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "kl_coef=0.05" in result.output and "ppo_epochs=2" in result.output
    bad = CliRunner().invoke(app, ["vibe", "train arithmetic", "--serve-option", "clip-eps=1.5", *common])
    assert bad.exit_code == 1 and "--clip-eps" in bad.output


def test_an_unstable_value_with_identical_zero_rewards_is_not_settled() -> None:
    """Every held-out reward after training exactly 0 on both seeds: unstable, but the margin's interval
    is degenerate, so the verdict is not settled (the finding stays unconfirmed)."""
    from a3r.graph import RunOutcome
    from a3r.study.analysis import RewardSummary
    from a3r.study.plans import StabilityCriterion
    from a3r.study.research import verdicts

    baseline = RewardSummary(tasks=2, episodes=4, mean_reward=0.375, pass_at_1=0.375, pass_at_2=0.5)
    outcomes = [
        RunOutcome(
            key=f"coarse-batch_size=1-s{seed}",
            run_id=seed,
            purpose="sweep",
            status="finished",
            reason="",
            seed=seed,
            value=1.0,
            curve=[(1, 0.0)],
            eval=RewardSummary(
                tasks=2, episodes=4, mean_reward=0.0, pass_at_1=0.0, pass_at_2=0.0, rewards=[0.0] * 4
            ),
        )
        for seed in (0, 1)
    ]
    (config,) = verdicts(outcomes, baseline=baseline, criterion=StabilityCriterion())
    assert config.stable is False and config.margin is not None
    assert config.margin.verdict.value == "unconfirmed" and not config.settled


def test_dry_run_warns_when_steps_are_fewer_than_the_stability_window(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    question = "find min stable batch size on arithmetic"
    short = CliRunner().invoke(app, ["research", question, "--steps", "1", *common])
    assert short.exit_code == 0, short.output
    assert "warning: 1 step(s) < the stability rule's window of the last 2 steps" in short.output
    assert "the untrained model" in short.output
    enough = CliRunner().invoke(app, ["research", question, "--steps", "2", *common])
    assert enough.exit_code == 0 and "warning: " not in enough.output


def test_dry_run_prices_each_value_and_warns_over_budget(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    plan = OfflineProvider().plan("find min stable batch size on arithmetic", mode="research")
    design = design_study(
        plan, seconds_per_episode=1.0, speed_source="assumed", eval_episodes=8, preflight_episodes=8
    )
    coarse = design.stages[1]
    g, steps = plan.training.group_size, plan.training.steps
    # B = 1, 2, 4, 8 on 2 seeds: episodes per run = steps·B·G + eval (8), plus the server overhead each
    overhead = coarse.seconds - 2 * sum(steps * b * g + 8 for b in (1, 2, 4, 8))
    assert overhead == pytest.approx(8 * SERVER_OVERHEAD_S)
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    question = "find min stable batch size on arithmetic"
    # 15 min: the smallest configuration (B = 1 on 10 seeds, ≈ 13 min with the preflight) fits, the rest
    # does not (below it the dry run refuses: issue 33, see test_stages.py)
    over = CliRunner().invoke(app, ["research", question, "--budget-minutes", "15", "--seeds", "10", *common])
    assert over.exit_code == 0, over.output
    out = over.output
    assert "batch_size ∈ {1, 2, 4, 8}" in out and "1.0" not in out.split("stages:")[1].split("\n")[2]
    assert (
        "warning: the estimate exceeds the budget of 15 min" in out
        and "would drop batch_size values {" in out
    )
    assert "replicate: 10 seeds per configuration; up to 0 run(s)" in out
    assert "coarse {1, 2, 4, 8} on 10 seeds" in out and "at most 10 seeds" in out
    assert "sequential futility test" in out
    roomy = CliRunner().invoke(app, ["research", question, "--budget-minutes", "600", *common])
    assert roomy.exit_code == 0 and "warning" not in roomy.output


def test_dry_run_prices_max_tokens_by_the_token_cap() -> None:
    plan = OfflineProvider().plan("find the best max tokens on arithmetic", mode="research")
    assert plan.sweep is not None and plan.sweep.variable == "max_tokens"
    design = design_study(
        plan, seconds_per_episode=1.0, speed_source="assumed", eval_episodes=8, preflight_episodes=8
    )
    coarse = design.stages[1]
    episodes = plan.training.steps * plan.training.batch_size * plan.training.group_size
    default = resolve_setting("max_tokens", "arithmetic").default  # the template's own default (16)
    assert token_cap(plan) == default
    # training episodes scale with the cap; the 8 evaluation attempts run the frozen evaluator's cap
    expected = len(plan.training.seeds) * sum(
        SERVER_OVERHEAD_S + episodes * v / default + 8 for v in coarse.values
    )
    assert coarse.seconds == pytest.approx(expected)
    # The runner's budget check prices a run with the same function: a budget that holds the dry run's
    # coarse stage keeps every value, and one second less drops the largest cap first under "best".
    specs = sweep_specs(plan, coarse.values, "coarse")
    fit = {"seconds_per_episode": 1.0, "eval_episodes": 8, "goal": "best", "measured_tokens": token_cap(plan)}
    kept, dropped = fit_budget(specs, budget_s=coarse.seconds, **fit)  # type: ignore[arg-type]
    assert len(kept) == len(specs) and not dropped
    _, dropped = fit_budget(specs, budget_s=coarse.seconds - 1, **fit)  # type: ignore[arg-type]
    assert dropped == [max(coarse.values)]


@pytest.mark.parametrize(
    ("question", "refusal"),
    [
        (
            "what is the effect of temperature 0 vs 1 on arithmetic",
            "error: a sampling temperature of 0 samples the same completion for every episode of a GRPO group",
        ),
        # near 0 is refused as 0 is: below 0.1 a group's completions are all but always identical
        (
            "effect of temperature 1e-9 on arithmetic",
            "error: a sampling temperature of 1e-09 is below 0.1, where a token 1 nat behind the top one is drawn",
        ),
        (
            "find min stable batch size on arithmetic with temperature 0.05",
            "error: a sampling temperature of 0.05 is below 0.1",
        ),
        (
            "find the effect of 3 vs 1 minibatches on arithmetic",
            "error: 3 minibatches do not divide the B·G = 2·4 = 8 episodes of a step (B=2, G=4): use one of "
            "1, 2, 4, 8",
        ),
    ],
)
def test_configurations_grpo_cannot_train_are_refused_in_one_line(
    tmp_path: Path, question: str, refusal: str
) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    refused = CliRunner().invoke(app, ["research", question, *common])
    assert refused.exit_code == 1 and refused.output.count("\n") == 1, refused.output
    assert refused.output.startswith(refusal)
    fine = CliRunner().invoke(
        app, ["research", "find the effect of 2 vs 1 minibatches on arithmetic", *common]
    )
    assert fine.exit_code == 0, fine.output
    draft = OfflineProvider().plan("train arithmetic", mode="vibe")
    odd = draft.model_copy(update={"training": draft.training.model_copy(update={"minibatches": 3})})
    with pytest.raises(PlanError, match="3 minibatches do not divide"):
        check_plan(odd)


def test_dry_runs_price_episodes_at_the_stored_speed_of_the_template(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app
    from memory import Store

    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    fresh = CliRunner().invoke(app, ["vibe", "train arithmetic", *common])
    assert fresh.exit_code == 0, fresh.output
    assert (
        "at 1.00 s per episode (assumed from the template: at most 1 model call of up to 16 tokens in all per "
        "episode, at 0.5 s a call + 32 tokens/s on 2 CPU cores; no earlier run of this template and model in "
        "the store" in fresh.output
    )
    with Store(tmp_path / "memory.db") as store:
        study = store.create_study("train arithmetic", kind="vibe")
        experiment = store.create_experiment(study.id, "arithmetic-train", template="arithmetic")
        for speed, model in ((2.5, "embedded"), (3.5, "embedded"), (0.1, "other/model"), (3.0, "embedded")):
            run = store.start_run(experiment.id, config={"purpose": "train", "model": model})
            store.finish_run(run.id, final_metrics={"seconds_per_episode": speed})
        other = store.create_experiment(study.id, "countdown-train", template="countdown")
        run = store.start_run(other.id, config={"purpose": "train", "model": "embedded"})
        store.finish_run(run.id, final_metrics={"seconds_per_episode": 9.0})
    stored = CliRunner().invoke(app, ["vibe", "train arithmetic", *common])
    assert stored.exit_code == 0, stored.output
    # the median of the three embedded-model arithmetic runs; the other model and template do not count
    assert "at 3.00 s per episode (measured: the median of 3 earlier arithmetic run(s) in " in stored.output
    research = CliRunner().invoke(app, ["research", "find the best KL coefficient on arithmetic", *common])
    assert research.exit_code == 0 and "at 3.00 s per episode (measured: the median of 3" in research.output
    # the plan states the preflight's time budget and what a cut attempt counts as
    assert "at most 285 s, server start included: attempts still under way then are cut and count as no" in (
        research.output
    )


def test_a_design_whose_coarse_runs_are_all_reused_prices_the_runs_left() -> None:
    """Found by a fresh user: an A-vs-B plan whose two arms earlier studies measured on 2 seeds printed
    "≈ 0.0 min" for its 8 replicate runs (priced at the dearest coarse run still to run: none)."""
    from a3r.graph import RunOutcome
    from a3r.study.design import PriorFinding

    plan = OfflineProvider().plan("lr 1e-4 vs 1e-3 on arithmetic", mode="research")
    assert plan.sweep is not None

    def prior(value: float, seeds: int) -> PriorFinding:
        outcomes = [
            RunOutcome(key=f"coarse-lr={value:g}-s{s}", run_id=s, purpose="sweep", status="finished", reason="",
                       seed=s, value=value)
            for s in range(seeds)
        ]  # fmt: skip
        return PriorFinding(finding_id=1, study_id=1, statement="x", value=value, status="unconfirmed",
                            outcomes=outcomes)  # fmt: skip

    common = {
        "seconds_per_episode": 1.0,
        "speed_source": "assumed",
        "eval_episodes": 8,
        "preflight_episodes": 8,
    }
    fresh = design_study(plan, **common)  # type: ignore[arg-type]
    reused = design_study(plan, priors=[prior(v, 2) for v in plan.sweep.coarse], **common)  # type: ignore[arg-type]
    coarse, replicate = reused.stages[1], reused.stages[-1]
    assert coarse.runs == 0 and coarse.seconds == 0 and reused.reused_runs == 4
    assert replicate.runs == fresh.stages[-1].runs == 8
    assert replicate.seconds == pytest.approx(fresh.stages[-1].seconds) and replicate.seconds > 0
    assert reused.runs == fresh.runs - 4 and reused.estimated_s > reused.stages[0].seconds
    # arms that already have the power rule's seeds need no replicate run
    full = design_study(plan, priors=[prior(v, 6) for v in plan.sweep.coarse], **common)  # type: ignore[arg-type]
    assert full.stages[-1].runs == 0 and full.reused_runs == 12


def test_the_pre_registered_rule_names_the_threshold_the_verdict_applies() -> None:
    """Found by a fresh user: the plan pre-registered "differs by at least δ = 0.1" while the verdict
    applied a minimum effect of 0.5 σ, two thresholds. The rule now names one threshold, m = 0.5 σ, the
    one `a3r.study.effects` applies, and says that the effect to detect (0.1) only sizes the seeds: a
    difference of 0.05 whose interval clears m is confirmed, as pre-registered."""
    from a3r.graph import RunOutcome
    from a3r.graph.reporter import _comparison_conclusion
    from a3r.study.analysis import RewardSummary
    from a3r.study.design import MINIMUM_EFFECT

    plan = OfflineProvider().plan("lr 1e-4 vs 1e-3 on arithmetic", mode="research")
    assert plan.sweep is not None and (plan.sweep.effect_size or 0.1) == 0.1
    (hypothesis,) = plan.hypotheses
    for text in (hypothesis.expected_outcome, hypothesis.decision_rule):
        assert MINIMUM_EFFECT in text and "δ" not in text, text
    assert (
        "The effect to detect (0.1) only sizes the seeds and is not a threshold" in hypothesis.decision_rule
    )

    def run(value: float, seed: int, mean: float) -> RunOutcome:
        summary = RewardSummary(tasks=4, episodes=8, mean_reward=mean, pass_at_1=mean, pass_at_2=mean)
        return RunOutcome(key=f"{value:g}-{seed}", run_id=seed, purpose="sweep", status="finished", reason="",
                          seed=seed, value=value, eval=summary)  # fmt: skip

    a, b = plan.sweep.coarse[:2]
    outcomes = [run(a, s, m) for s, m in enumerate((0.30, 0.31, 0.29, 0.30))]
    outcomes += [run(b, s, m) for s, m in enumerate((0.35, 0.36, 0.34, 0.35))]
    text, status = _comparison_conclusion({"plan": plan, "outcomes": outcomes}, [], "lr", "a_vs_b")  # type: ignore[typeddict-item]
    assert status.value == "confirmed" and "+0.050" in text, text  # below 0.1, above m
    assert "(= 0.5 σ, σ = " in text  # the verdict names the same m as the rule


def test_multi_turn_templates_are_priced_by_their_turns_and_tokens(tmp_path: Path) -> None:
    """Found by a fresh user: every template's dry run assumed 1 s per episode, a multi-turn game too (a
    3-player who-is-the-spy game measured 12.2–12.8 s). Before any run is stored, an episode is priced by
    the template's model calls and their token limits, and the line says what that assumes."""
    from typer.testing import CliRunner

    from a3r.app.cli import app
    from a3r.study.design import ASSUMED_SECONDS_PER_CALL, ASSUMED_TOKENS_PER_S, assumed_speed

    spy = templates.get_template("who_is_the_spy")
    calls = spy.episode_calls()  # 3 players describe (24 tokens) and vote (8) in each of 2 rounds
    assert calls is not None and len(calls) == 12 and sum(calls) == 2 * 3 * (24 + 8)
    bigger = spy.episode_calls({"n_players": 4, "max_rounds": 3})
    assert bigger is not None and len(bigger) == 24
    assert templates.get_template("arithmetic").episode_calls() == [16]  # one call of max_tokens
    wolves = templates.get_template(
        "werewolves"
    ).episode_calls()  # 5 players, 1 wolf, seer/witch/hunter, 2 days
    assert wolves is not None and len(wolves) == 2 * (1 + 2 + 5 + 5 + 1)
    seconds, assumes = assumed_speed("who_is_the_spy", {})
    assert seconds == pytest.approx(12 * ASSUMED_SECONDS_PER_CALL + 192 / ASSUMED_TOKENS_PER_S) == 12.0
    assert assumes.startswith("assumed from the template: at most 12 model calls of up to 192 tokens")
    assert assumed_speed("who_is_the_spy", {"n_players": 4, "max_rounds": 3})[0] > seconds
    assert assumed_speed(None, {})[0] == 1.0  # generated code says nothing of its calls
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    dry = CliRunner().invoke(app, ["vibe", "train who-is-the-spy", *common])
    assert dry.exit_code == 0, dry.output
    assert (
        "at 12.00 s per episode (assumed from the template: at most 12 model calls of up to 192 tokens"
        in (dry.output)
    )
    research = CliRunner().invoke(app, ["research", "best temperature on who is the spy", *common])
    assert research.exit_code == 0 and "at 12.00 s per episode (assumed from the template" in research.output
