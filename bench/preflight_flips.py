"""Does the preflight's go/no-go decision flip between repeated preflights of the same model?

    python bench/preflight_flips.py [--preflights 10] [--repeats 200] [--planned 64] [--group-size 4]

The untrained arithmetic model succeeds in 0.11–0.16 of its held-out attempts (issue 33), at the
futility bound p_min = 0.159 for G = 4. Each simulated preflight draws Bernoulli(p) attempts in start
order and runs them through the real sequential test (`a3r.study.sequential.FutilityTest.run`: a look
after every attempt, stop at the first crossing), as the held-out evaluator does. For each success
rate it prints how many of ``--preflights`` repeated preflights (different seeds) go on to the sweep,
the go-rate over ``--repeats`` preflights, and the exact go probability (dynamic programming over the
binomial paths: 1 − `FutilityTest.error_rate`), for today's rule (stop below p_stop, the indifference
zone) and for the rule before it (stop below p_min: ``stop_share = 1``).

CPU only, a few seconds. Results: bench/README.md §preflight_flips.py.
"""

from __future__ import annotations

import argparse

import numpy as np

from a3r.study.sequential import FutilityTest, SignalRule

RATES = (0.0, 0.03, 0.06, 0.09, 0.11, 0.13, 0.15, 0.16, 0.2)


def go_count(test: FutilityTest, p: float, preflights: int, rng: np.random.Generator) -> int:
    """How many of ``preflights`` simulated preflights at success rate ``p`` go on (the test does not stop)."""
    return sum(not test.run(list(rng.random(test.planned) < p)).stopped for _ in range(preflights))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preflights", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument(
        "--planned", type=int, default=64, help="attempts: held-out tasks × attempts per task"
    )
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rules = {"indifference zone": SignalRule(), "stop below p_min": SignalRule(stop_share=1.0)}
    for name, rule in rules.items():
        test = rule.test(args.group_size, args.planned)
        print(
            f"\n{name}: G = {args.group_size}, {args.planned} planned attempts, p_min = {test.p_min:.3f}, "
            f"stops below p_stop = {test.p_stop:.3f}, first possible stop after {test.first_stop} attempts"
        )
        print(f"| p | go in {args.preflights} preflights | go-rate ({args.repeats}) | exact go probability |")
        print("|---|---|---|---|")
        rng = np.random.default_rng(args.seed)
        for p in RATES:
            few = go_count(test, p, args.preflights, rng)
            many = go_count(test, p, args.repeats, rng) / args.repeats
            print(f"| {p:.2f} | {few}/{args.preflights} | {many:.3f} | {1 - test.error_rate(p):.3f} |")


if __name__ == "__main__":
    main()
