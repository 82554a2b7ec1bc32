"""How the offline planner reads a research question, and how it refuses one it cannot plan: true/false
template parameters as A vs B and effect-of, suggestions that plan when followed, values that are not
numbers, and the settings a refusal lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from a3r.errors import A3RError, OfflineUnsupported, PlanError
from a3r.providers import OfflineProvider
from a3r.study.design import hypotheses_for
from a3r.study.plans import PlanDraft, SweepSpec, check_plan
from a3r.study.request import check_request
from a3r.study.research import sweep_specs
from a3r.study.settings import resolve_setting


def _research(question: str) -> PlanDraft:
    return OfflineProvider().plan(question, mode="research")


def _quoted(message: str) -> list[str]:
    """The questions a refusal suggests, as it quotes them."""
    return re.findall(r"'([^']+)'", message)


# ------------------------------------------------------------------------------- true/false knobs
@pytest.mark.parametrize(
    ("question", "goal", "coarse", "objective"),
    [
        # found by a fresh user: refused, suggesting 'hide_leaks 1 vs 2'
        (
            "hide_leaks true vs false on who-is-the-spy",
            "a_vs_b",
            [1, 0],
            "compare hide leaks true (A) with false (B)",
        ),
        ("hide_leaks=true vs hide_leaks=false on who-is-the-spy", "a_vs_b", [1, 0], None),
        # found by a fresh user: refused ("which question about hide leaks?"), "on on" read as one word
        (
            "hide_leaks off vs on on who-is-the-spy",
            "a_vs_b",
            [0, 1],
            "compare hide leaks false (A) with true (B)",
        ),
        ("effect of tell_roles on on who-is-the-spy", "effect_of", [0, 1], None),
        (
            "is tell roles on better than off on who-is-the-spy",
            "a_vs_b",
            [0, 1],
            "does tell roles true beat false?",
        ),
        # found by a fresh user: "other than the reference 1, e.g. 'effect of hide_leaks 0'"
        (
            "effect of hide_leaks on who-is-the-spy",
            "effect_of",
            [1, 0],
            "the effect of hide leaks true → false",
        ),
        ("effect of hide_leaks off on who-is-the-spy", "effect_of", [1, 0], None),
        (
            "effect of tell_roles on who-is-the-spy",
            "effect_of",
            [0, 1],
            "the effect of tell roles false → true",
        ),
    ],
)
def test_a_true_false_knob_is_studied_as_a_vs_b_or_effect_of(
    question: str, goal: str, coarse: list[float], objective: str | None
) -> None:
    plan = _research(question)
    assert plan.sweep is not None
    assert (plan.sweep.goal, plan.sweep.coarse, plan.sweep.refine) == (goal, coarse, False)
    if objective is not None:
        assert plan.objective == objective
    variable = plan.sweep.variable
    # each run sets the switch to a bool; the plan's workflow keeps the template default
    specs = sweep_specs(plan, plan.sweep.coarse, "coarse")
    assert {s.params[variable] for s in specs} == {True, False}
    assert {s.key.split("-s")[0] for s in specs} == {f"coarse-{variable}=true", f"coarse-{variable}=false"}
    hypothesis = plan.hypotheses[0]
    text = f"{hypothesis.statement} {hypothesis.decision_rule}"
    assert "true" in text and "false" in text
    assert not re.search(r"(?<![\w.])[01](?![\w.])", hypothesis.statement)  # never 0 or 1


@pytest.mark.parametrize(
    ("question", "refusal"),
    [
        ("find the best hide_leaks on who-is-the-spy", "a best value is not a question"),
        ("find min stable hide_leaks on who-is-the-spy", "a minimal stable value is not a question"),
        ("hide_leaks true vs false vs yes on who-is-the-spy", "a best value is not a question"),
        ("what about hide_leaks on who-is-the-spy", "which question about hide leaks"),
        ("effect of hide_leaks true on who-is-the-spy", "other than the reference true"),
        (
            "hide_leaks 1 vs 2 on who-is-the-spy",
            r"hide leaks \(hide_leaks\) is true or false \(1 or 0\), not 2",
        ),
    ],
)
def test_a_true_false_knob_is_refused_in_one_line_naming_questions_that_plan(
    question: str, refusal: str
) -> None:
    with pytest.raises(A3RError, match=refusal) as caught:
        _research(question)
    message = str(caught.value)
    assert "\n" not in message and " 0'" not in message and " 1'" not in message
    for suggested in [q for q in _quoted(message) if "hide_leaks" in q]:
        plan = _research(f"{suggested} on who-is-the-spy")
        assert plan.sweep is not None and plan.sweep.goal in ("a_vs_b", "effect_of")


def test_every_plan_refuses_a_search_over_a_switch() -> None:
    """An LLM's plan passes the same gate: a best or min-stable sweep over true/false is refused."""
    for goal in ("best", "min_stable"):
        draft = PlanDraft(
            kind="research",
            template="who_is_the_spy",
            objective="x",
            training={"seeds": [0, 1]},
            sweep=SweepSpec(variable="hide_leaks", coarse=[0, 1], goal=goal),
        )
        with pytest.raises(PlanError, match=r"is true or false.*'hide_leaks true vs false'"):
            check_plan(draft)
    effect = PlanDraft(
        kind="research",
        template="who_is_the_spy",
        objective="x",
        training={"seeds": [0, 1]},
        sweep=SweepSpec(variable="hide_leaks", coarse=[1, 0], goal="effect_of", refine=False),
    )
    assert "from true (reference) to false" in hypotheses_for(check_plan(effect))[0].statement


def test_the_dry_run_prints_a_switch_as_true_and_false(tmp_path: Path) -> None:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    result = CliRunner().invoke(app, ["research", "effect of hide_leaks on who-is-the-spy", *common])
    assert result.exit_code == 0, result.output
    assert "plan (dry run, provider offline): the effect of hide leaks true → false" in result.output
    assert "coarse: hide_leaks ∈ {true, false}" in result.output
    assert "changing hide leaks from true (reference) to false" in result.output


# ---------------------------------------------------------------------------- refusals that plan
@pytest.mark.parametrize(
    ("question", "template"),
    [
        ("what about lr on arithmetic", "arithmetic"),
        ("what about batch size on arithmetic", "arithmetic"),
        ("what about temperature on arithmetic", "arithmetic"),
        ("what about kl on countdown", "countdown"),
        ("what about leak_penalty on who-is-the-spy", "who-is-the-spy"),
        ("what about tell_roles on who-is-the-spy", "who-is-the-spy"),
    ],
)
def test_which_question_refusal_suggests_questions_that_plan(question: str, template: str) -> None:
    """Found by a fresh user: the refusal suggested 'lr 1 vs 2' (lr 2 is out of range)."""
    with pytest.raises(OfflineUnsupported, match="which question about") as caught:
        _research(question)
    suggested = _quoted(str(caught.value))
    assert len(suggested) >= 2
    for form in suggested:
        plan = _research(f"{form} on {template}")
        assert plan.sweep is not None and plan.sweep.variable in form.replace(" ", "_")


# ------------------------------------------------------------------------------------- two tasks
@pytest.mark.parametrize(
    "question",
    [
        # found by a fresh user: each was planned on one of the two tasks, without a word
        "lr 1e-4 vs 1e-3 on arithmetic then countdown numbers game",
        "best lr on gsm8k and arithmetic",
        "best lr on who is the spy and werewolves",
        "best lr on the spy game and arithmetic",
        "find the best lr on math word problems and arithmetic",
        # refused before, as two templates named equally
        "compare arithmetic and countdown lr",
        "lr 1e-4 vs 1e-3 on arithmetic with countdown max_tokens",
    ],
)
@pytest.mark.parametrize("mode", ["research", "vibe"])
def test_a_request_naming_two_tasks_is_refused_in_one_line(question: str, mode: str) -> None:
    with pytest.raises(
        PlanError, match=r"the request names 2 tasks \(.+, .+\); a study runs on one task"
    ) as caught:
        OfflineProvider().plan(question, mode=mode)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("question", "template"),
    [
        (
            "find the best lr on countdown arithmetic puzzle",
            "countdown",
        ),  # countdown's keyword, not arithmetic
        ("find the best lr on countdown with a small model", "countdown"),  # a description, not a task
        ("find the best lr on a toy task", "arithmetic"),
        ("find the best lr on countdown with multiplication only", "countdown"),
        ("find the best lr on arithmetic sums that reach a target number", "arithmetic"),
    ],
)
def test_one_task_with_a_description_is_planned(question: str, template: str) -> None:
    assert _research(question).template == template


# ---------------------------------------------------------------------------------- not numbers
@pytest.mark.parametrize(
    ("question", "refusal"),
    [
        # found by a fresh user: nan got the range message, or was passed over
        ("lr nan vs 1e-3 on arithmetic", r"'lr nan': nan and inf are not numbers"),
        ("effect of lr nan on arithmetic", r"'lr nan': nan and inf are not numbers"),
        ("find the best lr on arithmetic lr=nan", r"lr=nan: nan and inf are not numbers"),
        ("find the best kl on arithmetic lr=nan", r"lr=nan: nan and inf are not numbers"),
        ("find the best lr on arithmetic temperature=inf", r"temperature=inf: nan and inf are not numbers"),
        (
            "find the best lr on arithmetic with temperature nan",
            r"'temperature nan': nan and inf are not numbers",
        ),
        ("find the best lr on arithmetic seeds=nan", r"seeds=nan: nan and inf are not numbers"),
        ("kl 0.1 vs inf on arithmetic", r"KL coefficient β \(kl_coef\) = inf: nan and inf are not numbers"),
    ],
)
def test_nan_and_inf_are_refused_as_not_numbers(question: str, refusal: str) -> None:
    with pytest.raises(PlanError, match=refusal) as caught:
        _research(question)
    assert "\n" not in str(caught.value) and "range" not in str(caught.value)


# ------------------------------------------------------------------------------- what can vary
def test_a_refusal_lists_each_setting_once_and_only_what_can_vary() -> None:
    """Found by a fresh user: max_tokens and temperature were listed twice, and level, n_tasks and seed
    (which change the task data) were listed as knobs."""
    with pytest.raises(OfflineUnsupported, match="names no setting to vary") as caught:
        _research("what about arithmetic")
    training, knobs = (group.split(", ") for group in re.findall(r"\(([^()]*)\)", str(caught.value))[:2])
    names = training + knobs
    assert len(names) == len(set(names)), names
    assert {"level", "n_tasks", "seed"}.isdisjoint(names)
    assert knobs == ["fewshot", "max_tokens", "temperature"]
    for name in names:  # every setting listed can be varied
        assert resolve_setting(name, "arithmetic").name == name


# ---------------------------------------------------------------------------- --serve-option hints
@pytest.mark.parametrize("command", ["vibe", "research"])
@pytest.mark.parametrize(
    "key", ["batch-size", "group-size", "max-steps", "lr", "lora-rank", "train", "training-config"]
)
def test_a_plan_serve_option_hint_names_options_the_command_has(
    tmp_path: Path, command: str, key: str
) -> None:
    """Found by a fresh user: research's hint for --serve-option batch-size named --batch-size, which
    a3r research does not have."""
    import typer.main

    group = typer.main.get_command(app)
    click_command = group.get_command(None, command)  # type: ignore[attr-defined]  # resolves the lazy command
    has = {opt for param in click_command.params for opt in param.opts}
    request = "train arithmetic" if command == "vibe" else "find the best kl on arithmetic"
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    result = CliRunner().invoke(app, [command, request, "--serve-option", f"{key}=3", *common])
    assert result.exit_code == 1 and result.output.startswith(f"error: --serve-option {key}: ")
    assert len(result.output.strip().splitlines()) == 1
    named = set(re.findall(r"--[a-z][a-z-]+", result.output)) - {"--serve-option"}
    assert named <= has, named - has
    written = re.search(r"write (\w+)=<value> in the request", result.output)
    if written:  # the pair the hint suggests plans, with its value
        pair = f"{written.group(1)}={'1e-3' if written.group(1) == 'lr' else 8}"
        plan = OfflineProvider().plan(f"{request} {pair}", mode=command if command == "research" else "vibe")
        assert getattr(plan.training, written.group(1)) == (1e-3 if written.group(1) == "lr" else 8)


# ------------------------------------------------------------------------------ budget warning
@pytest.mark.parametrize(
    ("question", "budget", "later"),
    [
        # found by a fresh user: the A-vs-B warning named a refine stage it does not have
        ("lr 1e-4 vs 1e-3 on arithmetic", "10", "the replicate stage stops"),
        # the spy game is priced by its turns (≈ 12 s an episode), so its coarse stage needs more time
        ("effect of hide_leaks on who-is-the-spy", "60", "the replicate stage stops"),
        ("find the best lr on arithmetic", "20", "the refine and replicate stages stop"),
    ],
)
def test_the_over_budget_warning_names_the_stages_the_design_has(
    tmp_path: Path, question: str, budget: str, later: str
) -> None:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    result = CliRunner().invoke(app, ["research", question, "--budget-minutes", budget, *common])
    assert result.exit_code == 0, result.output
    stages = re.findall(r"^    (\w+): ", result.output, re.MULTILINE)
    (warning,) = [line for line in result.output.splitlines() if "warning: the estimate exceeds" in line]
    assert warning.endswith(f"the coarse stage fits; {later} when the budget runs out")
    assert ("refine" in warning) == ("refine" in stages)


@pytest.mark.parametrize(
    "question", ["temperature 1 vs 0.7 on arithmetic", "effect of hide_leaks on who-is-the-spy"]
)
def test_a_comparison_that_cannot_fit_is_said_in_the_dry_run_and_refused_before_it_starts(
    tmp_path: Path, question: str
) -> None:
    """Found by a fresh user: the dry run said "the runner would drop temperature values {1} from the
    coarse stage" (the reference arm), while the real run ran the preflight and then stopped, since one
    arm alone cannot answer a comparison."""
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    dry = CliRunner().invoke(app, ["research", question, "--budget-minutes", "0.5", "--dry-run", *common])
    # issue 33 (5): a dry run of which not one stage fits refuses in one line, as the real run does
    assert dry.exit_code == 1 and len(dry.output.strip().splitlines()) == 1, dry.output
    (warning,) = dry.output.strip().splitlines()
    need = re.search(
        r"the preflight need ≈ ([\d.]+) min at [\d.]+ s per episode \(.*\); give --budget-minutes \1 or more$",
        warning,
    )
    assert warning.startswith("error: the comparison does not fit the budget of 0.5 min: both ") and need
    assert "drop" not in warning
    run = CliRunner().invoke(app, ["research", question, "--budget-minutes", "0.5", *common])
    assert run.exit_code == 1 and len(run.output.strip().splitlines()) == 1
    assert run.output.startswith("error: the comparison does not fit the budget of 0.5 min: both ")
    assert not (tmp_path / ".a3r").exists() and not (tmp_path / "memory.db").exists()  # nothing started
    enough = CliRunner().invoke(
        app, ["research", question, "--budget-minutes", need.group(1), "--dry-run", *common]
    )
    assert "the comparison does not fit" not in enough.output


# ------------------------------------------------------------------------ knobs never dropped
def test_a_template_knob_written_with_its_value_is_used_or_refused() -> None:
    """Found while checking these: 'with leak_penalty 0.3' was planned without it, on who-is-the-spy
    (the default 0.5 kept) and on arithmetic (which has no such parameter)."""
    plan = _research("find the best lr on who-is-the-spy with leak_penalty 0.3")
    assert plan.params["leak_penalty"] == 0.3
    assert OfflineProvider().plan("train arithmetic with n_tasks 64", mode="vibe").params["n_tasks"] == 64
    with pytest.raises(
        PlanError, match=r"unknown setting leak_penalty in the request, neither a parameter of arithmetic"
    ):
        _research("find the best lr on arithmetic with leak_penalty 0.3")
    with pytest.raises(OfflineUnsupported, match="also names leak penalty without a value"):
        _research("find the best lr on who-is-the-spy and leak penalty")
    with pytest.raises(
        OfflineUnsupported, match=r"also gives leak penalty 0.1, 0.3; .* one setting per study"
    ):
        _research("find the best lr on who-is-the-spy with leak_penalty 0.1 and 0.3")


# ------------------------------------------------------------------ knobs named *_max_tokens
@pytest.mark.parametrize(
    ("question", "variable", "goal", "coarse"),
    [
        # found by a fresh user: "varies describe max tokens and also names max response tokens"
        ("find the best describe_max_tokens on who-is-the-spy", "describe_max_tokens", "best", None),
        ("describe_max_tokens 16 vs 32 on who-is-the-spy", "describe_max_tokens", "a_vs_b", [16, 32]),
        ("find the best describe max tokens on who-is-the-spy", "describe_max_tokens", "best", None),
        ("vote_max_tokens 4 vs 8 on who-is-the-spy", "vote_max_tokens", "a_vs_b", [4, 8]),
        ("find the best speak_max_tokens on werewolves", "speak_max_tokens", "best", None),
        ("action-max-tokens 4 vs 8 on werewolves", "action_max_tokens", "a_vs_b", [4, 8]),
        ("find the best max tokens on arithmetic", "max_tokens", "best", None),
    ],
)
def test_a_knob_whose_name_holds_max_tokens_is_that_knob(
    question: str, variable: str, goal: str, coarse: list[float] | None
) -> None:
    plan = _research(question)
    assert plan.sweep is not None
    assert (plan.sweep.variable, plan.sweep.goal) == (variable, goal)
    if coarse is not None:
        assert plan.sweep.coarse == coarse


def test_a_vibe_reads_a_knob_whose_name_holds_max_tokens() -> None:
    plan = OfflineProvider().plan("train who-is-the-spy with describe max tokens 16", mode="vibe")
    assert plan.params["describe_max_tokens"] == 16


# ------------------------------------------------------------------------------- two datasets
@pytest.mark.parametrize(
    ("question", "mode", "named"),
    [
        # found by a fresh user: each was planned on the dataset named last or first, without a word
        ("lr 1e-4 vs 1e-3 on gsm8k and aime", "research", "gsm8k, aime"),
        ("find the best lr on aime and gsm8k", "research", "aime, gsm8k"),
        ("train math on aime and gsm8k", "vibe", "aime, gsm8k"),
        ("find the best lr on aime 2024 and aime 2025", "research", "aime24, aime25"),
    ],
)
def test_a_request_naming_two_datasets_is_refused_in_one_line(question: str, mode: str, named: str) -> None:
    with pytest.raises(
        PlanError, match=rf"the request names 2 datasets \({named}\); a plan runs on one"
    ) as caught:
        OfflineProvider().plan(question, mode=mode)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    for written in re.findall(r"dataset=\w+", str(caught.value)):  # the suggested pairs plan
        assert OfflineProvider().plan(f"{question} {written}", mode=mode).params["dataset"] == written[8:]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("question", "dataset"),
    [
        ("find the best lr on aime 2024", "aime24"),
        ("find the best lr on aime24 math", "aime24"),
        ("find the best lr on gsm8k", "gsm8k"),
    ],
)
def test_one_dataset_is_read(question: str, dataset: str) -> None:
    assert _research(question).params["dataset"] == dataset


# ------------------------------------------------------------------------- a setting given twice
@pytest.mark.parametrize(
    ("question", "refusal"),
    [
        # found by a fresh user: planned as "find the best learning rate among 0.0001, 0.001, 0.0003"
        (
            "lr 1e-4 vs 1e-3 on arithmetic lr=3e-4",
            r"learning rate \(lr\) is given twice with different values \(0.0001, 0.001; 0.0003\)",
        ),
        ("lr 1e-4 vs 1e-3 on arithmetic with lr 1e-3", r"learning rate \(lr\) is given twice"),
        (
            "hide_leaks true vs false on who-is-the-spy hide_leaks=true",
            r"hide leaks \(hide_leaks\) is given twice",
        ),
    ],
)
def test_a_varied_setting_given_twice_with_different_values_is_refused(question: str, refusal: str) -> None:
    with pytest.raises(PlanError, match=refusal) as caught:
        _research(question)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("question", "coarse"),
    [
        ("lr=1e-4 vs lr=1e-3 on arithmetic", [1e-4, 1e-3]),
        ("batch size 8 beats batch size 2 on arithmetic", [2, 8]),
        ("lr 1e-4 vs 1e-3 on arithmetic, lr 1e-4 vs 1e-3", [1e-4, 1e-3]),  # the same values again
    ],
)
def test_a_varied_setting_named_with_each_value_is_one_question(question: str, coarse: list[float]) -> None:
    plan = _research(question)
    assert plan.sweep is not None and plan.sweep.coarse == coarse


# ------------------------------------------------------------------------------ counts in words
@pytest.mark.parametrize(
    ("request_", "template", "read"),
    [
        # found by a fresh user: n_spies stayed 1, "parameters read from the request: none"
        ("train who-is-the-spy with 2 spies and 6 players", "who_is_the_spy", {"n_spies": 2, "n_players": 6}),
        (
            "train who-is-the-spy with two spies and six players",
            "who_is_the_spy",
            {"n_spies": 2, "n_players": 6},
        ),
        ("train who-is-the-spy with 3 rounds", "who_is_the_spy", {"max_rounds": 3}),
        ("train werewolves with 2 werewolves and 3 days", "werewolves", {"n_werewolves": 2, "max_days": 3}),
        ("train countdown with 4 numbers", "countdown", {"n_numbers": 4}),
    ],
)
def test_a_count_in_words_is_read(request_: str, template: str, read: dict[str, int]) -> None:
    plan = OfflineProvider().plan(request_, mode="vibe")
    assert plan.template == template
    assert {name: plan.params[name] for name in read} == read
    assert all(f"{name} = {value}" in plan.rationale for name, value in read.items())


@pytest.mark.parametrize(
    ("request_", "refusal"),
    [
        ("train who-is-the-spy with 2 spies", r"'n_spies': 2 spies is not fewer than half of 3 players"),
        ("train who-is-the-spy with 5 spies and 8 players", r"'n_spies': 5 is above the maximum 3"),
        ("train who-is-the-spy with 2.5 players", r"'n_players': expected an int, got 2.5"),
        ("train who-is-the-spy with inf players", r"'inf players': nan and inf are not numbers"),
        ("train arithmetic with 3 rounds", r"'3 rounds': the arithmetic template has no parameter for it"),
        ("train math on 100 tasks", r"'100 tasks': the math template has no parameter for it"),
    ],
)
def test_a_count_in_words_is_range_checked_or_refused(request_: str, refusal: str) -> None:
    with pytest.raises(PlanError, match=refusal) as caught:
        OfflineProvider().plan(request_, mode="vibe")
    assert "\n" not in str(caught.value)


def test_an_unknown_setting_is_refused_without_a_stray_colon() -> None:
    """Found by a fresh user: '…nor a training setting: (parameters…' when no name is near."""
    with pytest.raises(PlanError) as caught:
        OfflineProvider().plan("train who-is-the-spy top_p=0.9", mode="vibe")
    assert "nor a training setting (parameters of who_is_the_spy: " in str(caught.value)
    with pytest.raises(PlanError, match=r"nor a training setting: did you mean leak_penalty or "):
        OfflineProvider().plan("train who-is-the-spy leak_penalti=0.9", mode="vibe")


def test_any_providers_plan_of_a_request_naming_two_datasets_is_refused() -> None:
    """An LLM's plan passes the same check: it too would keep one of the two datasets."""
    draft = check_plan(PlanDraft(kind="train", template="math", params={"dataset": "aime"}, objective="x"))
    with pytest.raises(PlanError, match=r"the request names 2 datasets \(gsm8k, aime\)"):
        check_request("train math on gsm8k and aime", draft)
    assert check_request("train math on aime", draft) is draft
