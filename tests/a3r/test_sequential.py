"""The preflight's sequential futility test (`a3r.study.sequential`): the closed forms, the exact
Clopper–Pearson bound, and the calibration that keeps a trainable task's stopping probability at or
below α over every look."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from a3r.study.sequential import (
    SignalRule,
    informative_probability,
    min_success_rate,
    upper_bound,
)


def test_the_success_rate_grpo_needs_has_a_closed_form() -> None:
    p_min = min_success_rate(4, 0.5)
    assert p_min == pytest.approx(1 - 0.5**0.25) and p_min == pytest.approx(0.1591, abs=1e-4)
    # At p_min, a group of 4 is informative with probability q up to the p^G term (all four succeed).
    assert informative_probability(p_min, 4) == pytest.approx(0.5 - p_min**4)
    assert min_success_rate(8, 0.5) < min_success_rate(4, 0.5) < min_success_rate(2, 0.5)
    assert informative_probability(0.0, 4) == 0.0 and informative_probability(1.0, 4) == 0.0
    with pytest.raises(ValueError):
        min_success_rate(1, 0.5)
    with pytest.raises(ValueError):
        informative_probability(1.5, 4)


def test_a_mean_rate_below_p_min_bounds_the_informative_share_however_tasks_differ() -> None:
    # Jensen: E_t[π(p_t, G)] ≤ 1 − (1 − p̄)^G, so p̄ < p_min means fewer than q informative groups.
    rng = np.random.default_rng(0)
    for _ in range(200):
        rates = rng.beta(0.3, 3.0, size=int(rng.integers(2, 30)))
        mean_share = float(np.mean([informative_probability(float(p), 4) for p in rates]))
        assert mean_share <= 1 - (1 - rates.mean()) ** 4 + 1e-12


def test_the_upper_bound_is_exact_clopper_pearson() -> None:
    for n in (1, 5, 22, 60):
        assert upper_bound(0, n, 0.95) == pytest.approx(1 - 0.05 ** (1 / n))
    assert upper_bound(0, 300, 0.95) == pytest.approx(3 / 300, rel=0.01)  # the rule of three
    for x, n in ((1, 40), (3, 60), (10, 20)):
        u = upper_bound(x, n, 0.95)
        assert binom.cdf(x, n, u) == pytest.approx(0.05, abs=1e-9)  # P(X ≤ x | u) = α
    assert upper_bound(0, 0, 0.95) == 1.0 and upper_bound(4, 4, 0.95) == 1.0
    with pytest.raises(ValueError):
        upper_bound(5, 4, 0.95)


def test_looking_after_every_attempt_needs_the_calibrated_boundary() -> None:
    from a3r.study.sequential import _boundary, _cdf_rows, _crossing

    p_min = min_success_rate(4, 0.5)
    naive = _boundary(_cdf_rows(p_min, 60), 0.05)  # a fixed-n 95% bound checked at each of 60 looks
    assert _crossing(p_min, naive) > 0.06  # stops a trainable task too often
    test = SignalRule().test(4, 60)
    assert test.nominal < 0.05 and test.error_rate() <= 0.05
    assert test.error_rate() > 0.045  # calibrated, not merely conservative
    for group_size, planned in ((2, 40), (4, 128), (8, 200)):
        assert SignalRule().test(group_size, planned).error_rate() <= 0.05


def test_the_crossing_probability_matches_simulation() -> None:
    from a3r.study.sequential import _crossing

    test = SignalRule().test(4, 60)
    rng = np.random.default_rng(1)
    for p in (test.p_min, 0.08):
        paths = rng.random((40_000, 60)) < p
        successes = np.cumsum(paths, axis=1)
        stopped = (successes <= np.array(test.boundary)).any(axis=1).mean()
        assert stopped == pytest.approx(_crossing(p, test.boundary), abs=0.006)


def test_no_success_stops_at_the_first_possible_look() -> None:
    test = SignalRule().test(4, 60)
    # the stop is calibrated at p_stop (the indifference zone's lower end), not p_min: 32 looks, not 22
    assert test.first_stop == 32
    assert not test.check(0, 31).stopped and test.check(0, 32).stopped
    stop = test.check(0, 32)
    assert stop.upper < stop.stop_rate == pytest.approx(0.1021, abs=1e-4)
    assert stop.min_rate == pytest.approx(0.1591, abs=1e-4)
    assert stop.upper == pytest.approx(upper_bound(0, 32, 1 - test.nominal))
    text = stop.describe()
    assert "0 of 32 held-out attempts" in text and f"{stop.upper:.3f}" in text and "0.159" in text
    assert "G = 4" in text and "stopped after 32 of 60 planned attempts" in text
    # One success needs more evidence; a clearly trainable rate is never stopped.
    assert test.boundary[31] == 0 and not test.check(1, 40).stopped and test.check(1, 50).stopped
    assert test.error_rate(0.4) < 1e-4 and test.error_rate(0.0) == 1.0
    assert not test.check(20, 60).stopped


def test_the_wording_states_the_bound_never_a_zero_score() -> None:
    test = SignalRule().test(4, 64)
    stop = test.run([False] * 64)
    assert stop.stopped and stop.attempts == test.first_stop
    assert stop.headline() == (
        f"held-out success rate below {stop.upper:.3f} at 95% (0 of {stop.attempts} attempts earned a reward)"
    )
    for text in (stop.headline(), stop.describe()):
        assert "scores zero" not in text and "scores 0" not in text
    marginal = test.check(3, 64)  # 0.047: the rate may be below p_min, but is not shown below p_stop
    assert not marginal.stopped and "marginal signal, the study goes on" in marginal.describe()


def _go_rate(p: float, *, preflights: int, planned: int, seed: int) -> float:
    """Share of simulated preflights (Bernoulli(p) attempts in start order through the real test) that
    do not stop, i.e. go on to the sweep."""
    rng = np.random.default_rng(seed)
    test = SignalRule().test(4, planned)
    goes = sum(not test.run(list(rng.random(planned) < p)).stopped for _ in range(preflights))
    return goes / preflights


def test_the_decision_at_the_boundary_does_not_flip() -> None:
    # issue 33 (7): the untrained arithmetic model succeeds in 0.11–0.16 of attempts, at p_min = 0.159;
    # 16 held-out tasks × 4 attempts must go on to the sweep in at least 9 of 10 preflights
    assert _go_rate(0.13, preflights=200, planned=64, seed=7) >= 0.9
    assert _go_rate(0.11, preflights=200, planned=64, seed=8) >= 0.9
    # and the exact probability agrees over the whole range, and over more attempts
    for planned in (64, 128, 256):
        test = SignalRule().test(4, planned)
        for p in (0.11, 0.13, 0.16):
            assert 1 - test.error_rate(p) >= 0.95
    # a model that never succeeds still stops
    assert _go_rate(0.0, preflights=20, planned=64, seed=9) == 0.0


def test_too_few_attempts_never_stop_and_say_so() -> None:
    test = SignalRule().test(4, 16)
    assert test.first_stop is None and not test.check(0, 16).stopped
    assert "too few for it to ever stop" in test.check(0, 16).describe()
    lenient = SignalRule(confidence=0.9, min_informative=0.75)
    assert lenient.test(4, 16).first_stop is not None
    assert math.isclose(lenient.min_rate(4), 1 - 0.25**0.25)
    with pytest.raises(ValueError):
        SignalRule().test(4, 0)
