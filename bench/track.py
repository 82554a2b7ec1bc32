"""Per-commit tracking: a fixed suite of short seeded benchmarks, recorded in the knowledge store and judged
against the history of earlier commits.

    .venv/bin/python bench/track.py --quick                    # ≈ 3 min on 2 idle cores, seed 0
    .venv/bin/python bench/track.py                            # full suite, seeds 0,1,2 (≤ 15 min target)
    .venv/bin/python bench/track.py --quick --fail-on-regression --html track-html
    .venv/bin/python bench/track.py --report-only --html DIR   # verdicts + dashboard from the store alone
    .venv/bin/python bench/track.py --quick --code /tmp/track-abc123   # measure that checkout's swarm/
    .venv/bin/python bench/track.py --report-only --history bench/history/track.json --html DIR
    .venv/bin/python bench/track.py --quick --history bench/history/track.json --export bench/history/track.json

The suite (each benchmark returns per-step metrics and final numbers with a declared direction):

- ``learning``: GRPO on ``bench/learning.py``'s short-answer task in a real in-process server (what
  ``a3r`` starts: LoRA r16, mixed precision ``auto``, lr 2e-4), fewer steps; primary
  ``reward_last`` (mean reward of the last two steps), higher is better.
- ``merge``: ``bench/merge.py``'s realistic 12-call episodes; tokens through the trainer unmerged /
  merged (``tokens_ratio``), higher is better; deterministic per seed.
- ``throughput``: generated tokens/s of concurrent episodes through a real in-process server
  (``bench/serve.py``'s ``measure_throughput``); primary ``tokens_per_s`` at the top concurrency.
- ``update``: one GRPO update of ``TorchTrainer`` on the SmolLM2-135M shape (``bench/train_step.py``'s
  ``run_ours``) on one thread; primary ``cpu_s`` (median process CPU seconds per step, which other
  jobs on a shared machine disturb far less than wall time; ``step_s`` is recorded too), lower is
  better.
- ``spy``: who-is-the-spy games of ``templates/who_is_the_spy`` (rendered as a user would: 3 players,
  1 round, short replies, greedy) played by the embedded model through a real in-process server as
  ``eval`` episodes; the reward's parts (``win_rate``, ``leak_rate``, ``invalid_vote_rate``) and the
  primary ``reward_mean`` (mean episode reward over the games, every agent's reward counted), higher
  is better.

Every run goes to the store given by ``--store`` (default the a3r store ``.a3r/memory.db``; any
SQLAlchemy URL, e.g. a team's PostgreSQL) as described in ``bench/track_history.py``, with the commit
of the measured ``swarm`` package, its dirty flag, the machine and the package versions. The regression
rule compares this commit's runs with the earlier commits' runs of the same mode, machine and sizes
(the benchmark's own ``<benchmark>_…`` settings and ``threads``).

``--history FILE`` first loads a history exported earlier (the committed ``bench/history/track.json``)
into the store (idempotent); the runs of this invocation then go to that history's study, and
``--export FILE`` writes that study (else the store's first tracking study) back as JSON.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from track_history import (
    STUDY_KIND,
    VERDICT_COLUMNS,
    History,
    HistoryFileError,
    Status,
    Verdict,
    export_history,
    import_history,
    load_history,
    read_history,
    record_run,
    verdict_cells,
)

console = Console(width=None if sys.stdout.isatty() else 140)


Count = Annotated[int, Field(ge=1)]
"""A size that must be at least 1 (steps, episodes, tokens, threads, …)."""


class SuiteSettings(BaseModel):
    """Sizes of the suite's benchmarks (``--set NAME=VALUE`` overrides one).

    Each field's type carries its range (``Count``: ≥ 1), so an impossible value is refused when the
    settings are built, before anything runs or any store is opened."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: Count = 2
    """torch intra-op threads of the process (sampling and the learning server's updates)."""
    learning_steps: Count = 3
    learning_tasks: Count = 2
    """Tasks (GRPO groups) per step."""
    learning_group: Annotated[int, Field(ge=2)] = 4
    """Episodes per task (≥ 2: a group-relative advantage needs a group)."""
    learning_lora_rank: Annotated[int, Field(ge=0)] = 16
    """0: full fine-tuning in float32."""
    learning_lr: Annotated[float, Field(gt=0, le=1)] = 2e-4
    learning_mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    merge_episodes: Count = 2
    merge_calls: Count = 12
    throughput_concurrency: Annotated[tuple[Count, ...], Field(min_length=1)] = (1, 4)
    throughput_rounds: Count = 1
    throughput_tokens: Count = 8
    update_threads: Count = 1
    """torch threads of the update benchmark: one, so its CPU seconds ≈ the time on one idle core."""
    update_seqs: Count = 2
    update_prompt: Count = 32
    update_completion: Count = 64
    update_repeats: Count = 2
    update_small: bool = False
    """A 2-layer toy model instead of the SmolLM2-135M shape (tests)."""
    update_lora: bool = False
    spy_games: Count = 4
    """Who-is-the-spy games (episodes) per seed, played concurrently."""
    spy_players: Annotated[int, Field(ge=3)] = 3
    """Players per game (3, the template's fewest: 1 spy, 2 civilians)."""
    spy_rounds: Count = 1
    """Rounds before a surviving spy wins (1, the template's fewest)."""
    spy_describe_tokens: Count = 16
    spy_vote_tokens: Count = 8
    spy_temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    """0: greedy, so a seed's games are the same from one run to the next (sampling has no seed here)."""


QUICK = SuiteSettings()
FULL = SuiteSettings(
    learning_steps=8,
    learning_tasks=4,
    merge_episodes=4,
    throughput_concurrency=(1, 4, 16),
    throughput_rounds=2,
    throughput_tokens=32,
    update_seqs=4,
    update_prompt=64,
    update_completion=192,
    update_repeats=2,
    spy_games=6,
)
BACKEND = {"engine": "hf", "trainer": "torch", "device": "cpu"}


@dataclass
class Measurement:
    """What one benchmark run produced: metrics per step (step 1, 2, …) and the final numbers."""

    steps: list[dict[str, float]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    """One tracked benchmark.

    Attributes:
        name: Experiment name in the store.
        description: What it measures.
        metric: Primary final metric (judged by the regression rule).
        higher_is_better: Direction of ``metric``.
        min_relative: Smallest relative change of ``metric`` that can count as a regression.
        curve: Per-step metric drawn on the dashboard.
        measure: ``(settings, seed) -> Measurement``.
        step: What one step of ``curve`` is (the dashboard's x axis).
        load_sensitive: ``metric`` is a timing that the machine's load moves (tokens/s, CPU seconds):
            runs at very different loads are not compared (`track_history.LOAD_RATIO`).
    """

    name: str
    description: str
    metric: str
    higher_is_better: bool
    min_relative: float
    curve: str
    measure: Callable[[SuiteSettings, int], Measurement]
    step: str = "step"
    load_sensitive: bool = False


# -- the benchmarks --------------------------------------------------------------------------------------
def measure_learning(s: SuiteSettings, seed: int) -> Measurement:
    """GRPO on learning.py's task through a real server; per step the server's step metrics."""
    import asyncio

    import learning
    import torch
    from serve import serve

    from swarm.batch import BatchConfig, BatchPolicy
    from swarm.client import AsyncSwarmClient
    from swarm.config import SamplingDefaults, ServerConfig, TrainingConfig
    from swarm.train import LoraSettings, TrainerConfig

    torch.manual_seed(seed)
    lora = (
        LoraSettings(r=s.learning_lora_rank, alpha=2 * s.learning_lora_rank) if s.learning_lora_rank else None
    )
    with tempfile.TemporaryDirectory(prefix="track-learning-") as tmp:
        config = ServerConfig(
            run_dir=Path(tmp) / "run",
            port=0,
            dtype="bfloat16" if lora and s.learning_mixed_precision != "no" else "float32",
            mixed_precision=s.learning_mixed_precision,
            sampling=SamplingDefaults(temperature=1.0),
            training=TrainingConfig(
                batch=BatchConfig(
                    policy=BatchPolicy.TASKS, batch_size=s.learning_tasks, group_size=s.learning_group
                ),
                trainer=TrainerConfig(lr=s.learning_lr, micro_batch_size=8, lora=lora),
                checkpoint_every=1000,
            ),
        )
        with serve(None, config.run_dir, config) as url:
            started = time.perf_counter()
            rounds = asyncio.run(
                learning.drive(
                    url, s.learning_steps, s.learning_tasks, s.learning_group, first_seed=seed * 100_000
                )
            )
            wall = time.perf_counter() - started

            async def metrics() -> list[Any]:
                async with AsyncSwarmClient(url) as client:
                    return await client.metrics()

            history = asyncio.run(metrics())
    steps = [
        {
            "reward_mean": m.reward_mean or 0.0,
            "correct": sum(b[1] for b in batch) / len(batch),
            "words": sum(b[2] for b in batch) / len(batch),
            "loss": m.loss,
            "grad_norm": m.grad_norm,
            "step_s": m.time_s.total_s,
        }
        for m, batch in zip(history, rounds, strict=True)
    ]
    tail = steps[-min(2, len(steps)) :]
    return Measurement(
        steps,
        {
            "reward_last": statistics.fmean(x["reward_mean"] for x in tail),
            "reward_first": steps[0]["reward_mean"],
            "reward_rise": statistics.fmean(x["reward_mean"] for x in tail) - steps[0]["reward_mean"],
            "correct_last": statistics.fmean(x["correct"] for x in tail),
            "wall_s": wall,
        },
    )


def measure_merge(s: SuiteSettings, seed: int) -> Measurement:
    """merge.py's episodes: tokens unmerged / merged and calls per sample, per episode and in total."""
    import random

    import merge
    from transformers import AutoTokenizer

    from swarm.engine.model_loading import resolve_model
    from swarm.tracking.merge import build_samples
    from swarm.tracking.render import PromptRenderer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None).directory), local_files_only=True)
    renderer = PromptRenderer(tokenizer)
    rng = random.Random(seed)
    steps, unmerged_total, merged_total, calls_total, samples_total = [], 0, 0, 0, 0
    for k in range(s.merge_episodes):
        calls = merge.build_episode(renderer, rng, s.merge_calls)
        samples, stats = build_samples(f"ep{k}", calls)
        unmerged = sum(len(q.ids_T) for q in merge.unmerged_sequences([calls]))
        merged = sum(len(q.ids_T) for q in merge.merged_sequences(samples))
        unmerged_total, merged_total = unmerged_total + unmerged, merged_total + merged
        calls_total, samples_total = calls_total + len(calls), samples_total + len(samples)
        steps.append(
            {
                "tokens_ratio": unmerged / merged,
                "merge_ratio": stats.merge_ratio,
                "splice_mismatches": float(stats.splice_mismatches),
            }
        )
    return Measurement(
        steps,
        {
            "tokens_ratio": unmerged_total / merged_total,
            "merge_ratio": calls_total / samples_total,
            "tokens_unmerged": float(unmerged_total),
            "tokens_merged": float(merged_total),
        },
    )


def measure_throughput(s: SuiteSettings, seed: int) -> Measurement:
    """serve.py's throughput rows through a real server, one step per concurrency level."""
    import serve

    from swarm.engine import HFEngine, load_model, resolve_model

    source = resolve_model(None)
    model, tokenizer = load_model(source)
    engine = HFEngine(model, tokenizer, source.name)
    steps = []
    try:
        with tempfile.TemporaryDirectory(prefix="track-serve-") as tmp, serve.serve(engine, Path(tmp)) as url:
            for c in sorted(s.throughput_concurrency):
                row = serve.measure_throughput(engine, url, c, s.throughput_rounds, s.throughput_tokens)
                steps.append(
                    {
                        "concurrency": float(c),
                        "tokens_per_s": row.tokens_per_s,
                        "episodes_per_s": row.calls / row.wall_s,
                        "rows_per_batch": row.rows_per_batch,
                    }
                )
    finally:
        engine.close()
    final = {"tokens_per_s": steps[-1]["tokens_per_s"], "episodes_per_s": steps[-1]["episodes_per_s"]}
    if len(steps) > 1:
        final["speedup"] = steps[-1]["tokens_per_s"] / steps[0]["tokens_per_s"]
    return Measurement(steps, final)


def measure_update(s: SuiteSettings, seed: int) -> Measurement:
    """train_step.py's ``run_ours``: one step per timed repeat."""
    import argparse

    import torch
    import train_step

    args = argparse.Namespace(
        small=s.update_small,
        seqs=s.update_seqs,
        prompt=s.update_prompt,
        completion=s.update_completion,
        lora=s.update_lora,
        recompute=False,
        repeats=s.update_repeats,
        threads=s.update_threads,
    )
    result = train_step.run_ours(args)
    torch.set_num_threads(s.threads)  # run_ours set the update's own count
    steps = [{"step_s": t, "cpu_s": c} for t, c in zip(result["times"], result["cpu_s"], strict=True)]
    return Measurement(
        steps, {"step_s": result["median_s"], "cpu_s": result["median_cpu_s"], "peak_mb": result["peak_mb"]}
    )


def measure_spy(s: SuiteSettings, seed: int) -> Measurement:
    """Who-is-the-spy games of ``templates/who_is_the_spy`` (rendered as a user would, every role
    trainable) played by the embedded model through a real in-process server, as ``eval`` episodes
    (never trained); one step per game, in task order.

    Seed ``s`` plays tasks ``s·G … s·G + G − 1`` of the template's data builder with data seed ``s``
    (so each seed has its own word pairs, seating and word swaps); with ``spy_temperature`` 0 the
    replies are greedy, so a seed's games repeat from one run to the next.
    """
    import asyncio
    import importlib.util
    import json as json_

    import serve

    from swarm.client import AsyncSwarmClient
    from swarm.engine import HFEngine, load_model, resolve_model
    from templates import render

    params = {
        "n_players": s.spy_players,
        "n_spies": 1,
        "max_rounds": s.spy_rounds,
        "train_roles": "both",
        "n_tasks": (seed + 1) * s.spy_games,
        "seed": seed,
        "describe_max_tokens": s.spy_describe_tokens,
        "vote_max_tokens": s.spy_vote_tokens,
        "temperature": s.spy_temperature,
    }
    source = resolve_model(None)
    model, tokenizer = load_model(source)
    engine = HFEngine(model, tokenizer, source.name)
    try:
        with tempfile.TemporaryDirectory(prefix="track-spy-") as tmp:
            rendered = render("who_is_the_spy", params, Path(tmp) / "spy")
            spec = importlib.util.spec_from_file_location("track_spy_workflow", rendered.workflow)
            assert spec is not None and spec.loader is not None
            workflow = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(workflow)
            lines = rendered.tasks.read_text(encoding="utf-8").splitlines()
            tasks = [json_.loads(line) for line in lines[seed * s.spy_games :]]

            async def game(client: AsyncSwarmClient, task: dict[str, Any]) -> tuple[Any, Any]:
                agents = workflow.trainable_agents(task)
                async with client.episode(task["id"], kind="eval", trainable_agents=agents) as ep:
                    result = await workflow.run(task, ep.llm)
                    await ep.finish(result)
                return result, await client.get_episode(ep.id)

            async def games(url: str) -> list[tuple[Any, Any]]:
                async with AsyncSwarmClient(url) as client:
                    return list(await asyncio.gather(*(game(client, task) for task in tasks)))

            with serve.serve(engine, Path(tmp) / "run") as url:
                started = time.perf_counter()
                played = asyncio.run(games(url))
                wall = time.perf_counter() - started
    finally:
        engine.close()
    steps = [
        {
            "reward": result.reward,
            "win_rate": result.metrics["win_rate"],
            "leak_rate": result.metrics["leak_rate"],
            "invalid_vote_rate": result.metrics["invalid_vote_rate"],
            "spy_won": result.metrics["spy_won"],
            "rounds": result.metrics["rounds"],
            "completion_tokens": float(sum(len(c.completion_ids) for c in view.calls)),
        }
        for result, view in played
    ]
    calls = sum(len(view.calls) for _, view in played)
    tokens = sum(x["completion_tokens"] for x in steps)
    mean = {name: statistics.fmean(x[name] for x in steps) for name in steps[0]}
    final = {
        "reward_mean": mean["reward"],
        **{name: mean[name] for name in ("win_rate", "leak_rate", "invalid_vote_rate", "spy_won", "rounds")},
        "calls": float(calls),
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
    }
    return Measurement(steps, final)


SUITE: tuple[Benchmark, ...] = (
    Benchmark(
        "learning",
        "GRPO on bench/learning.py's short-answer task, in-process server, a3r's LoRA settings",
        "reward_last", True, 0.10, "reward_mean", measure_learning,
    ),
    Benchmark(
        "merge",
        "bench/merge.py's 12-call episodes: tokens through the trainer, unmerged / merged",
        "tokens_ratio", True, 0.01, "tokens_ratio", measure_merge, "episode",
    ),
    Benchmark(
        "throughput",
        "generated tokens/s of concurrent episodes through a real in-process server (hf engine)",
        "tokens_per_s", True, 0.15, "tokens_per_s", measure_throughput, "concurrency level", True,
    ),
    Benchmark(
        "update",
        "one GRPO update of TorchTrainer, SmolLM2-135M shape, fp32, 1 thread (bench/train_step.py); "
        "judged on process CPU seconds per step, steadier than wall time on a shared machine",
        "cpu_s", False, 0.15, "cpu_s", measure_update, "timed repeat", True,
    ),
    Benchmark(
        "spy",
        "who-is-the-spy games (templates/who_is_the_spy, 3 players, 1 round, greedy) played by the "
        "embedded model through a real in-process server; the mean reward per game (its parts are in "
        "each run's final metrics, not drawn)",
        "reward_mean", True, 0.10, "reward", measure_spy, "game",
    ),
)  # fmt: skip
BY_NAME = {b.name: b for b in SUITE}


# -- running and recording -------------------------------------------------------------------------------
def _use_code(checkout: Path) -> Path:
    """Import ``swarm`` from ``checkout`` (a ``git worktree`` of an older commit) instead of this tree.

    Only ``swarm/`` is taken from there (through a symlink in a temporary folder put first on
    ``sys.path``): the bench scripts, the store (``memory``) and provenance stay this tree's, so an old
    commit's engine, trainer and server are measured and recorded into today's store schema."""
    if "swarm" in sys.modules:
        raise RuntimeError("swarm was imported before --code could take effect")
    if not (checkout / "swarm" / "__init__.py").is_file():
        raise typer.BadParameter(f"{checkout} has no swarm/ package", param_hint="--code")
    shim = Path(tempfile.mkdtemp(prefix="track-code-"))
    atexit.register(shutil.rmtree, shim, ignore_errors=True)
    (shim / "swarm").symlink_to((checkout / "swarm").resolve(), target_is_directory=True)
    sys.path.insert(0, str(shim))
    # Without this, a module the old checkout lacks would be found by this tree's editable install and
    # the run would silently measure a mix of both versions.
    sys.meta_path.insert(0, _CheckoutOnly(shim, checkout))
    return checkout


class _CheckoutOnly(importlib.abc.MetaPathFinder):
    """Finds ``swarm`` and its submodules in the ``--code`` checkout only: a module missing there is a
    ``ModuleNotFoundError`` naming the checkout, never this tree's module of the same name."""

    def __init__(self, shim: Path, checkout: Path) -> None:
        self.shim = shim
        self.checkout = checkout

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "swarm" and not fullname.startswith("swarm."):
            return None
        search = [str(self.shim)] if fullname == "swarm" else path
        spec = importlib.machinery.PathFinder.find_spec(fullname, search)
        if spec is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} in the --code checkout {self.checkout}", name=fullname
            )
        return spec


def _swarm_root() -> Path:
    import swarm

    return Path(swarm.__file__).resolve().parents[1]


def _run_config(provenance: Any, mode: str, settings: SuiteSettings) -> dict[str, Any]:
    return {
        "mode": mode,
        "dirty": provenance.dirty,
        "provenance": provenance.model_dump(exclude={"git_commit"}),
        "backend": BACKEND,
        "settings": settings.model_dump(mode="json"),
        "load_avg_1m": os.getloadavg()[0],
    }


def run_suite(
    store: Any,
    benchmarks: list[Benchmark],
    seeds: list[int],
    settings: SuiteSettings,
    mode: str,
    study_id: int | None = None,
) -> dict[str, list[int]]:
    """Run every benchmark for every seed and record each run (into the tracking study ``study_id``, by
    default the store's first); returns the new run ids by benchmark.

    A benchmark that raises is recorded as a failed run (its error message) and the suite goes on."""
    import torch

    from a3r.study.provenance import collect_provenance

    torch.set_num_threads(settings.threads)
    provenance = collect_provenance(_swarm_root())
    console.print(
        f"commit [bold]{(provenance.git_commit or 'unknown')[:12]}[/]{' (dirty)' if provenance.dirty else ''} · "
        f"{mode} · seeds {seeds} · torch {provenance.versions.get('torch')} · "
        f"{provenance.machine['cpu']} ×{provenance.machine['cores']} · store {store.url}"
    )
    new: dict[str, list[int]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("suite", total=len(benchmarks) * len(seeds))
        for bench in benchmarks:
            for seed in seeds:
                progress.update(task, description=f"{bench.name} seed {seed}")
                started = time.perf_counter()
                try:
                    measured: Measurement | None = bench.measure(settings, seed)
                    error = None
                except Exception as exc:  # recorded as a failed run; the other benchmarks still run
                    measured, error = None, f"{type(exc).__name__}: {exc}"
                    console.print(f"[red]{bench.name} seed {seed} failed:[/] {error}")
                run_id = record_run(
                    store,
                    benchmark=bench.name,
                    description=bench.description,
                    seed=seed,
                    git_commit=provenance.git_commit,
                    config=_run_config(provenance, mode, settings),
                    steps=measured.steps if measured else [],
                    final=measured.final if measured else None,
                    error=error,
                    study_id=study_id,
                )
                if measured is not None:
                    new.setdefault(bench.name, []).append(run_id)
                    console.print(
                        f"{bench.name} seed {seed}: {bench.metric} {measured.final[bench.metric]:.4g} "
                        f"({time.perf_counter() - started:.0f} s)"
                    )
                progress.advance(task)
    return new


def verdicts(
    history: History,
    benchmarks: list[Benchmark],
    new: dict[str, list[int]],
    *,
    k: float,
    min_history: int,
    checked_out: str | None = None,
) -> list[Verdict]:
    """The rule for each benchmark: its new runs, or else (``--report-only``) the runs of the
    ``checked_out`` commit, or of the latest commit when that one has none, against those before;
    one verdict per suite mode the candidate ran in (quick and full runs are never mixed)."""
    out = []
    for bench in benchmarks:
        ids = new.get(bench.name)
        groups = [ids] if ids else []
        if not ids:  # report-only: the checked-out commit is the candidate (else the latest one run)
            runs = [r for r in history.runs.get(bench.name, []) if r.value(bench.metric) is not None]
            if not runs:
                continue
            last = next((r for r in reversed(runs) if r.commit == checked_out), runs[-1])
            modes = sorted({r.mode for r in runs if r.commit == last.commit})
            groups = [[r.run.id for r in runs if r.commit == last.commit and r.mode == m] for m in modes]
        out += [
            history.verdict(
                bench.name,
                bench.metric,
                group,
                higher_is_better=bench.higher_is_better,
                k=k,
                min_relative=bench.min_relative,
                min_history=min_history,
                load_sensitive=bench.load_sensitive,
            )
            for group in groups
        ]
    return out


STATUS_STYLE = {
    Status.ok: "green",
    Status.improvement: "cyan",
    Status.regression: "bold red",
    Status.no_history: "yellow",
    Status.not_comparable: "magenta",
}


def verdict_table(rows: list[Verdict], k: float) -> Table:
    table = Table(title=f"Regression verdicts (band: earlier commits' mean ± {k:g}σ and a minimum change)")
    for col in VERDICT_COLUMNS:
        table.add_column(
            col, justify="left" if col in ("benchmark", "commit", "metric", "verdict") else "right"
        )
    for v in rows:
        *cells, status = verdict_cells(v)
        table.add_row(*cells, f"[{STATUS_STYLE[v.status]}]{status}[/]")
    notes = [f"{v.benchmark} [{v.mode}]: {v.status.value}: {v.note}" for v in rows if v.note]
    if notes:
        table.caption, table.caption_justify = "\n".join(notes), "left"
    return table


# -- CLI -------------------------------------------------------------------------------------------------
def _scratch_store() -> str:
    """A store in a temporary folder removed at exit: where ``--report-only --history`` without
    ``--store`` loads the history, so that no store the user did not name is written."""
    scratch = tempfile.mkdtemp(prefix="track-report-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return str(Path(scratch) / "history.db")


def _say_off_head(rows: list[Verdict], head: str | None) -> None:
    """Name the benchmarks judged on another commit than the checked-out one (it has no runs of them)."""
    off_head = sorted({v.benchmark for v in rows if head and v.commit != head})
    if head and off_head:
        console.print(
            f"[yellow]the checked-out commit {head[:10]} has no runs of {', '.join(off_head)}: "
            "judged their latest commit[/]"
        )


def _checked_out_commit() -> str | None:
    """The commit checked out in the tree whose ``swarm`` is measured (``None`` outside git)."""
    from a3r.study.provenance import collect_provenance

    return collect_provenance(_swarm_root()).git_commit


def settings_from(base: SuiteSettings, assignments: list[str]) -> SuiteSettings:
    """``base`` with ``NAME=VALUE`` assignments applied (values parsed as JSON, else taken as text).

    Raises:
        typer.BadParameter: An unknown name, a missing ``=`` or a value the settings refuse.
    """
    values = base.model_dump()
    for item in assignments:
        name, sep, raw = item.partition("=")
        if not sep or name not in SuiteSettings.model_fields:
            known = ", ".join(SuiteSettings.model_fields)
            raise typer.BadParameter(
                f"{item!r}: expected NAME=VALUE with NAME one of {known}", param_hint="--set"
            )
        try:
            values[name] = json.loads(raw)
        except json.JSONDecodeError:
            values[name] = raw
    try:
        return SuiteSettings.model_validate(values)
    except ValidationError as exc:
        problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise typer.BadParameter(problem, param_hint="--set") from None


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a comma-separated list of integers", param_hint="--seeds"
        ) from None
    if not seeds or min(seeds) < 0:
        raise typer.BadParameter("give at least one seed, each >= 0", param_hint="--seeds")
    return seeds


def _arguments(
    only: list[str] | None, set_: list[str] | None, seeds: str | None, *, quick: bool, report_only: bool
) -> tuple[list[str], SuiteSettings, list[int]]:
    """The benchmarks' names, the settings and the seeds of the command line, checked.

    Raises:
        typer.BadParameter: An unknown benchmark, a bad setting or seed list, or ``--set`` / ``--seeds``
            with ``--report-only`` (which runs nothing, so they would silently do nothing).
    """
    names = only or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise typer.BadParameter(
            f"unknown benchmark {unknown[0]!r}; known: {', '.join(BY_NAME)}", param_hint="--only"
        )
    if report_only and (set_ or seeds is not None):
        given = " and ".join(o for o, v in (("--set", set_), ("--seeds", seeds)) if v)
        raise typer.BadParameter(
            "--report-only runs no benchmark, so it would change nothing", param_hint=given
        )
    settings = settings_from(QUICK if quick else FULL, set_ or [])
    return names, settings, _seeds(seeds or ("0" if quick else "0,1,2"))


def _check_paths(store: str | None, export: Path | None, *, must_exist: bool) -> None:
    """Refuse, in one line and before anything is created or run, a store or export path that cannot work.

    A SQLite ``store`` path (no ``://``) needs an existing parent folder (a typo must not create
    folders), and an existing file when ``must_exist`` (``--report-only`` reads a store, never makes an
    empty one); ``export`` needs an existing parent folder and must not be a folder itself.

    Raises:
        typer.Exit: Code 2, after the one-line error on stderr.
    """
    problem = None
    if store is not None and "://" not in store:
        path = Path(store).expanduser()
        if must_exist and not path.exists():
            problem = f"--store {store}: no such store (--report-only reads an existing one)"
        elif not path.parent.is_dir():
            problem = f"--store {store}: no such folder {path.parent} (it is not created)"
        elif path.is_dir():
            problem = f"--store {store}: a folder, not a store file"
    if problem is None and export is not None:
        if export.is_dir():
            problem = f"--export {export}: a folder; give the JSON file to write"
        elif not export.parent.is_dir():
            problem = f"--export {export}: no such folder {export.parent} (it is not created)"
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


def main(
    quick: Annotated[
        bool, typer.Option("--quick", help="the short settings (≈ 3 min on 2 idle cores)")
    ] = False,
    seeds: Annotated[
        str | None, typer.Option(help="comma-separated seeds (default: 0 with --quick, else 0,1,2)")
    ] = None,
    only: Annotated[
        list[str] | None, typer.Option(help=f"run only these benchmarks (repeatable): {', '.join(BY_NAME)}")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="override a setting, NAME=VALUE (JSON value; repeatable)"),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(help="knowledge store: SQLite path or SQLAlchemy URL (default .a3r/memory.db)"),
    ] = None,
    code: Annotated[
        Path | None, typer.Option(help="measure the swarm/ package of this checkout (e.g. a git worktree)")
    ] = None,
    k: Annotated[float, typer.Option(min=0, help="band width in standard deviations")] = 3.0,
    min_history: Annotated[int, typer.Option(min=1, help="fewest earlier runs that make a band")] = 3,
    fail_on_regression: Annotated[
        bool, typer.Option("--fail-on-regression", help="exit 1 when a benchmark regressed")
    ] = False,
    html: Annotated[Path | None, typer.Option(help="write the static dashboard (index.html) here")] = None,
    report_only: Annotated[
        bool, typer.Option("--report-only", help="run nothing: verdicts and dashboard from the store")
    ] = False,
    history_files: Annotated[
        list[Path] | None,
        typer.Option(
            "--history",
            help="first load this exported history into the store (repeatable; idempotent), "
            "e.g. bench/history/track.json; new runs go to its study",
        ),
    ] = None,
    export: Annotated[
        Path | None, typer.Option(help="write the tracking study as JSON here at the end (see --history)")
    ] = None,
) -> None:
    """Run the tracked benchmark suite, record it per commit and judge it against earlier commits."""
    from memory import Store, StoreError

    try:
        names, settings, seed_list = _arguments(only, set_, seeds, quick=quick, report_only=report_only)
    except typer.BadParameter as exc:  # one line, not click's framed usage error
        typer.echo(f"error: {exc.format_message()}", err=True)
        raise typer.Exit(2) from None
    benchmarks = [BY_NAME[n] for n in names]
    _check_paths(store, export, must_exist=report_only and not history_files)
    try:  # every history file is read and checked before the store is opened (or created)
        histories = [(path, read_history(path)) for path in history_files or []]
    except HistoryFileError as exc:
        typer.echo(f"error: --history {exc}", err=True)
        raise typer.Exit(2) from None
    if code is not None:
        _use_code(code)
    if report_only and histories and store is None:  # never write a history into a store not given
        store = _scratch_store()
    try:
        with Store(store) as db:
            study_id = None
            for path, export_file in histories:
                study_id = import_history(db, path, export_file)
                console.print(f"history: {path} → tracking study {study_id} of {db.url}")
            new = (
                {}
                if report_only
                else run_suite(db, benchmarks, seed_list, settings, "quick" if quick else "full", study_id)
            )
            history = load_history(db)
            head = _checked_out_commit() if report_only else None
            rows = verdicts(history, benchmarks, new, k=k, min_history=min_history, checked_out=head)
            _say_off_head(rows, head)
            console.print(verdict_table(rows, k))
            if report_only:
                judged = {v.benchmark for v in rows}
                for name in names:
                    if name not in judged:
                        console.print(f"[yellow]no {name} runs in this store[/]")
            if html is not None:
                from track_html import write_dashboard

                page = write_dashboard(html, history, SUITE, rows, db, checked_out=head)
                console.print(f"dashboard: {page}")
            if export is not None:
                tracking = [s.id for s in db.studies() if s.kind == STUDY_KIND]
                if not tracking:
                    typer.echo("error: --export: the store holds no tracking study yet", err=True)
                    raise typer.Exit(2)
                exported = study_id if study_id is not None else tracking[0]
                others = ", ".join(str(i) for i in tracking if i != exported)
                if others:
                    console.print(f"[yellow]export: tracking studies {others} of the store are left out[/]")
                console.print(f"history written: {export_history(db, exported, export)}")
    except HistoryFileError as exc:
        typer.echo(f"error: --history {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except StoreError as exc:
        console.print(f"[red]store error:[/] {exc}")
        raise typer.Exit(2) from None
    if not report_only and not new:
        typer.echo(
            f"error: every benchmark run failed ({len(benchmarks) * len(seed_list)} runs, recorded as failed)",
            err=True,
        )
        raise typer.Exit(1)
    regressed = [v for v in rows if v.status is Status.regression]
    if fail_on_regression and regressed:
        typer.echo(
            "regression: "
            + ", ".join(
                f"{v.benchmark} {v.metric} {v.relative_change:+.1%} vs earlier commits" for v in regressed
            ),
            err=True,
        )
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
