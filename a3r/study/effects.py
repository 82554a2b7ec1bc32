"""Effects with their uncertainty, and the verdict they support: the one place a3r decides whether a
claimed effect (a reward gain, a stability margin, a held-out change) cleared the noise.

Every headline a3r writes (the vibe report's hypothesis, the research conclusion, the analyst's
findings) takes its verdict from an `Effect`:

* **confirmed**: the effect's 95% confidence interval lies entirely above the *minimum effect*;
* **refuted**: the interval lies entirely below it (any effect is smaller than what would matter, or
  of the opposite sign);
* **unconfirmed**: the interval straddles it; `Effect.more_needed` then says about how many more seeds
  or steps would settle it, up to `MORE_REACH` times what was run; beyond that (a flat series, an effect
  ≈ the minimum effect) the verdict says more seeds or steps are unlikely to settle it at this effect
  size, and gives the effect and its interval instead (`Effect.out_of_reach`). A run that cannot learn (no update, zero-signal groups) is never confirmed,
  and neither confirmed nor refuted is a degenerate interval (standard error 0: every replicate
  identical, e.g. all rewards 0), which measures no noise at all.

The minimum effect is ``MIN_EFFECT_SD`` (0.5) times the observed noise standard deviation σ of the
series (Cohen's "medium" standardized effect d = 0.5; J. Cohen, *Statistical Power Analysis for the
Behavioral Sciences*, 2nd ed., 1988, §2.2.3): an effect smaller than half the step-to-step noise is not
worth claiming even when many steps make its interval narrow.

Two sources of replication:

* **over seeds** (`seed_effect`): each seed gives one estimate; the interval is Student's t over
  seeds (k − 1 degrees of freedom), so 2 seeds give t = 12.7 and rarely confirm anything;
* **over steps** of one run (`step_effect`: the least-squares trend, `level_effect`: the mean against
  a fixed level): successive steps of one policy are autocorrelated, so the naive n overstates the
  evidence. The residuals' lag-1 autocorrelation ρ gives the effective sample size of an AR(1) series,
  n_eff = n (1 − ρ) / (1 + ρ), ρ clipped to [0, 0.95] (Zwiers & von Storch 1995, "Taking serial
  correlation into account in tests of the mean", J. Climate 8:336; Wilks, *Statistical Methods in
  the Atmospheric Sciences*, 3rd ed., 2011, eq. 5.12; for trends Santer et al. 2000), which sets both
  the standard error and the degrees of freedom.

**The reward's scale.** Given the range of the values (a template's reward range,
`templates.TemplateMeta.reward_range`), every interval is clipped to the effects that range allows (a
change of a reward in [0, 1] lies in [−1, +1]); with fewer than `MIN_N_EFF` effective points an
interval that would cover that whole range says nothing, and the effect reports "too few points" instead
(a 6-step train-reward trend with n_eff 2.9 gave "95% CI −3.192 … +3.478" on a reward in [0, 1]).

Pure functions of plain numbers (no I/O); rewards are in the task's reward units.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict
from scipy.stats import t as student_t

from a3r.study.wording import counted, unit_noun

__all__ = [
    "LEVEL",
    "MIN_EFFECT_SD",
    "MIN_N_EFF",
    "MORE_REACH",
    "Effect",
    "EffectVerdict",
    "Scale",
    "curve_effect",
    "effective_size",
    "lag1_autocorrelation",
    "level_effect",
    "seed_effect",
    "step_effect",
    "two_sample_effect",
    "unbiased_rho",
]

LEVEL = 0.95
"""Confidence level of every interval."""

MIN_EFFECT_SD = 0.5
"""Minimum effect, in units of the observed noise standard deviation (Cohen's d = 0.5)."""

MORE_REACH = 10
"""Most replication an unconfirmed verdict names, as a multiple of what was run: an interval that
would need more than 10× the seeds or steps run to clear the minimum effect is out of reach at this
effect size, and the verdict says so instead of naming a number that no study would run."""

MAX_RHO = 0.95
"""Largest lag-1 autocorrelation used (a larger estimate would make n_eff vanish)."""

MIN_STEPS = 4
"""Fewest steps of one run that `step_effect` judges (two per half)."""

MIN_N_EFF = 5.0
"""Fewest effective points whose interval is given even when it covers every effect the reward's range
allows: below it such an interval is reported as too few points."""

Scale = tuple[float, float]
"""The range ``(low, high)`` a value (a reward) can take, in reward units."""

Unit = Literal["seeds", "steps", "episodes"]


class EffectVerdict(StrEnum):
    """What an effect's interval supports (values match `memory.FindingStatus`)."""

    confirmed = "confirmed"
    refuted = "refuted"
    unconfirmed = "unconfirmed"


class Effect(BaseModel):
    """An estimated effect with its confidence interval and verdict.

    Attributes:
        estimate: The effect, in reward units (``nan`` when nothing could be estimated).
        low: Lower bound of the `LEVEL` confidence interval.
        high: Upper bound.
        min_effect: The effect that counts: ``MIN_EFFECT_SD`` × ``noise_sd`` (or as given).
        noise_sd: Observed noise standard deviation σ behind the minimum effect.
        n: Replicates behind the estimate (seeds, steps or episodes).
        unit: What ``n`` counts.
        n_eff: Effective sample size after the autocorrelation correction (``n`` for independent units).
        autocorrelation: Lag-1 autocorrelation of the residuals (``nan`` when not estimated).
        verdict: `EffectVerdict`.
        more_needed: About how many more units (of ``unit``) would settle an unconfirmed verdict
            (``None`` when settled or when no number of units would, e.g. a run that cannot learn).
        note: Why the verdict is capped or could not be computed, or that more replication is unlikely
            to settle it ("" when none of these).
        out_of_reach: Unconfirmed, and more than `MORE_REACH` × ``n`` more units would be needed to
            settle it at the observed effect and noise (``more_needed`` is then ``None``).
        min_effect_basis: Where ``min_effect`` comes from when it is not ``MIN_EFFECT_SD`` × ``noise_sd``
            (e.g. a non-inferiority margin whose tolerance is already in the reference); "" for that rule.
        bounds: The effects the reward's range allows (``None``: the range is unknown); ``low`` and
            ``high`` lie within them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    estimate: float
    low: float
    high: float
    min_effect: float
    noise_sd: float
    n: int
    unit: Unit
    n_eff: float
    autocorrelation: float = math.nan
    verdict: EffectVerdict
    more_needed: int | None = None
    note: str = ""
    min_effect_basis: str = ""
    out_of_reach: bool = False
    bounds: Scale | None = None

    def describe(self, *, verdict: bool = True) -> str:
        """One line: the verdict first (unless ``verdict=False``), then the estimate, its interval, the
        minimum effect and what would settle it."""
        head = f"{self.verdict.value}: " if verdict else ""
        settle = (
            f"; ≈ {self.more_needed} more {unit_noun(self.more_needed, self.unit)} would settle it"
            if self.verdict is EffectVerdict.unconfirmed and self.more_needed is not None
            else ""
        )
        if not math.isfinite(self.estimate):
            return f"{head}not estimated: {self.note or 'no value to estimate it from'}{settle}"
        units = counted(self.n, self.unit)
        if self.unit == "steps" and math.isfinite(self.autocorrelation):
            units += f", lag-1 autocorrelation taken as {max(self.autocorrelation, 0.0):.2f} → n_eff {self.n_eff:.1f}"
        interval = (
            f"{int(LEVEL * 100)}% CI {self.low:+.3f} … {self.high:+.3f}"
            if math.isfinite(self.low) and math.isfinite(self.high)
            else ("too few points for an interval" if self.too_few else "no interval")
        )
        floor = (
            f"{_number(self.min_effect)} ({self.min_effect_basis}); noise σ = {_number(self.noise_sd)}"
            if self.min_effect_basis
            else f"{_number(self.min_effect)} (= {MIN_EFFECT_SD:g} σ, σ = {_number(self.noise_sd)})"
        )
        text = f"{head}{self.estimate:+.3f} ({interval}; {units}); minimum effect {floor}"
        if self.note:
            text += f"; {self.note}"
        return text + settle

    @property
    def too_few(self) -> bool:
        """Whether the interval was withheld: fewer than `MIN_N_EFF` effective points, and it would have
        covered every effect the reward's range allows."""
        return self.note.startswith(_TOO_FEW)


_TOO_FEW = "too few points"


def _effect_bounds(scale: Scale | None, reference: float = math.nan) -> Scale | None:
    """The effects a value range allows: a change or difference of two values in ``scale`` lies within
    ± its width; a mean minus a fixed ``reference``, within ``scale`` shifted by it."""
    if scale is None:
        return None
    low, high = scale
    if math.isfinite(reference):
        return low - reference, high - reference
    return low - high, high - low


def _number(value: float) -> str:
    """Three decimals, or two significant digits for a value that three decimals would show as 0."""
    if value != 0 and math.isfinite(value) and abs(value) < 0.0005:
        return f"{value:.2g}"
    return f"{value:.3f}"


def lag1_autocorrelation(residuals: Sequence[float]) -> float:
    """Lag-1 autocorrelation r₁ = Σ e_t e_{t+1} / Σ e_t² of zero-mean residuals.

    Returns:
        r₁ in [-1, 1], or ``nan`` for fewer than 3 values or zero variance.
    """
    if len(residuals) < 3:
        return math.nan
    denominator = sum(e * e for e in residuals)
    if denominator <= 0:
        return math.nan
    return sum(a * b for a, b in itertools.pairwise(residuals)) / denominator


def unbiased_rho(r1: float, n: int) -> float:
    """A cautious lag-1 autocorrelation from a short series' estimate r₁.

    r₁ is biased low by about (1 + 4ρ)/n (Marriott & Pope 1954, "Bias in the estimation of
    autocorrelations", Biometrika 41:390), corrected as ρ̃ = (n r₁ + 1) / (n − 4); half a standard error
    of r₁, √((1 − ρ̃²)/n) / 2 (Bartlett 1946), is then added, since n_eff is very sensitive to ρ on
    short series. Measured on 10 steps over 1,500 trials (tests/a3r/test_effects.py has the harness):
    AR(1) noise with ρ = 0.6 confirmed a trend in 6% of trials uncorrected and 4.1% with this; white
    noise in 0.5%; a trend of 2 σ per step was confirmed in 87% of trials (94% with the bias correction
    alone, at 5.4% false confirmations).

    Returns:
        The ρ to use (``nan`` for ``nan`` input); for n <= 4, `MAX_RHO` (too few steps to tell).
    """
    if not math.isfinite(r1):
        return r1
    if n <= 4:
        return MAX_RHO
    corrected = min(max((n * r1 + 1.0) / (n - 4), -1.0), MAX_RHO)
    return corrected + 0.5 * math.sqrt(max(0.0, 1.0 - corrected * corrected) / n)


def effective_size(n: int, rho: float) -> float:
    """Effective sample size of the mean of an AR(1) series: n (1 − ρ) / (1 + ρ), ρ clipped to
    [0, `MAX_RHO`] (negative estimates are treated as independence, which is conservative); at least 1.

    Source: Zwiers & von Storch (1995), J. Climate 8:336, eq. 4; Wilks (2011) eq. 5.12.
    """
    r = 0.0 if not math.isfinite(rho) else min(max(rho, 0.0), MAX_RHO)
    return max(1.0, n * (1.0 - r) / (1.0 + r))


def _quantile(df: float) -> float:
    return float(student_t.ppf(0.5 + LEVEL / 2, max(df, 1.0)))


@dataclass(frozen=True)
class _Rule:
    """How an estimate is judged, as the public effect functions pass it on to `_judge`: the minimum
    effect (``None``: `MIN_EFFECT_SD` σ) and where it comes from, whether the runs can learn (``False``
    caps the verdict at unconfirmed; ``why_not`` says why) and the bounds of the effect (`_effect_bounds`)."""

    min_effect: float | None = None
    min_effect_basis: str = ""
    can_learn: bool = True
    why_not: str = ""
    bounds: Scale | None = None


def _judge(
    *,
    estimate: float,
    se: float,
    df: float,
    n: int,
    unit: Unit,
    n_eff: float,
    noise_sd: float,
    autocorrelation: float = math.nan,
    rule: _Rule,
) -> Effect:
    """Interval, minimum effect, verdict and the replication that would settle it; the verdict is
    judged against the very ``min_effect`` the `Effect` carries (and `Effect.describe` prints). With
    ``rule.bounds`` the interval is clipped to them, and withheld (too few points) when it covers them
    entirely on fewer than `MIN_N_EFF` effective points."""
    min_effect, can_learn, why_not, bounds = rule.min_effect, rule.can_learn, rule.why_not, rule.bounds
    min_effect_basis = rule.min_effect_basis
    floor = MIN_EFFECT_SD * noise_sd if min_effect is None else min_effect
    basis = "" if min_effect is None else (min_effect_basis or "given, not derived from σ")
    verdict, note, more, out_of_reach = EffectVerdict.unconfirmed, "", None, False
    low = high = math.nan
    if not (math.isfinite(estimate) and math.isfinite(se) and math.isfinite(floor)):
        note = why_not or "too few replicates for an interval"
    elif se <= 0:
        # every replicate identical (e.g. all rewards 0): a zero-width interval measures no noise at all
        noun = {"seeds": "seed-to-seed", "steps": "step-to-step", "episodes": "episode-to-episode"}[unit]
        note = f"no {noun} variation measured (all values identical): the interval is degenerate"
    else:
        half = _quantile(df) * se
        low, high = estimate - half, estimate + half
        if bounds is not None:
            low, high = max(low, bounds[0]), min(high, bounds[1])
        if bounds is not None and n_eff < MIN_N_EFF and low <= bounds[0] and high >= bounds[1]:
            low = high = math.nan
            note = (
                f"{_TOO_FEW}: n_eff {n_eff:.1f} < {MIN_N_EFF:g}, and the {int(LEVEL * 100)}% interval ± {half:.3f} "
                f"would cover every effect the reward's range allows ({bounds[0]:+.3f} … {bounds[1]:+.3f})"
            )
        elif low > floor:
            verdict = EffectVerdict.confirmed
        elif high < floor:
            verdict = EffectVerdict.refuted
        if not can_learn and verdict is EffectVerdict.confirmed:
            verdict = EffectVerdict.unconfirmed
            note = f"not confirmed: {why_not or 'the run cannot learn'}"
        if verdict is EffectVerdict.unconfirmed and can_learn:
            more = _more_needed(gap=abs(estimate - floor), se=se, df=df, n=n, n_eff=n_eff)
            if more is None or more > MORE_REACH * n:
                more, out_of_reach = None, True
                note = note or (
                    f"more {unit} are unlikely to settle it at this effect size (it would take more than "
                    f"{MORE_REACH * n} more, {MORE_REACH}× the {counted(n, unit)} run)"
                )
    return Effect(
        estimate=estimate,
        low=low,
        high=high,
        min_effect=floor,
        noise_sd=noise_sd,
        n=n,
        unit=unit,
        n_eff=n_eff,
        autocorrelation=autocorrelation,
        verdict=verdict,
        more_needed=more,
        note=note,
        min_effect_basis=basis,
        out_of_reach=out_of_reach,
        bounds=bounds,
    )


MAX_MORE = 100_000
"""Largest replication `_more_needed` reports; beyond it the answer is ``None``."""


def _more_needed(*, gap: float, se: float, df: float, n: int, n_eff: float) -> int | None:
    """Smallest number of extra units after which the interval, if the estimate and the noise stayed
    as observed, would clear the decision boundary ``gap`` away: the standard error shrinks as
    √(n / n') and the degrees of freedom grow in proportion to the effective size.

    Returns:
        The extra units, or ``None`` when ``gap`` is 0 or more than `MAX_MORE` would be needed.
    """
    if gap <= 0 or se <= 0 or n < 1:
        return None

    def settles(extra: int) -> bool:
        scale = (n + extra) / n
        return _quantile(df + (scale - 1) * n_eff) * se / math.sqrt(scale) < gap

    high = 1
    while not settles(high):
        high *= 2
        if high > MAX_MORE:
            return None
    low = high // 2  # settles(low) is False (or low == 0)
    while high - low > 1:
        middle = (low + high) // 2
        if settles(middle):
            high = middle
        else:
            low = middle
    return high


def _undecided(n: int, unit: Unit, note: str) -> Effect:
    return Effect(
        estimate=math.nan,
        low=math.nan,
        high=math.nan,
        min_effect=math.nan,
        noise_sd=math.nan,
        n=n,
        unit=unit,
        n_eff=float(n),
        verdict=EffectVerdict.unconfirmed,
        note=note,
    )


def step_effect(
    series: Sequence[float],
    *,
    can_learn: bool = True,
    why_not: str = "",
    min_effect: float | None = None,
    scale: Scale | None = None,
) -> Effect:
    """Change of one run's per-step series along its least-squares trend, over steps with the
    autocorrelation handled (Santer et al. 2000, "Statistical significance of trends and trend
    differences in layer-average atmospheric temperature time series", J. Geophys. Res. 105:7337,
    eqs. 3–6).

    With steps t = 0..n−1, OLS slope b and residuals e: ρ is the residuals' lag-1 autocorrelation,
    n_e = `effective_size` (n, ρ), s_e² = Σe² / (n_e − 2), SE(b) = s_e / √Σ(t − t̄)², and the interval uses
    t with n_e − 2 degrees of freedom (both floored at 1). The effect is the fitted change over the run,
    b·(n − 1); σ (for the minimum effect) is the residual standard deviation √(Σe² / (n − 2)).

    Args:
        series: Values per step in step order (e.g. mean train reward), shape (n,).
        can_learn: ``False`` caps the verdict at unconfirmed (a run that cannot learn is never confirmed).
        why_not: Why it cannot learn (shown in the note).
        min_effect: Override of the minimum effect (default ``MIN_EFFECT_SD`` × σ).
        scale: The values' range (the reward's), which bounds the change (module docstring).

    Returns:
        The effect; unconfirmed with a note when fewer than `MIN_STEPS` steps are finite.
    """
    values = [v for v in series if math.isfinite(v)]
    n = len(values)
    if n < MIN_STEPS:
        effect = _undecided(n, "steps", f"{n} step(s): at least {MIN_STEPS} are needed")
        return effect.model_copy(update={"more_needed": MIN_STEPS - n if can_learn else None})
    t_mean = (n - 1) / 2
    y_mean = statistics.fmean(values)
    sxx = sum((t - t_mean) ** 2 for t in range(n))
    slope = sum((t - t_mean) * (y - y_mean) for t, y in enumerate(values)) / sxx
    residuals = [y - (y_mean + slope * (t - t_mean)) for t, y in enumerate(values)]
    squares = sum(e * e for e in residuals)
    rho = unbiased_rho(lag1_autocorrelation(residuals), n)
    n_e = effective_size(n, rho)
    s_e = math.sqrt(squares / max(1.0, n_e - 2))
    return _judge(
        estimate=slope * (n - 1),
        se=s_e / math.sqrt(sxx) * (n - 1),
        df=max(1.0, n_e - 2),
        n=n,
        unit="steps",
        n_eff=n_e,
        noise_sd=math.sqrt(squares / (n - 2)),
        autocorrelation=rho,
        rule=_Rule(min_effect, can_learn=can_learn, why_not=why_not, bounds=_effect_bounds(scale)),
    )


def level_effect(
    series: Sequence[float],
    reference: float,
    *,
    min_effect: float | None = None,
    min_effect_basis: str = "",
    noise_sd: float | None = None,
    scale: Scale | None = None,
) -> Effect:
    """Mean of one run's per-step series minus a fixed ``reference`` (e.g. the last k steps' reward
    against the stability threshold), with the autocorrelation handled as in `step_effect`.

    Args:
        series: Values per step, shape (n,).
        reference: The level to compare with.
        min_effect: Override of the minimum effect.
        min_effect_basis: Where the override comes from (printed by `Effect.describe`).
        noise_sd: σ to set the minimum effect from (default: the series' own standard deviation).
        scale: The values' range, which bounds the mean minus ``reference``.
    """
    values = [v for v in series if math.isfinite(v)]
    if len(values) < 2:
        return _undecided(len(values), "steps", f"{len(values)} step(s): an interval needs 2")
    mean = statistics.fmean(values)
    sigma = statistics.stdev(values)
    rho = unbiased_rho(lag1_autocorrelation([v - mean for v in values]), len(values))
    n_eff = effective_size(len(values), rho)
    return _judge(
        estimate=mean - reference,
        se=sigma / math.sqrt(n_eff),
        df=max(1.0, n_eff - 1),
        n=len(values),
        unit="steps",
        n_eff=n_eff,
        noise_sd=sigma if noise_sd is None else noise_sd,
        autocorrelation=rho,
        rule=_Rule(min_effect, min_effect_basis, bounds=_effect_bounds(scale, reference)),
    )


def seed_effect(
    estimates: Sequence[float],
    *,
    noise_sd: float | None = None,
    min_effect: float | None = None,
    min_effect_basis: str = "",
    can_learn: bool = True,
    why_not: str = "",
    scale: Scale | None = None,
) -> Effect:
    """An effect replicated over seeds: mean of the per-seed estimates, Student's t over seeds.

    Args:
        estimates: One estimate per seed, shape (k,).
        noise_sd: σ behind the minimum effect (e.g. the pooled within-run step noise); default the
            standard deviation of the per-seed estimates.
        min_effect: Override of the minimum effect.
        min_effect_basis: Where the override comes from (printed by `Effect.describe`).
        can_learn: ``False`` caps the verdict at unconfirmed.
        why_not: Why it cannot learn.
        scale: The range of the rewards behind each estimate (a change or a difference of them), which
            bounds the effect to ± its width.

    Returns:
        The effect; unconfirmed with a note for fewer than two seeds.
    """
    values = [v for v in estimates if math.isfinite(v)]
    if len(values) < 2:
        return _undecided(len(values), "seeds", f"{len(values)} seed(s): an interval over seeds needs 2")
    sd = statistics.stdev(values)
    return _judge(
        estimate=statistics.fmean(values),
        se=sd / math.sqrt(len(values)),
        df=len(values) - 1,
        n=len(values),
        unit="seeds",
        n_eff=float(len(values)),
        noise_sd=sd if noise_sd is None else noise_sd,
        rule=_Rule(min_effect, min_effect_basis, can_learn, why_not, _effect_bounds(scale)),
    )


def two_sample_effect(
    after: Sequence[float],
    before: Sequence[float],
    *,
    min_effect: float | None = None,
    unit: Unit = "episodes",
    sides: tuple[str, str] = ("after", "before"),
    min_effect_basis: str = "",
    scale: Scale | None = None,
) -> Effect:
    """Mean of ``after`` minus mean of ``before`` over independent replicates (e.g. held-out rewards
    after vs before training over episodes, or two arms' per-seed means over seeds): Welch's t
    interval with the Welch–Satterthwaite degrees of freedom (B. L. Welch 1947, "The generalization of
    'Student's' problem when several different population variances are involved", Biometrika 34:28).
    σ is the pooled standard deviation.

    Args:
        after: The first sample, shape (n_a,).
        before: The second sample, shape (n_b,).
        min_effect: Override of the minimum effect.
        unit: What one value is (an episode's reward, a seed's mean).
        sides: Names of the two samples, for the note when one has fewer than 2 values.
        min_effect_basis: Where the override comes from (printed by `Effect.describe`).
        scale: The values' range, which bounds the difference to ± its width.

    Returns:
        The effect; unconfirmed and not estimated when a side has fewer than 2 finite values (the
        note says how many each side has).
    """
    a = [v for v in after if math.isfinite(v)]
    b = [v for v in before if math.isfinite(v)]
    if len(a) < 2 or len(b) < 2:
        counts = f"{counted(len(a), unit)} {sides[0]} and {len(b)} {sides[1]}"
        return _undecided(
            len(a) + len(b), unit, f"{counts}, but an interval needs at least 2 {unit} on each side"
        )
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df_den = (va * va / (len(a) - 1)) + (vb * vb / (len(b) - 1))
    df = (va + vb) ** 2 / df_den if df_den > 0 else len(a) + len(b) - 2
    pooled = math.sqrt(
        ((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b))
        / (len(a) + len(b) - 2)
    )
    return _judge(
        estimate=statistics.fmean(a) - statistics.fmean(b),
        se=se,
        df=df,
        n=len(a) + len(b),
        unit=unit,
        n_eff=float(len(a) + len(b)),
        noise_sd=pooled,
        rule=_Rule(min_effect, min_effect_basis, bounds=_effect_bounds(scale)),
    )


def curve_effect(
    curves: Sequence[Sequence[float]],
    *,
    can_learn: bool = True,
    why_not: str = "",
    scale: Scale | None = None,
) -> Effect:
    """The change of a per-step series (its fitted trend over the run) over whatever replication exists:
    over seeds (`seed_effect` of each seed's `step_effect` estimate, σ = the pooled within-run noise)
    when two or more seeds have at least `MIN_STEPS` steps, else over the steps of the one run
    (`step_effect`).

    Args:
        curves: One per-step series per seed.
        can_learn: ``False`` caps the verdict at unconfirmed.
        why_not: Why the runs cannot learn.
        scale: The reward's range, which bounds the change (module docstring).
    """
    judged = [step_effect(c, can_learn=can_learn, why_not=why_not, scale=scale) for c in curves]
    usable = [e for e in judged if math.isfinite(e.estimate)]
    if len(usable) >= 2:
        noise = math.sqrt(statistics.fmean(e.noise_sd**2 for e in usable))
        return seed_effect(
            [e.estimate for e in usable], noise_sd=noise, can_learn=can_learn, why_not=why_not, scale=scale
        )
    if usable:
        return usable[0]
    longest = max(judged, key=lambda e: e.n, default=None)
    return longest if longest is not None else _undecided(0, "steps", "no trainer step recorded")
