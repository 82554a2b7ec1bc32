"""Measure the research itself: staged ``a3r research`` studies against a full grid, on simulated
landscapes with a known answer.

    python bench/research.py [--seeds 20] [--landscape min-stable-batch]

Each landscape is a family of learning curves per configuration with realistic noise: a run's
held-out mean reward is its configuration's true level plus a seed-to-seed effect (σ_seed) and the
binomial noise of its held-out attempts; its training curve rises from the baseline to that level with
per-step noise. An unstable configuration's runs collapse with a per-run probability (after a random
step the reward and the policy entropy fall to near zero; the real detectors,
`a3r.study.analysis.detect_collapse`, read the simulated trainer metrics), so a short sweep can call
it stable by luck. The simulator (`SimulatedRuns`) sits
behind the research graph's run seam (`a3r.graph.context.RunExecutor`), in place of
`a3r.swarmops.execution.execute_run`: planner, coder, runner, analyst and reporter are the real nodes,
on a real SQLite store and checkpointer, so what is measured is the code ``a3r research`` runs.

For each landscape and simulator seed it runs the staged study once and reports the runs it spent,
whether its answer is right, and whether its conclusion says "confirmed"; a *false confirmed* is a
confirmed conclusion with a wrong answer. The full grid runs every value of the landscape's fine grid
(the resolution the staged design reaches) on as many seeds as the staged study gave the configurations
its answer rests on, through the same simulator, and answers with the same verdict functions.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from a3r.graph.builder import build_graph, open_checkpointer
from a3r.graph.context import Ledger, RunContext
from a3r.providers import OfflineProvider
from a3r.study.analysis import RewardSummary, detect_collapse
from a3r.study.design import ranked_by_held_out
from a3r.study.plans import PlanDraft, StabilityCriterion
from a3r.study.research import min_stable_value, verdicts
from a3r.study.runs import RunOutcome, RunSpec
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.execution import Workspace
from memory import Store

BASELINE = 0.3
"""True held-out mean reward of the untrained model."""

SECONDS_PER_EPISODE = 1.0
"""Simulated client seconds per episode (the budget is spent in simulated seconds)."""


@dataclass(frozen=True)
class Landscape:
    """A simulated study: the question, the true level of each configuration, and the answer.

    Attributes:
        name: Short name.
        question: The ``a3r research`` question (planned by the offline provider).
        grid: The fine grid a full-grid study runs (the staged design's final resolution).
        answer: The right answer.
        level: True held-out mean reward of a configuration (its value → reward).
        collapse: Probability that one run of a configuration collapses.
        seed_sd: Seed-to-seed SD of a configuration's held-out mean reward.
    """

    name: str
    question: str
    grid: tuple[float, ...]
    answer: float
    level: Callable[[float], float]
    collapse: Callable[[float], float]
    seed_sd: float = 0.03


def _bump(center: float, width: float, gain: float) -> Callable[[float], float]:
    """Reward peaked at ``center`` on a log10 axis (0 is read as 1e-3)."""

    def level(value: float) -> float:
        x = math.log10(max(value, 1e-3 if center > 1e-3 else 1e-9))
        return BASELINE + gain * math.exp(-((x - math.log10(center)) ** 2) / (2 * width**2))

    return level


LANDSCAPES: dict[str, Landscape] = {
    landscape.name: landscape
    for landscape in (
        Landscape(
            name="min-stable-batch",
            question="find min stable batch size 1 2 4 8 16 32 on arithmetic",
            grid=tuple(float(b) for b in range(1, 33)),
            answer=6.0,
            level=lambda b: BASELINE + 0.15,
            collapse=lambda b: 0.0 if b >= 6 else 0.8,
        ),
        Landscape(
            name="best-lr",
            question="find the best lr 1e-6 1e-5 1e-4 1e-3 1e-2 on arithmetic",
            grid=(1e-6, 3.2e-6, 1e-5, 3.2e-5, 1e-4, 3.2e-4, 1e-3, 3.2e-3, 1e-2),
            answer=3.2e-4,
            level=_bump(3.2e-4, 0.5, 0.3),
            collapse=lambda lr: 0.9 if lr >= 1e-2 else 0.0,
        ),
        Landscape(
            name="best-kl",
            question="find the best KL coefficient on arithmetic",
            grid=(0.0, 0.0025, 0.01, 0.032, 0.1, 0.32, 1.0),
            answer=0.032,
            level=_bump(0.032, 0.6, 0.3),
            collapse=lambda kl: 0.0,
        ),
    )
}


class SimulatedRuns:
    """A `a3r.graph.context.RunExecutor` answering from a `Landscape`: every run a deterministic
    function of (simulator seed, value, run seed), so a configuration's seed gives the same run
    whichever design asks for it.

    Attributes:
        runs: Training runs executed (the preflight is not counted).
    """

    def __init__(self, landscape: Landscape, sim_seed: int) -> None:
        self.landscape = landscape
        self.sim_seed = sim_seed
        self.runs = 0

    def __call__(
        self,
        spec: RunSpec,
        *,
        ctx: ExecutionContext,
        ws: Workspace,
        run_id: int,
        budget_s: float,
        eval_reserve_s: float,
    ) -> RunOutcome:
        """The simulated outcome of ``spec`` (a preflight: the untrained model's evaluation)."""
        episodes = ctx.eval_tasks * ctx.eval_samples
        if spec.purpose == "preflight":
            rng = random.Random(f"{self.sim_seed}:preflight")
            rewards = _attempts(rng, BASELINE, ctx.eval_tasks * ctx.preflight_samples)
            return _outcome(spec, run_id, [], rewards, ctx.eval_tasks, wall_s=20.0 + len(rewards))
        if spec.value is None:
            raise ValueError(f"the simulator runs sweeps only, not {spec.purpose} runs")
        self.runs += 1
        return simulate(
            self.landscape, self.sim_seed, spec, run_id=run_id, eval_tasks=ctx.eval_tasks, episodes=episodes
        )


def _attempts(rng: random.Random, p: float, n: int) -> list[float]:
    p = min(1.0, max(0.0, p))
    return [1.0 if rng.random() < p else 0.0 for _ in range(n)]


def _outcome(
    spec: RunSpec, run_id: int, curve: list[float], rewards: list[float], tasks: int, *, wall_s: float
) -> RunOutcome:
    mean = statistics.fmean(rewards)
    summary = RewardSummary(
        tasks=tasks,
        episodes=len(rewards),
        mean_reward=mean,
        pass_at_1=mean,
        pass_at_2=math.nan,
        rewards=rewards,
    )
    return RunOutcome(
        key=spec.key,
        run_id=run_id,
        purpose=spec.purpose,
        seed=spec.seed,
        stage=spec.stage,
        value=spec.value,
        status="finished",
        reason="simulated",
        steps=len(curve),
        episodes=len(curve) * spec.settings.batch_size * spec.settings.group_size,
        wall_s=wall_s,
        curve=[(i + 1, v) for i, v in enumerate(curve)],
        eval=summary,
        seconds_per_episode=SECONDS_PER_EPISODE,
    )


def simulate(
    landscape: Landscape, sim_seed: int, spec: RunSpec, *, run_id: int, eval_tasks: int, episodes: int
) -> RunOutcome:
    """One training run of ``spec`` on the landscape: its curve and its held-out evaluation."""
    assert spec.value is not None
    rng = random.Random(f"{sim_seed}:{spec.value!r}:{spec.seed}")
    steps = spec.settings.steps
    collapsed = rng.random() < landscape.collapse(spec.value)
    final = landscape.level(spec.value) + rng.gauss(0.0, landscape.seed_sd)
    curve = [BASELINE + (final - BASELINE) * (i + 1) / steps + rng.gauss(0.0, 0.04) for i in range(steps)]
    entropy = [0.8 + rng.gauss(0.0, 0.05) for _ in range(steps)]
    if collapsed:  # the policy collapses after a random step: reward and entropy fall to near zero
        at = rng.randrange(1, steps)
        final = abs(rng.gauss(0.02, 0.02))
        curve = curve[:at] + [abs(rng.gauss(0.02, 0.02)) for _ in range(steps - at)]
        entropy = entropy[:at] + [abs(rng.gauss(0.01, 0.005)) for _ in range(steps - at)]
    rewards = _attempts(rng, final, episodes)
    rows = [
        {"step": i + 1, "reward_mean": r, "entropy": e}
        for i, (r, e) in enumerate(zip(curve, entropy, strict=True))
    ]
    diagnoses = detect_collapse(  # the real detectors on the simulated trainer metrics
        rows,
        drop_max=spec.stability.drop_max,
        entropy_min=spec.stability.entropy_min,
        kl_max=spec.stability.kl_max,
    )
    per_step = spec.settings.batch_size * spec.settings.group_size * SECONDS_PER_EPISODE * 1.3
    outcome = _outcome(spec, run_id, curve, rewards, eval_tasks, wall_s=20.0 + steps * per_step + episodes)
    return outcome.model_copy(update={"diagnoses": diagnoses})


def _answer(plan: PlanDraft, outcomes: Sequence[RunOutcome], baseline: RewardSummary) -> float | None:
    assert plan.sweep is not None
    configs = verdicts(outcomes, baseline=baseline, criterion=plan.stability or StabilityCriterion())
    if plan.sweep.goal == "min_stable":
        return min_stable_value(configs)
    ranked = ranked_by_held_out(configs)
    return ranked[0].value if ranked else None


@dataclass(frozen=True)
class StudyResult:
    """One staged study and its full-grid counterpart."""

    runs: int
    reused: int
    answer: float | None
    confirmed: bool
    grid_runs: int
    grid_answer: float | None
    conclusion: str


def invoke_study(ctx: RunContext, question: str, folder: Path) -> dict[str, Any]:
    """Run the research graph on ``question`` to its end with ``ctx`` (its executor: a `SimulatedRuns`),
    checkpointed in ``folder/checkpoints.db``; returns the thread's final state values."""
    graph = build_graph(open_checkpointer(folder / "checkpoints.db"))
    config = {"configurable": {"thread_id": ctx.thread_id}, "recursion_limit": 1000}
    graph.invoke(  # type: ignore[call-overload]
        {"request": question, "mode": "research", "force": False, "overrides": {}},
        config,
        context=ctx,
    )
    return dict(graph.get_state(config).values)  # type: ignore[arg-type]


def run_study(
    landscape: Landscape, sim_seed: int, folder: Path, *, budget_minutes: float = 600.0, thread: str = "sim"
) -> StudyResult:
    """The staged study of ``landscape`` through the research graph (the store ``folder/memory.db``:
    fresh per study in the benchmark; a second thread on the same folder reuses the first one's runs
    through its findings), and the full grid at the seeds the staged study's answer rests on."""
    folder.mkdir(parents=True, exist_ok=True)
    store = Store(str(folder / "memory.db"))
    ledger = Ledger(folder / "checkpoints.db")
    simulator = SimulatedRuns(landscape, sim_seed)
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=ledger,
        thread_id=f"{thread}-{landscape.name}-{sim_seed}",
        root=folder,
        budget_s=budget_minutes * 60.0,
        eval_tasks=64,
        eval_samples=2,
        preflight_samples=2,
        execute=simulator,
    )
    try:
        values = invoke_study(ctx, landscape.question, folder)
    finally:
        ledger.close()
        store.close()
    plan: PlanDraft = values["plan"]
    outcomes: list[RunOutcome] = values.get("outcomes", [])
    baseline: RewardSummary = values["baseline"]
    conclusion: str = values.get("conclusion") or ""
    answer = _answer(plan, outcomes, baseline)
    seeds = max(
        (
            len({o.seed for o in outcomes if o.value == v})
            for v in {o.value for o in outcomes if o.value is not None}
        ),
        default=2,
    )
    grid: list[RunOutcome] = []
    for value in landscape.grid:
        for seed in range(seeds):
            spec = _grid_spec(plan, value, seed)
            grid.append(simulate(landscape, sim_seed, spec, run_id=0, eval_tasks=64, episodes=128))
    return StudyResult(
        runs=simulator.runs,
        reused=sum(len(p.outcomes) for p in values.get("priors") or []),
        answer=answer,
        confirmed=conclusion.startswith("confirmed"),
        grid_runs=len(grid),
        grid_answer=_answer(plan, grid, baseline),
        conclusion=conclusion,
    )


def _grid_spec(plan: PlanDraft, value: float, seed: int) -> RunSpec:
    from a3r.study.research import sweep_specs

    return sweep_specs(plan, [value], "grid", seeds=[seed])[0]


def _same(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def measure(names: Sequence[str], seeds: int, console: Console) -> list[dict[str, float | str]]:
    """Run every landscape on ``seeds`` simulator seeds; print and return one row per landscape."""
    rows: list[dict[str, float | str]] = []
    with tempfile.TemporaryDirectory(prefix="a3r-research-bench-") as tmp:
        for name in names:
            landscape = LANDSCAPES[name]
            results = [run_study(landscape, s, Path(tmp) / f"{name}-{s}") for s in range(seeds)]
            right = sum(_same(r.answer, landscape.answer) for r in results)
            grid_right = sum(_same(r.grid_answer, landscape.answer) for r in results)
            confirmed = sum(r.confirmed for r in results)
            false_confirmed = sum(r.confirmed and not _same(r.answer, landscape.answer) for r in results)
            runs = [r.runs for r in results]
            grid_runs = [r.grid_runs for r in results]
            ratios = [r.runs / r.grid_runs for r in results]
            rows.append(
                {
                    "landscape": name,
                    "seeds": seeds,
                    "runs": statistics.median(runs),
                    "grid_runs": statistics.median(grid_runs),
                    "ratio": statistics.median(ratios),
                    "ratio_max": max(ratios),
                    "right": right / seeds,
                    "grid_right": grid_right / seeds,
                    "confirmed": confirmed / seeds,
                    "false_confirmed": false_confirmed,
                }
            )
    table = Table(title=f"staged research vs full grid ({seeds} simulator seeds each; medians)")
    for column in (
        "landscape",
        "runs (staged)",
        "runs (grid)",
        "staged/grid",
        "worst ratio",
        "right (staged)",
        "right (grid)",
        "confirmed",
        "false confirmed",
    ):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["landscape"]),
            f"{row['runs']:g}",
            f"{row['grid_runs']:g}",
            f"{row['ratio']:.0%}",
            f"{row['ratio_max']:.0%}",
            f"{row['right']:.0%}",
            f"{row['grid_right']:.0%}",
            f"{row['confirmed']:.0%}",
            f"{row['false_confirmed']:g} / {row['seeds']:g}",
        )
    console.print(table)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="simulator seeds per landscape")
    parser.add_argument("--landscape", choices=sorted(LANDSCAPES), action="append", help="default: all")
    args = parser.parse_args()
    measure(args.landscape or list(LANDSCAPES), args.seeds, Console(width=160))


if __name__ == "__main__":
    main()
