"""The study report: Markdown with PNG plots (`a3r.study.plots`). Every number comes from the recorded
run outcomes (the swarm API and client records) and the store.

The report opens with one plain line (`a3r.study.headline`): what changed, by how much, its interval,
whether it is confirmed and what would settle it; the full derivation follows below it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from a3r.study.analysis import RewardSummary, part_roles, part_scale, reward_range
from a3r.study.effects import MIN_N_EFF, Effect, step_effect
from a3r.study.headline import conclusion_line, headline, verdict_label
from a3r.study.plans import PlanDraft, training_line
from a3r.study.plots import plot_held_out, plot_parts, plot_rewards, plot_sweep
from a3r.study.research import ConfigVerdict
from a3r.study.runs import RunOutcome, episodes_text, status_text
from a3r.study.settings import value_text
from a3r.study.stability import trained_steps
from a3r.study.wording import counted
from memory import FindingPublic, HypothesisPublic, PatchPublic, StudyPublic

__all__ = ["joined_parts", "plot_parts", "plot_rewards", "plot_sweep", "write_report"]

_EMPTY = ("–", "0.000")
"""Cells that carry no information: a column whose every cell is one of these is left out of a table."""


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


def _reading(effect: Effect) -> str:
    """Which way a part moved, by its trend's interval: beyond ± the minimum effect, or neither."""
    if effect.low > effect.min_effect:
        return "rose"
    if effect.high < -effect.min_effect:
        return "fell"
    return (
        "no clear change" if effect.estimate == effect.estimate and not effect.too_few else "too few points"
    )


def _trend_text(effect: Effect) -> str:
    """A part's change along its trend for the parts table: `Effect.describe` without a verdict; with
    too few effective points, the estimate and its n only (no "± x" of an interval it withheld)."""
    if not effect.too_few:
        return effect.describe(verdict=False)
    return (
        f"{effect.estimate:+.3f} (too few points for an interval: n_eff {effect.n_eff:.1f} < {MIN_N_EFF:g}; "
        f"{counted(effect.n, effect.unit)})"
    )


def _values(values: Sequence[float], variable: str = "", template: str | None = None) -> str:
    """``{0.0001, 0.001}``; a switch's values as ``{true, false}`` (`value_text`)."""
    return "{" + ", ".join(value_text(variable, template, v) for v in values) + "}"


def _parts_table(parts: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = [
        "| part | run | points | first → last | change along its trend (95% CI) | reading |",
        "|---|---|---|---|---|---|",
    ]
    scales = {
        name: part_scale(v for c in parts.values() for v in c.get(name, []))
        for name in {name for c in parts.values() for name in c}
    }
    for label, curves in parts.items():
        for name, points in sorted(curves.items()):
            effect = step_effect(points, scale=scales[name])
            lines.append(
                f"| {name} | {label} | {len(points)} | {_fmt(points[0])} → {_fmt(points[-1])} | "
                f"{_trend_text(effect)} | {_reading(effect)} |"
            )
    return lines


def _table(columns: Sequence[tuple[str, Sequence[str]]], *, droppable: Sequence[str] = ()) -> list[str]:
    """A Markdown table from ``(header, cells)`` columns; a ``droppable`` column whose cells are all empty
    or 0.000 (p@1 of a task nobody solves) is left out, and a line under the table says so."""
    dropped = [h for h, cells in columns if h in droppable and cells and all(c in _EMPTY for c in cells)]
    kept = [(h, cells) for h, cells in columns if h not in dropped]
    lines = ["| " + " | ".join(h for h, _ in kept) + " |", "|" + "---|" * len(kept)]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*(cells for _, cells in kept), strict=True)]
    if dropped:
        lines += ["", f"_Not shown: {', '.join(dropped)} (0.000 or – in every row)._"]
    return lines


def _verdict(study: StudyPublic, conclusion: str, findings: Sequence[FindingPublic]) -> list[str]:
    """The one plain line, then the conclusion it was read from (when it says more) and how verdicts
    are reached."""
    line = conclusion_line(conclusion, findings, question=study.question, kind=study.kind)
    lines = [f"**Verdict.** {line}", ""]
    if line != conclusion:
        lines += [f"Derivation: {conclusion}", ""]
    return [
        *lines,
        (
            "_Verdicts come from `a3r.study.effects`: confirmed only when the effect's 95% confidence interval "
            "(over seeds, or over steps with their autocorrelation handled) clears the minimum effect "
            "m (0.5 σ of the observed noise; 0 for a stability margin, whose threshold already allows the "
            "pre-registered tolerance δ); otherwise unconfirmed, with what would settle it. m is the one "
            "threshold the pre-registered decision rules name; their effect to detect only sizes the "
            "replicate stage's seeds._"
        ),
        "",
    ]


def stability_n(outcomes: Sequence[RunOutcome], baseline: RewardSummary | None) -> dict[str, int]:
    """The n the stability definition compared, for `StabilityCriterion.describe`: held-out tasks, attempts
    after training and before (the untrained model's), when every evaluated run shares them; empty
    (the definition then says n is stated with each verdict) otherwise."""
    evals = [o.eval for o in outcomes if o.purpose in ("train", "sweep") and o.eval is not None]
    if baseline is None or not evals:
        return {}
    tasks = {e.tasks for e in evals} | {baseline.tasks}
    after = {e.episodes for e in evals}
    if len(tasks) != 1 or len(after) != 1:
        return {}
    return {"tasks": tasks.pop(), "after": after.pop(), "before": baseline.episodes}


def _plan(
    plan: PlanDraft,
    notes: Sequence[str],
    hypotheses: Sequence[HypothesisPublic],
    n: Mapping[str, int] | None = None,
) -> list[str]:
    lines = [
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
        n = n or {}
        compared = plan.stability.describe(tasks=n.get("tasks"), after=n.get("after"), before=n.get("before"))
        lines.append(f"- operational definition: {compared}")
    lines += [f"- {note}" for note in notes]
    lines += ["", "## Pre-registered hypotheses", ""]
    for h in hypotheses:
        lines.append(
            f"- ({h.registered_at:%Y-%m-%d %H:%M:%S} UTC) **{h.statement}** — expected: {h.expected_outcome}; decision rule: {h.decision_rule}"
        )
    return lines


def _server_text(outcome: RunOutcome) -> str:
    """Where a run trained, for the Runs table: ``tenant of server coarse`` (a LoRA tenant of its stage's
    shared server, `a3r.swarmops.tenancy`) or ``own``."""
    if not outcome.tenant_server:
        return "own"
    return f"tenant of server {outcome.tenant_server.removesuffix('-tenants')}"


def _runs(
    outcomes: Sequence[RunOutcome], baseline: RewardSummary | None, reused: Mapping[int, str] | None
) -> list[str]:
    lines: list[str] = []
    if baseline is not None:
        lines += [
            "",
            "## Preflight (untrained model, held-out tasks)",
            "",
            f"n = {baseline.tasks} tasks, {baseline.episodes} attempts: mean reward {_fmt(baseline.mean_reward)}, "
            f"p@1 {_fmt(baseline.pass_at_1)}, p@2 {_fmt(baseline.pass_at_2)}.",
        ]
    rows = []
    for o in outcomes:
        last = o.curve[-1][1] if o.curve else (o.episode_curve[-1] if o.episode_curve else math.nan)
        e = o.eval
        origin = (reused or {}).get(o.run_id)
        status = status_text(o.status) + (f", reused from {origin}" if origin else "")
        unevaluated = "–"
        if e is None and o.purpose == "sweep" and o.status != "finished" and trained_steps(o) == 0:
            unevaluated = "– (not evaluated: no step trained)"  # its policy is the preflight's untrained one
        elif e is None and o.purpose == "sweep" and o.status == "budget":
            unevaluated = "– (not evaluated: budget)"  # its steps ended after the budget stop (fresh-s6 #2)
        held_out = [f"{e.tasks} / {e.episodes}" if e else unevaluated, _fmt(e.pass_at_1 if e else None)]
        wall = "–" if origin else f"{o.wall_s:.0f}"
        row = [o.key, status, str(o.steps), episodes_text(o), wall, _fmt(last), *held_out]
        rows.append([*row, _fmt(e.pass_at_2 if e else None), _mean_se(e)])
    header = ["run", "status", "steps", "train episodes", "wall s", "last reward"]
    header += ["held-out n (tasks / attempts)", "held-out p@1", "held-out p@2", "held-out mean ± SE"]
    columns = [(h, [row[i] for row in rows]) for i, h in enumerate(header)]
    if any(o.tenant_server for o in outcomes):  # a stage's runs trained side by side on one server
        columns.append(("server", [_server_text(o) for o in outcomes]))
    table = _table(columns, droppable=("held-out p@1", "held-out p@2"))
    late = next((o for o in outcomes if "untrained)" in episodes_text(o)), None)
    if late is not None and late.trained_episodes is not None:
        trained, more = late.trained_episodes, late.episodes - late.trained_episodes
        table += [
            "",
            f"_{episodes_text(late)} ({late.key}): {trained} episodes the run's steps trained, and {more} more "
            "that finished after its last step took its batch (no step of the run trained them; a "
            "continuation on the same server may). How many finish late depends on what was in flight at "
            "the last step, so seeds of one configuration can differ there while their trained episodes "
            "are the same._",
        ]
    return [*lines, "", "## Runs", "", *table]


def _configurations(
    configs: Sequence[ConfigVerdict], name: str, template: str | None, stability: bool
) -> list[str]:
    columns: list[tuple[str, list[str]]] = [
        (name, [value_text(name, template, c.value) for c in configs]),
        ("seeds", [str(c.seeds) for c in configs]),
    ]
    if stability:
        columns += [
            ("stable seeds", [str(c.stable_seeds) for c in configs]),
            ("stable", [c.stable_text for c in configs]),
        ]
    columns += [
        ("last-k train reward", [_fmt(c.last_k_reward) for c in configs]),
        ("held-out p@1" if not stability else "p@1", [_fmt(c.pass_at_1) for c in configs]),
        ("held-out p@2" if not stability else "p@2", [_fmt(c.pass_at_2) for c in configs]),
        (
            "held-out mean reward" if not stability else "mean reward",
            [_fmt(c.eval_mean_reward) for c in configs],
        ),
    ]
    if stability:
        columns.append(("why unstable", ["; ".join(c.reasons + c.not_run)[:300] for c in configs]))
    droppable = ("held-out p@1", "held-out p@2", "p@1", "p@2")
    return ["", "## Configurations", "", *_table(columns, droppable=droppable)]


def _figures(
    folder: Path,
    plan: PlanDraft,
    outcomes: Sequence[RunOutcome],
    baseline: RewardSummary | None,
    reward_parts: Sequence[str],
) -> list[str]:
    """The held-out before/after, reward-curve and reward-part figures with their Markdown."""
    lines: list[str] = []
    held_out = plot_held_out(outcomes, baseline, folder / "held_out.png", scale=reward_range(plan.template))
    if held_out is not None:
        lines += [
            "",
            "## Held-out reward before and after training",
            "",
            f"![held-out before and after]({held_out.name})",
        ]
    curves = plot_rewards(outcomes, folder / "reward_curves.png")
    if curves is not None:
        lines += ["", "## Reward curves", "", f"![reward curves]({curves.name})"]
    parts = joined_parts(
        outcomes, reward_parts, plan.sweep.variable if plan.sweep else "value", plan.template
    )
    parts_png = plot_parts(parts, folder / "reward_parts.png", part_roles(plan.template))
    if parts_png is not None:
        lines += [
            "",
            "## Reward parts",
            "",
            "The reward split into its parts (the workflow's episode metrics), the mean of each over the "
            "episodes each trainer step trained, per configuration and seed (episodes that finished after "
            "the last step took its batch trained nothing and are left out; a rate on a fixed 0–1 scale; "
            "the good direction in each panel's title):",
            "",
            f"![reward parts]({parts_png.name})",
            "",
            *_parts_table(parts),
        ]
    return lines


def _findings_and_patches(
    findings: Sequence[FindingPublic], patches: Sequence[PatchPublic], study: StudyPublic
) -> list[str]:
    lines: list[str] = []
    if findings:
        lines += ["", "## Findings", ""]
        for f in findings:
            label = verdict_label(f.status.value, f.evidence)
            line = headline(
                f.statement, f.evidence, question=study.question, kind=study.kind, status=f.status.value
            )
            derivation = f" — {f.statement}" if line != f.statement else ""
            seeds = ",".join(map(str, f.seeds)) or "none"
            runs = ",".join(map(str, f.run_ids)) or "none"
            lines.append(
                f"- **{line}** [{label}, confidence {f.confidence:.2f}, seeds {seeds}, runs {runs}]{derivation}"
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
    return lines


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
    """Write ``report.md`` (and ``held_out.png``, ``reward_curves.png``, ``reward_parts.png``,
    ``sweep.png``) into ``folder``.

    Args:
        conclusion: The study's conclusion; the report opens with its one plain line (read from the
            finding of the same statement, `a3r.study.headline`) and shows the conclusion below it.
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
    # stability verdicts belong to a min-stable question; the other goals compare held-out rewards
    stability = plan.sweep is not None and plan.sweep.goal == "min_stable"
    variable = plan.sweep.variable if plan.sweep else "value"
    sweep = plot_sweep(
        configs, variable, baseline, folder / "sweep.png", stability=stability, template=plan.template
    )
    lines = [f"# Study {study.id}: {study.question}", "", *_verdict(study, conclusion, findings)]
    lines += _plan(plan, notes, hypotheses, stability_n(outcomes, baseline))
    lines += _runs(outcomes, baseline, reused)
    if configs:
        lines += _configurations(configs, variable, plan.template, stability)
    lines += _figures(folder, plan, outcomes, baseline, reward_parts)
    if sweep is not None:
        lines += ["", "## Sweep", "", f"![sweep]({sweep.name})"]
    lines += _findings_and_patches(findings, patches, study)
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
