"""Staged study designs: preflight → coarse → refine → replicate, seeds from a power rule, prior
findings reused, and the plan as a reader sees it (``a3r research --dry-run``).

* **preflight**: held-out evaluation of the untrained model (the baseline; stops a study with no
  signal before any training).
* **coarse**: the plan's values (`a3r.study.settings.Setting.coarse` by default), `SEED_FLOOR` seeds
  each; values a prior finding already measured under the same template, parameters and settings are
  not run again: its runs are reused (`PriorFinding`).
* **refine**: for ``min_stable``, bisection between the smallest stable value and the unstable one
  below it until they are adjacent (`a3r.study.research.refine_values`); for ``best``, the midpoints
  between the best value and its tested neighbours (`best_refine_values`), up to `BEST_REFINE_ROUNDS`.
* **replicate**: more seeds for the configurations the answer rests on (``min_stable``: the chosen
  value and the failing one below it; ``best``: the best and the runner-up; ``a_vs_b``/``effect_of``:
  both arms), as many as the power rule (`seeds_per_arm`) asks from the observed seed-to-seed SD and
  the effect size to detect, capped by ``SweepSpec.max_seeds`` and the budget.

Pure functions over plans and run outcomes (no I/O).
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import norm
from scipy.stats import t as student_t

import templates
from a3r.errors import PlanError
from a3r.study.analysis import RewardSummary
from a3r.study.effects import LEVEL, MIN_EFFECT_SD
from a3r.study.plans import HypothesisDraft, PlanDraft, StabilityCriterion
from a3r.study.price import SEQUENTIAL, SERVER_OVERHEAD_S, Serving, estimate_run_s
from a3r.study.research import (
    WRAP_UP_S,
    ConfigVerdict,
    compared_evals,
    fit_budget,
    min_stable_value,
    sweep_specs,
    token_cap,
)
from a3r.study.runs import RunOutcome
from a3r.study.sequential import SignalRule
from a3r.study.settings import Setting, resolve_setting
from a3r.study.wording import counted

__all__ = [
    "ASSUMED_SECONDS_PER_CALL",
    "ASSUMED_SECONDS_PER_EPISODE",
    "ASSUMED_SEED_SD",
    "ASSUMED_TOKENS_PER_S",
    "BEST_REFINE_ROUNDS",
    "DEFAULT_EFFECT",
    "POWER",
    "SEED_FLOOR",
    "STABLE_CONFIRM_SEEDS",
    "PriorFinding",
    "StageSketch",
    "StudyDesign",
    "answering_values",
    "assumed_speed",
    "best_refine_values",
    "check_overrides",
    "coarse_values",
    "design_study",
    "hypotheses_for",
    "ranked_by_held_out",
    "replicate_additions",
    "seed_means",
    "seeds_per_arm",
]

SEED_FLOOR = 2
"""Seeds of every configuration in the coarse and refine stages (an interval over seeds needs 2)."""

STABLE_CONFIRM_SEEDS = 4
"""Seeds on which a minimal-stable answer must have been stable before it is confirmed, and to which
the replicate stage brings it. k stable runs of k bound a configuration's per-run failure rate only by
1 − 0.05^(1/k) at 95% (Clopper–Pearson; the "rule of three" 3/k for large k): 78% at k = 2, 53% at 4,
39% at 6; two lucky seeds of a value that fails most runs are not a finding."""

POWER = 0.8
"""1 − β: the chance the replicate stage's seeds confirm an effect of the size to detect."""

DEFAULT_EFFECT = 0.1
"""The effect size to detect (reward units, 0..1 rewards) when the plan sets none."""

ASSUMED_SEED_SD = 0.05
"""Seed-to-seed SD of a configuration's outcome assumed for the dry run's plan before any is measured
(reward units; the replicate stage uses the SD the coarse stage observed)."""

ASSUMED_SECONDS_PER_EPISODE = 1.0
"""Wall seconds per episode the dry run assumes when no prior run measured one and the template does
not say its model calls (generated code): arithmetic sweep runs on the embedded model took 37–152 s for
48–160 episodes on 2 CPU cores (≈ 0.4–0.8 s each after the server's start, a3r/README.md §Measured)."""

ASSUMED_SECONDS_PER_CALL = 0.5
"""Wall seconds per model call of an episode, before its tokens (`assumed_speed`)."""

ASSUMED_TOKENS_PER_S = 32.0
"""Completion tokens per second an episode's calls decode at (`assumed_speed`). With
`ASSUMED_SECONDS_PER_CALL` these price an arithmetic episode (1 call of ≤ 16 tokens) at 1.0 s, the old
assumption (measured 0.4–0.8 s), and a 3-player 2-round who-is-the-spy game (≤ 12 calls, ≤ 192 tokens)
at 12 s, against 12.2–12.8 s its smoke runs measured on the embedded model on 2 idle CPU cores
(2026-12-02, a3r/README.md §Budget); calls are priced at their token limit, an upper bound."""


def assumed_speed(template: str | None, params: Mapping[str, Any]) -> tuple[float, str]:
    """Seconds per episode a dry run assumes before any run of ``template`` was measured, and what the
    number assumes: the template's model calls per episode at most (`templates.Template.episode_calls`:
    a multi-turn game's every turn over its most rounds) at `ASSUMED_SECONDS_PER_CALL` each plus their
    token limits at `ASSUMED_TOKENS_PER_S`; `ASSUMED_SECONDS_PER_EPISODE` when the template says
    nothing of its calls (generated code)."""
    calls = templates.get_template(template).episode_calls(dict(params)) if template else None
    if not calls:
        return ASSUMED_SECONDS_PER_EPISODE, (
            f"assumed {ASSUMED_SECONDS_PER_EPISODE:g} s: the code does not say its model calls per episode"
        )
    seconds = len(calls) * ASSUMED_SECONDS_PER_CALL + sum(calls) / ASSUMED_TOKENS_PER_S
    return seconds, (
        f"assumed from the template: at most {counted(len(calls), 'model calls')} of up to {sum(calls)} "
        f"tokens in all per episode, at {ASSUMED_SECONDS_PER_CALL:g} s a call + {ASSUMED_TOKENS_PER_S:g} "
        "tokens/s on 2 CPU cores"
    )


PREFLIGHT_BUDGET_S = 285.0
"""Wall seconds the research preflight run may take, from its server's start to its verdict: the
target of ≤ 5 min for a question the untrained model cannot answer (issue 18), less ≈ 15 s for the
planning, code check and report around it (14 s measured on the idle 2-core box for the AIME
question, server start included). The evaluator's attempts get the rest after the server start
(`a3r.swarmops.evaluate` ``--time-budget``); an attempt still under way then is cut and counts as no
success, and the verdict says how many were cut, after how long and after about how many tokens."""

BEST_REFINE_ROUNDS = 1
"""Refine rounds of a ``best`` question (each tests the midpoints around the current best)."""

MIN_STABLE_REFINE_ROUNDS = 4
"""Most bisection rounds of a ``min_stable`` question (1..16 resolves in 3)."""


def seeds_per_arm(
    sd: float,
    delta: float,
    *,
    min_effect: float = 0.0,
    two_sample: bool = True,
    floor: int = SEED_FLOOR,
    cap: int = 6,
) -> int:
    """Seeds per configuration for the replicate stage: the power rule.

    The smallest n ≥ ``floor`` with

        (t_{1−α/2, df} + z_{1−β}) · σ · √(k / n) ≤ δ − m,

    k = 2 and df = 2n − 2 for two arms compared (Welch's interval over seeds with equal n), k = 1 and
    df = n − 1 for one arm against a fixed threshold; α = 1 − `LEVEL`, 1 − β = `POWER`, σ the observed
    seed-to-seed SD, δ the effect size to detect and m the minimum effect the verdict demands (0.5 σ for
    a comparison, `a3r.study.effects.MIN_EFFECT_SD`; 0 for a stability margin). This is the normal-
    approximation sample size n = k (z_{1−α/2} + z_{1−β})² σ² / (δ − m)² for a superiority test with
    margin m (S.-C. Chow, J. Shao, H. Wang, *Sample Size Calculations in Clinical Research*, 2nd ed.,
    2008, §3.2: two-sample parallel design, test for superiority with a margin), with Student's t
    quantile in place of z_{1−α/2} and solved by search, which matters at the few seeds RL studies
    afford.

    Args:
        sd: Observed seed-to-seed standard deviation of the outcome (reward units); ``nan`` or ≤ 0 gives
            ``floor``.
        delta: Effect size to detect (reward units, > 0).
        min_effect: The minimum effect m the verdict must clear.
        two_sample: Two arms compared (``True``) or one arm against a threshold.
        floor: Fewest seeds.
        cap: Most seeds (the budget's cap); returned when no n ≤ cap has the power.

    Returns:
        Seeds per arm, in [floor, cap].
    """
    if not math.isfinite(sd) or sd <= 0:
        return floor
    gap = delta - min_effect
    if gap <= 0:
        return cap
    k = 2 if two_sample else 1
    z_beta = float(norm.ppf(POWER))
    for n in range(max(floor, 2), cap + 1):
        df = 2 * n - 2 if two_sample else n - 1
        t_alpha = float(student_t.ppf(1 - (1 - LEVEL) / 2, df))
        if (t_alpha + z_beta) * sd * math.sqrt(k / n) <= gap:
            return n
    return cap


class PriorFinding(BaseModel):
    """A finding of an earlier study that measured a configuration this study would run: same
    template, template parameters, varied setting and value, and training settings (seeds aside).

    Attributes:
        finding_id: Store id of the finding.
        study_id: Its study.
        statement: What it says.
        value: The configuration's value of the varied setting.
        status: ``confirmed`` / ``refuted`` / ``unconfirmed``.
        outcomes: Its runs (reused as this study's data for that value; wall time 0).
    """

    model_config = ConfigDict(frozen=True)

    finding_id: int
    study_id: int
    statement: str
    value: float
    status: str
    outcomes: list[RunOutcome] = Field(default_factory=list)

    def cite(self) -> str:
        """One line citing the finding."""
        seeds = sorted({o.seed for o in self.outcomes})
        text = self.statement if len(self.statement) <= 140 else self.statement[:139] + "…"
        return f"finding #{self.finding_id} (study {self.study_id}, seeds {seeds}): {text}"


def coarse_values(plan: PlanDraft, priors: Sequence[PriorFinding]) -> list[float]:
    """The coarse stage's values left to run: the plan's, less those whose prior findings bring at
    least as many seeds as the plan runs (their runs are reused)."""
    assert plan.sweep is not None
    covered = {p.value for p in priors if len({o.seed for o in p.outcomes}) >= len(plan.training.seeds)}
    return [v for v in plan.sweep.coarse if v not in covered]


def answering_values(goal: str, cost: Mapping[float, float], *, reused: int = 0) -> list[float]:
    """The configurations still to run that the least answer of a study's goal needs, cheapest first.

    A best-value question compares values, so it needs two (less those whose runs prior findings bring:
    ``reused``), and the two cheapest answer most cheaply; a min-stable question is answered by one
    value, the cheapest. An A-vs-B or effect-of study needs both arms (its callers price those whole).

    Args:
        goal: The sweep's goal (``best``, ``min_stable``, ...).
        cost: Seconds of each value still to run, on every seed (any unit; only the order matters).
        reused: Distinct plan values whose runs prior findings bring (`coarse_values` leaves them out).

    Returns:
        At least one value (while ``cost`` has any), at most ``len(cost)``; ``[]`` for an empty ``cost``.
    """
    needed = max(1, 2 - reused) if goal == "best" else 1
    return sorted(cost, key=lambda v: cost[v])[:needed]


def seed_means(outcomes: Sequence[RunOutcome], value: float) -> list[float]:
    """Held-out mean reward of each evaluated sweep run of ``value`` (one number per seed), over the
    held-out tasks every evaluated sweep run of ``outcomes`` ran (`compared_evals`)."""
    shared, _ = compared_evals(outcomes)
    return [
        e.mean_reward
        for i, e in sorted(shared.items())
        if outcomes[i].value == value and math.isfinite(e.mean_reward)
    ]


def _pooled_sd(groups: Sequence[Sequence[float]]) -> float:
    """Pooled within-group SD over the groups with ≥ 2 values (``nan`` without any)."""
    num = sum((len(g) - 1) * statistics.variance(g) for g in groups if len(g) >= 2)
    den = sum(len(g) - 1 for g in groups if len(g) >= 2)
    return math.sqrt(num / den) if den else math.nan


def ranked_by_held_out(configs: Sequence[ConfigVerdict]) -> list[ConfigVerdict]:
    """Evaluated configurations, highest mean held-out reward first."""
    scored = [c for c in configs if math.isfinite(c.eval_mean_reward)]
    return sorted(scored, key=lambda c: c.eval_mean_reward, reverse=True)


def best_refine_values(configs: Sequence[ConfigVerdict], setting: Setting) -> list[float]:
    """For a ``best`` question: the values to test between the best value and its tested neighbours
    (`Setting.midpoint`), not tested yet. When the runner-up is a neighbour of the best, the optimum
    of a unimodal landscape most likely lies between the two, so only that midpoint is tested;
    otherwise the midpoints on both sides."""
    ranked = ranked_by_held_out(configs)
    if len(ranked) < 2:
        return []
    tested = sorted(c.value for c in configs)
    best, runner_up = ranked[0].value, ranked[1].value
    index = tested.index(best)
    neighbours = [tested[i] for i in (index - 1, index + 1) if 0 <= i < len(tested)]
    if runner_up in neighbours:
        neighbours = [runner_up]
    extra: list[float] = []
    for neighbour in neighbours:
        middle = setting.midpoint(best, neighbour)
        if middle is not None and middle not in tested:
            extra.append(middle)
    return sorted(extra)


def replicate_additions(
    plan: PlanDraft,
    configs: Sequence[ConfigVerdict],
    outcomes: Sequence[RunOutcome],
    *,
    baseline: RewardSummary,
    criterion: StabilityCriterion,
) -> tuple[dict[float, list[int]], str]:
    """New seeds for the configurations the answer rests on, by the power rule.

    Returns:
        ``({value: new seeds}, one line saying what the rule decided and why)``; empty when every
        deciding configuration is settled or already has the seeds the rule asks for.
    """
    assert plan.sweep is not None
    sweep = plan.sweep
    delta = sweep.effect_size or DEFAULT_EFFECT
    seeds_of = {c.value: sorted(set(c.seeds)) for c in configs}
    used = {o.seed for o in outcomes if o.purpose == "sweep"}
    next_seed = max(used, default=-1) + 1
    arms: list[float] = []
    if sweep.goal == "min_stable":
        chosen = min_stable_value(configs)
        if chosen is None:
            return {}, "replicate: no stable value to replicate"
        below = [c for c in configs if c.value < chosen and c.stable is False]
        deciding = [c for c in configs if c.value == chosen] + below[-1:]
        unsettled = [c for c in deciding if not c.settled or c.value == chosen]
        sd = _pooled_sd([c.seed_margins for c in unsettled])  # held-out after − (before − δ), per seed
        n = max(
            seeds_per_arm(sd, delta, two_sample=False, cap=sweep.max_seeds),
            min(STABLE_CONFIRM_SEEDS, sweep.max_seeds),
        )
        arms = [c.value for c in unsettled]
        why = (
            f"σ(held-out margin over seeds) = {sd:.3f}, effect to detect {delta:g}, one-sided margin test; the answer needs "
            f">= {STABLE_CONFIRM_SEEDS} stable seeds"
        )
    else:
        ranked = ranked_by_held_out(configs)
        if len(ranked) < 2:
            return {}, "replicate: fewer than two evaluated configurations"
        if sweep.goal == "best":
            arms = [ranked[0].value, ranked[1].value]
        else:
            arms = sorted({c.value for c in configs})[:2]
        groups = [seed_means(outcomes, c.value) for c in configs]
        sd = _pooled_sd(groups)
        n = seeds_per_arm(sd, delta, min_effect=MIN_EFFECT_SD * sd, cap=sweep.max_seeds)
        why = (
            f"σ(held-out mean over seeds) = {sd:.3f}, effect to detect {delta:g}, verdict threshold m = "
            f"{MIN_EFFECT_SD:g} σ = {MIN_EFFECT_SD * sd:.3f}"
        )
    additions: dict[float, list[int]] = {}
    for value in arms:
        missing = n - len(seeds_of.get(value, []))
        if missing > 0:
            additions[value] = list(range(next_seed, next_seed + missing))
            next_seed += missing
    setting = resolve_setting(sweep.variable, plan.template)
    values = ", ".join(setting.text(v) for v in arms)
    line = f"replicate: power rule → {n} seeds per configuration for {sweep.variable} ∈ {{{values}}} ({why}, power {POWER:g})"
    return additions, line


_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def reword_seeds(text: str, before: Sequence[int], after: Sequence[int]) -> str:
    """``text`` with its mentions of the seeds ``before`` rewritten for the seeds ``after``: a count of
    seeds equal to ``len(before)`` ("2 seeds", "two seeds", "2 random seeds") becomes ``len(after)``, and
    a written seed list ("seeds [0, 1]", "seeds 0 and 1") becomes ``after``. Other counts (a cap such as
    "at most 6 seeds") are kept."""
    n, m = len(before), len(after)
    words = [str(n)] + ([_NUMBER_WORDS[n]] if n < len(_NUMBER_WORDS) else [])
    count = re.compile(rf"\b({'|'.join(words)})(\s+(?:\w+[ -])?seeds?\b)", re.IGNORECASE)
    text = count.sub(lambda g: f"{m}{g.group(2).rstrip('sS')}{'s' if m > 1 else ''}", text)
    listed = ", ".join(map(str, before))
    joined = " and ".join([", ".join(map(str, before[:-1])), str(before[-1])]) if n > 1 else str(before[0])
    noun = "seeds" if m > 1 else "seed"
    for written in (f"[{listed}]", f"{{{listed}}}", joined):
        text = re.sub(rf"\bseeds?\s+{re.escape(written)}(?!\d|\.\d)", f"{noun} {list(after)}", text)
    return text


def check_overrides(plan: PlanDraft, overrides: Mapping[str, Any]) -> None:
    """Refuse command-line training settings the study's sweep would override: each run of a sweep
    over a training setting sets that setting itself, so a fixed value given for it (``--serve-option
    kl-coef=0.1`` while the study varies the KL coefficient) would be dropped without a word.

    Raises:
        PlanError: The swept setting is among ``overrides`` (one line naming it and its values).
    """
    if plan.sweep is None or plan.sweep.variable not in overrides:
        return
    setting = resolve_setting(plan.sweep.variable, plan.template)
    if setting.target != "training":
        return
    values = ", ".join(f"{v:g}" for v in plan.sweep.coarse)
    raise PlanError(
        f"the study varies {setting.label} ({plan.sweep.variable} ∈ {{{values}}}): the fixed "
        f"{plan.sweep.variable} = {overrides[plan.sweep.variable]} given on the command line would be replaced "
        "by each run's value; drop it, or ask a question about another setting"
    )


def restate_for_training(draft: PlanDraft, plan: PlanDraft) -> PlanDraft:
    """``plan`` (``draft`` with the command line's training settings) with hypotheses that say the
    seeds it will run: a3r's own pre-registered hypotheses (`hypotheses_for`) are rewritten for it, and
    an LLM's have their seed counts and seed lists reworded (`reword_seeds`)."""
    if draft.sweep is not None and draft.hypotheses == hypotheses_for(draft):
        return plan.model_copy(update={"hypotheses": hypotheses_for(plan)})
    before, after = draft.training.seeds, plan.training.seeds
    if before == after:
        return plan
    reworded = [
        h.model_copy(
            update={
                "statement": reword_seeds(h.statement, before, after),
                "expected_outcome": reword_seeds(h.expected_outcome, before, after),
                "decision_rule": reword_seeds(h.decision_rule, before, after),
            }
        )
        for h in plan.hypotheses
    ]
    return plan.model_copy(update={"hypotheses": reworded})


MINIMUM_EFFECT = f"the minimum effect m = {MIN_EFFECT_SD:g} σ (σ: the seed-to-seed SD the runs show)"
"""The one threshold a comparison's verdict applies (`a3r.study.effects`), as the plan states it."""


def power_text(delta: float, most: int) -> str:
    """How the replicate stage's seeds are chosen, in the plan's words: the effect to detect sizes
    them (`seeds_per_arm`); it is not the verdict's threshold."""
    return (
        f"seeds per the power rule (enough for a true effect of {delta:g} to clear the verdict's threshold "
        f"with power {POWER:g}; at most {most} seeds)"
    )


def not_a_threshold(delta: float) -> str:
    """The sentence that keeps the effect to detect apart from the verdict's minimum effect."""
    return (
        f"The effect to detect ({delta:g}) only sizes the seeds and is not a threshold: a difference smaller "
        f"than {delta:g} whose interval clears m is confirmed"
    )


def hypotheses_for(plan: PlanDraft) -> list[HypothesisDraft]:
    """The pre-registered hypothesis of a research plan, with its decision rule."""
    assert plan.sweep is not None
    sweep = plan.sweep
    setting = resolve_setting(sweep.variable, plan.template)
    values = ", ".join(setting.text(v) for v in sweep.coarse)
    delta = sweep.effect_size or DEFAULT_EFFECT
    floor = max(len(plan.training.seeds), SEED_FLOOR)
    most = max(sweep.max_seeds, floor)
    stages = (
        f"staged: coarse {{{values}}} on {floor} seeds, refine, then replicate with {power_text(delta, most)}"
    )
    if sweep.goal == "min_stable":
        stability = plan.stability or StabilityCriterion()
        return [
            HypothesisDraft(
                statement=f"there is a smallest stable {setting.label} among {{{values}}} and values below it are unstable",
                expected_outcome=(
                    "configurations at or above some value are stable on every seed, those below are not; "
                    f"stability: {stability.describe()}"
                ),
                decision_rule=(
                    f"{stages}. The answer is the smallest value whose every seed (>= {stability.min_seeds}) is stable "
                    "with every larger tested value stable; confirmed only when it was stable on >= "
                    f"{STABLE_CONFIRM_SEEDS} seeds, its margin over the threshold (95% CI over seeds) excludes 0 and "
                    "the value below failed by a hard failure or a refuted margin, with no stable value below a "
                    "failing one; refuted when no value is stable; else unconfirmed"
                ),
            )
        ]
    if sweep.goal == "best":
        return [
            HypothesisDraft(
                statement=f"among the tested values of {setting.label} one gives the highest held-out mean reward",
                expected_outcome="a value whose mean held-out reward over seeds exceeds every other's",
                decision_rule=(
                    f"{stages}. Best = the highest mean held-out reward over seeds; confirmed when the 95% Welch "
                    f"interval of its lead over the runner-up (one observation per seed) lies above {MINIMUM_EFFECT}; "
                    f"otherwise unconfirmed, with the seeds that would settle it. {not_a_threshold(delta)}"
                ),
            )
        ]
    a, b = (setting.text(v) for v in sweep.coarse[:2])
    claim = (
        f"{setting.label} = {b} gives a higher held-out mean reward than {a}"
        if sweep.goal == "a_vs_b"
        else f"changing {setting.label} from {a} (reference) to {b} changes the held-out mean reward"
    )
    return [
        HypothesisDraft(
            statement=claim,
            expected_outcome=(
                f"the mean held-out reward over seeds differs between {a} and {b} by more than {MINIMUM_EFFECT}"
            ),
            decision_rule=(
                f"staged: both arms on {floor} seeds, then replicate with {power_text(delta, most)}. Effect = "
                f"mean({b}) − mean({a}) over seeds (Welch 95% interval, one observation per seed): confirmed "
                f"when the interval lies above {MINIMUM_EFFECT}"
                + (
                    ", refuted when it lies below it; otherwise unconfirmed"
                    if sweep.goal == "a_vs_b"
                    else "; a change that lowers the reward is reported the same way with the sign flipped; otherwise unconfirmed"
                )
                + f". {not_a_threshold(delta)}"
            ),
        )
    ]


class StageSketch(BaseModel):
    """One stage of the plan as the dry run prints it.

    Attributes:
        name: ``preflight``, ``coarse``, ``refine``, ``replicate``.
        values: Values of the varied setting it runs (``[]`` for the preflight; decided later for
            refine and replicate).
        seeds: Seeds per configuration.
        runs: Runs it spends (at most, for the stages decided later).
        seconds: Estimated wall seconds.
        note: How its configurations are chosen.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    values: list[float] = Field(default_factory=list)
    seeds: int = 0
    runs: int = 0
    seconds: float = 0.0
    note: str = ""


class StudyDesign(BaseModel):
    """The staged plan of a research question (printed by ``a3r research --dry-run``).

    Attributes:
        setting: The varied setting.
        stages: In order.
        priors: Prior findings whose runs are reused.
        seconds_per_episode: The speed the estimate assumes.
        speed_source: Where that speed comes from.
        cheapest: The coarse values still to run that answer most cheaply (`answering_values`: two for a
            best-value question, one for a min-stable one) and their seconds on every seed (both arms for
            an A-vs-B or effect-of study, named by the first); ``None`` when every coarse value is reused.
    """

    model_config = ConfigDict(frozen=True)

    setting: Setting
    stages: list[StageSketch]
    priors: list[PriorFinding] = Field(default_factory=list)
    seconds_per_episode: float
    speed_source: str
    cheapest: tuple[tuple[float, ...], float] | None = None

    @property
    def estimated_s(self) -> float:
        """Estimated wall seconds of every stage (the refine and replicate stages at their most)."""
        return sum(s.seconds for s in self.stages)

    @property
    def comparison_need_s(self) -> float:
        """Wall seconds the smallest answer of the study needs at the design's speed: the preflight,
        the coarse stage's runs still to run (for an A-vs-B or effect-of study: both arms on the floor
        seeds, which the runner will not split) and the thread's wrap-up (`WRAP_UP_S`)."""
        return sum(s.seconds for s in self.stages if s.name in ("preflight", "coarse")) + WRAP_UP_S

    @property
    def smallest_need_s(self) -> float:
        """Wall seconds the least the study can run to answer its goal needs at the design's speed: the
        preflight, the `cheapest` coarse configurations on every seed and the wrap-up (`WRAP_UP_S`)."""
        preflight = sum(s.seconds for s in self.stages if s.name == "preflight")
        return preflight + (self.cheapest[1] if self.cheapest else 0.0) + WRAP_UP_S

    @property
    def runs(self) -> int:
        """Runs of every stage still to run (at most); reused prior runs are not counted."""
        return sum(s.runs for s in self.stages)

    @property
    def reused_runs(self) -> int:
        """Runs of prior findings this study reuses instead of running them."""
        return sum(len(p.outcomes) for p in self.priors)


def _sketch_run(plan: PlanDraft, value: float, *, seconds_per_episode: float, eval_episodes: int) -> float:
    """Estimated seconds of one run at ``value`` of the varied setting, by the runner's own price
    (`a3r.study.research.estimate_run_s`): a training setting that sets the episodes per step (batch
    size B, group size G) or the steps is priced by its own episodes; a response-token cap
    ``max_tokens`` scales the seconds per training episode by value / the plan's cap."""
    (spec,) = sweep_specs(plan, [value], "estimate", seeds=[0])
    return estimate_run_s(
        spec,
        seconds_per_episode=seconds_per_episode,
        eval_episodes=eval_episodes,
        measured_tokens=token_cap(plan),
    )


def budget_drops(
    plan: PlanDraft,
    design: StudyDesign,
    *,
    budget_s: float,
    eval_episodes: int,
    serving: Serving = SEQUENTIAL,
) -> list[float]:
    """Coarse values the runner would drop to fit ``budget_s`` after the preflight (the same rule as
    at run time: `a3r.study.research.fit_budget`, its runs served as ``serving`` says), at the design's
    assumed speed."""
    coarse = next((s for s in design.stages if s.name == "coarse"), None)
    preflight = sum(s.seconds for s in design.stages if s.name == "preflight")
    if coarse is None or plan.sweep is None:
        return []
    _, dropped = fit_budget(
        sweep_specs(plan, coarse.values, "coarse"),
        budget_s=budget_s - preflight,
        seconds_per_episode=design.seconds_per_episode,
        eval_episodes=eval_episodes,
        goal=plan.sweep.goal,
        measured_tokens=token_cap(plan),
        serving=serving,
    )
    return dropped


def design_study(
    plan: PlanDraft,
    *,
    priors: Sequence[PriorFinding] = (),
    seconds_per_episode: float,
    speed_source: str,
    eval_episodes: int,
    preflight_episodes: int,
    seed_sd: float = ASSUMED_SEED_SD,
    preflight_budget_s: float = PREFLIGHT_BUDGET_S,
) -> StudyDesign:
    """The stages a research plan will run, with configurations, seeds and an estimated time.

    The refine and replicate stages depend on results; they are sketched at their most: refine
    (``min_stable``) bisects the widest gap between coarse values, (``best``) tests two midpoints per
    round; replicate brings two configurations to the power rule's seeds for ``seed_sd``.

    Args:
        plan: A research plan (`a3r.study.plans.check_plan` passed).
        priors: Prior findings whose runs are reused.
        seconds_per_episode: Assumed wall seconds per episode.
        speed_source: Where that number comes from (printed).
        eval_episodes: Held-out attempts per run's evaluation.
        preflight_episodes: Held-out attempts of the preflight.
        seed_sd: Seed-to-seed SD assumed for the power rule.
        preflight_budget_s: Wall seconds the preflight run may take (0: none): attempts still under
            way then are cut and count as no success.
    """
    assert plan.sweep is not None
    cost = {
        v: _sketch_run(plan, v, seconds_per_episode=seconds_per_episode, eval_episodes=eval_episodes)
        for v in plan.sweep.coarse
    }
    # refine and replicate values are decided later: priced at the dearest coarse value, reused or not
    # (a study whose coarse runs are all reused still runs its replicate stage)
    per_run = max(cost.values(), default=0.0)
    stages = [
        _preflight_sketch(plan, seconds_per_episode, preflight_episodes, preflight_budget_s),
        _coarse_sketch(plan, priors, cost),
        *_refine_sketch(plan, per_run),
        *_replicate_sketch(plan, priors, per_run, seed_sd),
    ]
    return StudyDesign(
        setting=resolve_setting(plan.sweep.variable, plan.template),
        stages=stages,
        priors=list(priors),
        seconds_per_episode=seconds_per_episode,
        speed_source=speed_source,
        cheapest=_cheapest(plan, stages[1], cost),
    )


def _cheapest(
    plan: PlanDraft, coarse: StageSketch, cost: Mapping[float, float]
) -> tuple[tuple[float, ...], float] | None:
    """The coarse configurations still to run that answer most cheaply, with their seconds on every
    seed: `answering_values` (the two cheapest values for a best-value question, the cheapest for a
    min-stable one), or for an A-vs-B or effect-of study both arms, named by the first (the runner
    never runs one arm alone); ``None`` when the coarse stage has nothing to run."""
    assert plan.sweep is not None
    if not coarse.values:
        return None
    if plan.sweep.goal in ("a_vs_b", "effect_of"):
        return (coarse.values[0],), coarse.seconds
    reused = len(set(plan.sweep.coarse) - set(coarse.values))
    values = answering_values(plan.sweep.goal, {v: cost[v] for v in coarse.values}, reused=reused)
    return tuple(values), coarse.seeds * sum(cost[v] for v in values)


def _preflight_sketch(
    plan: PlanDraft, seconds_per_episode: float, preflight_episodes: int, preflight_budget_s: float
) -> StageSketch:
    preflight_s = SERVER_OVERHEAD_S + preflight_episodes * seconds_per_episode
    cap = ""
    if preflight_budget_s > 0:
        preflight_s = min(preflight_s, preflight_budget_s)
        cap = (
            f"; at most {preflight_budget_s:g} s, server start included: attempts still under way then are cut "
            "and count as no success (the verdict says how many, after how long and how many tokens)"
        )
    return StageSketch(
        name="preflight",
        runs=1,
        seconds=preflight_s,
        note=(
            f"held-out evaluation of the untrained model (up to {preflight_episodes} attempts); a sequential "
            "futility test (a3r.study.sequential) stops the study early, after as few attempts as it takes, "
            f"when its success rate is bounded below {SignalRule().stop_rate(plan.training.group_size):.3f} "
            f"(too few groups of G = {plan.training.group_size} with a non-zero advantage to train on){cap}"
        ),
    )


def _coarse_sketch(
    plan: PlanDraft, priors: Sequence[PriorFinding], cost: Mapping[float, float]
) -> StageSketch:
    assert plan.sweep is not None
    setting = resolve_setting(plan.sweep.variable, plan.template)
    floor = len(plan.training.seeds)
    coarse = coarse_values(plan, priors)
    reused = sorted({p.value for p in priors})
    note = "every value on every seed"
    if setting.name == "max_tokens" and setting.target == "template":
        note += (
            "; training episodes priced as if responses ran to the cap (an upper bound; the speed is taken at "
            f"{token_cap(plan) or setting.default:g}, the plan's cap; the runner's budget prices them alike)"
        )
    inside = [v for v in reused if v not in plan.sweep.coarse]
    reused = [v for v in reused if v in plan.sweep.coarse]
    if reused:
        note += f"; reused from prior findings: {', '.join(f'{v:g}' for v in reused)}"
    if inside:
        note += (
            f"; prior findings at {', '.join(f'{v:g}' for v in inside)} join the analysis (refine bisects from "
            "the bracket they give and never re-runs them)"
        )
    return StageSketch(
        name="coarse",
        values=coarse,
        seeds=floor,
        runs=len(coarse) * floor,
        seconds=floor * sum(cost[v] for v in coarse),
        note=note,
    )


def _refine_sketch(plan: PlanDraft, per_run: float) -> list[StageSketch]:
    sweep = plan.sweep
    assert sweep is not None
    if not (sweep.refine and sweep.goal in ("min_stable", "best")):
        return []
    if sweep.goal == "min_stable":
        ordered = sorted(sweep.coarse)
        widest = max((b - a for a, b in itertools.pairwise(ordered)), default=0.0)
        rounds = min(MIN_STABLE_REFINE_ROUNDS, max(0, math.ceil(math.log2(widest))) if widest > 1 else 0)
        per_round = 1
        how = "bisect between the smallest stable value and the unstable one below it"
    else:
        rounds, per_round = BEST_REFINE_ROUNDS, 2
        how = (
            f"the {resolve_setting(sweep.variable, plan.template).scale} midpoint between the best value and the "
            "runner-up when they are neighbours, else both midpoints around the best"
        )
    floor = len(plan.training.seeds)
    runs = rounds * per_round * floor
    return [
        StageSketch(
            name="refine",
            seeds=floor,
            runs=runs,
            seconds=runs * per_run,
            note=f"up to {rounds} round(s): {how}",
        )
    ]


def _replicate_sketch(
    plan: PlanDraft, priors: Sequence[PriorFinding], per_run: float, seed_sd: float
) -> list[StageSketch]:
    sweep = plan.sweep
    assert sweep is not None
    if not sweep.replicate:
        return []
    floor = len(plan.training.seeds)
    delta = sweep.effect_size or DEFAULT_EFFECT
    two = sweep.goal != "min_stable"
    n = seeds_per_arm(
        seed_sd,
        delta,
        min_effect=MIN_EFFECT_SD * seed_sd if two else 0.0,
        two_sample=two,
        cap=sweep.max_seeds,
    )
    n = max(n, floor)  # never fewer than the seeds asked for (--seeds)
    # two arms brought to n seeds; an A-vs-B or effect-of arm counts the seeds its prior findings bring
    arms = sweep.coarse[:2] if sweep.goal in ("a_vs_b", "effect_of") else []
    have = [max(floor, len({o.seed for p in priors if p.value == v for o in p.outcomes})) for v in arms]
    extra = sum(max(0, n - h) for h in have) if arms else 2 * (n - floor)
    deciding = {
        "min_stable": "the chosen value and the failing one below it",
        "best": "the best value and the runner-up",
    }.get(sweep.goal, "both arms")
    return [
        StageSketch(
            name="replicate",
            seeds=n,
            runs=extra,
            seconds=extra * per_run,
            note=(
                f"{deciding} brought to n seeds by the power rule (σ = {seed_sd:.3f} assumed until the coarse "
                f"stage measures it; effect to detect {delta:g}, power {POWER:g}, against the verdict's threshold "
                + (f"m = {MIN_EFFECT_SD:g} σ" if two else "0 (a stability margin)")
                + f"; n in [{floor}, {max(sweep.max_seeds, floor)}])"
            ),
        )
    ]
