"""One task, one model, several agent frameworks: does the framework change what GRPO learns?

    python bench/frameworks.py [--steps 8] [--seeds 0 1] [--frameworks openai langchain agentscope http anthropic]
        [--batch-size 4] [--group-size 4] [--max-tokens 48] [--batch-window 0.5] [--device cpu] [--threads N]

Each (framework, seed) trains a fresh swarm server on the embedded SmolLM2-135M-Instruct (in process;
LoRA r16, lr 2e-4, dtype and mixed precision ``auto`` as a3r starts servers, B=4 tasks × G=4 episodes
per step by default, ``torch.manual_seed(seed)`` before the model loads) through the real runner
(``swarm.client.Runner``, B·G episodes at once) with the framework's example from ``examples/``: the
math agent of ``examples/math_common.py`` (system line, the question, reward 1 when the reply's last
integer is the answer), over ``examples/data/math.jsonl`` in file order, cycled. ``openai``,
``langchain``, ``agentscope`` and ``http`` send the same messages, so they differ only in the client
stack; ``anthropic`` is the Anthropic-SDK tool loop (``examples/math_anthropic.py``: its prompt also
lists a calculator tool, and a tool call adds turns), so it is the same task but not the same prompt.
``--max-tokens`` sets every example's completion cap (``math_common.MAX_TOKENS``). The engine's batch
window is ``--batch-window`` (0.5 s, not the server's 5 ms): the first calls of a step reach the server
over a few hundred ms, and on a CPU a batch of 1 that starts alone costs as many decode steps as the
full batch that follows it.

Prints per framework the mean reward of the first step and of the last 3 steps (mean ± std over seeds)
and the spread of the final rewards across frameworks (max − min), next to the seed-to-seed std of
one framework (the noise floor: sampling is not bit-reproducible under concurrent batching, so equal
seeds give equal starting weights and settings, not equal samples). The paper's target: spread ≤ 0.04.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import uvicorn
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import math_common  # noqa: E402  (the examples' shared module: the same object they import)

from swarm.batch import BatchConfig, BatchPolicy  # noqa: E402
from swarm.client import AsyncSwarmClient, Runner, RunnerConfig, TaskSet, load_workflow  # noqa: E402
from swarm.config import SamplingDefaults, ServerConfig, TrainingConfig  # noqa: E402
from swarm.precision import MixedPrecision  # noqa: E402
from swarm.server.app import create_app  # noqa: E402
from swarm.train import LoraSettings, TrainerConfig  # noqa: E402

FRAMEWORKS = {
    "openai": "math_openai.py",
    "langchain": "math_langchain.py",
    "agentscope": "math_agentscope.py",
    "http": "math_http.py",
    "anthropic": "math_anthropic.py",
}


@dataclass(frozen=True)
class Sizes:
    """What every (framework, seed) run shares."""

    steps: int
    batch_size: int
    """B: tasks per step."""
    group_size: int
    """G: episodes per task."""
    max_tokens: int
    batch_window_s: float
    device: str
    threads: int | None


def tasks(steps: int, batch_size: int) -> list[dict[str, Any]]:
    """``steps · B`` tasks: the math dataset in file order, cycled (a repeat gets a new id)."""
    rows = [json.loads(line) for line in (EXAMPLES / "data" / "math.jsonl").read_text().splitlines() if line]
    out = []
    for i in range(steps * batch_size):
        row = dict(rows[i % len(rows)])
        row["id"] = f"{row['id']}#{i // len(rows)}"
        out.append(row)
    return out


def train(framework: str, seed: int, sizes: Sizes) -> dict[str, Any]:
    """Train ``sizes.steps`` GRPO steps through one framework; the per-step reward means."""
    steps, B, G = sizes.steps, sizes.batch_size, sizes.group_size
    math_common.MAX_TOKENS = sizes.max_tokens  # the examples read it at every call
    torch.manual_seed(seed)
    config = ServerConfig(
        run_dir=Path(tempfile.mkdtemp(prefix=f"frameworks-{framework}-")),
        port=0,
        dtype="auto",
        mixed_precision=MixedPrecision.AUTO,
        device=sizes.device,
        torch_threads=sizes.threads,
        batch_window_s=sizes.batch_window_s,
        max_batch_size=max(32, B * G),
        sampling=SamplingDefaults(temperature=1.0),
        training=TrainingConfig(
            batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=B, group_size=G),
            trainer=TrainerConfig(lr=2e-4, micro_batch_size=8, lora=LoraSettings(r=16, alpha=32)),
            checkpoint_every=1000,
            max_steps=steps,
        ),
    )
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.1)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    workflow = load_workflow(EXAMPLES / FRAMEWORKS[framework])
    started = time.monotonic()

    async def go() -> Any:
        client = AsyncSwarmClient(url, client_id=f"bench-{framework}", retry=Runner.default_retry())
        try:
            runner = Runner(
                workflow,
                {"default": client},
                TaskSet(tasks(steps, B)),
                RunnerConfig(group_size=G, concurrency=B * G, infra_retries=5),
                console=Console(file=io.StringIO()),
                show_progress=False,
            )
            summary = await runner.run()
            # The last step trains once its last group finishes; an episode the runner gave up on (out of
            # retries) leaves its group short, and then no wait fills the step.
            done = time.monotonic()
            while (await client.status()).step < steps and time.monotonic() - done < 300:
                await asyncio.sleep(0.5)
            return summary
        finally:
            await client.aclose()

    try:
        summary = asyncio.run(go())
        history = server.config.app.state.runtime.training.history  # type: ignore[union-attr]
    finally:
        server.should_exit = True
        thread.join()
    rewards = [m.reward_mean for m in history if m.reward_mean is not None]
    return {
        "framework": framework,
        "seed": seed,
        "steps": len(history),
        "rewards": rewards,
        "first": rewards[0] if rewards else float("nan"),
        "final": statistics.fmean(rewards[-3:]) if rewards else float("nan"),
        "merge_ratio": statistics.fmean(m.merge_ratio for m in history) if history else float("nan"),
        "agent_failures": summary.agent_failures,
        "infra_failures": summary.infra_failures,
        "wall_s": time.monotonic() - started,
        "sizes": dataclasses.asdict(sizes),
    }


def _mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "–"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=list(FRAMEWORKS))
    parser.add_argument("--batch-size", type=int, default=4, help="B: tasks per step")
    parser.add_argument("--group-size", type=int, default=4, help="G: episodes per task")
    parser.add_argument(
        "--max-tokens", type=int, default=math_common.MAX_TOKENS, help="completion cap per call"
    )
    parser.add_argument("--batch-window", type=float, default=0.5, help="engine batch window, seconds")
    parser.add_argument("--device", default="cpu", help="torch device of the servers (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="also write the rows here (after every run)")
    parser.add_argument(
        "--report",
        type=Path,
        help="train nothing: print the table of rows saved by --json (say the same sizes)",
    )
    args = parser.parse_args()
    sizes = Sizes(
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        batch_window_s=args.batch_window,
        device=args.device,
        threads=args.threads,
    )
    console = Console(width=200)
    if args.report:
        saved = json.loads(args.report.read_text())
        if saved and "sizes" in saved[0]:
            sizes = Sizes(**saved[0]["sizes"])
        report(saved, sizes, console)
        return
    rows = []
    for seed in args.seeds:  # seeds outer: a cut-short run still has every framework at the first seed
        for framework in args.frameworks:
            console.print(f"training through {framework}, seed {seed} …")
            rows.append(train(framework, seed, sizes))
            row = rows[-1]
            console.print(
                f"  {row['steps']} steps, rewards {[round(r, 3) for r in row['rewards']]}, {row['wall_s']:.0f} s"
            )
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2))
    report(rows, sizes, console)


def report(rows: list[dict[str, Any]], sizes: Sizes, console: Console) -> None:
    """Print the table, the spreads and the noise floor of ``rows`` (frameworks and seeds as they come)."""
    B, G = sizes.batch_size, sizes.group_size
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    table = Table(
        title=f"{sizes.steps} GRPO steps per run (B={B}×G={G}, max {sizes.max_tokens} tokens a call, LoRA r16, "
        f"lr 2e-4, embedded SmolLM2-135M on {sizes.device}), math task, seeds {seeds}"
    )
    for column in (
        "framework",
        "seeds",
        "reward step 1",
        "final reward (last 3 steps)",
        "calls/sample",
        "failures",
        "wall s",
    ):
        table.add_column(column, justify="right")
    finals: dict[str, float] = {}
    seed_stds = []
    for framework in frameworks:
        mine = [r for r in rows if r["framework"] == framework]
        final = [r["final"] for r in mine]
        finals[framework] = statistics.fmean(final)
        if len(final) > 1:
            seed_stds.append(statistics.stdev(final))
        table.add_row(
            framework,
            str(len(mine)),
            _mean_std([r["first"] for r in mine]),
            _mean_std(final),
            f"{statistics.fmean(r['merge_ratio'] for r in mine):.2f}",
            f"{sum(r['agent_failures'] for r in mine)} agent / {sum(r['infra_failures'] for r in mine)} infra",
            f"{statistics.fmean(r['wall_s'] for r in mine):.0f}",
        )
    console.print(table)
    same_prompt = [f for f in finals if f != "anthropic"]
    for label, names in (("all frameworks", list(finals)), ("same prompt (no anthropic)", same_prompt)):
        if len(names) > 1:
            values = [finals[f] for f in names]
            console.print(
                f"spread of final reward, {label}: {max(values) - min(values):.3f} "
                f"(max {max(names, key=finals.__getitem__)}, min {min(names, key=finals.__getitem__)})"
            )
    if seed_stds:
        console.print(
            f"seed-to-seed std of one framework's final reward (median of {len(seed_stds)}): "
            f"{statistics.median(seed_stds):.3f}"
        )
    # Binomial standard error of one run's final reward (last 3 steps, 3·B·G episodes) at the mean reward.
    p = statistics.fmean(r["final"] for r in rows)
    episodes = min(3, sizes.steps) * B * G
    console.print(
        f"sampling standard error of one run's final reward at reward {p:.3f}: "
        f"{(p * (1 - p) / episodes) ** 0.5:.3f} ({episodes} episodes); of a mean over {len(seeds)} seeds: "
        f"{(p * (1 - p) / (episodes * len(seeds))) ** 0.5:.3f}"
    )


if __name__ == "__main__":
    main()
