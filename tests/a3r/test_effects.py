"""Verdicts that clear noise (`a3r.study.effects`): synthetic series whose truth is known."""

from __future__ import annotations

import math
import random

import pytest

from a3r.study.effects import (
    MIN_EFFECT_SD,
    MORE_REACH,
    EffectVerdict,
    curve_effect,
    effective_size,
    lag1_autocorrelation,
    level_effect,
    seed_effect,
    step_effect,
    two_sample_effect,
)
from a3r.study.wording import counted


def _noise(rng: random.Random, n: int, sd: float = 0.1, rho: float = 0.0) -> list[float]:
    """An AR(1) series with stationary standard deviation ``sd``."""
    out, previous = [], rng.gauss(0.0, sd)
    for _ in range(n):
        out.append(previous)
        previous = rho * previous + rng.gauss(0.0, sd * math.sqrt(1 - rho * rho))
    return out


def test_the_reported_spy_run_is_not_confirmed() -> None:
    # The run: per-step train reward zig-zagging between -0.18 and +0.16 on one seed, +0.036.
    curve = [-0.18, 0.10, -0.12, 0.16, -0.05, 0.08, -0.15, 0.12, -0.02, 0.07]
    effect = step_effect(curve)
    assert effect.verdict is EffectVerdict.unconfirmed
    assert effect.low < 0 < effect.high
    # ≈ 430 more steps would be needed after the 10 run: out of reach, said instead of the number
    assert effect.out_of_reach and effect.more_needed is None
    assert "more steps are unlikely to settle it at this effect size" in effect.describe()
    # the same noise on a rise of 0.01 per step: within reach, and the number is given
    calmer = step_effect([v + 0.01 * t for t, v in enumerate(curve)])
    assert calmer.more_needed is not None and 0 < calmer.more_needed <= MORE_REACH * 10
    assert f"≈ {calmer.more_needed} more steps would settle it" in calmer.describe()


def test_a_flat_series_says_more_steps_are_unlikely_to_settle_it() -> None:
    """Found by a fresh user: a flat curve (effect ≈ 0) read "≈ N more steps would settle it" with N in
    the thousands; beyond `MORE_REACH` × what was run the verdict gives the effect and its interval and
    says more steps or seeds are unlikely to settle it."""
    flat = [0.3 + e for e in _noise(random.Random(0), 12, sd=0.05)]
    effect = step_effect(flat)
    assert effect.verdict is EffectVerdict.unconfirmed and abs(effect.estimate) < effect.min_effect
    assert effect.more_needed is None and effect.out_of_reach
    text = effect.describe()
    assert "would settle it" not in text
    assert f"{effect.estimate:+.3f} (95% CI {effect.low:+.3f} … {effect.high:+.3f}; 12 steps" in text
    assert (
        "more steps are unlikely to settle it at this effect size" in text
        and "(it would take more than 120 more, 10× the 12 steps run)" in text
    )
    seeds = seed_effect([0.05, -0.03, 0.08, -0.02], noise_sd=0.04)  # a mean right at the minimum effect
    assert seeds.out_of_reach and "more seeds are unlikely to settle it" in seeds.describe()


def test_one_more_seed_or_step_is_singular() -> None:
    two = seed_effect([0.20, 0.30], noise_sd=0.1)
    assert two.more_needed == 1 and "≈ 1 more seed would settle it" in two.describe()
    assert "1 more seeds" not in two.describe()
    short = step_effect([0.0, 0.5, 0.4])
    assert short.more_needed == 1 and "≈ 1 more step would settle it" in short.describe()
    assert (counted(1, "runs"), counted(2, "runs"), counted(1, "episodes")) == (
        "1 run",
        "2 runs",
        "1 episode",
    )


@pytest.mark.parametrize(("rho", "at_most"), [(0.0, 0.025), (0.6, 0.05)])
def test_noise_only_series_are_almost_never_confirmed(rho: float, at_most: float) -> None:
    # The interval is 95% two-sided and must also clear the minimum effect: about 2.5% false
    # confirmations for independent steps; autocorrelated steps mimic trends on 10 points (measured
    # 4.1% at rho 0.6 over 1500 trials; without the autocorrelation handling 6%).
    rng = random.Random(17)
    trials = 400
    confirmed = sum(
        step_effect(_noise(rng, 10, rho=rho)).verdict is EffectVerdict.confirmed for _ in range(trials)
    )
    assert confirmed / trials < at_most


def test_autocorrelation_widens_the_interval() -> None:
    rng = random.Random(3)
    series = _noise(rng, 40, rho=0.8)
    assert lag1_autocorrelation([v - sum(series) / 40 for v in series]) > 0.4
    assert effective_size(40, 0.8) == pytest.approx(40 * 0.2 / 1.8)
    assert effective_size(40, -0.5) == 40 and effective_size(3, 0.95) == 1.0
    correlated = step_effect(series)
    shuffled = series[:]
    random.Random(0).shuffle(shuffled)
    independent = step_effect(shuffled)
    assert correlated.n_eff < independent.n_eff
    assert correlated.high - correlated.low > independent.high - independent.low


def test_a_clear_trend_is_confirmed_and_a_clear_fall_refuted() -> None:
    rng = random.Random(5)
    rising = [0.08 * t + e for t, e in enumerate(_noise(rng, 10, sd=0.05))]
    effect = step_effect(rising)
    assert effect.verdict is EffectVerdict.confirmed
    assert effect.low > effect.min_effect > 0 and effect.estimate == pytest.approx(0.72, abs=0.15)
    assert effect.more_needed is None
    falling = [-v for v in rising]
    assert step_effect(falling).verdict is EffectVerdict.refuted


def test_a_run_that_cannot_learn_is_never_confirmed() -> None:
    rising = [0.1 * t for t in range(10)]
    effect = step_effect(rising, can_learn=False, why_not="every group had identical rewards")
    assert effect.verdict is EffectVerdict.unconfirmed and effect.more_needed is None
    assert "identical rewards" in effect.describe()


def test_too_few_steps_say_how_many_more() -> None:
    effect = step_effect([0.0, 0.5])
    assert effect.verdict is EffectVerdict.unconfirmed and effect.more_needed == 2
    assert not math.isfinite(effect.estimate) and "at least 4" in effect.describe()


def test_over_seeds_two_seeds_rarely_settle_but_many_do() -> None:
    two = seed_effect([0.20, 0.30], noise_sd=0.1)
    assert two.verdict is EffectVerdict.unconfirmed and two.more_needed is not None
    assert two.high - two.low > 1.0  # t(1) = 12.7
    six = seed_effect([0.20, 0.30, 0.25, 0.28, 0.22, 0.26], noise_sd=0.1)
    assert six.verdict is EffectVerdict.confirmed and six.min_effect == pytest.approx(MIN_EFFECT_SD * 0.1)
    assert seed_effect([0.3]).verdict is EffectVerdict.unconfirmed


def test_curve_effect_uses_seeds_when_there_are_several() -> None:
    rng = random.Random(11)
    curves = [[0.08 * t + e for t, e in enumerate(_noise(rng, 8, sd=0.05))] for _ in range(4)]
    effect = curve_effect(curves)
    assert effect.unit == "seeds" and effect.n == 4 and effect.verdict is EffectVerdict.confirmed
    one = curve_effect(curves[:1])
    assert one.unit == "steps" and one.n == 8
    noise = curve_effect([_noise(rng, 8) for _ in range(3)])
    assert noise.verdict is not EffectVerdict.confirmed
    assert curve_effect([]).verdict is EffectVerdict.unconfirmed


def test_level_and_two_sample_effects() -> None:
    above = level_effect([0.50, 0.52, 0.49, 0.51, 0.50, 0.52], reference=0.30)
    assert above.verdict is EffectVerdict.confirmed and above.estimate == pytest.approx(0.207, abs=0.01)
    assert level_effect([0.1, 0.5], reference=0.3).verdict is EffectVerdict.unconfirmed
    rng = random.Random(2)
    before = [rng.gauss(0.3, 0.2) for _ in range(200)]
    after = [rng.gauss(0.3, 0.2) for _ in range(200)]
    same = two_sample_effect(after, before)
    assert same.verdict is not EffectVerdict.confirmed and same.low < 0 < same.high
    better = two_sample_effect([v + 0.3 for v in after], before)
    assert better.verdict is EffectVerdict.confirmed
    assert two_sample_effect([0.1], before).verdict is EffectVerdict.unconfirmed


def test_a_degenerate_interval_is_never_settled() -> None:
    """Two seeds whose rewards are all exactly 0 (no signal) give a zero-width interval: the
    reported study called it "confirmed, 95% CI -0.325 … -0.325"; it must stay unconfirmed."""
    flat = seed_effect([-0.325, -0.325], noise_sd=0.0, min_effect=0.0)
    assert flat.verdict is EffectVerdict.unconfirmed
    assert "no seed-to-seed variation measured" in flat.describe()
    assert not (math.isfinite(flat.low) or math.isfinite(flat.high))
    assert level_effect([0.2, 0.2, 0.2], reference=0.5).verdict is EffectVerdict.unconfirmed
    assert two_sample_effect([1.0, 1.0], [0.0, 0.0]).verdict is EffectVerdict.unconfirmed
    # any variation at all still decides as before
    assert (
        seed_effect([-0.325, -0.326, -0.324], noise_sd=0.1, min_effect=0.0).verdict is EffectVerdict.refuted
    )


def test_intervals_respect_the_rewards_scale() -> None:
    # issue 33 (6): a 6-step train-reward trend on a reward in [0, 1] had "95% CI −3.192 … +3.478"
    from a3r.study.effects import MIN_N_EFF, two_sample_effect

    series = [0.125, 0.5, 0.5, 0.125, 0.25, 0.5]
    raw = step_effect(series)
    assert raw.n_eff < MIN_N_EFF and raw.high - raw.low > 2  # wider than every change [0, 1] allows
    bounded = step_effect(series, scale=(0.0, 1.0))
    assert bounded.too_few and math.isnan(bounded.low) and bounded.verdict is EffectVerdict.unconfirmed
    text = bounded.describe()
    assert "too few points for an interval" in text and "CI" not in text
    assert f"{bounded.estimate:+.3f}" in text and "n_eff 3.2" in text
    # an interval wider than the range on one side only is clipped to it, never wider than the range
    clipped = step_effect([0.0, 0.5, 0.0, 0.5, 0.25, 0.5], scale=(0.0, 1.0))
    assert clipped.high == 1.0 and -1.0 <= clipped.low < 0 and not clipped.too_few
    # a difference of held-out means of a reward in [-1, 1] lies in [-2, 2]; two seeds a side
    arms = two_sample_effect([0.9, -0.8], [-0.9, 0.7], unit="seeds", scale=(-1.0, 1.0))
    assert arms.too_few or (arms.low >= -2.0 and arms.high <= 2.0)
    # a settled effect is untouched by its scale
    rising = [0.1 * t for t in range(10)]
    assert step_effect(rising, scale=(0.0, 1.0)).verdict == step_effect(rising).verdict


def test_templates_know_their_reward_range() -> None:
    from a3r.study.analysis import reward_range

    assert reward_range("arithmetic") == (0.0, 1.0)
    assert reward_range("who_is_the_spy") == (-1.0, 1.0)
    assert reward_range(None) is None and reward_range("no-such-template") is None
