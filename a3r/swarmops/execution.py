"""Executing one run: a swarm server (started or attached), ``swarm run`` clients and held-out
evaluations as subprocesses, monitored only through the swarm HTTP API and the subprocesses' files.

The monitor polls ``GET /api/v1/status`` (policy step, episode counts), ``GET /api/v1/metrics``
(per-step trainer metrics, recorded as `memory` metric points), ``GET /api/v1/events`` (warnings and
errors, recorded as store events), the client's ``progress.jsonl`` and, for a server it started, the
model calls in the server's access log and its CPU use. It enforces the step target and the wall-time
budget and tells a *hung* run (no step, no episode, no event, no client record, no model call, an idle
server for ``hang_after_s``) from a *slow* one (episodes or calls flow, or the server computes, but no
trainer step for a while: noted, not stopped). The rules are the pure `a3r.swarmops.monitoring.judge`;
here is the poll loop that feeds it observations.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from a3r.errors import SwarmProcessError
from a3r.study.analysis import (
    Diagnosis,
    EpisodeRecord,
    RewardSummary,
    detect_all,
    detect_crash,
    detect_stall,
    detect_zero_signal,
    groups_of,
    metric_series,
    part_curves,
    read_progress,
    step_parts,
    summarise_rewards,
    trained_count,
)
from a3r.study.price import SERVER_OVERHEAD_S
from a3r.study.research import (
    EVAL_BUDGET_SHARE,
    EVAL_RESERVE_MARGIN,
    recheck_steps,
    replan_training,
    size_heldout,
)
from a3r.study.runs import RunOutcome, RunSpec, RunStatusName
from a3r.study.sequential import SignalCheck
from a3r.study.settings import SETTINGS, serve_flags
from a3r.study.wording import counted
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.monitoring import Observation, RunEnd, RunWatch, Verdict, WatchRules, final_end, judge
from a3r.swarmops.processes import (
    ManagedProcess,
    ServerHandle,
    end_stale,
    launch,
    start_server,
    swarm_command,
)
from a3r.swarmops.serving_dtype import study_dtype
from a3r.swarmops.teacher import start_teacher, student_env, teacher_key
from a3r.swarmops.tenant_calls import (
    CALL_TIMEOUT_S,
    TenantStartError,
    create_tenant,
    retire_and_read,
    retire_tenant,
    transport_failure,
)
from a3r.swarmops.trained import trained_metrics
from memory import NOT_METRICS, RunUpdate
from swarm.client import (
    ClientError,
    Event,
    ServeOptions,
    ServeOptionsError,
    ServerStepMetrics,
    StatusView,
    TenantView,
)

__all__ = [
    "EVAL_BUDGET_SHARE",
    "NOT_EVALUATED_UNTRAINED",
    "Workspace",
    "cpu_seconds",
    "eval_tasks_within",
    "execute_run",
    "execute_tenant_run",
    "tenant_server_options",
]


@dataclass(frozen=True)
class Workspace:
    """Files of a study's workspace (written by the coder).

    Attributes:
        root: The workspace folder.
        servers: Where its servers' run dirs are (``None``: ``root/servers``); a template-knob variant
            training as a tenant of its stage's server keeps the study's (`a3r.swarmops.tenancy`).
    """

    root: Path
    servers: Path | None = None

    @property
    def workflow(self) -> Path:
        return self.root / "workflow.py"

    @property
    def tasks(self) -> Path:
        return self.root / "tasks.jsonl"

    @property
    def heldout(self) -> Path:
        return self.root / "heldout.jsonl"

    @property
    def evaluator(self) -> Path:
        """Frozen copy of the workflow and reward used for held-out evaluation (never patched)."""
        return self.root / "evaluator" / "workflow.py"

    def run_dir(self, key: str) -> Path:
        return self.root / "runs" / key

    def server_dir(self, server_key: str) -> Path:
        return (self.servers or self.root / "servers") / server_key

    def task_count(self) -> int:
        with self.tasks.open(encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())


class _Control:
    """A run's server read through its control routes (``SwarmClient``; the admin token travels in a
    header and is never logged), one poll at a time.

    A poll the server does not answer (``httpx.TransportError``: down, restarting, or too busy to answer
    in time) or answers with an error (``ClientError``) reads as *no news*: the monitor judges a silent
    server by its process and by how long nothing moved. An answer that breaks the protocol raises.
    """

    def __init__(self, handle: ServerHandle, tenant: str | None = None) -> None:
        self.client = handle.client()
        self.tenant = tenant
        """The LoRA tenant this run trains as (its metrics, step and events); ``None``: the server's
        one policy."""
        self.event_seq = 0
        """Sequence number of the last server event read."""

    def tenant_view(self) -> TenantView | None:
        """The run's tenant (step, open and pending episodes), or ``None`` when this poll got no answer."""
        assert self.tenant is not None
        try:
            return self.client.tenant(self.tenant)
        except (ClientError, httpx.TransportError):
            return None

    def status(self) -> StatusView | None:
        """The server's status, or ``None`` when this poll got no answer."""
        try:
            return self.client.status()
        except (ClientError, httpx.TransportError):
            return None

    def metrics(self) -> list[ServerStepMetrics] | None:
        """Every per-step metrics row so far, or ``None`` when this poll got no answer."""
        try:
            if self.tenant is not None:
                return self.client.tenant_metrics(self.tenant)
            return self.client.metrics()
        except (ClientError, httpx.TransportError):
            return None

    def events(self) -> list[Event]:
        """Server events since the last poll (none when this poll got no answer)."""
        try:
            events = self.client.events(since=self.event_seq)
        except (ClientError, httpx.TransportError):
            return []
        if events:
            self.event_seq = events[-1].seq
        if self.tenant is not None:  # another tenant's events are its run's
            events = [e for e in events if e.tenant in (None, self.tenant)]
        return events

    def close(self) -> None:
        self.client.close()


@dataclass
class _LogCounter:
    """Counts a marker in a growing log file, reading only what was appended since the last call
    (a started server's access log: ``POST /v1/chat/completions`` lines show model calls inside
    long multi-turn episodes, which no event reports until the episode ends)."""

    path: Path | None
    marker: bytes = b'"POST /v1/chat/completions'
    count: int = 0
    _offset: int = 0
    _tail: bytes = b""

    def update(self) -> int:
        if self.path is None:
            return self.count
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return self.count
        self._offset += len(chunk)
        data = self._tail + chunk
        self.count += data.count(self.marker)
        self._tail = data[-(len(self.marker) - 1) :] if data else b""
        return self.count


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, seconds) a process has used, from ``/proc/<pid>/stat``; ``None`` if
    unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _numeric(metrics: ServerStepMetrics) -> dict[str, float]:
    """A step's top-level numbers by name (finite only; the step itself and its time stamp,
    `memory.NOT_METRICS`, left out), with the mean completion length ``completion_tokens_mean`` = trained
    tokens per sample and a distilling server's ``distill/<key>`` metrics (docs/METRICS.md; nested under
    ``distill`` in the row)."""
    values = {
        k: float(v)
        for k, v in metrics.model_dump().items()
        if k != "step"
        and k not in NOT_METRICS
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    }
    values |= {f"distill/{k}": float(v) for k, v in metrics.distill.items() if math.isfinite(v)}
    if values.get("samples"):
        values["completion_tokens_mean"] = values.get("tokens", 0.0) / values["samples"]
    return values


def _reward_curve(rows: list[ServerStepMetrics]) -> list[tuple[int, float]]:
    """``(step, mean train reward)`` of the steps that report one."""
    return metric_series([{"step": row.step, "reward_mean": row.reward_mean} for row in rows], "reward_mean")


PREFLIGHT_MIN_ATTEMPT_S = 60.0
"""The least time a preflight's evaluator gets, however long its server took to start (the preflight
then runs past its budget): attempts cut after a few seconds would decide nothing, yet count as no
success."""

EVAL_CONCURRENCY = 8
"""Attempts a held-out evaluation runs at once (a preflight with a futility test runs more: as many as
the test needs before it can decide, so its first possible look comes after one batch)."""

PLAN_SERVE_OPTIONS = (
    "train",
    "batch-policy",
    *(s.flag for s in SETTINGS.values() if s.flag is not None),
    "distill-coef",
    "max-steps",
)
"""``swarm serve`` options every run sets from its plan (`_server_options`); users cannot override them."""


def _server_options(
    spec: RunSpec, ctx: ExecutionContext, teacher: ServerHandle | None = None, tenants: int = 0
) -> ServeOptions:
    """The run's ``swarm serve`` options: the user's (validated when the thread began), the plan's, and
    a3r's defaults for what neither set; a distilling run's ``--teacher`` is the URL of ``teacher``,
    the server a3r started for a checkpoint-directory teacher (`a3r.swarmops.teacher`). With
    ``tenants`` > 0 the server of a stage's LoRA tenants (`tenant_server_options`).

    Raises:
        ServeOptionsError: the user's options no longer validate (a resumed thread under a newer swarm).
    """
    s = spec.settings
    options = dict(ctx.server_options)
    if spec.purpose == "preflight":
        options["train"] = False
    else:
        options.update(
            {
                "train": True,
                "batch-policy": "tasks",
                **serve_flags(s),
                "max-steps": s.steps if spec.purpose in ("train", "sweep") else None,
            }
        )
        if teacher is not None:
            options["teacher-url"] = teacher.url
        if tenants > 0:  # each tenant's settings are its own (`execute_tenant_run`); no server-wide stop
            options.update({"tenants": tenants, "max-steps": None})
    # bf16 compute (and bf16 base weights under LoRA) where the device has fast bf16 kernels: 2-3×
    # faster rollouts and updates on AMX CPUs and GPUs; float32 elsewhere. Explicit options win. One
    # weights dtype for every server of the thread (`a3r.swarmops.serving_dtype`).
    options["dtype"] = study_dtype(options)
    options.setdefault("mixed-precision", "auto")
    if options.get("train", True):
        # bf16 sampling makes the engine's logprobs differ from the trainer's: truncated importance
        # sampling (C = 2, as Yao et al. 2025) corrects the gradient for it.
        options.setdefault("tis-cap", 2.0)
    # Synchronous training (on-policy): asynchronous mode (`--serve-option max-staleness=1`) ran the
    # who-is-the-spy job no faster on 2 CPU cores (sampling and updates share them; 1228 s vs 1233 s
    # for 10 steps), and gains only where episodes idle on slow tools (bench/async_training.py).
    return ServeOptions.from_flags(options)


def tenant_server_options(spec: RunSpec, ctx: ExecutionContext, tenants: int) -> ServeOptions:
    """``swarm serve`` options of a stage's tenant server (`a3r.swarmops.tenancy`): a run of the stage's
    options (its LoRA rank, engine, precision) with ``--tenants`` and no ``--max-steps``.

    Raises:
        ServeOptionsError: the options do not validate (e.g. ``--tenants`` without LoRA).
    """
    return _server_options(spec, ctx, tenants=tenants)


class _Recorder:
    """Writes metric points and notable server events of one run into the store, once each."""

    def __init__(self, ctx: ExecutionContext, run_id: int) -> None:
        self.ctx = ctx
        self.run_id = run_id
        history = ctx.store.metric_history(run_id)
        self.last_step = max((p.step for p in history), default=-1)
        self._rewinds: set[tuple[int, float]] = set()

    def metrics(self, rows: list[ServerStepMetrics]) -> None:
        for row in rows:
            rewind = (row.step, row.created_at)
            if row.rewound_steps and row.step <= self.last_step and rewind not in self._rewinds:
                # the server restarted from a checkpoint: this step number is used a second time
                self._rewinds.add(rewind)
                self.ctx.store.log_event(
                    f"server train.rewound: steps {row.rewound_steps} were lost in a server restart and are "
                    "redone; their earlier metric points are from the lost updates",
                    run_id=self.run_id,
                    level="warning",
                )
                self.last_step = row.step - 1
            if row.step > self.last_step:
                values = _numeric(row)
                if values:
                    self.ctx.store.log_metrics(self.run_id, row.step, values)
                self.last_step = row.step

    def events(self, events: list[Event]) -> None:
        for event in events:
            if event.level in ("warning", "error") or event.kind.startswith(
                ("train.failed", "checkpoint.loaded")
            ):
                self.ctx.store.log_event(
                    f"server {event.kind}: {event.message}"[:2000], run_id=self.run_id, level=event.level
                )

    def note(self, message: str, level: str = "info") -> None:
        self.ctx.store.log_event(message, run_id=self.run_id, level=level)
        self.ctx.say(message)


def _client(
    spec: RunSpec,
    ws: Workspace,
    url: str,
    run_dir: Path,
    start_step: int,
    env: dict[str, str],
    tenant: str | None = None,
) -> ManagedProcess:
    s = spec.settings
    # Training runs get three times the groups their steps need (batches the trainer skips, groups
    # cut by a drain); the runner stops the client once the target step is reached. A run that may
    # re-plan back up (`RunSpec.resize`) gets the groups of the steps and B asked for.
    steps, batch = s.steps, s.batch_size
    if spec.resize is not None:
        steps, batch = max(steps, spec.resize.asked_steps), max(batch, spec.resize.asked_batch_size)
    remaining = max(1, steps - start_step)
    purpose_tasks = s.smoke_tasks if spec.purpose == "smoke" else (3 * remaining + 1) * batch
    tasks_needed = max(1, purpose_tasks)
    available = max(1, ws.task_count())
    epochs = max(1, math.ceil(tasks_needed / available))
    argv = [
        *swarm_command(),
        "run",
        str(ws.workflow),
        "--server",
        url,
        "--dataset",
        str(ws.tasks),
        "--group-size",
        str(s.group_size),
        "--concurrency",
        str(s.concurrency),
        "--epochs",
        str(epochs),
        "--max-tasks",
        str(min(tasks_needed, available)),
        "--state-dir",
        str(run_dir / "client"),
        "--client-id",
        f"a3r-{spec.key}"[:200],
        "--heartbeat",
        "10",
        "--no-progress",
        *(["--tenant", tenant] if tenant is not None else []),
    ]
    end_stale(run_dir / "client.pid")  # a client a killed a3r left behind (where PDEATHSIG is unavailable)
    return launch("client", argv, log_path=run_dir / "client.log", cwd=ws.root, env=env)


def eval_tasks_within(
    ctx: ExecutionContext, budget_s: float, seconds_per_episode: float, *, reserve_s: float = 0.0
) -> int:
    """Held-out tasks to evaluate: ``ctx.eval_tasks``, fewer when their expected time (at the measured
    seconds per episode, ``eval_samples`` attempts each) would exceed what the evaluation may take:
    `EVAL_BUDGET_SHARE` of the budget left, or, when more, the time the run kept for it (``reserve_s``,
    less its `EVAL_RESERVE_MARGIN`; a run the budget stopped has little else left, and 15% of its
    reserve would evaluate a fraction of the tasks it was kept for); at least 2."""
    if not math.isfinite(seconds_per_episode) or seconds_per_episode <= 0:
        return ctx.eval_tasks
    allowed = max(EVAL_BUDGET_SHARE * budget_s, min(reserve_s, budget_s) / EVAL_RESERVE_MARGIN)
    affordable = int(allowed / (seconds_per_episode * ctx.eval_samples))
    return max(2, min(ctx.eval_tasks, affordable))


@dataclass(frozen=True)
class _Evaluation:
    """What a held-out evaluation produced.

    Attributes:
        summary: Rewards of the ended attempts (``None`` when the evaluation failed).
        note: Why it failed, or which attempts failed (what and after how long); ``""`` when none.
        seconds: Wall seconds it took.
        signal: The preflight's sequential futility test after its last look (``None`` without one).
        timed_out: The wall seconds it was given ran out (the run's budget left) and it was stopped.
    """

    summary: RewardSummary | None
    note: str
    seconds: float
    signal: SignalCheck | None = None
    timed_out: bool = False


def _preflight_end(found: _Evaluation) -> tuple[RunStatusName, str]:
    """How a preflight ended and why: ``finished`` with its baseline, ``budget`` when the thread's budget
    left ran out before its evaluation ended (a stop, not a crash), else ``crashed``."""
    if found.summary is None:
        return (
            ("budget", f"the budget stopped it: {found.note}") if found.timed_out else ("crashed", found.note)
        )
    reason = f"baseline held-out mean reward {found.summary.mean_reward:.3f}"
    if found.signal is not None and found.signal.stopped:
        reason += f"; stopped early: {found.signal.describe()}"
    return "finished", reason + (f"; {found.note}" if found.note else "")


def _failure_note(failed: list[EpisodeRecord], total: int) -> str:
    """``k of n held-out attempts failed ...``, with the distinct failures (time limits grouped)."""
    timeouts = [r for r in failed if (r.error or "").startswith("TimeoutError: task ")]
    cut = [r for r in failed if (r.error or "").startswith("cut: ")]
    others = sorted({(r.error or r.status)[:160] for r in failed if r not in timeouts and r not in cut})
    parts = [f"{len(cut)} cut at the evaluation's time budget"] if cut else []
    if timeouts:
        limit = (timeouts[0].error or "").split("within the ", 1)[-1].split(" episode limit", 1)[0]
        parts.append(f"{len(timeouts)} ran past the {limit} episode time limit")
    parts += others[:3]
    return f"{len(failed)} of {total} held-out attempts failed and count as incorrect ({'; '.join(parts)})"


def _cut_note(summary: dict[str, Any]) -> str:
    """What the evaluator's ``--time-budget`` cut, in one sentence (``""`` when it cut nothing): how
    many attempts, after how long and about how many tokens, that the futility bound counts them as
    no success, and what the attempts that ended on their own show alone."""
    cut = int(summary.get("cut") or 0)
    if not cut:
        return ""
    ended = int(summary.get("ended") or 0)
    tokens = summary.get("cut_tokens")
    rate = summary.get("tokens_per_s")
    far = (
        f" after ≈ {tokens} completion tokens each (the {rate:.1f} tokens/s the ended attempts decoded)"
        if tokens is not None and rate is not None
        else " (no ended attempt gave a decoding rate to estimate their tokens from)"
    )
    text = (
        f"{cut} of {ended} attempts were cut at {summary.get('cut_after_s') or 0:.0f} s by the preflight's "
        f"{summary.get('time_budget_s') or 0:.0f} s time budget{far}; the bound counts a cut attempt as no "
        "success, i.e. it assumes a cut attempt would not have succeeded"
    )
    alone = summary.get("uncut_signal")
    if alone:
        check = SignalCheck.model_validate(alone)
        decides = "would also stop the test" if check.stopped else "would not stop the test alone"
        text += (
            f"; the {check.attempts} attempts that ended on their own had {check.successes} success(es), a rate "
            f"below {check.upper:.3f}, which {decides}"
        )
    skipped = int(summary.get("not_begun") or 0)
    if skipped:
        text += f"; {skipped} planned attempt(s) never began within the budget"
    return text


def _evaluate(
    ctx: ExecutionContext,
    ws: Workspace,
    url: str,
    run_dir: Path,
    timeout_s: float,
    *,
    samples: int | None = None,
    max_tasks: int | None = None,
    env: dict[str, str] | None = None,
    futility_group_size: int | None = None,
    time_budget_s: float | None = None,
    tenant: str | None = None,
) -> _Evaluation:
    """Held-out evaluation with the frozen evaluator.

    Args:
        ctx: Run context (evaluation sizes, the signal rule, limits).
        ws: The study workspace.
        url: The server.
        run_dir: Where ``eval.jsonl``, ``eval.log`` and ``eval-summary.json`` go.
        timeout_s: Wall seconds the whole evaluation may take.
        samples: Attempts per task (default ``ctx.eval_samples``).
        max_tasks: Held-out tasks (default ``ctx.eval_tasks``).
        env: The evaluator's environment (the client token).
        futility_group_size: G of a preflight's sequential futility test (`a3r.study.sequential`,
            with ``ctx.signal``); the evaluation then stops as soon as the test decides, running at once
            as many attempts as the test needs before it can decide (up to the server's batch size).
        time_budget_s: Wall seconds the evaluator may take (``--time-budget``): attempts still under
            way then are cut and count as no success; the note says how many and how far they got.
        tenant: The LoRA tenant whose adapter the attempts sample (``--tenant``; ``None``: the server's
            one policy).
    """
    out = run_dir / "eval.jsonl"
    out.unlink(missing_ok=True)
    summary_path = run_dir / "eval-summary.json"
    summary_path.unlink(missing_ok=True)
    samples = samples or ctx.eval_samples
    max_tasks = max_tasks or ctx.eval_tasks
    argv = [
        sys.executable,
        "-m",
        "a3r.swarmops.evaluate",
        str(ws.evaluator),
        "--server",
        url,
        "--dataset",
        str(ws.heldout),
        "--out",
        str(out),
        "--samples",
        str(samples),
        "--max-tasks",
        str(max_tasks),
        "--episode-timeout",
        str(ctx.episode_timeout_s),
        "--summary",
        str(summary_path),
        *_stop_flags(ctx, ws, samples, max_tasks, futility_group_size, time_budget_s),
        *(["--tenant", tenant] if tenant is not None else []),
    ]
    started = time.monotonic()
    process = launch("eval", argv, log_path=run_dir / "eval.log", cwd=ws.root, env=env)
    code = process.wait(timeout_s)
    if code is None:
        process.stop()
        return _Evaluation(
            None,
            f"held-out evaluation exceeded the {timeout_s:.0f} s left",
            time.monotonic() - started,
            timed_out=True,
        )
    elapsed = time.monotonic() - started
    records = read_progress(out)
    if code != 0 or not records:
        text = f"evaluation exited with code {code}: {process.log_text(1500).strip()[-600:]}"
        return _Evaluation(None, text, elapsed)
    return _read_evaluation(records, summary_path, elapsed)


def _stop_flags(
    ctx: ExecutionContext,
    ws: Workspace,
    samples: int,
    max_tasks: int,
    futility_group_size: int | None,
    time_budget_s: float | None,
) -> list[str]:
    """The evaluator's flags that end it early: a preflight's sequential futility test (run at once as
    many attempts as the test needs before it can decide, up to the server's batch size) and its time
    budget."""
    extra: list[str] = []
    if futility_group_size:
        planned = min(max_tasks, _count_lines(ws.heldout)) * samples
        first = ctx.signal.test(futility_group_size, max(1, planned)).first_stop or 0
        default_batch = ServeOptions.model_fields["max_batch_size"].default  # sequences sampled together
        batch = int(ctx.server_options.get("max-batch-size", default_batch))
        extra = [
            "--stop-group-size",
            str(futility_group_size),
            "--stop-confidence",
            repr(ctx.signal.confidence),
            "--stop-informative",
            repr(ctx.signal.min_informative),
            "--concurrency",
            str(max(EVAL_CONCURRENCY, min(first, batch))),
        ]
    if time_budget_s is not None:
        extra += ["--time-budget", repr(max(1.0, time_budget_s))]
    return extra


def _read_evaluation(records: list[EpisodeRecord], summary_path: Path, elapsed: float) -> _Evaluation:
    """An evaluation's rewards by task from its records (an attempt that failed, by a time limit or an
    error, is an incorrect attempt: limits are part of the evaluation), with the sequential test's
    verdict and the cut attempts the evaluator's summary reports."""
    signal: SignalCheck | None = None
    cuts = ""
    try:
        written = json.loads(summary_path.read_text(encoding="utf-8"))
        found = written.get("signal")
        signal = SignalCheck.model_validate(found) if found else None
        cuts = _cut_note(written)
    except (OSError, ValueError):
        signal = None
    failed = [r for r in records if r.status != "finished" or r.reward is None]
    groups: dict[str, list[float]] = {}  # one evaluation is one round (its file is new): by task id
    for record in records:
        reward = record.reward if record.status == "finished" and record.reward is not None else 0.0
        groups.setdefault(record.task_id, []).append(reward)
    note = _failure_note(failed, len(records)) if failed else ""
    note += f": {cuts}" if cuts else ""
    return _Evaluation(summarise_rewards(groups, keep_tasks=True), note, elapsed, signal)


def _server_for(spec: RunSpec, ctx: ExecutionContext, ws: Workspace, rec: _Recorder) -> ServerHandle:
    if ctx.server_url is not None and spec.purpose in ("smoke", "train"):
        return ServerHandle(url=ctx.server_url.rstrip("/"), admin_token=ctx.admin_token)
    key = spec.server_key or spec.key
    handle = ctx.servers.get(key)
    if handle is not None and handle.process is not None and handle.process.poll() is None:
        return handle
    try:
        teacher = start_teacher(spec, ctx, ws.server_dir(teacher_key(key)), key)
        options = _server_options(spec, ctx, teacher)
    except ServeOptionsError as exc:
        raise SwarmProcessError(f"swarm serve refuses the options: {exc}") from None
    if teacher is not None:
        rec.note(f"run {spec.key}: teacher server started at {teacher.url} ({spec.settings.teacher})")
    handle = start_server(ws.server_dir(key), model=ctx.model, options=options, env=student_env(teacher))
    ctx.servers[key] = handle
    rec.note(f"run {spec.key}: swarm serve started at {handle.url} (run dir {ws.server_dir(key)})")
    return handle


def _release(spec: RunSpec, ctx: ExecutionContext, outcome: RunOutcome | None) -> None:
    """Stop the run's server unless a later run continues on it (kept, or stopped for a patch)."""
    if spec.keep_server or (outcome is not None and outcome.status == "needs_attention"):
        return
    key = spec.server_key or spec.key
    for handle in (ctx.servers.pop(key, None), ctx.servers.pop(teacher_key(key), None)):
        if handle is not None:
            handle.stop()


def execute_run(
    spec: RunSpec,
    *,
    ctx: ExecutionContext,
    ws: Workspace,
    run_id: int,
    budget_s: float,
    eval_reserve_s: float = 0.0,
) -> RunOutcome:
    """Run ``spec`` to its end and record it (metric points, events) under store run ``run_id``.

    Args:
        spec: What to run.
        ctx: Run context (store, servers, limits).
        ws: The study workspace.
        run_id: Store run (status ``running``); finished by the caller.
        budget_s: Wall seconds this run may take at most, its held-out evaluation included.
        eval_reserve_s: Seconds of ``budget_s`` kept for the held-out evaluation after training: the
            watch stops training ``eval_reserve_s`` before the budget ends, and the evaluation runs
            also after such a budget stop.

    Returns:
        The outcome; failures to start come back as ``failed_to_start`` outcomes, not exceptions.
    """
    run_dir = ws.run_dir(spec.key)
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = _Recorder(ctx, run_id)
    started = time.monotonic()
    try:
        handle = _server_for(spec, ctx, ws, rec)
    except SwarmProcessError as exc:
        rec.note(f"run {spec.key}: {exc}", "error")
        return RunOutcome(
            **spec.outcome_fields(),
            run_id=run_id,
            status="failed_to_start",
            reason=str(exc),
            run_dir=str(run_dir),
        )
    # where the TUI follows the run: live from this server, and afterwards from its run dir
    server_dir = None if handle.process is None else str(ws.server_dir(spec.server_key or spec.key))
    ctx.store.update_run(run_id, RunUpdate(server_url=handle.url, run_dir=server_dir))
    api = _Control(handle)
    outcome: RunOutcome | None = None
    try:
        if ctx.server_url is not None and handle.process is None and spec.purpose == "train":
            _attach(spec, handle, api, rec)
        run = _Run(spec, ctx, ws, handle, api, rec, run_dir, run_id, started, budget_s, eval_reserve_s)
        outcome = _preflight(run) if spec.purpose == "preflight" else _monitor(run)
        return outcome
    finally:
        api.close()
        _release(spec, ctx, outcome)


def execute_tenant_run(
    spec: RunSpec,
    *,
    ctx: ExecutionContext,
    ws: Workspace,
    handle: ServerHandle,
    server_key: str,
    tenant: str,
    run_id: int,
    budget_s: float,
    eval_reserve_s: float = 0.0,
) -> RunOutcome:
    """Run ``spec`` as LoRA tenant ``tenant`` of a shared server (a sweep stage's, `a3r.swarmops.tenancy`)
    and record it as :func:`execute_run` records a run: the tenant is created with the run's settings (lr,
    B, G, KL, clip, epochs, minibatches, the ``tasks`` batch policy, ``max_steps`` = its steps, its seed),
    its client begins every episode under it (``swarm run --tenant``), the watch reads the tenant's step
    and metrics, a budget stop pauses it, its held-out evaluation samples its adapter, and it is retired
    (its adapter saved as a LoRA checkpoint) when the run ends. Thread-safe: runs of one stage call it
    side by side.

    Args:
        spec: What to run (a sweep run).
        ctx: Run context.
        ws: The run's workspace.
        handle: The shared server (started with ``--tenants``).
        server_key: Its key (its run dir is ``ws.server_dir(server_key)``).
        tenant: The tenant id.
        run_id: Store run (status ``running``); finished by the caller.
        budget_s: Wall seconds this run may take, its held-out evaluation included.
        eval_reserve_s: Seconds of ``budget_s`` kept for the held-out evaluation.

    Returns:
        The outcome; a tenant the server refuses comes back as a ``failed_to_start`` outcome.
    """
    spec = spec.model_copy(update={"server_key": server_key, "keep_server": True, "tenant": tenant})
    run_dir = ws.run_dir(spec.key)
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = _Recorder(ctx, run_id)
    started = time.monotonic()
    config = dict(ctx.store.get_run(run_id).config or {})
    config |= {"tenant": tenant, "tenant_server": server_key}
    server_dir = str(ws.server_dir(server_key))
    ctx.store.update_run(run_id, RunUpdate(server_url=handle.url, run_dir=server_dir, config=config))
    api = _Control(handle, tenant)
    try:
        try:
            _ensure_tenant(spec, handle, api, tenant, rec)
        except (ClientError, httpx.TransportError, TenantStartError) as exc:
            reason = _tenant_start_failure(tenant, exc)
            rec.note(f"run {spec.key}: {reason}", "error")
            return RunOutcome(
                **spec.outcome_fields(),
                run_id=run_id,
                status="failed_to_start",
                reason=reason,
                run_dir=str(run_dir),
                tenant=tenant,
                tenant_server=server_key,
            )
        rec.note(f"run {spec.key}: tenant {tenant} of the stage's server {handle.url} ({server_key})")
        run = _Run(spec, ctx, ws, handle, api, rec, run_dir, run_id, started, budget_s, eval_reserve_s)
        return _monitor(run).model_copy(update={"tenant": tenant, "tenant_server": server_key})
    finally:
        try:
            retire_tenant(handle, tenant)  # one still being created is retired once created
        except ClientError as exc:
            rec.note(f"run {spec.key}: retiring tenant {tenant}: {exc}", "warning")
        except httpx.TransportError as exc:
            why = transport_failure(exc, f"retiring tenant {tenant}", CALL_TIMEOUT_S)
            rec.note(f"run {spec.key}: {why}", "warning")
        api.close()


def _tenant_start_failure(tenant: str, exc: Exception) -> str:
    """Why a run's tenant was not created, in one line that is never empty: the server's refusal, or the
    timeout or lost connection (`a3r.swarmops.tenant_calls`)."""
    if isinstance(exc, ClientError):
        return f"the server refused tenant {tenant}: {exc}"
    if isinstance(exc, httpx.TransportError):
        return transport_failure(exc, f"creating tenant {tenant}", CALL_TIMEOUT_S)
    return str(exc)


def _ensure_tenant(spec: RunSpec, handle: ServerHandle, api: _Control, tenant: str, rec: _Recorder) -> None:
    """Create the run's tenant with its settings (`a3r.swarmops.tenant_calls.create_tenant`: a slow create
    is waited for, and one the client gave up on is read back); a resident one of that id (the stage's
    server resumed it after a killed a3r: its run dir keeps its tenants) is continued, resumed if the budget
    paused it.

    Raises:
        ClientError | httpx.TransportError: the server refused it (a retired tenant of that id included).
        TenantStartError: the create timed out or lost its connection and the server has no such tenant.
    """
    s = spec.settings
    settings = {
        "lr": s.lr,
        "batch_size": s.batch_size,
        "group_size": s.group_size,
        "kl_coef": s.kl_coef,
        "clip_eps": s.clip_eps,
        "ppo_epochs": s.ppo_epochs,
        "minibatches": s.minibatches,
        "batch_policy": "tasks",
        "max_steps": s.steps,
        "seed": spec.seed,
    }
    try:
        create_tenant(
            handle, tenant, settings, note=lambda line: rec.note(f"run {spec.key}: {line}", "warning")
        )
    except ClientError as exc:
        if exc.status_code != 409:
            raise
        view = api.client.tenant(tenant)  # 404: the cap was reached, not the id taken
        if view.state.value == "retired":
            raise
        if view.state.value != "active":
            api.client.resume_tenant(tenant)
        rec.note(f"run {spec.key}: continuing as tenant {tenant} from its step {view.step}", "warning")


def _attach(spec: RunSpec, handle: ServerHandle, api: _Control, rec: _Recorder) -> None:
    """Apply a training run's settings to an attached server (``PATCH /api/v1/config``), or note that it
    kept its own."""
    s = spec.settings
    try:
        api.client.patch_config(batch_size=s.batch_size, group_size=s.group_size, lr=s.lr)
        kept = ""
    except ClientError as exc:  # 409: it does not train; 422: it refuses these settings
        kept = f"server kept its own training config ({exc})"
    rec.note(f"run {spec.key}: attached to {handle.url}; " + (kept or "live config applied"))


def _preflight(run: _Run) -> RunOutcome:
    """A research preflight: the held-out evaluation of the untrained model, under its own time budget
    and the sequential futility test."""
    spec, ctx, handle = run.spec, run.ctx, run.handle
    found = _evaluate(
        ctx,
        run.ws,
        handle.url,
        run.run_dir,
        run.budget_s,
        samples=max(ctx.preflight_samples, ctx.eval_samples),
        env=handle.client_env(),
        futility_group_size=spec.settings.group_size,
        # the preflight's own budget, less the server start just measured, bounds every attempt
        time_budget_s=(
            max(PREFLIGHT_MIN_ATTEMPT_S, ctx.preflight_budget_s - (time.monotonic() - run.started))
            if ctx.preflight_budget_s > 0
            else None
        ),
    )
    run.rec.events(run.api.events())
    summary, error = found.summary, found.note
    episodes = summary.episodes if summary else 0
    status, reason = _preflight_end(found)
    return RunOutcome(
        **spec.outcome_fields(),
        run_id=run.run_id,
        status=status,
        reason=reason,
        episodes=episodes,
        wall_s=time.monotonic() - run.started,
        eval=summary,
        run_dir=str(run.run_dir),
        seconds_per_episode=found.seconds / episodes if episodes else math.nan,
        diagnoses=detect_crash(error, exit_code=1) if status == "crashed" else [],
        eval_s=found.seconds,
        signal=found.signal,
    )


@dataclass(frozen=True)
class _Run:
    """One training or smoke run under way: what it runs with, on and records to."""

    spec: RunSpec
    ctx: ExecutionContext
    ws: Workspace
    handle: ServerHandle
    api: _Control
    rec: _Recorder
    run_dir: Path
    run_id: int
    started: float
    budget_s: float
    eval_reserve_s: float = 0.0

    @property
    def tenant(self) -> str | None:
        """The LoRA tenant the run trains as on a shared server (`a3r.swarmops.tenancy`), else ``None``."""
        return self.spec.tenant


@dataclass
class _Sources:
    """Where the poll loop reads a run: the client process, the server's status, metrics and events (the
    metrics and events are recorded as they are read), its access log and CPU time, and the client's
    episode records. Keeps the last metric rows and episode records read."""

    run: _Run
    client: ManagedProcess
    calls: _LogCounter
    server_pid: int | None
    rows: list[ServerStepMetrics] = field(default_factory=list)
    episodes: list[EpisodeRecord] = field(default_factory=list)
    client_started: float = field(default_factory=time.monotonic)
    """When the client started (its episodes' throughput is measured from here)."""
    rechecked: bool = False
    """Whether the run was already found not to reach its target in its budget (`recheck_steps`)."""

    @property
    def progress_path(self) -> Path:
        return self.run.run_dir / "client" / "progress.jsonl"

    def cpu(self) -> float | None:
        return cpu_seconds(self.server_pid) if self.server_pid is not None else None

    def observe(self) -> Observation:
        run = self.run
        code = self.client.poll()
        now = time.monotonic()
        status = run.api.status()
        process = run.handle.process
        if status is None and process is not None and process.poll() is not None:
            return Observation(now=now, client_exit=code, server_exit=process.poll())
        new_rows = run.api.metrics()
        if new_rows:
            self.rows = new_rows
            run.rec.metrics(new_rows)
        run.rec.events(run.api.events())
        self.episodes = read_progress(self.progress_path)
        live: str | None = None
        # a distilling run learns from the teacher's per-token signal even where a group's rewards tie
        if run.spec.early_stop and code is None and not run.spec.settings.distill:
            found = detect_zero_signal(
                groups_of(self.episodes), group_size=run.spec.settings.group_size, min_groups=2
            )
            live = found[0].summary if found else None
        counts = status.episodes if status else None
        step = status.step if status else None
        finished, aborted = (counts.finished, counts.aborted) if counts else (0, None)
        open_, pending = (counts.open, counts.pending) if counts else (None, 0)
        if run.tenant is not None:  # the tenant's own step and episodes on the shared server
            view = run.api.tenant_view()
            step = view.step if view else None
            finished, aborted = (view.trained + view.pending, None) if view else (0, None)
            open_, pending = (view.open_episodes, view.pending) if view else (None, 0)
        return Observation(
            now=now,
            client_exit=code,
            step=step,
            state=status.state.value if status else None,
            finished=finished,
            aborted=aborted,
            open=open_,
            pending=pending,
            client_records=len(self.episodes),
            event_seq=run.api.event_seq,
            model_calls=self.calls.update(),
            server_cpu_s=self.cpu(),
            live_problem=live,
        )


def _monitor(run: _Run) -> RunOutcome:
    """Start the client on the run's server, watch it to its end (`judge`), then conclude."""
    spec, ctx, handle, api = run.spec, run.ctx, run.handle, run.api
    initial = api.status()
    start_step = initial.step if initial else 0
    training = initial.training_enabled if initial else False
    if run.tenant is not None:  # a new tenant trains (the server's base never does) from its own step 0
        start_step, training = 0, True
    target = spec.settings.steps if spec.purpose in ("train", "sweep") and training else None
    if target is not None and handle.process is None:
        # An attached server may have trained before this thread: count steps from where it stood.
        base = int(ctx.ledger.once(ctx.key("runner", f"attach-base:{handle.url}"), lambda: start_step))
        target = base + spec.settings.steps
    if target is not None and handle.process is not None and run.tenant is None:
        # A server of ours may have been started by an earlier run (the smoke run's): it must stop
        # training at this run's target, not go on with the episodes pooled after it.
        # Its B too: the planner may have sized the game down after the smoke run (`size_training`).
        try:
            api.client.patch_config(max_steps=target, batch_size=spec.settings.batch_size)
        except ClientError as exc:
            run.rec.note(
                f"run {spec.key}: the server refused max_steps {target}, batch_size "
                f"{spec.settings.batch_size}: {exc}",
                "warning",
            )
    client = _client(spec, run.ws, handle.url, run.run_dir, start_step, handle.client_env(), run.tenant)
    run.rec.note(
        f"run {spec.key}: client started (G={spec.settings.group_size}, B={spec.settings.batch_size}, "
        f"step {start_step}" + (f" → {target})" if target else ")")
    )
    sources = _Sources(
        run,
        client,
        calls=_LogCounter(handle.process.log_path if handle.process is not None else None),
        server_pid=handle.process.pid if handle.process is not None else None,
    )
    rules = WatchRules(
        hang_after_s=ctx.hang_after_s,
        budget_s=max(0.0, run.budget_s - run.eval_reserve_s),
        target=target,
        early_stop=spec.early_stop,
    )
    watch = RunWatch.begin(started=run.started, now=time.monotonic(), step=start_step, cpu_s=sources.cpu())
    plan = _StepPlan.of(spec, target)
    samples: list[tuple[float, int, int]] = []
    while True:
        obs = sources.observe()
        if obs.server_exit is None and obs.step is not None and obs.step > watch.last_step:
            # before the watch judges the step: a run re-planned up goes on past its old target
            _replan(run, plan, obs.step, (sources.client_started, start_step), obs.now)
            rules = replace(rules, target=plan.target)
        verdict = judge(watch, obs, rules)
        watch = verdict.watch
        if obs.server_exit is None:
            samples.append((obs.now, watch.last_step, obs.finished))
            _report(run, sources, verdict, plan, start_step)
        if verdict.end is not None:
            return _conclude(
                run, sources, verdict.end, watch, start_step, plan.target, samples, obs.server_exit
            )
        time.sleep(ctx.poll_s)


@dataclass
class _StepPlan:
    """A training run's step target and B as it re-plans after every step (`_replan`).

    Attributes:
        target: The step to train to (``None``: no step target).
        batch_size: B now.
        asked_target: The step the run was asked to reach before any sizing.
        mark: ``(time, step)`` from which the step time is measured: the first step seen (the first
            step also pays the trainer's start) and every change of B.
    """

    target: int | None
    batch_size: int
    asked_target: int = 0
    mark: tuple[float, int] | None = None

    @classmethod
    def of(cls, spec: RunSpec, target: int | None) -> _StepPlan:
        """The plan a run starts with: its spec's steps to ``target``; a sized run may go back up to the
        steps it was asked for (`RunSpec.resize`)."""
        asked = spec.resize.asked_steps if spec.resize is not None else spec.settings.steps
        base = (target or 0) - spec.settings.steps
        return cls(target=target, batch_size=spec.settings.batch_size, asked_target=base + asked)


def _replan(run: _Run, plan: _StepPlan, step: int, start: tuple[float, int], now: float) -> None:
    """Re-plan a sized training run (`RunSpec.resize`) after a measured step, up as well as down
    (`a3r.study.research.replan_training`): its share of the budget left is ``(budget − margin) / (1 +
    later runs)`` less the held-out evaluation's reserve and the server overhead. A change is applied to
    the server (``PATCH /api/v1/config``: ``max_steps``, ``batch_size``) and noted."""
    resize, spec = run.spec.resize, run.spec
    if (
        resize is None
        or plan.target is None
        or run.handle.process is None
        or spec.start_step
        or step <= start[1]
        or run.tenant is not None
    ):
        # an attached server's training config is its owner's; a continuation keeps its steps; a tenant's
        # settings are fixed when it is created
        return
    if plan.mark is None and step < plan.target:
        plan.mark = (now, step)  # measured from here: the first step also paid the trainer's start
        return
    plan.mark = plan.mark or start  # the last planned step: measured from the client's start
    if step <= plan.mark[1]:
        return
    share = (run.budget_s - resize.margin_s) / (1 + resize.later_runs)
    decided = replan_training(
        step=step,
        target=plan.target,
        batch_size=plan.batch_size,
        asked_target=plan.asked_target,
        asked_batch_size=resize.asked_batch_size,
        seconds_per_step=(now - plan.mark[0]) / (step - plan.mark[1]),
        time_left_s=run.started + share - run.eval_reserve_s - SERVER_OVERHEAD_S - now,
    )
    if decided.note is None:
        return
    try:
        run.api.client.patch_config(max_steps=decided.target, batch_size=decided.batch_size)
    except (ClientError, httpx.TransportError) as exc:
        run.rec.note(f"run {spec.key}: {decided.note}, but the server refused it: {exc}", "warning")
        return
    if decided.batch_size != plan.batch_size:
        plan.mark = (now, step)
    plan.target, plan.batch_size = decided.target, decided.batch_size
    run.rec.note(f"run {spec.key}: {decided.note}")


def _report(run: _Run, sources: _Sources, verdict: Verdict, plan: _StepPlan, start_step: int) -> None:
    """Note a new trainer step (with its train reward and, for a run with a budget reserve that does not
    re-plan itself (`_replan`), whether the steps left still fit: `recheck_steps`, said once) and a run
    turning slow."""
    key, episodes, target = run.spec.key, len(sources.episodes), plan.target
    if verdict.stepped and target is not None:
        reward = _reward_curve(sources.rows)
        step = verdict.watch.last_step
        now = time.monotonic()
        per_step = (now - sources.client_started) / (step - start_step) if step > start_step else math.nan
        run.rec.note(
            f"run {key}: step {step}/{target}"
            + (f" · train reward {reward[-1][1]:.3f}" if reward else "")
            + f" · {counted(episodes, 'episodes')} of this run"
            + (f" · {per_step:.0f} s per step so far" if math.isfinite(per_step) else "")
        )
        # from the second step on: the first also pays the trainer's start (172 s against ~110 s later
        # on the idle 2-core box), which made the re-check predict a budget stop that never came
        if (
            run.eval_reserve_s > 0
            and run.spec.resize is None
            and not sources.rechecked
            and step - start_step >= 2
        ):
            late = recheck_steps(
                step=step,
                target=target,
                seconds_per_step=per_step,
                time_left_s=run.started + run.budget_s - run.eval_reserve_s - now,
            )
            if late is not None:
                sources.rechecked = True
                run.rec.note(f"run {key}: {late}", "warning")
    if verdict.slow_s is not None:
        run.rec.note(
            f"run {key}: no trainer step for {verdict.slow_s:.0f} s, but the server keeps "
            f"working ({episodes} episodes of this run): slow, not hung",
            "warning",
        )


def _conclude(
    run: _Run,
    sources: _Sources,
    end: RunEnd,
    watch: RunWatch,
    start_step: int,
    target: int | None,
    samples: list[tuple[float, int, int]],
    server_exit: int | None,
) -> RunOutcome:
    """Stop the client, read what the run left, diagnose it, evaluate it when it finished, and build its
    outcome."""
    spec, client, api, rec = run.spec, sources.client, run.api, run.rec
    if end.status == "budget" and run.handle.process is not None and server_exit is None:
        _freeze_training(run, watch.last_step)
    exit_code = client.poll()
    if exit_code is None:
        exit_code = client.stop()
        exit_code = None if end.status != "crashed" else exit_code
    client_s = time.monotonic() - sources.client_started
    episodes = read_progress(sources.progress_path)
    rows = api.metrics() or sources.rows
    rec.metrics(rows)
    rec.events(api.events())
    diagnoses = _diagnose(run, end, rows, episodes, exit_code, server_exit, client.own_log_text())
    # Held-out evaluation with the frozen evaluator: after a sweep run, and in vibe before (smoke) and
    # after (train) training, so a train-reward gain can be checked against held-out reward. A run the
    # budget stopped is evaluated too: its budget kept `eval_reserve_s` for it. A sweep run stopped
    # before its first step is not: its policy is the untrained one the preflight measured (the H200
    # re-run spent ~35 s of its budget evaluating one, issue 33).
    untrained = spec.purpose == "sweep" and end.status != "finished" and watch.last_step <= start_step
    evaluable = not untrained and (
        end.status == "finished"
        or (end.status == "budget" and server_exit is None and run.eval_reserve_s > 0)
    )
    last_step = watch.last_step
    if not evaluable and run.tenant is not None and end.status == "budget" and server_exit is None:
        # steps under way at the budget stop end after it (fresh-s6 #2): the retire waits for them, and its
        # answer and the tenant's metrics say what the run trained; its adapter is retired unevaluated
        final, retired_rows = _retire_now(run)
        if final is not None and final > last_step:
            rows, last_step = retired_rows or rows, final
            rec.metrics(rows)
            if untrained:
                untrained = False
                rec.note(
                    f"run {spec.key}: {NOT_EVALUATED_BUDGET} (its step {final} ended after the budget stop)"
                )
    if untrained:
        rec.note(f"run {spec.key}: {NOT_EVALUATED_UNTRAINED}")
    eval_summary: RewardSummary | None = None
    eval_s = math.nan
    if spec.purpose in ("sweep", "smoke", "train") and evaluable and run.ctx.eval_tasks > 0:
        eval_summary, eval_s = _evaluate_run(run, client_s / max(1, len(episodes)))
        rows = api.metrics() or rows  # a step that was under way when training stopped has ended now
        rec.metrics(rows)
        last_step = max([last_step, *(row.step for row in rows)])
    if target is not None and not (end.status == "budget" and last_step > watch.last_step):
        # a run the budget cut while its step was under way did not stall: that step ended after the stop
        diagnoses += detect_stall(samples, window_s=max(run.ctx.hang_after_s, 30.0))
    settled = final_end(end, last_step=last_step, target=target)  # all steps trained: finished, not cancelled
    reason = settled.reason
    if settled is end and last_step > watch.last_step:
        reason += f"; the step under way then ended: step {last_step}"
    step_times = [t for t, _, _ in samples]
    return _outcome(
        run,
        settled.status,
        reason,
        rows=rows,
        episodes=episodes,
        last_step=last_step,
        start_step=start_step,
        client_s=client_s,
        seconds_per_step=(
            (step_times[-1] - step_times[0]) / (last_step - start_step)
            if last_step > start_step
            else math.nan
        ),
        diagnoses=diagnoses,
        eval_summary=eval_summary,
        eval_s=eval_s,
    )


def _diagnose(
    run: _Run,
    end: RunEnd,
    rows: list[ServerStepMetrics],
    episodes: list[EpisodeRecord],
    exit_code: int | None,
    server_exit: int | None,
    log_text: str,
) -> list[Diagnosis]:
    """What the run's server log, metrics, episodes and client log show (a3r.study.analysis); a client
    a3r stopped (attention, hang, budget, target reached) is not read as crashed by its exit code, nor by
    what it printed after the stop signal (``log_text`` is `ManagedProcess.own_log_text`)."""
    spec, process = run.spec, run.handle.process
    diagnoses: list[Diagnosis] = []
    if server_exit is not None and process is not None:
        diagnoses += detect_crash(process.own_log_text(), exit_code=process.poll())
    stopped_by_us = end.status in ("needs_attention", "hung", "budget") or end.reason.startswith(
        "reached step"
    )
    return diagnoses + detect_all(
        rows=[{"step": row.step, **_numeric(row)} for row in rows],
        episodes=episodes,
        group_size=spec.settings.group_size,
        rewards_only=not spec.settings.distill,
        log_text=log_text,
        exit_code=None if stopped_by_us else exit_code,
        drop_max=spec.stability.drop_max,
        entropy_min=spec.stability.entropy_min,
        kl_max=spec.stability.kl_max,
    )


NOT_EVALUATED_UNTRAINED = (
    "held-out evaluation skipped: no step trained, so its policy is the untrained one the preflight measured"
)
"""Why a sweep run stopped before its first step has no held-out evaluation (`_conclude`)."""
NOT_EVALUATED_BUDGET = "held-out evaluation skipped: not evaluated: budget"
"""Why a tenant run the budget stopped before its first step, whose step ended after the stop, has no
held-out evaluation: its budget is spent and its tenant is retired to read that step (`_conclude`)."""


def _retire_now(run: _Run) -> tuple[int | None, list[ServerStepMetrics]]:
    """Retire the run's tenant now and read its final step and metrics (`retire_and_read`); a failure is
    noted and reads as nothing (``(None, [])``): the run's own retire tries again."""
    assert run.tenant is not None
    try:
        return retire_and_read(run.handle, run.tenant)
    except (ClientError, httpx.TransportError) as exc:
        run.rec.note(
            f"run {run.spec.key}: retiring tenant {run.tenant} after the budget stop: {exc}", "warning"
        )
        return None, []


def _evaluate_run(run: _Run, per_episode: float) -> tuple[RewardSummary | None, float]:
    """The run's held-out evaluation, on the held-out tasks of the thread's first one (sized to the
    budget then, so that before/after numbers are comparable; a vibe thread's first is the smoke run's
    baseline, sized with room for the training after it: `size_heldout`). Returns its rewards (``None``
    when it failed) and its seconds."""
    spec, ctx = run.spec, run.ctx
    remaining = max(30.0, run.eval_reserve_s, run.budget_s - (time.monotonic() - run.started))
    available = _count_lines(run.ws.heldout)
    n_tasks = int(
        ctx.ledger.once(
            ctx.key("runner", "eval-tasks"),
            lambda: (
                _smoke_heldout(run, per_episode, available)
                if spec.purpose == "smoke"
                else eval_tasks_within(ctx, remaining, per_episode, reserve_s=run.eval_reserve_s)
            ),
        )
    )
    run.rec.note(
        f"run {spec.key}: held-out evaluation on {min(n_tasks, available)} of {available} held-out tasks × "
        f"{ctx.eval_samples} attempts"
    )
    if run.tenant is not None:
        # a tenant the budget paused admits no episode: resumed for its evaluation (its client is stopped;
        # episodes it pooled may still form a step, read after the evaluation like a step under way)
        with contextlib.suppress(ClientError, httpx.TransportError):
            if run.api.client.tenant(run.tenant).state.value == "paused":
                run.api.client.resume_tenant(run.tenant)
    found = _evaluate(
        ctx,
        run.ws,
        run.handle.url,
        run.run_dir,
        remaining,
        max_tasks=n_tasks,
        env=run.handle.client_env(),
        tenant=run.tenant,
    )
    if found.note:
        run.rec.note(f"run {spec.key}: {found.note}", "warning")
    return found.summary, found.seconds


def _outcome(
    run: _Run,
    status: RunStatusName,
    reason: str,
    *,
    rows: list[ServerStepMetrics],
    episodes: list[EpisodeRecord],
    last_step: int,
    start_step: int,
    client_s: float,
    seconds_per_step: float,
    diagnoses: list[Diagnosis],
    eval_summary: RewardSummary | None,
    eval_s: float,
) -> RunOutcome:
    """A training or smoke run's outcome from what it left: curves, episodes, evaluation, speed."""
    spec = run.spec
    train_groups = groups_of(episodes)
    finished_eps = sum(len(v) for v in train_groups.values())
    metric_names = sorted({name for ep in episodes for name in ep.metrics})
    # the episodes each step of this run consumed (trained, or dropped as zero-signal): the parts'
    # points, one per step; episodes that finished after the last batch was taken trained nothing (a
    # smoke run trains nothing: its parts stay per B·G episodes)
    per_step = (
        None
        if spec.purpose == "smoke"
        else [row.episodes + row.episodes_dropped for row in rows if row.step > start_step]
    )
    # on a server of ours the pool says which step consumed each episode: a run's trained episodes are
    # those its steps (start_step, last_step] trained, also when it shares the server (and its run dir)
    # with the smoke run or with the run it continues, whose client wrote none of them
    trained = (
        trained_metrics(
            run.ws.server_dir(spec.server_key or spec.key),
            after_step=start_step,
            up_to_step=last_step,
            tenant=spec.tenant,
        )
        if per_step is not None and run.handle.process is not None
        else None
    )
    trained_n = (
        len(trained)
        if trained is not None
        else None
        if per_step is None
        else trained_count(per_step, finished_eps)
    )
    return RunOutcome(
        **spec.outcome_fields(),
        run_id=run.run_id,
        status=status,
        reason=reason,
        steps=last_step,
        episodes=max(finished_eps, trained_n or 0),
        trained_episodes=trained_n,
        wall_s=time.monotonic() - run.started,
        curve=[(s, v) for s, v in _reward_curve(rows) if s > start_step or spec.start_step == 0],
        episode_curve=[statistics.fmean(v) for v in train_groups.values() if v],
        eval=eval_summary,
        train=summarise_rewards(train_groups) if train_groups else None,
        diagnoses=diagnoses,
        final_metrics=_numeric(rows[-1]) if rows else {},
        run_dir=str(run.run_dir),
        seconds_per_episode=client_s / finished_eps if finished_eps else math.nan,
        seconds_per_step=seconds_per_step,
        parts=_parts(
            run,
            episodes,
            sorted({*metric_names, *(name for _, metrics in trained or [] for name in metrics)}),
            per_step=per_step,
            trained=trained,
        ),
        eval_s=eval_s,
    )


def _parts(
    run: _Run,
    episodes: list[EpisodeRecord],
    names: list[str],
    *,
    per_step: list[int] | None,
    trained: list[tuple[int, dict[str, float]]] | None,
) -> dict[str, list[float]]:
    """The run's reward-part curves: one point per step it trained, over the episodes the step took,
    ``trained`` (read from the pool of a server of ours, `a3r.swarmops.trained`); else from the client's
    records in order, as many per step as the step consumed; a smoke run's per B·G episodes."""
    spec = run.spec
    if per_step is None:
        return part_curves(episodes, names, per_point=spec.settings.batch_size * spec.settings.group_size)
    if trained is not None:
        return step_parts(trained, names)
    return part_curves(episodes, names, per_point=1, per_step=per_step)


def _smoke_heldout(run: _Run, seconds_per_episode: float, available: int) -> int:
    """Held-out tasks of a vibe thread's evaluations, sized in its smoke run from the speed just
    measured (`a3r.study.research.size_heldout`); the decision is noted in the log."""
    sizing = size_heldout(
        run.spec.settings,
        seconds_per_episode=seconds_per_episode,
        budget_s=run.budget_s,
        time_left_s=run.budget_s - (time.monotonic() - run.started),
        samples=run.ctx.eval_samples,
        max_tasks=max(1, min(run.ctx.eval_tasks, available or run.ctx.eval_tasks)),
    )
    run.rec.note(f"run {run.spec.key}: {sizing.note}")
    return sizing.tasks


def _count_lines(path: Path) -> int:
    """Non-empty lines of a JSONL file (0 when it is missing)."""
    if not path.is_file():
        return 0
    with path.open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _freeze_training(run: _Run, step: int) -> None:
    """Stop a server of ours from training past ``step`` once a3r's budget ended the run: episodes
    already pooled would otherwise form one more batch (a step and its checkpoint a3r would not
    record). A step already under way still ends (and is read after the evaluation)."""
    try:
        if run.tenant is not None:  # a tenant's settings are fixed: it is paused (no episode, no step)
            run.api.client.pause_tenant(run.tenant)
        elif step >= 1:
            run.api.client.patch_config(max_steps=step)
        else:
            run.api.client.patch_config(training_enabled=False)
    except (ClientError, httpx.TransportError) as exc:
        run.rec.note(f"run {run.spec.key}: could not stop training at step {step}: {exc}", "warning")
