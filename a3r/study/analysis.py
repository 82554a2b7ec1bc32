"""Statistics and failure detectors over what a training run leaves behind.

Inputs are plain records read from the swarm HTTP API and the client runner's files: per-step trainer
metrics (``GET /api/v1/metrics`` rows), ended episodes (the runner's ``progress.jsonl``: kind, round,
task id, group member, status, reward) and the client log. Every detector returns `Diagnosis` objects
whose ``evidence`` holds the numbers it saw, so a finding can cite them.

Detectors (docs/ARCHITECTURE.md §Inside a3r): crashes (tracebacks in the client log), zero-signal
groups (all rewards of a GRPO group equal: the group-normalised advantage is 0 for every member),
collapse (reward drop, entropy collapse, KL blow-up), length collapse, reward hacking signs (train
reward up while held-out reward down) and stalls (episodes flow, the policy step does not move).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import templates
from a3r.study.effects import EffectVerdict, Scale, step_effect

__all__ = [
    "STOP_EXCEPTIONS",
    "Diagnosis",
    "DiagnosisKind",
    "EpisodeRecord",
    "RewardSummary",
    "detect_all",
    "detect_collapse",
    "detect_crash",
    "detect_length_collapse",
    "detect_part_exploits",
    "detect_reward_hacking",
    "detect_stall",
    "detect_zero_signal",
    "groups_of",
    "mean_ci",
    "metric_series",
    "on_shared_tasks",
    "part_curves",
    "part_roles",
    "part_scale",
    "pass_at_k",
    "read_progress",
    "reward_range",
    "shared_tasks",
    "step_parts",
    "summarise_rewards",
    "task_span",
    "trained_count",
]


class DiagnosisKind(StrEnum):
    """What went wrong (or is suspicious) in a run."""

    crash = "crash"
    zero_signal = "zero_signal"
    collapse = "collapse"
    length_collapse = "length_collapse"
    reward_hacking = "reward_hacking"
    stall = "stall"
    hang = "hang"


class Diagnosis(BaseModel):
    """One detection with its evidence.

    Attributes:
        kind: What was detected.
        summary: One readable sentence with the numbers.
        evidence: The numbers (and short excerpts) behind it.
        patchable: Whether a change of the workflow, reward or data files may fix it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: DiagnosisKind
    summary: str
    evidence: dict[str, float | int | str] = Field(default_factory=dict)
    patchable: bool = False


class EpisodeRecord(BaseModel):
    """One ended episode as the client runner recorded it (a line of ``progress.jsonl``).

    Attributes:
        kind: ``train`` or ``eval``.
        round: Epoch (train) or eval round.
        task_id: Task id (the GRPO group key together with ``round``).
        member: Index in its group, 0..G-1.
        status: ``finished``, ``aborted`` (agent failure), ``infra_failure`` or ``partial_finish``.
        reward: Episode reward (``None`` when aborted).
        time: Unix time the end was recorded, in seconds.
        error: Why an evaluation attempt failed (``a3r.swarmops.evaluate`` records only).
        metrics: The workflow's episode metrics (``Result.metrics``: the reward's parts, e.g.
            ``format_ok``, ``correct``, ``win_rate``), empty when it reported none.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: str
    round: int
    task_id: str
    member: int
    status: str
    reward: float | None = None
    time: float = 0.0
    error: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


def read_progress(path: Path) -> list[EpisodeRecord]:
    """Episodes of a runner's ``progress.jsonl`` in file order; a torn last line is skipped.

    Args:
        path: The file (missing: no episodes).
    """
    if not path.is_file():
        return []
    records: list[EpisodeRecord] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(EpisodeRecord.model_validate(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return records


def groups_of(episodes: Iterable[EpisodeRecord], kind: str = "train") -> dict[tuple[int, str], list[float]]:
    """Rewards of finished episodes grouped by (round, task id), in order of first appearance."""
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for ep in episodes:
        if ep.kind == kind and ep.status == "finished" and ep.reward is not None:
            groups[(ep.round, ep.task_id)].append(ep.reward)
    return dict(groups)


def part_curves(
    episodes: Iterable[EpisodeRecord],
    names: Sequence[str],
    *,
    per_point: int,
    per_step: Sequence[int] | None = None,
) -> dict[str, list[float]]:
    """Curves of the reward's parts: the mean of each named episode metric per trainer step, or over
    successive chunks of ``per_point`` finished train episodes where the steps are not known.

    With ``per_step`` (the episodes each trainer step consumed, in step order), point k is the mean over
    the next ``per_step[k]`` finished train episodes in record order (≈ the episodes step k trained on),
    one point per step; the episodes that finished after the last step's batch was taken (trained by no
    step) are left out. Without it, chunks of ``per_point`` (``per_point`` = B·G makes one point about
    one trainer step's batch), a last partial chunk counting when it holds at least half a chunk.

    Args:
        episodes: Client records (``progress.jsonl``).
        names: Metric names (a template's ``reward_parts``); names no episode reported are left out.
        per_point: Episodes per point (>= 1), where ``per_step`` is ``None``.
        per_step: Episodes consumed by each trainer step (`swarm.protocol.ServerStepMetrics`:
            ``episodes`` + ``episodes_dropped``), in step order.

    Returns:
        Name → means, shape (points,).
    """
    if per_step is not None:
        return _step_part_curves(episodes, names, per_step)
    size = max(1, per_point)
    rows = [ep.metrics for ep in episodes if ep.kind == "train" and ep.status == "finished" and ep.metrics]
    curves: dict[str, list[float]] = {}
    for name in names:
        values = [row[name] for row in rows if name in row and math.isfinite(row[name])]
        chunks = [values[i : i + size] for i in range(0, len(values), size)]
        points = [statistics.fmean(c) for c in chunks if len(c) * 2 >= size]
        if points:
            curves[name] = points
    return curves


def trained_count(per_step: Sequence[int], finished: int) -> int:
    """Finished train episodes that some trainer step consumed: ``Σ per_step``, at most ``finished``."""
    return min(sum(max(0, n) for n in per_step), finished)


def step_parts(
    trained: Iterable[tuple[int, Mapping[str, float]]], names: Sequence[str]
) -> dict[str, list[float]]:
    """Curves of the reward's parts, one point per trainer step: the mean of each named metric over the
    episodes the step trained.

    Args:
        trained: ``(step, episode metrics)`` per trained episode (`a3r.swarmops.trained.trained_metrics`).
        names: Metric names; names no trained episode reported are left out.

    Returns:
        Name → means in step order, shape (steps with a value,).
    """
    by_step: dict[int, list[Mapping[str, float]]] = defaultdict(list)
    for step, metrics in trained:
        by_step[step].append(metrics)
    curves: dict[str, list[float]] = {}
    for name in names:
        points = []
        for step in sorted(by_step):
            values = [m[name] for m in by_step[step] if name in m and math.isfinite(m[name])]
            if values:
                points.append(statistics.fmean(values))
        if points:
            curves[name] = points
    return curves


def _step_part_curves(
    episodes: Iterable[EpisodeRecord], names: Sequence[str], per_step: Sequence[int]
) -> dict[str, list[float]]:
    """`part_curves` with one point per trainer step (see there)."""
    rows = [ep.metrics for ep in episodes if ep.kind == "train" and ep.status == "finished"]
    trained: list[tuple[int, Mapping[str, float]]] = []
    start = 0
    for step, n in enumerate(per_step):
        trained += [(step, row) for row in rows[start : start + max(0, n)]]
        start += max(0, n)
    return step_parts(trained, names)


def part_roles(template: str | None) -> dict[str, str]:
    """A template's reward parts and their roles (`templates.TemplateMeta.reward_parts`); none for a
    generated workflow or an unknown template."""
    if template is None:
        return {}
    try:
        return dict(templates.get_template(template).meta.reward_parts)
    except templates.TemplateError:
        return {}


def reward_range(template: str | None) -> tuple[float, float] | None:
    """The episode rewards a template's reward can pay (`templates.TemplateMeta.reward_range`), which
    bound the intervals of reward effects (`a3r.study.effects`); ``None`` for a generated workflow or
    an unknown template (its range is not known)."""
    if template is None:
        return None
    try:
        return templates.get_template(template).meta.reward_range
    except templates.TemplateError:
        return None


RATE_SCALE: Scale = (0.0, 1.0)
"""The range of a rate (a reward part whose every value lies in [0, 1]: a share of episodes)."""


def part_scale(values: Iterable[float]) -> Scale | None:
    """The known range of a reward part from its values (means per step): `RATE_SCALE` when every
    finite value lies in [0, 1] (a rate), else ``None`` (unbounded as far as a3r knows). The one home of
    the rule that a part's trend interval (`a3r.study.effects.step_effect`) is bounded by its range, for
    the report's table, the plots and the exploit detector alike."""
    finite = [v for v in values if math.isfinite(v)]
    return RATE_SCALE if finite and all(0.0 <= v <= 1.0 for v in finite) else None


def detect_part_exploits(parts: Mapping[str, Sequence[float]], roles: Mapping[str, str]) -> list[Diagnosis]:
    """One part of the reward exploited: over a run's per-batch part curves (`part_curves`), a
    ``violation`` rate that rises, or a ``shaping`` bonus that rises while no ``goal`` part does. A
    rise counts only when its trend's interval clears the noise (`a3r.study.effects.step_effect`
    confirmed), so noise never triggers a reward patch.

    Args:
        parts: Metric name → means per B·G train episodes, in order.
        roles: Metric name → role (`part_roles`).

    Returns:
        Patchable ``reward_hacking`` diagnoses whose evidence names the ``part`` and its ``role``.
    """
    rises = {
        name: step_effect(points, scale=part_scale(points)) for name, points in parts.items() if name in roles
    }
    goal_rises = any(
        effect.verdict is EffectVerdict.confirmed for name, effect in rises.items() if roles[name] == "goal"
    )
    found: list[Diagnosis] = []
    for name, effect in rises.items():
        role = roles[name]
        if effect.verdict is not EffectVerdict.confirmed or role not in ("violation", "shaping"):
            continue
        if role == "shaping" and goal_rises:
            continue
        points = parts[name]
        why = (
            "a rule the reward penalises is broken more and more: the penalty is too weak for what breaking it wins"
            if role == "violation"
            else "the policy collects the shaping bonus without reaching the goal"
        )
        found.append(
            Diagnosis(
                kind=DiagnosisKind.reward_hacking,
                summary=f"{name} ({role}) rose from {points[0]:.3f} to {points[-1]:.3f} ({effect.describe()}): {why}",
                evidence={
                    "part": name,
                    "role": role,
                    "first": round(points[0], 4),
                    "last": round(points[-1], 4),
                    "change": round(effect.estimate, 4),
                    "low": round(effect.low, 4),
                    "high": round(effect.high, 4),
                },
                patchable=True,
            )
        )
    return found


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: the chance that at least one of k samples drawn without
    replacement from n attempts with c correct is correct.

    ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code", eq. 1).

    Args:
        n: Attempts (>= k).
        c: Correct attempts, 0..n.
        k: Samples drawn.

    Raises:
        ValueError: ``k > n``, or ``c`` outside 0..n.
    """
    if not 0 <= c <= n or k > n or k < 1:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Mean and half-width of its normal-approximation confidence interval (``z`` · s / √n).

    Returns:
        ``(mean, half_width)``; the half width is ``nan`` for fewer than two values, and the mean is
        ``nan`` for none.
    """
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, z * statistics.stdev(values) / math.sqrt(len(values))


class RewardSummary(BaseModel):
    """Rewards of a set of episodes per task and over tasks.

    Attributes:
        tasks: Tasks with at least one finished episode.
        episodes: Finished episodes.
        mean_reward: Mean episode reward.
        pass_at_1: Mean over tasks of unbiased pass@1 (reward >= threshold counts as correct).
        pass_at_2: Mean over tasks with >= 2 attempts of unbiased pass@2 (``nan`` if none).
        rewards: Every episode's reward, for intervals (`a3r.study.effects.two_sample_effect`); empty
            in summaries recorded before it was kept.
        task_rewards: The rewards per task id (held-out evaluations), so that two evaluations can be
            compared on the tasks both ran (`shared_tasks`, `on_tasks`); empty when not kept.
        correct_threshold: The reward at which an attempt counted as correct.
    """

    model_config = ConfigDict(frozen=True)

    tasks: int
    episodes: int
    mean_reward: float
    pass_at_1: float
    pass_at_2: float
    rewards: list[float] = Field(default_factory=list)
    task_rewards: dict[str, list[float]] = Field(default_factory=dict)
    correct_threshold: float = 1.0

    def on_tasks(self, tasks: Collection[str]) -> RewardSummary:
        """The same evaluation restricted to ``tasks`` (those it did not run are ignored).

        Raises:
            ValueError: The summary kept no rewards per task.
        """
        if not self.task_rewards:
            raise ValueError("this evaluation kept no rewards per task")
        kept = {task: rewards for task, rewards in self.task_rewards.items() if task in tasks}
        return summarise_rewards(kept, correct_threshold=self.correct_threshold, keep_tasks=True)


def shared_tasks(summaries: Iterable[RewardSummary]) -> frozenset[str] | None:
    """The task ids every one of ``summaries`` evaluated; ``None`` when one of them kept no rewards per
    task (recorded before they were kept) or there is no summary."""
    found: frozenset[str] | None = None
    for summary in summaries:
        if not summary.task_rewards:
            return None
        tasks = frozenset(summary.task_rewards)
        found = tasks if found is None else found & tasks
    return found


def on_shared_tasks(summaries: Sequence[RewardSummary]) -> tuple[list[RewardSummary], frozenset[str] | None]:
    """The summaries restricted to the tasks every one of them evaluated (`shared_tasks`), so that they
    compare the same tasks; unchanged, with ``None`` for the tasks, when one kept no rewards per task."""
    tasks = shared_tasks(summaries)
    if tasks is None:
        return list(summaries), None
    return [s.on_tasks(tasks) for s in summaries], tasks


def task_span(tasks: Collection[str]) -> str:
    """The task ids of a comparison in a few words: all of them up to 6, else the first 3 and a count."""
    ordered = sorted(tasks, key=lambda t: (len(t), t))
    if len(ordered) <= 6:
        return ", ".join(ordered)
    return f"{', '.join(ordered[:3])}, … ({len(ordered)} in all)"


def summarise_rewards(
    groups: Mapping[Any, Sequence[float]], *, correct_threshold: float = 1.0, keep_tasks: bool = False
) -> RewardSummary:
    """Mean reward, pass@1 and pass@2 (`pass_at_k`) of grouped rewards.

    Args:
        groups: Rewards per task (e.g. `groups_of` of eval episodes with G >= 2).
        correct_threshold: An attempt is correct when its reward is at least this.
        keep_tasks: Keep the rewards per task (`RewardSummary.task_rewards`, keyed by ``str(key)``).
    """
    rewards = [r for rs in groups.values() for r in rs]
    p1: list[float] = []
    p2: list[float] = []
    for rs in groups.values():
        if not rs:
            continue
        c = sum(1 for r in rs if r >= correct_threshold)
        p1.append(pass_at_k(len(rs), c, 1))
        if len(rs) >= 2:
            p2.append(pass_at_k(len(rs), c, 2))
    return RewardSummary(
        tasks=len(p1),
        episodes=len(rewards),
        mean_reward=statistics.fmean(rewards) if rewards else math.nan,
        pass_at_1=statistics.fmean(p1) if p1 else math.nan,
        pass_at_2=statistics.fmean(p2) if p2 else math.nan,
        rewards=rewards,
        task_rewards={str(task): list(rs) for task, rs in groups.items() if rs} if keep_tasks else {},
        correct_threshold=correct_threshold,
    )


def metric_series(rows: Sequence[Mapping[str, Any]], name: str) -> list[tuple[int, float]]:
    """``(step, value)`` of metric ``name`` in each row that has it as a finite number.

    Rows are the server's per-step metrics by their field names (``swarm.protocol.ServerStepMetrics``:
    ``reward_mean``, ``entropy``, ``kl``; plus ``completion_tokens_mean``, see ``execution``); a row
    without ``step`` counts as step ``index + 1``.
    """
    out: list[tuple[int, float]] = []
    for index, row in enumerate(rows):
        step = row.get("step", index + 1)
        value = row.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out.append((int(step), float(value)))
    return out


_TRACEBACK = re.compile(r"Traceback \(most recent call last\):.*?(?:\n\S[^\n]*)", re.DOTALL)

STOP_EXCEPTIONS = ("KeyboardInterrupt", "SystemExit", "asyncio.exceptions.CancelledError", "CancelledError")
"""Exceptions a process raises when a3r stops it (SIGINT, SIGTERM, a cancelled task): a traceback
ending in one of them records our stop (the budget, a hang, an early stop), not the run's own failure,
whatever state the process was in (importing at start-up, a smoke episode, a training step, an
evaluation)."""


_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
"""How Python joins the tracebacks of one exception chain (PEP 3134): only the last one propagated."""

_GROUP_HEADER = re.compile(
    r"^[ \t]*\+ Exception Group Traceback \(most recent call last\):[ \t]*$", re.MULTILINE
)
"""The first line of an exception group's traceback (PEP 654), whose lines then start with ``|`` or ``+``."""


@dataclass(frozen=True)
class _Traceback:
    """One traceback in a log: where it is, its text, the exception line it ends with (a group's: its first
    sub-exception that is not a stop, else its first), and whether that is a3r's stop (`STOP_EXCEPTIONS`;
    a group's when every sub-exception is)."""

    start: int
    end: int
    text: str
    error: str
    stop: bool


def _exception_name(line: str) -> str:
    return line.split(":", 1)[0].strip()


def _group_traceback(log_text: str, header: re.Match[str]) -> _Traceback:
    """The exception group traceback that begins at ``header``: its prefixed lines up to a blank line, another
    traceback, or the last prefixed line (a sub-exception's message may continue on unprefixed lines)."""
    end = header.end()
    errors: list[str] = []
    position = header.end()
    for line in log_text[header.end() :].split("\n")[1:]:
        position += 1 + len(line)
        stripped = line.strip()
        if not stripped or ("Traceback (most recent call last)" in line and not stripped.startswith("|")):
            break
        if not stripped.startswith(("|", "+")):
            continue  # a message's continuation line, or other output interleaved
        end = position
        if not stripped.startswith("|"):
            continue  # a separator between sub-exceptions
        content = stripped[1:].removeprefix(" ")
        if not content or content[0].isspace() or "Traceback (most recent call last)" in content:
            continue  # a frame, its code, or a nested traceback's first line
        if content.startswith(_CHAINED):
            if errors:
                errors.pop()  # that exception was handled: the chain's next one propagated
            continue
        errors.append(content)
    leaves = [e for e in errors if not _exception_name(e).endswith("ExceptionGroup")]
    own = [e for e in leaves if _exception_name(e) not in STOP_EXCEPTIONS]
    error = (own or leaves or errors or [""])[0]
    return _Traceback(header.start(), end, log_text[header.start() : end], error, bool(leaves) and not own)


def _final_tracebacks(log_text: str) -> list[_Traceback]:
    """The log's tracebacks, one per exception chain: the chain's last traceback, the exception that
    propagated. A stop signal that lands while a library handles an exception of its own (``except
    ImportError:`` around an optional import) prints that exception's traceback first, then "During handling
    of the above exception…" and the ``KeyboardInterrupt``: the chain is the stop's, not an ImportError.
    Exception groups (an ``asyncio.TaskGroup``'s errors, PEP 654) are one traceback each, judged by their
    sub-exceptions."""
    groups = [_group_traceback(log_text, header) for header in _GROUP_HEADER.finditer(log_text)]
    plain_text = log_text
    for group in groups:  # their nested tracebacks are theirs: blanked, the offsets kept
        blank = re.sub(r"[^\n]", " ", log_text[group.start : group.end])
        plain_text = plain_text[: group.start] + blank + plain_text[group.end :]
    plain = []
    for match in _TRACEBACK.finditer(plain_text):
        error = match.group(0).strip().splitlines()[-1].strip()
        plain.append(
            _Traceback(
                match.start(), match.end(), match.group(0), error, _exception_name(error) in STOP_EXCEPTIONS
            )
        )
    found = sorted([*groups, *plain], key=lambda tb: tb.start)
    final = []
    for index, traceback in enumerate(found):
        between = log_text[traceback.end : found[index + 1].start] if index + 1 < len(found) else ""
        if not any(marker in between for marker in _CHAINED):
            final.append(traceback)
    return final


def detect_crash(log_text: str, *, exit_code: int | None, agent_failures: int = 0) -> list[Diagnosis]:
    """A client crash: a non-zero exit code or agent failures, with the last traceback as evidence.

    Tracebacks of a3r's own stop (`STOP_EXCEPTIONS`: a budget stop while the client was still
    importing raises ``KeyboardInterrupt``) are not a crash and are left out.

    Args:
        log_text: The client's combined stdout/stderr.
        exit_code: The client's exit code (``None`` while running, or stopped by us).
        agent_failures: Episodes aborted because the workflow raised.
    """
    tracebacks = [tb for tb in _final_tracebacks(log_text) if not tb.stop]
    if exit_code in (None, 0) and agent_failures == 0 and not tracebacks:
        return []
    last = tracebacks[-1].text if tracebacks else ""
    tail = "\n".join(last.strip().splitlines()[-6:]) if last else log_text.strip()[-600:]
    error_line = tracebacks[-1].error if tracebacks else ""
    summary = (
        f"client {'exited with code ' + str(exit_code) if exit_code not in (None, 0) else 'raised'}"
        f"{': ' + error_line if error_line else ''}; {len(tracebacks)} traceback(s), "
        f"{agent_failures} agent failure(s)"
    )
    return [
        Diagnosis(
            kind=DiagnosisKind.crash,
            summary=summary,
            evidence={
                "exit_code": -1 if exit_code is None else exit_code,
                "tracebacks": len(tracebacks),
                "agent_failures": agent_failures,
                "traceback_tail": tail[-1500:],
            },
            patchable=True,
        )
    ]


def detect_zero_signal(
    groups: Mapping[Any, Sequence[float]], *, group_size: int, threshold: float = 0.8, min_groups: int = 2
) -> list[Diagnosis]:
    """Zero-signal groups: full groups whose rewards are all equal (GRPO advantage 0 everywhere).

    Args:
        groups: Train rewards per (round, task).
        group_size: G; only full groups count.
        threshold: Fraction of zero-signal groups that triggers the diagnosis.
        min_groups: Full groups needed before judging.
    """
    full = [list(rs) for rs in groups.values() if len(rs) >= group_size]
    if len(full) < min_groups:
        return []
    flat = [rs for rs in full if max(rs) - min(rs) < 1e-9]
    fraction = len(flat) / len(full)
    if fraction < threshold:
        return []
    all_zero = sum(1 for rs in flat if rs[0] <= 0.0)
    all_max = len(flat) - all_zero
    cause = "every attempt fails" if all_zero >= all_max else "every attempt gets the same positive reward"
    return [
        Diagnosis(
            kind=DiagnosisKind.zero_signal,
            summary=(
                f"{len(flat)}/{len(full)} groups ({fraction:.0%}) have identical rewards, mostly because "
                f"{cause}: GRPO advantages are zero and the policy gets no gradient"
            ),
            evidence={
                "groups": len(full),
                "zero_signal_groups": len(flat),
                "fraction": round(fraction, 4),
                "all_zero_groups": all_zero,
                "all_same_positive_groups": all_max,
                "mean_reward": round(statistics.fmean(r for rs in full for r in rs), 4),
            },
            patchable=True,
        )
    ]


def _halves(series: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    if len(series) < 4:
        return None
    mid = len(series) // 2
    return statistics.fmean(v for _, v in series[:mid]), statistics.fmean(v for _, v in series[mid:])


def detect_collapse(
    rows: Sequence[Mapping[str, Any]],
    *,
    drop_max: float = 0.25,
    entropy_min: float = 0.05,
    kl_max: float = 1.0,
) -> list[Diagnosis]:
    """Collapse: the reward falls from the first to the second half of the run, the entropy falls
    below ``entropy_min`` (nats/token) or the KL exceeds ``kl_max``.

    Args:
        rows: Per-step trainer metrics.
    """
    found: list[Diagnosis] = []
    halves = _halves(metric_series(rows, "reward_mean"))
    if halves is not None and halves[0] - halves[1] > drop_max:
        found.append(
            Diagnosis(
                kind=DiagnosisKind.collapse,
                summary=f"mean reward fell from {halves[0]:.3f} (first half) to {halves[1]:.3f} (second half)",
                evidence={
                    "reward_first_half": round(halves[0], 4),
                    "reward_second_half": round(halves[1], 4),
                },
            )
        )
    # (metric, bound's name, bound, whether a value breaches it, summary of the last breach)
    bounds: tuple[tuple[str, str, float, Callable[[float], bool], str], ...] = (
        (
            "entropy",
            "entropy_min",
            entropy_min,
            lambda v: v < entropy_min,
            "entropy collapsed to {value:.4f} nats/token at step {step} (< {bound:g})",
        ),
        (
            "kl",
            "kl_max",
            kl_max,
            lambda v: v > kl_max,
            "KL reached {value:.3f} at step {step} (> {bound:g}): the policy diverges",
        ),
    )
    for metric, bound_name, bound, breaches, summary in bounds:
        breaching = [(s, v) for s, v in metric_series(rows, metric) if breaches(v)]
        if breaching:
            step, value = breaching[-1]
            found.append(
                Diagnosis(
                    kind=DiagnosisKind.collapse,
                    summary=summary.format(value=value, step=step, bound=bound),
                    evidence={metric: round(value, 6), "step": step, bound_name: bound},
                )
            )
    return found


def detect_length_collapse(rows: Sequence[Mapping[str, Any]], *, ratio: float = 0.3) -> list[Diagnosis]:
    """Length collapse: mean completion length in the last third below ``ratio`` × the first third."""
    series = metric_series(rows, "completion_tokens_mean")
    if len(series) < 6:
        return []
    third = len(series) // 3
    first = statistics.fmean(v for _, v in series[:third])
    last = statistics.fmean(v for _, v in series[-third:])
    if first <= 0 or last >= ratio * first:
        return []
    return [
        Diagnosis(
            kind=DiagnosisKind.length_collapse,
            summary=f"completion length fell from {first:.1f} to {last:.1f} tokens",
            evidence={"length_first_third": round(first, 3), "length_last_third": round(last, 3)},
            patchable=True,
        )
    ]


def detect_reward_hacking(
    train: Sequence[tuple[int, float]], held_out: Sequence[tuple[int, float]], *, delta: float = 0.05
) -> list[Diagnosis]:
    """Reward hacking signs: train reward rises by more than ``delta`` while held-out reward falls by
    more than ``delta`` (first vs last point of each series).

    Args:
        train: ``(step or round, mean train reward)``, in order.
        held_out: ``(step or round, mean held-out reward)``, in order (>= 2 points).
    """
    if len(train) < 2 or len(held_out) < 2:
        return []
    train_gain = train[-1][1] - train[0][1]
    held_gain = held_out[-1][1] - held_out[0][1]
    if train_gain > delta and held_gain < -delta:
        return [
            Diagnosis(
                kind=DiagnosisKind.reward_hacking,
                summary=(
                    f"train reward rose by {train_gain:+.3f} while held-out reward changed by {held_gain:+.3f}: "
                    "the policy may exploit the reward"
                ),
                evidence={"train_gain": round(train_gain, 4), "held_out_gain": round(held_gain, 4)},
                patchable=True,
            )
        ]
    return []


def detect_stall(
    steps: Sequence[tuple[float, int, int]], *, window_s: float = 120.0, min_new_episodes: int = 1
) -> list[Diagnosis]:
    """A stall: over the last ``window_s`` seconds episodes kept finishing but the policy step did not
    move (training is enabled yet no update happens).

    Args:
        steps: ``(time in s, policy step, finished episodes)`` samples, oldest first.
    """
    if len(steps) < 2 or steps[-1][0] - steps[0][0] < window_s:
        return []
    recent = [s for s in steps if s[0] >= steps[-1][0] - window_s]
    t0, step0, done0 = recent[0]
    t1, step1, done1 = recent[-1]
    if step1 == step0 and done1 - done0 >= min_new_episodes:
        return [
            Diagnosis(
                kind=DiagnosisKind.stall,
                summary=(
                    f"{done1 - done0} episodes finished in {t1 - t0:.0f} s but the policy step stayed at {step1}"
                ),
                evidence={"window_s": round(t1 - t0, 1), "new_episodes": done1 - done0, "step": step1},
            )
        ]
    return []


def detect_all(
    *,
    rows: Sequence[Mapping[str, Any]],
    episodes: Sequence[EpisodeRecord],
    group_size: int,
    rewards_only: bool = True,
    log_text: str = "",
    exit_code: int | None = None,
    drop_max: float = 0.25,
    entropy_min: float = 0.05,
    kl_max: float = 1.0,
) -> list[Diagnosis]:
    """Every detector over one run's records (crash, zero signal, collapse, length, reward hacking).

    ``rewards_only=False`` (a run distilling a teacher: its per-token signal does not vanish where a
    group's rewards tie) leaves zero signal out."""
    agent_failures = sum(1 for ep in episodes if ep.status == "aborted")
    found = detect_crash(log_text, exit_code=exit_code, agent_failures=agent_failures)
    if rewards_only:
        found += detect_zero_signal(groups_of(episodes), group_size=group_size)
    found += detect_collapse(rows, drop_max=drop_max, entropy_min=entropy_min, kl_max=kl_max)
    found += detect_length_collapse(rows)
    train = metric_series(rows, "reward_mean")
    eval_rounds = groups_of(episodes, kind="eval")
    by_round: dict[int, list[float]] = defaultdict(list)
    for (round_, _task), rewards in eval_rounds.items():
        by_round[round_].extend(rewards)
    held = [(r, statistics.fmean(v)) for r, v in sorted(by_round.items()) if v]
    found += detect_reward_hacking(train, held)
    return found
