"""Sequential futility test of a preflight: stop evaluating the untrained model as soon as its
attempts show that GRPO would get too little signal from it.

**What GRPO needs.** GRPO's advantage of an episode is its reward minus the mean reward of its group
of G episodes of one task (scaled by the group's standard deviation). A group whose G rewards are all
equal has zero advantage for every episode and contributes no gradient (Shao et al. 2024,
"DeepSeekMath", §4.1.2, eq. 3; the "zero-variance groups" DAPO filters out, Yu et al. 2025, §3.2).
With 0/1 rewards and a per-attempt success rate p, a group carries a non-zero advantage with
probability

    π(p, G) = 1 − p^G − (1 − p)^G.

We call a task *trainable* when a group is informative with probability at least ``q``
(`SignalRule.min_informative`, default 1/2: at least half the groups carry a gradient). Since
π(p, G) ≤ 1 − (1 − p)^G, that needs a success rate of at least

    p_min = 1 − (1 − q)^(1/G)                         (G = 4, q = 1/2: p_min = 0.159).

Success rates differ between tasks; by Jensen's inequality ((1 − p)^G is convex in p) the mean over
tasks of π(p_t, G) is at most 1 − (1 − p̄)^G, so a *mean* success rate p̄ below p_min already implies
that fewer than a share q of the groups are informative, however the rate varies between tasks.

**The indifference zone.** A test that stops whenever the success rate is shown below p_min stops a
task that sits just below it in some preflights and not in others: the untrained arithmetic model
(success rate 0.11–0.16 across preflights, p_min = 0.159 for G = 4) stopped one study and swept in the
next. The test therefore stops only when the rate is shown below a lower rate p_stop, the p_min of
a share ``s·q`` of informative groups (`SignalRule.stop_share`, default 0.7: p_stop = 0.102 for G = 4,
q = 1/2). Between p_stop and p_min the signal is marginal: the study goes on (a task at p_stop or above
goes on with probability ≥ 1 − α), and the preflight line says the rate may be below p_min. Simulated
through this test (bench/preflight_flips.py), 64 attempts at 0.11–0.16 go on in ≥ 96% of preflights;
a model with no success stops after 32.

**The bound.** x successes in n attempts bound the success rate from above by the exact one-sided
Clopper–Pearson limit at confidence 1 − α: the p with P(X ≤ x | n, p) = α, i.e. the 1 − α quantile of
Beta(x + 1, n − x) (Clopper & Pearson 1934, Biometrika 26:404). With no success it is
1 − α^(1/n) ≈ 3/n at 95% (the "rule of three", Hanley & Lippman-Hand 1983, JAMA 249:1743).

**The sequential test.** The preflight looks after every attempt, so a fixed-n bound checked n times
would stop a trainable task more often than α. The stopping boundary is therefore calibrated exactly:
stop after n attempts when the successes are at most b_n, where b_n is the largest x with
P(X_n ≤ x | p_stop) ≤ a, and the nominal level a ≤ α is the largest for which a task with success rate
p_stop crosses the boundary within the planned N attempts with probability at most α (computed by
dynamic programming over the binomial paths; a repeated-significance design with a constant nominal
level, Armitage, McPherson & Rowe 1969, J. R. Stat. Soc. A 132:235). So a task at p_stop or above (a
trainable one a fortiori) is stopped with probability at most α, and an untrainable one (all attempts fail) stops after
`FutilityTest.first_stop` attempts.

Attempts are counted in the order they were *started* (the evaluator spreads them round-robin over
the held-out tasks): a test on the attempts that happened to end first would be biased by the time
an attempt takes, which depends on its outcome (a failing model often runs to the token limit).
A success is an attempt whose reward is above 0 (the rewards of the research templates are 0 for a
failed attempt).

Pure functions and frozen data (no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import beta, binom

__all__ = [
    "FutilityTest",
    "SignalCheck",
    "SignalRule",
    "informative_probability",
    "min_success_rate",
    "upper_bound",
]


def informative_probability(p: float, group_size: int) -> float:
    """π(p, G) = 1 − p^G − (1 − p)^G: the probability that a GRPO group of G attempts with 0/1 rewards
    and success rate ``p`` has unequal rewards (a non-zero advantage).

    Raises:
        ValueError: ``p`` outside [0, 1] or ``group_size`` < 2.
    """
    if not 0.0 <= p <= 1.0 or group_size < 2:
        raise ValueError(f"need 0 <= p <= 1 and G >= 2, got p={p}, G={group_size}")
    return 1.0 - p**group_size - (1.0 - p) ** group_size


def min_success_rate(group_size: int, min_informative: float) -> float:
    """p_min = 1 − (1 − q)^(1/G): below this mean success rate, fewer than a share ``q`` of GRPO groups
    of size G are informative (module docstring).

    Raises:
        ValueError: ``group_size`` < 2 or ``min_informative`` outside (0, 1).
    """
    if group_size < 2 or not 0.0 < min_informative < 1.0:
        raise ValueError(f"need G >= 2 and 0 < q < 1, got G={group_size}, q={min_informative}")
    return float(1.0 - (1.0 - min_informative) ** (1.0 / group_size))


def upper_bound(successes: int, attempts: int, confidence: float) -> float:
    """Exact one-sided Clopper–Pearson upper bound on a success rate: the ``confidence`` quantile of
    Beta(x + 1, n − x); 1 − α^(1/n) for x = 0; 1 when n = 0 or x = n.

    Raises:
        ValueError: ``successes`` outside [0, attempts] or ``confidence`` outside (0, 1).
    """
    if not 0 <= successes <= max(attempts, 0) or not 0.0 < confidence < 1.0:
        raise ValueError(f"need 0 <= x <= n and 0 < confidence < 1, got x={successes}, n={attempts}")
    if attempts == 0 or successes == attempts:
        return 1.0
    if successes == 0:
        return float(1.0 - (1.0 - confidence) ** (1.0 / attempts))
    return float(beta.ppf(confidence, successes + 1, attempts - successes))


class SignalRule(BaseModel):
    """When a preflight may stop for lack of signal (typed config; module docstring).

    Attributes:
        confidence: 1 − α: a trainable task is stopped with probability at most α.
        min_informative: q, the share of GRPO groups that must carry a non-zero advantage for the task
            to count as trainable.
        stop_share: s: the test stops only when fewer than s·q of the groups would be informative (the
            rate is shown below p_stop = p_min at s·q); rates between p_stop and p_min are the
            indifference zone, where the study goes on (module docstring).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    min_informative: float = Field(default=0.5, gt=0.0, lt=1.0)
    stop_share: float = Field(default=0.7, gt=0.0, le=1.0)

    def min_rate(self, group_size: int) -> float:
        """p_min for groups of ``group_size`` (`min_success_rate`)."""
        return min_success_rate(group_size, self.min_informative)

    def stop_rate(self, group_size: int) -> float:
        """p_stop for groups of ``group_size``: the rate the test must show the success rate below to
        stop (`min_success_rate` at ``stop_share`` × q)."""
        return min_success_rate(group_size, self.stop_share * self.min_informative)

    def test(self, group_size: int, planned: int) -> FutilityTest:
        """The calibrated sequential test over at most ``planned`` attempts for groups of ``group_size``.

        Raises:
            ValueError: ``planned`` < 1 or ``group_size`` < 2.
        """
        if planned < 1:
            raise ValueError(f"a sequential test needs at least 1 planned attempt, got {planned}")
        p_stop = self.stop_rate(group_size)
        nominal, boundary = _calibrate(p_stop, planned, 1.0 - self.confidence)
        return FutilityTest(
            rule=self,
            group_size=group_size,
            planned=planned,
            p_min=self.min_rate(group_size),
            p_stop=p_stop,
            nominal=nominal,
            boundary=boundary,
        )


def _cdf_rows(p: float, planned: int) -> list[np.ndarray]:
    """P(X_n ≤ x | p) for x = 0..n, one row per n = 1..N."""
    return [binom.cdf(np.arange(n + 1), n, p) for n in range(1, planned + 1)]


def _boundary(rows: Sequence[np.ndarray], level: float) -> tuple[int, ...]:
    """b_n for n = 1..N: the largest x with P(X_n ≤ x | p) ≤ ``level`` (−1: no x qualifies)."""
    return tuple(int(np.searchsorted(row, level, side="right")) - 1 for row in rows)


def _crossing(p: float, bounds: Sequence[int]) -> float:
    """P(X_n ≤ b_n for some n) for Bernoulli(p) attempts: dynamic programming over the successes of
    the paths that have not stopped yet."""
    alive = np.zeros(len(bounds) + 2)
    alive[0] = 1.0
    crossed = 0.0
    for b in bounds:
        alive[1:] = alive[1:] * (1.0 - p) + alive[:-1] * p
        alive[0] *= 1.0 - p
        if b >= 0:
            crossed += float(alive[: b + 1].sum())
            alive[: b + 1] = 0.0
    return crossed


def _calibrate(p: float, planned: int, alpha: float) -> tuple[float, tuple[int, ...]]:
    """The largest nominal level a ≤ α whose boundary a task with success rate ``p`` crosses within
    ``planned`` attempts with probability at most α, and that boundary (bisection on a: the crossing
    probability grows with a)."""
    rows = _cdf_rows(p, planned)
    top = _boundary(rows, alpha)
    if _crossing(p, top) <= alpha:
        return alpha, top
    low, high = 0.0, alpha
    best = _boundary(rows, low)
    for _ in range(40):
        mid = (low + high) / 2
        candidate = _boundary(rows, mid)
        if _crossing(p, candidate) <= alpha:
            low, best = mid, candidate
        else:
            high = mid
    return low, best


class SignalCheck(BaseModel):
    """The sequential test's state after some attempts, and what it says.

    Attributes:
        attempts: Attempts counted (a prefix in start order).
        successes: Attempts among them with a reward above 0.
        planned: Attempts the preflight planned (N, the most looks).
        group_size: G of the GRPO groups the study would train with.
        confidence: 1 − α, the test's overall confidence over its looks.
        nominal: a, the calibrated per-look level (≤ α).
        min_informative: q.
        min_rate: p_min = 1 − (1 − q)^(1/G).
        upper: The exact Clopper–Pearson upper bound on the success rate at level a: the success rate is
            below it with confidence 1 − α over every look.
        stopped: The boundary was crossed (``upper`` < ``stop_rate``): too little signal at this G.
        first_stop: The fewest attempts after which the test can stop (``None``: never within N).
        stop_rate: p_stop, the rate the test stops below (``None`` in checks recorded before the
            indifference zone: they stopped below ``min_rate``).
        stop_share: s, the share of q below which it stops.
    """

    model_config = ConfigDict(frozen=True)

    attempts: int
    successes: int
    planned: int
    group_size: int
    confidence: float
    nominal: float
    min_informative: float
    min_rate: float
    upper: float
    stopped: bool
    first_stop: int | None = None
    stop_rate: float | None = None
    stop_share: float = 1.0

    def headline(self) -> str:
        """What the test measured, in a few words: the bound on the success rate and the counts, e.g.
        "held-out success rate below 0.089 at 95% (0 of 32 attempts earned a reward)"; never a claim
        that the model scores zero, which no finite number of attempts shows."""
        return (
            f"held-out success rate below {self.upper:.3f} at {self.confidence:.0%} "
            f"({self.successes} of {self.attempts} attempts earned a reward)"
        )

    def describe(self) -> str:
        """One sentence: the counts, the bound, what GRPO needs, where the test stops, and whether it did."""
        head = (
            f"{self.successes} of {self.attempts} held-out attempts earned a reward: the success rate is below "
            f"{self.upper:.3f} at {self.confidence:.0%} confidence (exact Clopper–Pearson bound at the sequential "
            f"test's per-look level {self.nominal:.3f}, which keeps the error over up to {self.planned} looks "
            f"≤ {1 - self.confidence:.0%})"
        )
        need = (
            f"a GRPO group of G = {self.group_size} has a non-zero advantage with probability "
            f"≥ {self.min_informative:g} only at a success rate ≥ {self.min_rate:.3f} "
            f"(1 − (1 − p)^G ≥ {self.min_informative:g})"
        )
        stop = self.min_rate if self.stop_rate is None else self.stop_rate
        zone = (
            f"; the test stops only below {stop:.3f}, where fewer than {self.stop_share * self.min_informative:.2g} "
            f"of the groups are informative (between {stop:.3f} and {self.min_rate:.3f} the signal is marginal "
            "and the study goes on)"
            if self.stop_rate is not None and self.stop_rate < self.min_rate
            else ""
        )
        if self.stopped:
            return f"{head}; {need}{zone}: the test stopped after {self.attempts} of {self.planned} planned attempts"
        later = (
            f"it can stop after {self.first_stop} attempts without a success"
            if self.first_stop is not None
            else f"{self.planned} attempts are too few for it to ever stop"
        )
        ruled = (
            f"these attempts do not rule out a rate of {stop:.3f} ({later})"
            if self.upper >= self.min_rate or self.stop_rate is None
            else f"the rate may be below {self.min_rate:.3f}, but these attempts do not rule out {stop:.3f}: "
            f"marginal signal, the study goes on ({later})"
        )
        return f"{head}; {need}{zone}; {ruled}"


@dataclass(frozen=True)
class FutilityTest:
    """A calibrated sequential futility test (build with `SignalRule.test`).

    Attributes:
        rule: The rule it was built from.
        group_size: G.
        planned: N, the most attempts it looks at.
        p_min: The success rate GRPO needs (`min_success_rate`).
        p_stop: The rate it stops below (a task at p_stop or above is stopped with probability ≤ α).
        nominal: a, the per-look level of the boundary.
        boundary: b_n for n = 1..N: stop when the successes among the first n attempts are ≤ b_n.
    """

    rule: SignalRule
    group_size: int
    planned: int
    p_min: float
    p_stop: float
    nominal: float
    boundary: tuple[int, ...]

    @property
    def first_stop(self) -> int | None:
        """The fewest attempts after which the test can stop (all of them failed), or ``None`` when
        ``planned`` attempts are too few to ever decide."""
        return next((n for n, b in enumerate(self.boundary, start=1) if b >= 0), None)

    def check(self, successes: int, attempts: int) -> SignalCheck:
        """The test after ``attempts`` attempts (counted in start order) with ``successes`` successes.

        Raises:
            ValueError: ``successes`` outside [0, attempts].
        """
        if not 0 <= successes <= attempts:
            raise ValueError(f"need 0 <= successes <= attempts, got {successes} of {attempts}")
        n = min(attempts, self.planned)
        return SignalCheck(
            attempts=attempts,
            successes=successes,
            planned=self.planned,
            group_size=self.group_size,
            confidence=self.rule.confidence,
            nominal=self.nominal,
            min_informative=self.rule.min_informative,
            min_rate=self.p_min,
            upper=upper_bound(successes, attempts, 1.0 - self.nominal) if self.nominal > 0 else 1.0,
            stopped=n >= 1 and successes <= self.boundary[n - 1],
            first_stop=self.first_stop,
            stop_rate=self.p_stop,
            stop_share=self.rule.stop_share,
        )

    def error_rate(self, p: float | None = None) -> float:
        """P(the test stops within ``planned`` attempts) for a task with success rate ``p`` (default
        p_stop: the test's type-I error, ≤ α)."""
        return _crossing(self.p_stop if p is None else p, self.boundary)

    def run(self, outcomes: Sequence[bool]) -> SignalCheck:
        """The test over attempts in start order, looking after each one as a preflight does: the check
        at the first look that stops, else after the last (at most ``planned``) attempt.

        Raises:
            ValueError: No attempt.
        """
        if not outcomes:
            raise ValueError("the test needs at least one attempt")
        successes = 0
        seen = outcomes[: self.planned]
        for n, success in enumerate(seen, start=1):
            successes += bool(success)
            if successes <= self.boundary[n - 1]:
                return self.check(successes, n)
        return self.check(successes, len(seen))
