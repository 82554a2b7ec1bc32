"""The sweep's verdicts: which runs ran, the stability of each run and configuration under the
pre-registered definition (`a3r.study.plans.StabilityCriterion`), the held-out comparisons they rest
on, and the minimal stable value. Pure functions over run outcomes (no I/O).

**Only what ran is judged** (issue 33). A sweep run gives evidence only when it trained: a run that
never started, was cancelled (by the budget or an early stop) before its first step or before its
held-out evaluation, was stopped by the budget before its planned steps (not a completed run, even with
a held-out evaluation), or crashed or hung before its first step is *not run* (`not_run_reason`), with
the reason; a configuration none of whose runs ran is neither stable nor unstable, and no verdict,
finding or conclusion makes a claim about it. A crash or hang *after* training began, or a collapse,
is the run's own failure and makes it unstable. A budget stop is never a crash
(`a3r.study.analysis.STOP_EXCEPTIONS`).

**Like for like.** A run is stable when its held-out mean reward after training, on the held-out tasks
its evaluation shares with the untrained model's (the preflight), is at least the untrained model's
mean on those same tasks − δ: held-out against held-out, never a few training samples against a
held-out mean. A run without a held-out evaluation is judged against itself: its train reward over its
last k steps against its first k steps − δ. Each verdict states both sides with their n.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from a3r.study.analysis import DiagnosisKind, RewardSummary, on_shared_tasks, task_span
from a3r.study.effects import Effect, Scale, seed_effect, two_sample_effect
from a3r.study.plans import StabilityCriterion
from a3r.study.runs import RunOutcome, status_text
from a3r.study.wording import counted, unit_noun

__all__ = [
    "DROPPED_BY_REPLAN",
    "ConfigVerdict",
    "Verdict",
    "compared_evals",
    "compared_tasks_text",
    "judge_run",
    "min_stable_value",
    "non_monotone",
    "not_run_reason",
    "refine_values",
    "stability_margin",
    "trained_steps",
    "verdicts",
]

_OWN_FAILURES = (DiagnosisKind.collapse, DiagnosisKind.crash, DiagnosisKind.hang)
"""Diagnoses that make a run that trained unstable whatever its rewards: noise cannot explain them."""


DROPPED_BY_REPLAN = "dropped by the budget re-plan before it started"
"""Why a planned sweep run that never started gave no evidence: the budget, re-planned at the measured
time per run, left it out (`a3r.study.stages`)."""


def trained_steps(outcome: RunOutcome) -> int:
    """Trainer steps the run recorded (its server's step, or its reward curve's length when larger)."""
    return max(outcome.steps, len(outcome.curve))


def _own_failure(outcome: RunOutcome) -> list[str]:
    """The run's own failures: a crash or hang as its end, and crash, hang or collapse diagnoses."""
    found = (
        [f"run ended {status_text(outcome.status)}: {outcome.reason}"]
        if outcome.status in ("crashed", "hung")
        else []
    )
    return found + [d.summary for d in outcome.diagnoses if d.kind in _OWN_FAILURES]


def _not_run(outcome: RunOutcome) -> str | None:
    """Why the run gave no evidence, in a few words (`not_run_reason` without the run's own reason)."""
    steps = trained_steps(outcome)
    status = status_text(outcome.status)
    if outcome.status == "failed_to_start":
        return f"start failure ({status})"
    if steps == 0:
        return f"{'cancelled by the budget' if outcome.status == 'budget' else status} before its first step"
    if _own_failure(outcome):
        return None
    if outcome.status == "budget" and outcome.planned_steps is not None and steps < outcome.planned_steps:
        return f"cancelled by the budget at step {steps} of {outcome.planned_steps}"
    if outcome.eval is None and outcome.status in ("budget", "needs_attention"):
        return f"{status} after {counted(steps, 'steps')}, before its held-out evaluation"
    if outcome.eval is None and steps < 2:
        return f"{status} after {counted(steps, 'steps')} without a held-out evaluation"
    return None


def not_run_reason(outcome: RunOutcome) -> str | None:
    """Why a sweep run gives no evidence about its configuration, with the run's own reason, or ``None``
    when it does (module docstring): it never started, was cancelled before its first step or before
    its held-out evaluation, was stopped by the budget before its planned steps (``planned_steps``), crashed or hung before its first step, or ended with neither a held-out
    evaluation nor the steps to compare its train reward with itself."""
    why = _not_run(outcome)
    if why is None:
        return None
    return why + (f": {outcome.reason}" if outcome.reason else "")


class Verdict(BaseModel):
    """Stability of one run that ran, under the criterion, with the reasons when unstable.

    Attributes:
        key: The run's key.
        stable: Whether every rule of the criterion held.
        reasons: Why not.
        last_k_reward: Mean train reward over the last k steps (shown, not judged against the held-out
            baseline).
        hard: Unstable for a reason noise cannot explain (it crashed, hung or collapsed after training
            began), not only a held-out reward below the threshold.
        change: What the rule compared: held-out mean after − before on the shared tasks (or the last k
            train steps − the first k, for a run without a held-out evaluation); ``nan`` when nothing.
        compared: The comparison with its n, in words.
    """

    model_config = ConfigDict(frozen=True)

    key: str
    stable: bool
    reasons: list[str] = Field(default_factory=list)
    last_k_reward: float = math.nan
    hard: bool = False
    change: float = math.nan
    compared: str = ""


def _heldout_sides(
    outcome: RunOutcome, baseline: RewardSummary
) -> tuple[RewardSummary, RewardSummary, str] | None:
    """The run's held-out evaluation and the untrained baseline on the tasks both ran, and which."""
    if outcome.eval is None:
        return None
    (after, before), tasks = on_shared_tasks([outcome.eval, baseline])
    where = (
        f"the same {counted(after.tasks, 'tasks')}"
        if tasks is not None
        else "their own tasks (not recorded per task)"
    )
    return after, before, where


def judge_run(outcome: RunOutcome, baseline: RewardSummary, criterion: StabilityCriterion) -> Verdict:
    """Apply the operational definition of stability (`StabilityCriterion`) to one run that ran
    (`not_run_reason` is ``None``): its own failures, then held-out after training against held-out
    before on the same tasks (or, without a held-out evaluation, its train reward against itself)."""
    reasons = _own_failure(outcome)
    hard = bool(reasons)
    tail = [v for _, v in outcome.curve[-criterion.last_k :]]
    last_k = statistics.fmean(tail) if tail else math.nan
    change, compared = math.nan, ""
    sides = _heldout_sides(outcome, baseline)
    if sides is not None:
        after, before, where = sides
        change = after.mean_reward - before.mean_reward
        compared = (
            f"held-out mean reward after training {after.mean_reward:.3f} ({counted(after.episodes, 'attempts')}) vs "
            f"before {before.mean_reward:.3f} ({counted(before.episodes, 'attempts')}) on {where}"
        )
        if not after.mean_reward >= before.mean_reward - criterion.delta:
            reasons.append(f"{compared}: below before − {criterion.delta:g}")
    else:
        k = min(criterion.last_k, len(outcome.curve) // 2)
        if k >= 1:
            first = statistics.fmean(v for _, v in outcome.curve[:k])
            last = statistics.fmean(v for _, v in outcome.curve[-k:])
            change = last - first
            compared = (
                f"no held-out evaluation: train reward of its last {counted(k, 'steps')} {last:.3f} vs its first "
                f"{counted(k, 'steps')} {first:.3f}"
            )
            if not last >= first - criterion.delta:
                reasons.append(f"{compared}: below the first − {criterion.delta:g}")
    return Verdict(
        key=outcome.key,
        stable=not reasons,
        reasons=reasons,
        last_k_reward=last_k,
        hard=hard,
        change=change,
        compared=compared,
    )


class ConfigVerdict(BaseModel):
    """One swept configuration over its seeds.

    Attributes:
        value: The swept value.
        runs: Run keys (every run of the value, those that did not run included).
        run_ids: Store run ids.
        seeds: Seeds whose run ran and was judged.
        stable_seeds: Seeds judged stable.
        stable: ``True`` when >= ``min_seeds`` seeds ran and all are stable, ``False`` when any seed
            that ran is unstable, ``None`` when too few seeds ran (none: `not_run`).
        last_k_reward: Mean over the seeds that ran of the last-k-steps train reward.
        pass_at_1: Mean over the seeds that ran of held-out pass@1.
        pass_at_2: Mean over the seeds that ran of held-out pass@2.
        eval_mean_reward: Mean over the seeds that ran of held-out mean reward.
        reasons: Why seeds were unstable.
        margin: Held-out mean reward after − before training (on the shared tasks) with its interval
            over seeds (over episodes for one seed), against the pre-registered tolerance −δ (its
            minimum effect): confirmed above −δ, refuted below. ``None`` when no seed ran with a
            held-out evaluation.
        hard_failure: Some seed was unstable for a reason noise cannot explain (`Verdict.hard`).
        not_run: Why each run of the value that did not run gave no evidence ("seed 1: cancelled by the
            budget before its first step: …"); empty when every run ran.
        not_run_short: The same in a few words, seeds grouped by cause ("seeds 0, 1: cancelled by the
            budget before its first step"); "" when every run ran.
        seed_margins: Per seed that ran with a held-out evaluation: after − (before − δ).
    """

    model_config = ConfigDict(frozen=True)

    value: float
    runs: list[str]
    run_ids: list[int]
    seeds: list[int]
    stable_seeds: list[int]
    stable: bool | None
    last_k_reward: float
    pass_at_1: float
    pass_at_2: float
    eval_mean_reward: float
    reasons: list[str]
    margin: Effect | None = None
    hard_failure: bool = False
    not_run: list[str] = Field(default_factory=list)
    not_run_short: str = ""
    seed_margins: list[float] = Field(default_factory=list)

    @property
    def ran(self) -> bool:
        """Whether any run of the value ran (gave evidence about it)."""
        return bool(self.seeds)

    @property
    def stable_text(self) -> str:
        """``yes``, ``no``, ``undecided``, or ``not run`` with every seed's cause (``not run (seeds 0, 1:
        cancelled by the budget before its first step)``)."""
        if not self.ran:
            return f"not run ({self.not_run_short or '; '.join(self.not_run)})" if self.not_run else "not run"
        return {True: "yes", False: "no", None: "undecided"}[self.stable]

    @property
    def settled(self) -> bool:
        """Whether the stability verdict clears the noise: stable with a confirmed margin, or unstable
        by a hard failure or a refuted margin. A configuration that did not run is never settled."""
        if self.stable is True:
            return self.margin is not None and self.margin.verdict.value == "confirmed"
        if self.stable is False:
            return self.hard_failure or (self.margin is not None and self.margin.verdict.value == "refuted")
        return False


def stability_margin(
    outcomes: Sequence[RunOutcome],
    *,
    baseline: RewardSummary,
    criterion: StabilityCriterion,
    scale: Scale | None = None,
) -> Effect | None:
    """Held-out mean reward after − before training of one configuration's runs that ran, each on the
    tasks it shares with ``baseline``, through `a3r.study.effects`: over seeds (`seed_effect`) with two
    or more seeds, else over the episodes of the one run and the baseline (`two_sample_effect`). The
    minimum effect is −δ: a non-inferiority margin whose tolerance δ was pre-registered.

    Args:
        outcomes: The configuration's runs that ran.
        baseline: The untrained model's held-out evaluation (the preflight).
        criterion: δ.
        scale: The reward's range, which bounds the interval (`a3r.study.analysis.reward_range`).

    Returns:
        The margin, or ``None`` when no run has a held-out evaluation.
    """
    sides = [s for o in outcomes if (s := _heldout_sides(o, baseline)) is not None]
    if not sides:
        return None
    basis = f"a non-inferiority margin: the pre-registered tolerance −δ = −{criterion.delta:g}"
    if len(sides) == 1:
        after, before, _ = sides[0]
        return two_sample_effect(
            after.rewards, before.rewards, min_effect=-criterion.delta, min_effect_basis=basis, scale=scale
        )
    return seed_effect(
        [after.mean_reward - before.mean_reward for after, before, _ in sides],
        min_effect=-criterion.delta,
        min_effect_basis=basis,
        scale=scale,
    )


def _grouped(missing: Sequence[tuple[int, str]]) -> str:
    """Runs that did not run, as ``(seed, cause in a few words)``, their seeds grouped by cause: "seeds
    0, 1: cancelled by the budget before its first step; seed 2: start failure (…)"."""
    causes: dict[str, list[int]] = defaultdict(list)
    for seed, cause in missing:
        causes[cause].append(seed)
    return "; ".join(
        f"{unit_noun(len(seeds), 'seeds')} {', '.join(str(s) for s in seeds)}: {cause}"
        for cause, seeds in causes.items()
    )


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def compared_evals(outcomes: Sequence[RunOutcome]) -> tuple[dict[int, RewardSummary], frozenset[str] | None]:
    """The held-out evaluations of the evaluated sweep runs, each restricted to the tasks all of them
    ran (`a3r.study.analysis.on_shared_tasks`): configurations, arms and seeds are compared on the same
    held-out tasks even when some runs evaluated more (a prior study's runs, a different budget).

    Returns:
        ``({index of the run in outcomes: its restricted evaluation}, the shared task ids)``; the task
        ids are ``None`` when a run kept no rewards per task (its summary is then used unrestricted).
    """
    indices = [i for i, o in enumerate(outcomes) if o.purpose == "sweep" and o.eval is not None]
    restricted, tasks = on_shared_tasks([e for i in indices if (e := outcomes[i].eval) is not None])
    return dict(zip(indices, restricted, strict=True)), tasks


def compared_tasks_text(outcomes: Sequence[RunOutcome], baseline: RewardSummary | None = None) -> str:
    """Which held-out tasks the configurations were compared on, in one sentence ("" without an
    evaluated sweep run): their number and ids, and those of the runs or the baseline that ran more."""
    evaluated = [o.eval for o in outcomes if o.purpose == "sweep" and o.eval is not None]
    if not evaluated:
        return ""
    _, tasks = compared_evals(outcomes)
    if tasks is None:
        counts = sorted({e.tasks for e in evaluated})
        return (
            "held-out comparisons use each run's own tasks (some runs kept no rewards per task); runs "
            f"evaluated {' or '.join(str(c) for c in counts)} {unit_noun(max(counts), 'tasks')}"
        )
    text = f"held-out numbers of the configurations are over the {len(tasks)} task(s) every evaluated run ran ({task_span(tasks)})"
    more = sorted({e.tasks for e in evaluated if e.tasks > len(tasks)})
    if more:
        text += f"; runs that evaluated {' or '.join(str(m) for m in more)} {unit_noun(max(more), 'tasks')} are compared on these only"
    if baseline is not None and baseline.tasks != len(tasks):
        text += (
            f"; the untrained baseline (preflight) ran {counted(baseline.tasks, 'tasks')}, and its numbers over them are not "
            "a comparison with the trained runs"
        )
    return text


def verdicts(
    outcomes: Sequence[RunOutcome],
    *,
    baseline: RewardSummary,
    criterion: StabilityCriterion,
    scale: Scale | None = None,
    unstarted: Sequence[tuple[float, int]] = (),
    planned: Sequence[tuple[float, int]] = (),
    stopped: str = "",
) -> list[ConfigVerdict]:
    """Per swept value: the verdicts of its seeds that ran (`judge_run`), why the others did not run
    (`not_run_reason`; a planned run that never started: `DROPPED_BY_REPLAN`), and held-out
    p@1/p@2/mean reward of those that ran (over the held-out tasks every evaluated run ran:
    `compared_evals`), ascending by value. A value none of whose runs ran is listed with ``stable``
    ``None`` and its reasons.

    Args:
        outcomes: The thread's runs (only sweep runs count).
        baseline: The untrained model's held-out evaluation.
        criterion: The pre-registered definition.
        scale: The reward's range, which bounds the margins' intervals.
        unstarted: ``(value, seed)`` of the planned sweep runs the budget re-plan dropped before they
            started; one that has a run after all (a value re-admitted later) is not listed.
        planned: ``(value, seed)`` of every planned sweep run; with ``stopped``, each one without a run
            (and not in ``unstarted``) is listed as not run: ``not started: {stopped}``.
        stopped: Why the study stopped before its planned runs (``the study stopped after a start
            failure``); ``""``: it did not stop early, and ``planned`` is not used.
    """
    shared, _ = compared_evals(outcomes)
    evaluation = {id(outcomes[i]): e for i, e in shared.items()}
    grouped: dict[float, list[RunOutcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.purpose == "sweep" and outcome.value is not None:
            grouped[outcome.value].append(outcome)
    never: dict[float, list[int]] = defaultdict(list)
    for value, seed in unstarted:
        if seed not in {o.seed for o in grouped.get(value, [])} and seed not in never[value]:
            never[value].append(seed)
    halted: dict[float, list[int]] = defaultdict(list)
    for value, seed in planned if stopped else ():
        if seed not in {o.seed for o in grouped.get(value, [])} and seed not in {
            *never[value],
            *halted[value],
        }:
            halted[value].append(seed)
    result: list[ConfigVerdict] = []
    for value in sorted({*grouped, *(v for v, seeds in [*never.items(), *halted.items()] if seeds)}):
        runs = grouped.get(value, [])
        missing = [(o, why) for o in runs if (why := not_run_reason(o)) is not None]
        dropped = sorted(never.get(value, []))
        unbegun = [(seed, f"not started: {stopped}") for seed in sorted(halted.get(value, []))]
        ran = [o for o in runs if not_run_reason(o) is None]
        judged = [(o, judge_run(o, baseline, criterion)) for o in ran]
        seeds = [o.seed for o in ran]
        stable: bool | None = None
        if any(not v.stable for _, v in judged):
            stable = False
        elif judged and len(set(seeds)) >= criterion.min_seeds:
            stable = True
        evals = [evaluation[id(o)] for o in ran if id(o) in evaluation]
        margins = [
            v.change + criterion.delta for o, v in judged if o.eval is not None and math.isfinite(v.change)
        ]
        result.append(
            ConfigVerdict(
                value=value,
                runs=[o.key for o in runs],
                run_ids=[o.run_id for o in runs],
                seeds=seeds,
                stable_seeds=[o.seed for o, v in judged if v.stable],
                stable=stable,
                last_k_reward=_mean([v.last_k_reward for _, v in judged]),
                pass_at_1=_mean([e.pass_at_1 for e in evals]),
                pass_at_2=_mean([e.pass_at_2 for e in evals]),
                eval_mean_reward=_mean([e.mean_reward for e in evals]),
                reasons=[f"seed {o.seed}: {r}" for o, v in judged for r in v.reasons],
                margin=stability_margin(ran, baseline=baseline, criterion=criterion, scale=scale),
                hard_failure=any(v.hard for _, v in judged),
                not_run=[f"seed {o.seed}: {why}" for o, why in missing]
                + [f"seed {seed}: {DROPPED_BY_REPLAN}" for seed in dropped]
                + [f"seed {seed}: {why}" for seed, why in unbegun],
                not_run_short=_grouped(
                    [(o.seed, _not_run(o) or "") for o, _ in missing]
                    + [(seed, DROPPED_BY_REPLAN) for seed in dropped]
                    + unbegun
                ),
                seed_margins=margins,
            )
        )
    return result


def min_stable_value(configs: Sequence[ConfigVerdict]) -> float | None:
    """The smallest tested value from which every larger tested value is stable (undecided values
    neither count for nor against), or ``None`` when the largest decided value is unstable.

    Stability is taken as monotone in the swept size: a stable value with an unstable one above it
    does not count (see `non_monotone`)."""
    decided = sorted((c for c in configs if c.stable is not None), key=lambda c: c.value)
    answer: float | None = None
    for config in reversed(decided):
        if not config.stable:
            break
        answer = config.value
    return answer


def non_monotone(configs: Sequence[ConfigVerdict]) -> list[float]:
    """Stable values below the largest unstable value (evidence that the verdicts are noisy)."""
    unstable = [c.value for c in configs if c.stable is False]
    if not unstable:
        return []
    return [c.value for c in configs if c.stable and c.value < max(unstable)]


def refine_values(configs: Sequence[ConfigVerdict], tested: Sequence[float]) -> list[float]:
    """For a minimal-stable question: the integer midpoint between `min_stable_value` and the largest
    unstable value below it, if one exists and was not tested yet."""
    smallest = min_stable_value(configs)
    if smallest is None:
        return []
    below = [c.value for c in configs if c.stable is False and c.value < smallest]
    if not below:
        return []
    low = max(below)
    middle = math.floor((low + smallest) / 2)
    if low < middle < smallest and middle not in tested:
        return [float(middle)]
    return []
