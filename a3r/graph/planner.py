"""The planner (supervisor): interprets the request once, then routes after every analysed run.

First visit: the provider's plan (template, parameters, settings, hypotheses, sweep, stability
definition) is written into the store (study and hypotheses, before any run) and the first runs are
queued. Later visits: queued runs go to the runner (a vibe training run sized to the budget after the
smoke run, a sweep stage re-planned after each run: `a3r.study.stages.refit_queue`); a research thread
moves through its stages as `a3r.study.stages.next_stage` decides; when nothing is left, the reporter
concludes. The node reads the state and applies decisions; the rules live in `a3r.study`.
"""

from __future__ import annotations

import math
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import ValidationError

import templates
from a3r.errors import PlanError
from a3r.graph.context import RunContext
from a3r.graph.records import ensure_hypotheses, ensure_study, prior_findings
from a3r.graph.state import ResearchState
from a3r.study.design import (
    PriorFinding,
    check_overrides,
    design_study,
    restate_for_training,
)
from a3r.study.plans import (
    PlanDraft,
    TrainingSettings,
    check_plan,
    steps_warning,
    temperature_warning,
    training_line,
)
from a3r.study.research import (
    SAFETY_SHARE,
    eval_reserve_s,
    initial_queue,
    size_training,
)
from a3r.study.runs import Resizing
from a3r.study.stages import Stage, StageBudget, StageDecision, StudyProgress, next_stage, refit_queue

__all__ = ["planner"]

Route = Literal["coder", "runner", "reporter"]


def planner(state: ResearchState, runtime: Runtime[RunContext]) -> Command[Route]:
    """Plan on the first visit; afterwards pick the next runs or hand over to the reporter."""
    ctx = runtime.context
    if state.get("plan") is None:
        return _first_plan(state, ctx)
    if state.get("queue"):
        return _size_to_budget(state, ctx) or _refit_stage(state, ctx) or Command(goto="runner")
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
    for n, i in enumerate(runs):
        # each run re-plans after every step from its measured step time, back up to what was asked
        resize = Resizing(
            asked_steps=sizing.planned,
            asked_batch_size=sizing.planned_batch_size,
            margin_s=SAFETY_SHARE * ctx.budget_s,
            later_runs=len(runs) - 1 - n,
        )
        settings = queue[i].settings.model_copy(update=sized)
        queue[i] = queue[i].model_copy(update={"settings": settings, "resize": resize})
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
        n = {"tasks": ctx.eval_tasks, "after": ctx.eval_tasks * ctx.eval_samples}
        n["before"] = ctx.eval_tasks * (ctx.preflight_samples if mode == "research" else ctx.eval_samples)
        line += f"; stability: {plan.stability.describe(**n, planned=True)}"
    ctx.store.log_event(line, study_id=study_id)
    ctx.say(line)
    lines = [line]
    short = plan.stability.window_warning(plan.training.steps) if plan.stability is not None else None
    for warning in (short, steps_warning(plan), temperature_warning(plan)):
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
            "stage": Stage.preflight if plan.kind == "research" else Stage.train,
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


def _refit_stage(state: ResearchState, ctx: RunContext) -> Command[Route] | None:
    """After each sweep run while its stage has runs queued: the stage re-planned at the measured speed
    (`a3r.study.stages.refit_queue`), down as well as up; ``None`` when nothing changes."""
    outcomes = state.get("outcomes", [])
    if state["mode"] != "research" or not outcomes or outcomes[-1].purpose != "sweep":
        return None
    decision = refit_queue(_progress(state), state.get("queue") or [], _stage_budget(state, ctx))
    if decision is None:
        return None
    update = decision.update()
    update.setdefault("queue", [])
    return _apply(decision, state, ctx, update)


def _apply(
    decision: StageDecision, state: ResearchState, ctx: RunContext, update: dict[str, object] | None = None
) -> Command[Route]:
    """Say and log a stage decision's lines and route to its next node."""
    for line in decision.lines:
        if line in decision.events:
            ctx.store.log_event(line, study_id=state["study_id"])
        ctx.say(line)
    return Command(goto=decision.goto, update=decision.update() if update is None else update)


def _progress(state: ResearchState) -> StudyProgress:
    """The research part of the state, as `a3r.study.stages` reads it."""
    return StudyProgress(
        plan=state["plan"],
        stage=Stage(state.get("stage", Stage.preflight)),
        outcomes=state.get("outcomes", []),
        baseline=state.get("baseline"),
        priors=state.get("priors") or [],
        refine_rounds=state.get("refine_rounds", 0),
        dropped=state.get("dropped") or [],
        force=state.get("force", False),
    )


def _stage_budget(state: ResearchState, ctx: RunContext) -> StageBudget:
    """The budget a stage decision plans with, now."""
    return StageBudget(
        left_s=ctx.budget_left_s(state.get("outcomes", [])),
        eval_episodes=ctx.eval_tasks * ctx.eval_samples,
        signal=ctx.signal,
        advice=_recommendations(state["plan"]),
        total_s=ctx.budget_s,
        serving=ctx.serving(),
    )


def _research_step(state: ResearchState, ctx: RunContext) -> Command[Route]:
    """After a research stage's runs: the next stage (`a3r.study.stages.next_stage`), said and logged."""
    return _apply(next_stage(_progress(state), _stage_budget(state, ctx)), state, ctx)


def _recommendations(plan: PlanDraft) -> str:
    """What to try when the untrained model scores zero: the template's own advice (`templates.Template.easier`),
    else a task with signal (a template's ``starter``), an easier subset, a few-shot prompt."""
    try:
        own = templates.get_template(plan.template).easier(plan.params) if plan.template else None
    except templates.TemplateError:
        own = None
    if own is not None:
        return f"{own}, a stronger base model (--model)"
    starter = next((m for m in templates.list_templates() if m.starter), None)
    example = f" (e.g. the {starter.name} template {starter.starter})" if starter else ""
    return (
        f"a task with signal for this model{example}, an easier subset of {plan.template}, a stronger base "
        "model (--model), a few-shot prompt"
    )
