"""On-policy distillation against GRPO alone on arithmetic, held-out accuracy per step (issue 38).

    python bench/distill.py --out /tmp/distill          # ≈ 12 min idle, ≈ 25 min at load 4–7 (2 cores)
    python bench/distill.py --quick --out /tmp/distill  # the same path, tiny: 5.5 min at load 2–5
    python bench/distill.py --teacher /tmp/distill/teacher --out /tmp/distill2   # reuse the teacher

1. **Teacher**: GRPO from the embedded SmolLM2-135M-Instruct on the arithmetic template (level 1) with
   `learning.py`'s recipe as a3r runs it (`learning.recipe_config`: ``tasks`` policy B = 4 × G = 4,
   LoRA r 16 on bf16 base weights with bf16 autocast, lr 2e-4, sampling at temperature 1.0;
   ``--lora-rank 0 --lr 3e-5``: its full fine-tuning variant) for ``--teacher-steps`` steps, then
   checkpointed and its adapters merged into a full model folder, ``<out>/teacher`` (a LoRA checkpoint
   holds adapters only; ``swarm serve --model`` needs the whole model).
2. **Teacher server**: that folder served by an in-process swarm server that trains nothing
   (``swarm serve --model DIR --no-train``); students score their tokens on its ``POST /v1/score``.
3. **Students**: fresh embedded models, each on its own in-process server with the same recipe at
   B = ``--tasks`` (2, a3r's default, to fit the box) × G = 4, on the same training tasks per seed: pure
   distillation from the teacher (``--teacher URL --distill pure``: the per-token reverse-KL advantage
   alone, no task reward) against GRPO alone; ``--seeds`` seeds each, ``--steps`` steps each.

Held-out accuracy: greedy (temperature 0) replies to ``--eval-tasks`` tasks of the held-out split a3r
uses for arithmetic (generator seed + `a3r.graph.coder.HELDOUT_SEED_OFFSET`: tasks no run trains on),
before training (step 0) and after every step, as ``eval`` episodes (never trained). Intervals: 95 %
Student t over seeds, per arm and for the paired difference (distillation − GRPO, same seed, same
tasks). Prints a rich table and ratios; writes ``distill.png`` and ``distill.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import drive, recipe_config
from serve import serve
from spy_pilots import Interval, load_workflow, mean_interval

import templates
from a3r.graph.coder import HELDOUT_SEED_OFFSET
from swarm.client import AsyncSwarmClient
from swarm.config import DistillConfig, ServerConfig, TrainingConfig
from swarm.train import LoraSettings

ARMS = ("grpo", "distill")
"""The two training signals compared: GRPO alone (task reward), pure distillation (teacher)."""
LABELS = {"grpo": "GRPO alone", "distill": "pure distillation"}


@dataclass
class Settings:
    """What one bench run trains and measures (the command line)."""

    teacher_steps: int = 12
    steps: int = 5
    seeds: int = 3
    eval_tasks: int = 16
    teacher_tasks: int = 4
    tasks: int = 2
    group: int = 4
    lr: float = 2e-4
    lora_rank: int = 16
    level: int = 1


QUICK = Settings(teacher_steps=1, steps=2, seeds=2, eval_tasks=8)
"""``--quick``: the whole path in a few minutes (numbers too few to conclude anything)."""


@dataclass
class Curve:
    """One run: held-out accuracy after each step (index 0: before training) and its step metrics."""

    accuracy: list[float] = field(default_factory=list)
    train_reward: list[float] = field(default_factory=list)
    """Mean task reward of each step's rollouts."""
    teacher_kl: list[float] = field(default_factory=list)
    """``distill/teacher_kl`` of each step (nats per scored token; distillation only)."""
    scored_frac: list[float] = field(default_factory=list)
    """``distill/scored_frac`` of each step (distillation only)."""
    wall_s: float = 0.0


@dataclass
class Workflows:
    """The arithmetic template rendered twice: sampling at 1.0 (training), greedy (held-out)."""

    train: Any
    greedy: Any
    train_tasks: list[dict[str, Any]]
    heldout: list[dict[str, Any]]


def workflows(out: Path, s: Settings) -> Workflows:
    """The rendered workflows and the tasks: training tasks of generator seed 0, held-out tasks of seed
    `HELDOUT_SEED_OFFSET` (a3r's held-out split for a seeded generator)."""
    template = templates.get_template("arithmetic")
    params = {"level": s.level, "n_tasks": 1}
    for name in ("workflow-train", "workflow-greedy"):  # rendered afresh: --out may be reused
        shutil.rmtree(out / name, ignore_errors=True)
    return Workflows(
        train=load_workflow(out / "workflow-train", {**params, "temperature": 1.0}, "arithmetic"),
        greedy=load_workflow(out / "workflow-greedy", {**params, "temperature": 0.0}, "arithmetic"),
        train_tasks=template.build_tasks({"level": s.level, "seed": 0, "n_tasks": 512}),
        heldout=template.build_tasks(
            {"level": s.level, "seed": HELDOUT_SEED_OFFSET, "n_tasks": s.eval_tasks}
        ),
    )


async def play(client: AsyncSwarmClient, workflow: Any, task: dict[str, Any], kind: str) -> float:
    """One episode of ``task`` through the rendered workflow; its reward (1 correct, else 0)."""
    async with client.episode(task["id"], kind=kind) as ep:
        result = await workflow.run(task, ep.llm)
        await ep.finish(result)
    return float(result.reward)


EVAL_CONCURRENCY = 8
"""Held-out episodes at once (a3r's too): 32 at once took 3–4× as long as 4 rounds of 8 here."""


async def accuracy(client: AsyncSwarmClient, wf: Workflows) -> float:
    """Greedy held-out accuracy of the policy the server serves now."""
    limit = asyncio.Semaphore(EVAL_CONCURRENCY)

    async def one(task: dict[str, Any]) -> float:
        async with limit:
            return await play(client, wf.greedy, task, "eval")

    return statistics.fmean(await asyncio.gather(*(one(task) for task in wf.heldout)))


async def train(
    url: str,
    s: Settings,
    wf: Workflows,
    size: tuple[int, int],
    seed: int,
    console: Console | None = None,
    *,
    every_step: bool = True,
) -> Curve:
    """``size`` = (steps, B) training steps of B tasks × G on the server at ``url`` (whatever its
    signal), held-out accuracy before and after each (``every_step=False``: after the last only), said
    on ``console``; seed ``seed`` picks the training tasks (the same for every arm)."""
    steps, tasks = size
    curve = Curve()
    offset = seed * 131  # each seed its own tasks, every arm the same ones

    async def episode(client: AsyncSwarmClient, index: int, _seed: int) -> float:
        task = wf.train_tasks[(index + offset) % len(wf.train_tasks)]
        return await play(client, wf.train, task, "train")

    async def evaluate(client: AsyncSwarmClient, step: int) -> None:
        if not (every_step or step in (0, steps)):
            return
        curve.accuracy.append(await accuracy(client, wf))
        if console is not None:
            console.print(
                f"  step {step}: held-out {curve.accuracy[-1]:.3f} ({time.perf_counter() - started:.0f} s)"
            )

    started = time.perf_counter()
    async with AsyncSwarmClient(url) as client:
        await evaluate(client, 0)
    rounds = await drive(
        url,
        steps,
        tasks,
        s.group,
        first_seed=seed * 100_000,
        play=episode,
        n_tasks=len(wf.train_tasks),
        after_step=evaluate,
    )
    curve.wall_s = time.perf_counter() - started
    curve.train_reward = [statistics.fmean(batch) for batch in rounds]
    async with AsyncSwarmClient(url) as client:
        for row in await client.metrics():
            if "teacher_kl" in row.distill:
                curve.teacher_kl.append(row.distill["teacher_kl"])
                curve.scored_frac.append(row.distill.get("scored_frac", math.nan))
    return curve


def recipe(run_dir: Path, s: Settings, tasks: int) -> ServerConfig:
    """`learning.recipe_config` with these settings and B = ``tasks``: LoRA r on bf16 base weights with
    bf16 autocast (what a3r starts; ``--lora-rank 0``: full fine-tuning in float32). ``run_dir`` is
    emptied first: a server would resume from what an earlier bench run left there."""
    shutil.rmtree(run_dir, ignore_errors=True)
    lora = LoraSettings(r=s.lora_rank, alpha=2 * s.lora_rank) if s.lora_rank else None
    return recipe_config(
        run_dir, lr=s.lr, tasks=tasks, group=s.group, lora=lora, mixed_precision="bf16" if lora else "no"
    )


def merged_teacher(checkpoint: Path, target: Path) -> Path:
    """A LoRA checkpoint's adapters merged into the embedded model's float32 weights, saved as a Hugging
    Face folder ``target`` that ``swarm serve --model`` loads (a LoRA checkpoint holds adapters only)."""
    from peft import PeftModel

    from swarm.engine import load_model, resolve_model

    base, tokenizer = load_model(resolve_model(None))
    merged = PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload()
    merged.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


def make_teacher(out: Path, s: Settings, wf: Workflows, console: Console) -> tuple[Path, Curve]:
    """GRPO from the embedded model with `learning.py`'s recipe, checkpointed (LoRA adapters merged into
    a full model folder); its folder and curve."""
    torch.manual_seed(1234)
    config = recipe(out / "teacher-run", s, s.teacher_tasks)
    console.print(
        f"teacher: GRPO, {s.teacher_steps} steps of B={s.teacher_tasks} × G={s.group} (learning.py's recipe)"
    )
    with serve(None, config.run_dir, config) as url:
        curve = asyncio.run(
            train(url, s, wf, (s.teacher_steps, s.teacher_tasks), 99, console, every_step=False)
        )

        async def save() -> str:
            async with AsyncSwarmClient(url) as client:
                return (await client.checkpoint()).path

        folder = Path(asyncio.run(save()))
    if s.lora_rank:
        folder = merged_teacher(folder, out / "teacher")
    console.print(
        f"teacher saved: {folder} (held-out accuracy {curve.accuracy[0]:.3f} → {curve.accuracy[-1]:.3f})"
    )
    return folder, curve


def teacher_config(folder: Path, out: Path) -> ServerConfig:
    """The teacher server: the checkpoint folder served, nothing trained (a fresh run dir)."""
    shutil.rmtree(out / "teacher-serve", ignore_errors=True)
    return ServerConfig(
        model=str(folder), run_dir=out / "teacher-serve", port=0, training=TrainingConfig(enabled=False)
    )


def student_config(out: Path, s: Settings, arm: str, seed: int, teacher_url: str) -> ServerConfig:
    """A fresh student's server: `learning.py`'s recipe, plus pure distillation from the teacher."""
    config = recipe(out / f"{arm}-seed{seed}", s, s.tasks)
    if arm == "grpo":
        return config
    distill = DistillConfig(teacher_url=teacher_url, mode="pure")
    return config.model_copy(update={"training": config.training.model_copy(update={"distill": distill})})


def paired(a: list[Curve], b: list[Curve], step: int) -> Interval:
    """Mean and 95 % t interval over seeds of ``b − a`` at ``step`` (same seed, same tasks)."""
    return mean_interval([y.accuracy[step] - x.accuracy[step] for x, y in zip(a, b, strict=True)])


def at(curves: list[Curve], step: int) -> Interval:
    """Mean held-out accuracy at ``step`` over seeds with its 95 % t interval."""
    return mean_interval([c.accuracy[step] for c in curves])


def area(curves: list[Curve]) -> float:
    """Mean held-out accuracy over steps 1..S and seeds (the area under the learning curve)."""
    return statistics.fmean(a for c in curves for a in c.accuracy[1:])


def report(s: Settings, runs: dict[str, list[Curve]], teacher: Curve, console: Console) -> dict[str, Any]:
    """Print the table and the ratios; return what distill.json holds."""
    table = Table(
        title=f"held-out greedy accuracy on arithmetic level {s.level} ({s.eval_tasks} tasks), mean over "
        f"{s.seeds} seeds [95 % t interval]; B={s.tasks} × G={s.group}, "
        f"{f'LoRA r{s.lora_rank} (bf16)' if s.lora_rank else 'full fine-tuning'}, lr {s.lr:g}"
    )
    for col in ("step", LABELS["grpo"], LABELS["distill"], "distill − GRPO (paired)", "teacher KL (nats)"):
        table.add_column(col, justify="right")
    for step in range(s.steps + 1):
        kl = [c.teacher_kl[step - 1] for c in runs["distill"] if 0 < step <= len(c.teacher_kl)]
        table.add_row(
            str(step),
            at(runs["grpo"], step).show(3),
            at(runs["distill"], step).show(3),
            paired(runs["grpo"], runs["distill"], step).show(3),
            f"{statistics.fmean(kl):.3f}" if kl else "–",
        )
    console.print(table)
    last = s.steps
    grpo, dist = at(runs["grpo"], last).value, at(runs["distill"], last).value
    base = statistics.fmean(c.accuracy[0] for arm in ARMS for c in runs[arm])
    gap = teacher.accuracy[-1] - base
    ratios = {
        "final_ratio": dist / grpo if grpo > 0 else math.inf,
        "area_ratio": area(runs["distill"]) / area(runs["grpo"]) if area(runs["grpo"]) > 0 else math.inf,
        "gap_closed_distill": (dist - base) / gap if gap > 0 else math.nan,
        "gap_closed_grpo": (grpo - base) / gap if gap > 0 else math.nan,
        "wall_s_per_step_distill": statistics.fmean(c.wall_s for c in runs["distill"]) / s.steps,
        "wall_s_per_step_grpo": statistics.fmean(c.wall_s for c in runs["grpo"]) / s.steps,
    }
    console.print(
        f"teacher (GRPO {s.teacher_steps} steps): held-out {teacher.accuracy[0]:.3f} → {teacher.accuracy[-1]:.3f}; "
        f"students start at {base:.3f}"
    )
    console.print(
        f"step {last}: distillation {dist:.3f} vs GRPO {grpo:.3f}: ratio {ratios['final_ratio']:.2f}; "
        f"mean over steps 1–{last}: ratio {ratios['area_ratio']:.2f}; share of the teacher's gain reached: "
        f"distillation {ratios['gap_closed_distill']:.2f}, GRPO {ratios['gap_closed_grpo']:.2f}"
    )
    console.print(
        f"wall s per step (with its held-out evaluation): distillation {ratios['wall_s_per_step_distill']:.1f}, "
        f"GRPO {ratios['wall_s_per_step_grpo']:.1f}"
    )
    return {
        "settings": asdict(s),
        "teacher": asdict(teacher),
        "runs": {arm: [asdict(c) for c in curves] for arm, curves in runs.items()},
        "ratios": ratios,
        "interval": "95 % Student t over seeds (paired for the difference)",
    }


def plot(s: Settings, runs: dict[str, list[Curve]], teacher: Curve, path: Path) -> None:
    """Held-out accuracy per step, each arm's mean with its 95 % t band, the teacher's level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    steps = list(range(s.steps + 1))
    for arm, colour in zip(ARMS, ("tab:blue", "tab:orange"), strict=True):
        points = [at(runs[arm], step) for step in steps]
        ax.plot(steps, [p.value for p in points], marker="o", color=colour, label=LABELS[arm])
        ax.fill_between(steps, [p.low for p in points], [p.high for p in points], color=colour, alpha=0.2)
    ax.axhline(teacher.accuracy[-1], color="grey", linestyle="--", label="teacher")
    ax.set_xlabel("trainer step")
    ax.set_ylabel(f"held-out greedy accuracy ({s.eval_tasks} tasks)")
    ax.set_title(f"arithmetic level {s.level}: distillation vs GRPO alone ({s.seeds} seeds, 95 % t)")
    ax.set_ylim(0, 1)
    ax.set_xticks(steps)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes: the path, not an answer")
    parser.add_argument("--out", type=Path, default=None, help="where checkpoints, plot and JSON go")
    parser.add_argument("--teacher", type=Path, default=None, help="a saved teacher checkpoint folder")
    defaults = Settings()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None)
    args = parser.parse_args()
    base = QUICK if args.quick else defaults
    s = Settings(**{k: v if (v := getattr(args, k)) is not None else getattr(base, k) for k in asdict(base)})
    out = args.out or Path(tempfile.mkdtemp(prefix="distill-"))
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=140)
    started = time.perf_counter()
    wf = workflows(out, s)
    if args.teacher is None:
        folder, teacher = make_teacher(out, s, wf, console)
    else:
        folder, teacher = args.teacher, Curve()
    runs: dict[str, list[Curve]] = {arm: [] for arm in ARMS}
    with serve(None, out / "teacher-serve", teacher_config(folder, out)) as teacher_url:
        if not teacher.accuracy:  # a saved teacher: measure it

            async def measure() -> list[float]:
                async with AsyncSwarmClient(teacher_url) as client:
                    return [await accuracy(client, wf)]

            teacher.accuracy = asyncio.run(measure())
        for seed in range(s.seeds):
            for arm in ARMS:
                torch.manual_seed(seed)
                console.print(f"seed {seed}, {LABELS[arm]}: {s.steps} steps")
                config = student_config(out, s, arm, seed, teacher_url)
                with serve(None, config.run_dir, config) as url:
                    curve = asyncio.run(train(url, s, wf, (s.steps, s.tasks), seed, console))
                runs[arm].append(curve)
                console.print(
                    f"seed {seed} {LABELS[arm]}: held-out {' → '.join(f'{a:.2f}' for a in curve.accuracy)} "
                    f"({curve.wall_s:.0f} s)"
                )
    found = report(s, runs, teacher, console)
    found["wall_s"] = time.perf_counter() - started
    (out / "distill.json").write_text(json.dumps(found, indent=1), encoding="utf-8")
    plot(s, runs, teacher, out / "distill.png")
    console.print(f"wrote {out / 'distill.png'} and {out / 'distill.json'} ({found['wall_s']:.0f} s wall)")


if __name__ == "__main__":
    main()
