"""The planner (supervisor): interprets the request once, then routes after every analysed run.

First visit: the provider's plan (template, parameters, settings, hypotheses, sweep, stability
definition) is written into the store (study and hypotheses, before any run) and the first runs are
queued. Later visits: queued runs go to the runner; a research thread moves through its stages
(preflight → coarse → refine, `a3r.study.research`); when nothing is left, the reporter concludes.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import ValidationError

from a3r.errors import PlanError
from a3r.graph.context import RunContext
from a3r.graph.records import ensure_hypotheses, ensure_study, prior_findings
from a3r.graph.state import ResearchState
from a3r.study.analysis import RewardSummary
from a3r.study.design import (
    BEST_REFINE_ROUNDS,
    MIN_STABLE_REFINE_ROUNDS,
    PriorFinding,
    best_refine_values,
    check_overrides,
    coarse_values,
    design_study,
    replicate_additions,
    restate_for_training,
)
from a3r.study.plans import (
    PlanDraft,
    StabilityCriterion,
    TrainingSettings,
    check_plan,
    temperature_warning,
    training_line,
)
from a3r.study.research import (
    SAFETY_SHARE,
    estimate_run_s,
    eval_reserve_s,
    fit_budget,
    initial_queue,
    min_stable_value,
    refine_values,
    size_training,
    sweep_specs,
    token_cap,
    verdicts,
)
from a3r.study.runs import RunSpec
from a3r.study.sequential import SignalCheck
from a3r.study.settings import resolve_setting, value_text
from a3r.study.wording import counted

__all__ = ["planner"]

Route = Literal["coder", "runner", "reporter"]

_FAILED = re.compile(r"\d+ of \d+ held-out attempts failed.*$")
"""The evaluation's note on failed attempts (`a3r.swarmops.execution`), the last part of a run's reason."""


def planner(state: ResearchState, runtime: Runtime[RunContext]) -> Command[Route]:
    """Plan on the first visit; afterwards pick the next runs or hand over to the reporter."""
    ctx = runtime.context
    if state.get("plan") is None:
        return _first_plan(state, ctx)
    if state.get("queue"):
        return _size_to_budget(state, ctx) or Command(goto="runner")
    if state["mode"] == "vibe" or state.get("conclusion"):
        return Command(goto="reporter")
    return _research_step(state, ctx)


def _size_to_budget(state: ResearchState, ctx: RunContext) -> Command[Route] | None:
    """Once, after the smoke run: fit the training run to the budget left at the speed the smoke run
    measured, keeping time for the held-out evaluation and a `SAFETY_SHARE` margin (`size_training`:
    a smaller B first, fewer steps only when even B = 1 does not fit). ``None`` when there is nothing
    to size."""
    outcomes = state.get("outcomes", [])
    queue = list(state.get("queue") or [])
    if (
        state.get("sizing")
        or state["mode"] != "vibe"
        or not outcomes
        or outcomes[-1].purpose != "smoke"
        or outcomes[-1].status != "finished"
        or queue[0].purpose != "train"
        or queue[0].start_step != 0
    ):
        return None
    head = queue[0]
    runs = [i for i, spec in enumerate(queue) if spec.purpose == "train" and spec.start_step == 0]
    budget_left = ctx.budget_left_s(state.get("outcomes", []))
    sizing = size_training(
        head.settings,
        seconds_per_episode=outcomes[-1].seconds_per_episode,
        budget_s=budget_left,
        reserve_s=eval_reserve_s(head, outcomes, budget_s=budget_left),
        margin_s=SAFETY_SHARE * ctx.budget_s,
        runs=len(runs),
    )
    # Every seed trains the same game (comparable seeds), and the plan says what runs: a continuation
    # after a patch (`a3r.graph.analyst.continuation`) and the report read it.
    sized = {"steps": sizing.steps, "batch_size": sizing.batch_size}
    for i in runs:
        queue[i] = queue[i].model_copy(update={"settings": queue[i].settings.model_copy(update=sized)})
    plan = state["plan"]
    plan = plan.model_copy(update={"training": plan.training.model_copy(update=sized)})
    ctx.store.log_event(sizing.note, study_id=state["study_id"])
    ctx.say(sizing.note)
    return Command(
        goto="runner",
        update={"queue": queue, "plan": plan, "sizing": sizing.note, "log": [sizing.note]},
    )


def _first_plan(state: ResearchState, ctx: RunContext) -> Command[Route]:
    request, mode = state["request"], state["mode"]
    plan = ctx.provider.plan(request, mode=mode)
    overrides = state.get("overrides") or {}
    if overrides:
        check_overrides(plan, overrides)
        try:
            training = TrainingSettings.model_validate({**plan.training.model_dump(), **overrides})
        except ValidationError as exc:
            raise PlanError(
                "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
            ) from None
        draft = plan
        plan = plan.model_copy(update={"training": training})
        plan = restate_for_training(draft, plan)  # the hypotheses say the seeds asked for
        plan = check_plan(plan)
    study_id = ensure_study(ctx, request, "research" if mode == "research" else "vibe")
    hypothesis_ids = ensure_hypotheses(ctx, study_id, plan.hypotheses)
    line = f"plan ({ctx.provider.name}): {plan.objective}; template {plan.template}; {training_line(plan)}"
    if plan.stability is not None:
        line += f"; stability: {plan.stability.describe()}"
    ctx.store.log_event(line, study_id=study_id)
    ctx.say(line)
    lines = [line]
    short = plan.stability.window_warning(plan.training.steps) if plan.stability is not None else None
    for warning in (short, temperature_warning(plan)):
        if warning is not None:
            ctx.store.log_event(warning, study_id=study_id)
            ctx.say(warning)
            lines.append(warning)
    priors = prior_findings(ctx.store, plan, model=ctx.model, study_id=study_id)
    if plan.kind == "research" and plan.sweep is not None:
        lines += [f"design: {stage}" for stage in _design_lines(plan, priors, ctx.preflight_budget_s)]
        lines += [f"prior: reusing the runs of {p.cite()}" for p in priors]
        for text in lines[1:]:
            ctx.store.log_event(text, study_id=study_id)
            ctx.say(text)
    return Command(
        goto="coder",
        update={
            "plan": plan,
            "study_id": study_id,
            "hypothesis_ids": hypothesis_ids,
            "queue": initial_queue(plan),
            "stage": "preflight" if plan.kind == "research" else "train",
            "priors": priors,
            "log": lines,
        },
    )


def _design_lines(plan: PlanDraft, priors: list[PriorFinding], preflight_budget_s: float) -> list[str]:
    """The staged design as the log shows it (one line per stage)."""
    assert plan.sweep is not None
    design = design_study(
        plan,
        priors=priors,
        seconds_per_episode=math.nan,
        speed_source="measured by the preflight",
        eval_episodes=0,
        preflight_episodes=0,
        preflight_budget_s=preflight_budget_s,
    )
    out = [f"preflight: {design.stages[0].note.split('; ', 1)[-1]}"] if preflight_budget_s > 0 else []
    for stage in design.stages[1:]:
        values = (
            f" {plan.sweep.variable} ∈ {{{', '.join(design.setting.text(v) for v in stage.values)}}}"
            if stage.values
            else ""
        )
        out.append(f"{stage.name}{values}, {stage.seeds} seeds per configuration: {stage.note}")
    return out


def _research_step(state: ResearchState, ctx: RunContext) -> Command[Route]:
    plan = state["plan"]
    assert plan.sweep is not None
    stage = state.get("stage", "preflight")
    outcomes = state.get("outcomes", [])
    budget_left = ctx.budget_left_s(state.get("outcomes", []))
    eval_episodes = ctx.eval_tasks * ctx.eval_samples
    if stage == "preflight":
        pre = next((o for o in reversed(outcomes) if o.purpose == "preflight"), None)
        if pre is None or pre.eval is None:
            reason = pre.reason if pre else "no preflight ran"
            if pre is not None and pre.status == "budget":
                return _conclude(
                    f"stopped: the budget ran out during the preflight evaluation ({reason}); raise --budget-minutes"
                )
            return _conclude(f"stopped: the preflight evaluation failed ({reason})")
        baseline = pre.eval
        line = (
            f"preflight: untrained model on {baseline.tasks} held-out tasks, {baseline.episodes} attempts: mean reward "
            f"{baseline.mean_reward:.3f}, p@1 {baseline.pass_at_1:.3f}, p@2 {baseline.pass_at_2:.3f}"
        )
        signal = pre.signal or _signal_of(baseline, plan.training.group_size, ctx)
        # The sequential test decides when there is one: a zero score on too few attempts to rule out the
        # signal GRPO needs is not evidence of futility (a fresh user's 16-attempt preflight stopped a
        # study while its own test said "these attempts do not rule that rate out").
        if baseline.mean_reward <= 0.0 and signal is not None and not signal.stopped:
            line += f"; a zero score, but not a stop: {signal.describe()}"
        ctx.say(line)
        if (
            (baseline.mean_reward <= 0.0 and signal is None) or (signal is not None and signal.stopped)
        ) and not state.get("force", False):
            if signal is not None and signal.stopped:
                head = (
                    f"the untrained model gets too little signal for GRPO on {plan.template}: "
                    f"{signal.headline()} ({signal.describe()})"
                )
            else:
                head = (
                    f"no held-out attempt of the untrained model earned a reward on {plan.template}, "
                    "so GRPO would see only zero-signal groups"
                    + (
                        f" ({signal.describe()})"
                        if signal is not None
                        else f" (0 of {baseline.episodes} attempts)"
                    )
                )
            failed = _FAILED.search(pre.reason)
            return _conclude(
                f"stopped before the sweep: {head}. Recommendations: {_recommendations(plan)}, or --force to "
                "sweep anyway." + (f" Note: {failed.group(0)}." if failed else ""),
                update={"baseline": baseline, "log": [line]},
            )
        priors = state.get("priors") or []
        reused = [o for p in priors for o in p.outcomes]
        specs = sweep_specs(plan, coarse_values(plan, priors), "coarse")
        kept, dropped = fit_budget(
            specs,
            budget_s=budget_left,
            seconds_per_episode=pre.seconds_per_episode,
            eval_episodes=eval_episodes,
            goal=plan.sweep.goal,
            measured_tokens=token_cap(plan),  # the preflight ran the plan's own cap
        )
        lines = [line]
        if dropped and plan.sweep.goal in ("a_vs_b", "effect_of"):  # one arm alone cannot answer a comparison
            named = ", ".join(resolve_setting(plan.sweep.variable, plan.template).text(v) for v in dropped)
            return _conclude(
                f"stopped: the comparison needs both {plan.sweep.variable} values on {len(plan.training.seeds)} "
                f"seeds, and {named} does not fit the remaining budget of {budget_left:.0f} s at the preflight's "
                f"{pre.seconds_per_episode:.1f} s per episode; raise --budget-minutes",
                update={"baseline": baseline, "log": [line]},
            )
        cuts: list[str] = []
        if dropped:
            cuts.append(
                f"budget: dropped {plan.sweep.variable} values "
                f"[{', '.join(resolve_setting(plan.sweep.variable, plan.template).text(v) for v in dropped)}] "
                f"from the coarse stage (would not fit {budget_left:.0f} s at the preflight's "
                f"{pre.seconds_per_episode:.1f} s per episode)"
            )
            lines += cuts
        if not kept and reused and not dropped:  # every coarse value was measured before
            return _after_stage(
                {**state, "outcomes": [*outcomes, *reused], "baseline": baseline, "stage": "coarse"},
                ctx,
                update={"baseline": baseline, "outcomes": reused},
                log=lines,
            )
        if not kept:
            return _conclude(
                f"stopped: no configuration with {len(plan.training.seeds)} seeds fits the remaining budget of "
                f"{budget_left:.0f} s; raise --budget-minutes",
                update={"baseline": baseline, "log": lines},
            )
        for text in lines[1:]:
            ctx.say(text)
        return Command(
            goto="runner",
            update={
                "baseline": baseline,
                "stage": "coarse",
                "queue": kept,
                "outcomes": reused,
                "log": lines,
                "budget_cuts": cuts,
                "dropped": dropped,
            },
        )
    return _after_stage(state, ctx)


def _after_stage(
    state: ResearchState,
    ctx: RunContext,
    update: dict[str, object] | None = None,
    log: list[str] | None = None,
) -> Command[Route]:
    """After the coarse or a refine stage: refine again while the answer's interval can narrow
    (``min_stable``: bisection; ``best``: midpoints around the best, `BEST_REFINE_ROUNDS`), then
    replicate the configurations the answer rests on with the power rule's seeds, then report.
    ``update`` and ``log`` carry the caller's state changes (reused prior runs) into the command."""
    plan = state["plan"]
    assert plan.sweep is not None
    sweep = plan.sweep
    extra_update = dict(update or {})
    logged = list(log or [])
    outcomes = state.get("outcomes", [])
    baseline = state.get("baseline")
    assert baseline is not None
    criterion = plan.stability or StabilityCriterion()
    budget_left = ctx.budget_left_s(state.get("outcomes", []))
    eval_episodes = ctx.eval_tasks * ctx.eval_samples
    measured = [o.seconds_per_episode for o in outcomes if o.purpose == "sweep"]
    per_episode = min((m for m in measured if m == m), default=float("nan"))
    configs = verdicts(outcomes, baseline=baseline, criterion=criterion)
    tested = [c.value for c in configs]
    rounds = state.get("refine_rounds", 0)

    cuts: list[str] = []  # what the budget skipped or cut, for the report

    def cost(specs: list[RunSpec]) -> str:
        seconds = sum(
            estimate_run_s(s, seconds_per_episode=per_episode, eval_episodes=eval_episodes) for s in specs
        )
        return (
            f"{counted(len(specs), 'runs')} ≈ {seconds:.0f} s at the measured {per_episode:.1f} s per episode"
        )

    def go(
        specs: list[RunSpec], name: str, line: str, goal: str, asked: str = "", **more: object
    ) -> Command[Route] | None:
        kept, dropped = fit_budget(
            specs,
            budget_s=budget_left,
            seconds_per_episode=per_episode,
            eval_episodes=eval_episodes,
            goal=goal,
        )
        if not kept:
            note = f"{name}: skipped, {asked or cost(specs)} would not fit the {max(0.0, budget_left):.0f} s left"
            ctx.say(note)
            logged.append(note)
            cuts.append(f"budget: {note}")
            return None
        if dropped:
            shown = ", ".join(value_text(sweep.variable, plan.template, v) for v in dropped)
            line += f" (budget: dropped {shown})"
            cuts.append(
                f"budget: {name} dropped {sweep.variable} {shown}: {cost(specs)} would not fit the "
                f"{budget_left:.0f} s left"
            )
        ctx.store.log_event(line, study_id=state["study_id"])
        ctx.say(line)
        return Command(
            goto="runner",
            update={
                **extra_update,
                "stage": name,
                "queue": kept,
                "log": [*logged, line],
                "budget_cuts": cuts,
                **more,
            },
        )

    # coarse values dropped at the preflight's speed, again when the runs' measured speed fits them (a
    # min-stable question needs them only while no value tested so far is stable: they are the larger ones)
    left_out = list(state.get("dropped") or [])
    if left_out and (sweep.goal != "min_stable" or min_stable_value(configs) is None):
        kept, still = fit_budget(
            sweep_specs(plan, left_out, "coarse"),
            budget_s=budget_left,
            seconds_per_episode=per_episode,
            eval_episodes=eval_episodes,
            goal=sweep.goal,
        )
        if kept:
            back = sorted({s.value for s in kept if s.value is not None})
            line = (
                f"budget: re-admitted {sweep.variable} values [{', '.join(value_text(sweep.variable, plan.template, v) for v in back)}] "
                f"dropped from the coarse stage: {cost(kept)} fit the {budget_left:.0f} s left"
            )
            cuts.append(line)
            ctx.store.log_event(line, study_id=state["study_id"])
            ctx.say(line)
            return Command(
                goto="runner",
                update={
                    **extra_update,
                    "stage": "coarse",
                    "queue": kept,
                    "dropped": still,
                    "log": [*logged, line],
                    "budget_cuts": cuts,
                },
            )
    if sweep.refine:  # also after a replicate stage that moved the answer
        extra: list[float] = []
        if sweep.goal == "min_stable" and rounds < MIN_STABLE_REFINE_ROUNDS:
            extra = refine_values(configs, tested)
            why = "between the smallest stable value and the unstable one below"
        elif sweep.goal == "best" and rounds < BEST_REFINE_ROUNDS:
            extra = best_refine_values(configs, resolve_setting(sweep.variable, plan.template))
            why = "between the best value and its neighbours"
        if extra:
            specs = sweep_specs(plan, extra, f"refine{rounds + 1}")
            values = ", ".join(value_text(sweep.variable, plan.template, v) for v in extra)
            command = go(
                specs,
                "refine",
                f"refine: testing {sweep.variable} ∈ {{{values}}} {why}",
                "min_stable" if sweep.goal == "min_stable" else "best",
                refine_rounds=rounds + 1,
            )
            if command is not None:
                return command
    if sweep.replicate:  # bounded: arms stop at the power rule's n ≤ max_seeds
        additions, line = replicate_additions(plan, configs, outcomes, baseline=baseline, criterion=criterion)
        if additions:
            # as many more seeds per configuration as fit (all of them, else fewer, at least one each)
            wanted = max(len(seeds) for seeds in additions.values())
            for k in range(wanted, 0, -1):
                specs = [
                    s
                    for value, seeds in additions.items()
                    for s in sweep_specs(plan, [value], "replicate", seeds=seeds[:k])
                ]
                _, dropped = fit_budget(
                    specs,
                    budget_s=budget_left,
                    seconds_per_episode=per_episode,
                    eval_episodes=eval_episodes,
                    goal="best",
                )
                if not dropped:
                    break
            every = [
                s
                for value, seeds in additions.items()
                for s in sweep_specs(plan, [value], "replicate", seeds=seeds)
            ]
            asked = cost(every) + (
                f", nor 1 more seed per configuration ({cost(specs)})" if wanted > 1 else ""
            )
            if k < wanted and not dropped:
                cut = (
                    f"replicate: {counted(k, 'more seeds')} per configuration instead of the power rule's "
                    f"{wanted}: all {cost(every)} would not fit the {max(0.0, budget_left):.0f} s left"
                )
                line += f"; budget: {cut.split(': ', 1)[1]}"
                cuts.append(f"budget: {cut}")
            command = go(specs, "replicate", line, "best", asked=asked)
            if command is not None:
                return command
        else:
            ctx.say(line)
            logged.append(line)
    return Command(
        goto="reporter", update={**extra_update, "stage": "done", "log": logged, "budget_cuts": cuts}
    )


def _signal_of(baseline: RewardSummary, group_size: int, ctx: RunContext) -> SignalCheck | None:
    """The futility test over a preflight's attempts when the evaluator recorded none (all ended
    attempts, since their start order is unknown): successes are rewards above 0."""
    if baseline.rewards:
        successes, attempts = sum(1 for r in baseline.rewards if r > 0), len(baseline.rewards)
    elif baseline.mean_reward <= 0.0:
        successes, attempts = 0, baseline.episodes
    else:
        return None
    if attempts < 1:
        return None
    return ctx.signal.test(max(2, group_size), attempts).check(successes, attempts)


def _recommendations(plan: PlanDraft) -> str:
    """What to try when the untrained model scores zero, by template."""
    if plan.template == "arithmetic":
        level = int(plan.params.get("level") or 1)
        if level > 1:
            fewshot = ", few-shot examples on" if plan.params.get("fewshot") is False else ""
            return f"arithmetic level {level - 1} or 1 (easier questions){fewshot}, a stronger base model (--model)"
        return ("few-shot examples on, " if plan.params.get("fewshot") is False else "") + (
            "more completion tokens, a stronger base model (--model)"
        )
    return (
        "a task with signal for this model (e.g. the arithmetic template at level 1), an easier subset of "
        f"{plan.template}, a stronger base model (--model), a few-shot prompt"
    )


def _conclude(text: str, update: dict[str, object] | None = None) -> Command[Route]:
    return Command(goto="reporter", update={**(update or {}), "conclusion": text, "stage": "done"})
