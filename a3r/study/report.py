"""The study report: Markdown with PNG plots (matplotlib, Agg backend). Every number comes from the
recorded run outcomes (the swarm API and client records) and the store.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from a3r.study.analysis import RewardSummary
from a3r.study.effects import Effect, step_effect
from a3r.study.plans import PlanDraft, training_line
from a3r.study.research import ConfigVerdict
from a3r.study.runs import RunOutcome, status_text
from a3r.study.settings import value_text
from memory import FindingPublic, HypothesisPublic, PatchPublic, StudyPublic

__all__ = ["joined_parts", "plot_parts", "plot_rewards", "plot_sweep", "write_report"]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _mean_se(summary: RewardSummary | None) -> str:
    """A held-out mean reward with its standard error over attempts (s/√n), when the rewards were kept."""
    if summary is None:
        return "–"
    rewards = summary.rewards
    if len(rewards) < 2:
        return _fmt(summary.mean_reward)
    return f"{_fmt(summary.mean_reward)} ± {statistics.stdev(rewards) / math.sqrt(len(rewards)):.3f}"


def plot_rewards(outcomes: Sequence[RunOutcome], path: Path) -> Path | None:
    """Reward curves: mean train reward per trainer step (or per group when no step ran), one line per run.

    Returns:
        The PNG path, or ``None`` when no run has a curve.
    """
    drawable = [o for o in outcomes if o.curve or o.episode_curve]
    if not drawable:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for o in drawable:
        if o.curve:
            ax.plot([s for s, _ in o.curve], [v for _, v in o.curve], marker="o", label=f"{o.key} (per step)")
        else:
            ax.plot(
                range(1, len(o.episode_curve) + 1),
                o.episode_curve,
                marker=".",
                linestyle="--",
                label=f"{o.key} (per group)",
            )
    ax.set_xlabel("trainer step (or group index)")
    ax.set_ylabel("mean train reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def joined_parts(
    outcomes: Sequence[RunOutcome], names: Sequence[str], variable: str = "value", template: str | None = None
) -> dict[str, dict[str, list[float]]]:
    """Reward-part curves of the training runs, one per configuration, seed and reward (labelled
    ``seed 0`` for a training run, ``seed 0, after patch 1`` for its continuation on a patched reward,
    ``lr = 0.001, seed 0`` for a sweep run of ``variable``): a continuation on the same reward is joined
    to its seed's curve; runs of different configurations or rewards are never pooled. Keeps the parts
    in ``names`` (every recorded part when empty)."""
    joined: dict[str, dict[str, list[float]]] = {}
    for o in outcomes:
        if o.purpose not in ("train", "sweep"):
            continue
        label = f"seed {o.seed}"
        if o.purpose == "sweep" and o.value is not None:
            label = f"{variable} = {value_text(variable, template, o.value)}, {label}"
        if o.reward_patch is not None:
            label += f", after patch {o.reward_patch}"
        for name, points in o.parts.items():
            if not names or name in names:
                joined.setdefault(label, {}).setdefault(name, []).extend(points)
    return joined


def plot_parts(parts: dict[str, dict[str, list[float]]], path: Path) -> Path | None:
    """One panel per reward part, one line per configuration and seed (`joined_parts`): its mean per
    B·G train episodes (≈ one step).

    Returns:
        The PNG path, or ``None`` when no part was recorded.
    """
    names = sorted({name for curves in parts.values() for name in curves})
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for label, curves in parts.items():
            if name in curves:
                ax.plot(range(1, len(curves[name]) + 1), curves[name], marker="o", label=label)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("batch of B·G train episodes (≈ step)", fontsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _reading(effect: Effect) -> str:
    """Which way a part moved, by its trend's interval: beyond ± the minimum effect, or neither."""
    if effect.low > effect.min_effect:
        return "rose"
    if effect.high < -effect.min_effect:
        return "fell"
    return "no clear change" if effect.estimate == effect.estimate else "too few points"


def _values(values: Sequence[float], variable: str = "", template: str | None = None) -> str:
    """``{0.0001, 0.001}``; a switch's values as ``{true, false}`` (`value_text`)."""
    return "{" + ", ".join(value_text(variable, template, v) for v in values) + "}"


def _parts_table(parts: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = [
        "| part | run | points | first → last | change along its trend (95% CI) | reading |",
        "|---|---|---|---|---|---|",
    ]
    for label, curves in parts.items():
        for name, points in sorted(curves.items()):
            effect = step_effect(points)
            lines.append(
                f"| {name} | {label} | {len(points)} | {_fmt(points[0])} → {_fmt(points[-1])} | "
                f"{effect.describe(verdict=False)} | {_reading(effect)} |"
            )
    return lines


def plot_sweep(
    configs: Sequence[ConfigVerdict],
    variable: str,
    baseline: RewardSummary | None,
    path: Path,
    *,
    stability: bool = True,
    template: str | None = None,
) -> Path | None:
    """Held-out p@1, p@2 and last-k train reward per swept value, stable values marked when
    ``stability`` (a min-stable question); a switch's values are labelled true/false (``template``:
    the study's, to resolve the setting).

    Returns:
        The PNG path, or ``None`` when no configuration has a finite number to plot (every run failed
        to start, say): the report says what happened without a figure.
    """
    series = [
        ("train reward, last k steps", "o", [c.last_k_reward for c in configs]),
        ("held-out p@1", "s", [c.pass_at_1 for c in configs]),
        ("held-out p@2", "^", [c.pass_at_2 for c in configs]),
    ]
    if not any(math.isfinite(y) for _, _, ys in series for y in ys):
        return None
    xs = [c.value for c in configs]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, marker, ys in series:
        ax.plot(xs, ys, marker=marker, label=label)
    if baseline is not None and math.isfinite(baseline.mean_reward):
        ax.axhline(baseline.mean_reward, color="grey", linestyle=":", label="untrained baseline")
    for c in configs:
        if c.stable and stability:
            ax.axvline(c.value, color="green", alpha=0.15)
    if variable in ("batch_size", "group_size", "lr") and min(xs) > 0:
        ax.set_xscale("log", base=2 if variable != "lr" else 10)
        ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)  # from the values, not from the finite points alone
    labels = [value_text(variable, template, x) for x in xs]
    if any(label in ("true", "false") for label in labels):
        ax.set_xticks(xs, labels)
    ax.set_xlabel(variable + (" (green: stable on every seed)" if stability else ""))
    ax.set_ylabel("reward / pass rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(
    folder: Path,
    *,
    study: StudyPublic,
    plan: PlanDraft,
    hypotheses: Sequence[HypothesisPublic],
    outcomes: Sequence[RunOutcome],
    baseline: RewardSummary | None,
    configs: Sequence[ConfigVerdict],
    findings: Sequence[FindingPublic],
    patches: Sequence[PatchPublic],
    conclusion: str,
    reward_parts: Sequence[str] = (),
    notes: Sequence[str] = (),
    reused: Mapping[int, str] | None = None,
) -> Path:
    """Write ``report.md`` (and ``reward_curves.png``, ``reward_parts.png``, ``sweep.png``) into ``folder``.

    Args:
        reward_parts: The template's reward parts (episode metric names) to draw; every recorded
            part when empty.
        notes: Lines on how the runs were fitted to the budget (`a3r.study.research.size_training`) and
            what the thread's time came to against it (`a3r.study.research.budget_note`).
        reused: Where a run reused from an earlier study came from (``study 3, finding #5``), by its run id:
            its row says so and has no wall time of this study.

    Returns:
        The Markdown path.
    """
    folder.mkdir(parents=True, exist_ok=True)
    curves = plot_rewards(outcomes, folder / "reward_curves.png")
    # stability verdicts belong to a min-stable question; the other goals compare held-out rewards
    stability = plan.sweep is not None and plan.sweep.goal == "min_stable"
    sweep = plot_sweep(
        configs,
        plan.sweep.variable if plan.sweep else "value",
        baseline,
        folder / "sweep.png",
        stability=stability,
        template=plan.template,
    )
    lines = [
        f"# Study {study.id}: {study.question}",
        "",
        f"**Verdict.** {conclusion}",
        "",
        (
            "_Verdicts come from `a3r.study.effects`: confirmed only when the effect's 95% confidence interval "
            "(over seeds, or over steps with their autocorrelation handled) clears the minimum effect "
            "m (0.5 σ of the observed noise; 0 for a stability margin, whose threshold already allows the "
            "pre-registered tolerance δ); otherwise unconfirmed, with what would settle it. m is the one "
            "threshold the pre-registered decision rules name; their effect to detect only sizes the "
            "replicate stage's seeds._"
        ),
        "",
        "## Plan",
        f"- objective: {plan.objective}",
        f"- template: `{plan.template}`; parameters: `{plan.params}`",
        f"- training: {training_line(plan)}",
    ]
    if plan.sweep is not None:
        spec = plan.sweep
        a, b = (value_text(spec.variable, plan.template, v) for v in (spec.coarse + spec.coarse)[:2])
        goal = {
            "min_stable": f"find the smallest stable {spec.variable}",
            "best": f"find the {spec.variable} with the highest held-out reward",
            "a_vs_b": f"tell whether {spec.variable} = {b} beats {spec.variable} = {a}",
            "effect_of": f"measure the effect of changing {spec.variable} from {a} to {b}",
        }[spec.goal]
        stages = "coarse" + (", then refined between its values" if spec.refine else "")
        lines.append(
            f"- sweep: `{spec.variable}` ∈ {_values(spec.coarse, spec.variable, plan.template)} ({stages}), to {goal}"
        )
    if plan.stability is not None:
        lines.append(f"- operational definition: {plan.stability.describe()}")
    lines += [f"- {note}" for note in notes]
    lines += ["", "## Pre-registered hypotheses", ""]
    for h in hypotheses:
        lines.append(
            f"- ({h.registered_at:%Y-%m-%d %H:%M:%S} UTC) **{h.statement}** — expected: {h.expected_outcome}; decision rule: {h.decision_rule}"
        )
    if baseline is not None:
        lines += [
            "",
            "## Preflight (untrained model, held-out tasks)",
            "",
            f"n = {baseline.tasks} tasks, {baseline.episodes} attempts: mean reward {_fmt(baseline.mean_reward)}, "
            f"p@1 {_fmt(baseline.pass_at_1)}, p@2 {_fmt(baseline.pass_at_2)}.",
        ]
    lines += [
        "",
        "## Runs",
        "",
        "| run | status | steps | train episodes | wall s | last reward | held-out n (tasks / attempts) | held-out p@1 | held-out p@2 | held-out mean ± SE |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        last = o.curve[-1][1] if o.curve else (o.episode_curve[-1] if o.episode_curve else math.nan)
        e = o.eval
        origin = (reused or {}).get(o.run_id)
        status = status_text(o.status) + (f", reused from {origin}" if origin else "")
        lines.append(
            f"| {o.key} | {status} | {o.steps} | {o.episodes} | {'–' if origin else f'{o.wall_s:.0f}'} | {_fmt(last)} | "
            f"{f'{e.tasks} / {e.episodes}' if e else '–'} | "
            f"{_fmt(e.pass_at_1 if e else None)} | {_fmt(e.pass_at_2 if e else None)} | {_mean_se(e)} |"
        )
    if configs:
        name = plan.sweep.variable if plan.sweep else "value"
        lines += ["", "## Configurations", ""]
        if stability:
            lines += [
                f"| {name} | seeds | stable seeds | stable | last-k train reward | p@1 | p@2 | mean reward | why unstable |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
        else:
            lines += [
                f"| {name} | seeds | last-k train reward | held-out p@1 | held-out p@2 | held-out mean reward |",
                "|---|---|---|---|---|---|",
            ]
        for c in configs:
            stable = f" {c.stable_seeds} | {c.stable_text} |" if stability else ""
            why = f" {'; '.join(c.reasons + c.not_run)[:300]} |" if stability else ""
            lines.append(
                f"| {value_text(name, plan.template, c.value)} | {c.seeds} |{stable} {_fmt(c.last_k_reward)} | {_fmt(c.pass_at_1)} | "
                f"{_fmt(c.pass_at_2)} | {_fmt(c.eval_mean_reward)} |{why}"
            )
    if curves is not None:
        lines += ["", "## Reward curves", "", f"![reward curves]({curves.name})"]
    parts = joined_parts(
        outcomes, reward_parts, plan.sweep.variable if plan.sweep else "value", plan.template
    )
    parts_png = plot_parts(parts, folder / "reward_parts.png")
    if parts_png is not None:
        lines += [
            "",
            "## Reward parts",
            "",
            "The reward split into its parts (the workflow's episode metrics), the mean of each per B·G "
            "train episodes, per configuration and seed:",
            "",
            f"![reward parts]({parts_png.name})",
            "",
            *_parts_table(parts),
        ]
    if sweep is not None:
        lines += ["", "## Sweep", "", f"![sweep]({sweep.name})"]
    if findings:
        lines += ["", "## Findings", ""]
        for f in findings:
            lines.append(
                f"- [{f.status.value}, confidence {f.confidence:.2f}, seeds {f.seeds}, runs {f.run_ids}] {f.statement}"
            )
    if patches:
        lines += ["", "## Patches", ""]
        for p in patches:
            lines += [
                f"### Patch {p.id} of `{p.artifact_name}` — {p.status.value} (by {p.decided_by or '–'})",
                "",
                p.rationale,
                "",
                "```diff",
                p.diff.rstrip()[:4000],
                "```",
            ]
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
