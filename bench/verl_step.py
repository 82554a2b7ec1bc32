"""Bench: the verl trainer backend against the torch trainer on one GPU (issue 16, part 3).

**Fixed-seed batch** (``--part batch``). The embedded SmolLM2-135M-Instruct (fp32) is loaded twice on
the GPU: a :class:`~swarm.train.TorchTrainer` updates one copy, a :class:`~swarm.train.verl_backend.VerlTrainer`
(verl 0.9.1, FSDP2 actor in a one-GPU Ray worker group, SDPA) the other, on the same batch for
``--steps`` steps: ``--groups`` GRPO groups of ``--group-size`` samples, each a real chat prompt plus
``--completion`` completion tokens sampled from the model with a fixed seed, rewards drawn with a fixed
seed, our GRPO advantages. Printed per step: loss and policy loss of each backend, the largest weight
difference between the two copies next to the largest change of the torch copy since the start (the
update size), and each step's wall time; then the verl/torch ratio of the median step times (steps 2 and
later: the first verl step starts Ray and FSDP, reported on its own line).

**End to end** (``--part serve``). ``swarm serve --trainer verl --engine vllm --device cuda`` (and the same
with ``--trainer torch``) as a subprocess, trained for ``--serve-steps`` steps by ``swarm run
examples/math_openai.py`` clients over HTTP (``tasks`` policy, B = 2, G = 4); printed per step: reward
mean, loss and the step's time from ``GET /api/v1/metrics``.

Usage, on the GPU host with the vLLM bundle plus ``bench/verl-gpu-requirements.txt`` on PYTHONPATH::

    python bench/verl_step.py --json out.json                      # both parts, ~5 minutes
    python bench/verl_step.py --part batch --trainers torch --device cpu --steps 2 --groups 1   # CPU smoke run
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import torch
import typer
from rich.console import Console
from rich.table import Table

from swarm.engine import load_model, resolve_model
from swarm.tracking.records import Sample
from swarm.train import StepMetrics, TorchTrainer, TrainerConfig, VerlSettings
from swarm.train.losses import episode_advantages

ROOT = Path(__file__).resolve().parent.parent
console = Console(width=None if sys.stdout.isatty() else 150)
QUESTIONS = [
    "What is 12 + 7?",
    "Name a prime number larger than 20.",
    "Say hello in French.",
    "What colour is the sky on a clear day?",
    "Give one word that rhymes with cat.",
    "What is 9 times 8?",
    "Write a very short haiku about rain.",
    "Which is larger, 0.3 or 0.25?",
]


def fixed_batch(
    model: Any, tokenizer: Any, groups: int, group_size: int, completion: int, seed: int
) -> tuple[list[Sample], list[float], list[float]]:
    """``groups × group_size`` samples: a chat prompt, then ``completion`` tokens sampled by the model at
    temperature 1 (their recorded logprobs are the behaviour policy); rewards in {0, 1} from a seeded
    generator; our GRPO advantages per group."""
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    samples: list[Sample] = []
    rewards: dict[str, float] = {}
    group_ids: dict[str, list[str]] = {}
    torch.manual_seed(seed)
    for k in range(groups):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[k % len(QUESTIONS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for j in range(group_size):
            ids = torch.tensor([prompt], device=device)
            with torch.no_grad():
                out = model.generate(
                    ids,
                    max_new_tokens=completion,
                    min_new_tokens=completion,
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            new = out.sequences[0, len(prompt) :].tolist()
            logprobs = [
                float(torch.log_softmax(logit[0].float(), -1)[tok])
                for logit, tok in zip(out.logits, new, strict=True)
            ]
            eid = f"g{k}-e{j}"
            samples.append(
                Sample(
                    episode_id=eid,
                    index=0,
                    input_ids=prompt + new,
                    loss_mask=[0] * len(prompt) + [1] * len(new),
                    behaviour_logprobs=[0.0] * len(prompt) + logprobs,
                    call_ids=[0] * (len(prompt) + len(new)),
                    calls=[0],
                    weight=1.0,
                )
            )
            rewards[eid] = float(torch.randint(0, 2, (1,), generator=g))
            group_ids.setdefault(f"g{k}", []).append(eid)
    adv = episode_advantages(group_ids, rewards)
    return samples, [adv[s.episode_id] for s in samples], list(rewards.values())


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        float((x.detach().float() - y.detach().float().to(x.device)).abs().max())
        for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )


def update_agreement(a: torch.nn.Module, b: torch.nn.Module, start: torch.nn.Module) -> tuple[float, float]:
    """How alike two trained copies' updates from ``start`` are, over all parameters flattened:
    ``(cosine(Δa, Δb), ‖a − b‖ / ‖Δa‖)`` with ``Δx = x − start``. The largest single-weight difference
    says little under Adam: its first step moves every weight by ≈ ±lr whatever the gradient's size, so a
    weight whose gradient is float noise moves by lr one way in one copy and the other way in the other."""
    dot = na = nb = nd = 0.0
    for x, y, z in zip(a.parameters(), b.parameters(), start.parameters(), strict=True):
        x0 = z.detach().float().to(x.device)
        da = x.detach().float() - x0
        db = y.detach().float().to(x.device) - x0
        dot += float((da * db).sum())
        na += float((da * da).sum())
        nb += float((db * db).sum())
        nd += float(((da - db) ** 2).sum())
    return dot / max((na * nb) ** 0.5, 1e-30), (nd / max(na, 1e-30)) ** 0.5


def part_batch(args: dict[str, Any]) -> dict[str, Any]:
    source = resolve_model(args["model"])
    device = args["device"]
    base, tokenizer = load_model(source, dtype="float32", device=device)
    base.eval()
    samples, advantages, rewards = fixed_batch(
        base, tokenizer, args["groups"], args["group_size"], args["completion"], args["seed"]
    )
    config = TrainerConfig(lr=args["lr"], micro_batch_size=args["micro_batch_size"])
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    start = copy.deepcopy(base)
    trainers: dict[str, Any] = {}
    startup: dict[str, float] = {}
    if "torch" in args["trainers"]:
        trainers["torch"] = TorchTrainer(copy.deepcopy(base), config, pad_token_id=pad)
    if "verl" in args["trainers"]:
        from swarm.train.verl_backend import VerlTrainer

        t0 = time.perf_counter()
        verl = VerlTrainer(
            copy.deepcopy(base), source.directory, config, pad, settings=VerlSettings(n_gpus_per_node=1)
        )
        verl._workers()  # Ray, the FSDP actor and its model load: timed apart from the steps
        startup["verl"] = time.perf_counter() - t0
        trainers["verl"] = verl
    rows: list[dict[str, Any]] = []
    for step in range(1, args["steps"] + 1):
        row: dict[str, Any] = {"step": step}
        for name, trainer in trainers.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            m: StepMetrics = trainer.step(samples, advantages, rewards=rewards)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            row[f"{name}_s"] = time.perf_counter() - t0
            row[f"{name}_loss"] = m.loss
            row[f"{name}_policy_loss"] = m.policy_loss
            row[f"{name}_grad_norm"] = m.grad_norm
            row[f"{name}_drift"] = m.logprob_drift_mean
            row[f"{name}_drift_max"] = m.logprob_drift_max
        if len(trainers) == 2:
            row["update_cos"], row["rel_diff"] = update_agreement(
                trainers["torch"].model, trainers["verl"].model, start
            )
            row["max_weight_diff"] = max_diff(trainers["torch"].model, trainers["verl"].model)
        if "torch" in trainers:
            row["max_update"] = max_diff(trainers["torch"].model, start)
        rows.append(row)
    table = Table(
        title=f"fixed-seed batch: {len(samples)} samples, {sum(sum(s.loss_mask) for s in samples)} trained tokens"
    )
    for col in rows[0]:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()])
    console.print(table)
    result: dict[str, Any] = {"rows": rows, "startup_s": startup, "samples": len(samples)}
    later = rows[1:] or rows
    for name in trainers:
        result[f"{name}_median_s"] = statistics.median(r[f"{name}_s"] for r in later)
    if len(trainers) == 2:
        ratio = result["verl_median_s"] / result["torch_median_s"]
        result["verl_torch_ratio"] = ratio
        console.print(
            f"median step (steps ≥ 2): verl {result['verl_median_s']:.3f} s / torch {result['torch_median_s']:.3f} s "
            f"= {ratio:.2f}; verl startup {startup['verl']:.1f} s"
        )
    return result


def _wait(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/status", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


def serve_run(trainer: str, args: dict[str, Any], run_root: Path, port: int) -> dict[str, Any]:
    """One server with ``--trainer``, trained by ``swarm run`` until ``--serve-steps`` steps."""
    run_dir = run_root / f"serve-{trainer}"
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).parent
    swarm = [str(exe / "swarm")] if (exe / "swarm").exists() else [sys.executable, "-m", "swarm.cli"]
    server = subprocess.Popen(
        [
            *swarm,
            "serve",
            "--trainer",
            trainer,
            "--engine",
            args["engine"],
            "--device",
            args["device"],
            "--run-dir",
            str(run_dir),
            "--port",
            str(port),
            "--batch-policy",
            "tasks",
            "--batch-size",
            "2",
            "--group-size",
            "4",
            "--lr",
            str(args["lr"]),
            "--max-steps",
            str(args["serve_steps"]),
            "--checkpoint-every",
            "100",
        ],
        stdout=(run_root / f"serve-{trainer}.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    client = None
    try:
        _wait(url, 600)
        t0 = time.perf_counter()
        client = subprocess.Popen(
            [
                *swarm,
                "run",
                str(ROOT / "examples" / "math_openai.py"),
                "--server",
                url,
                "--dataset",
                str(ROOT / "examples" / "data" / "math.jsonl"),
                "--group-size",
                "4",
                "--concurrency",
                "8",
                "--epochs",
                "5",
                "--state-dir",
                str(run_root / f"client-{trainer}"),
                "--fresh",
            ],
            stdout=(run_root / f"client-{trainer}.log").open("w"),
            stderr=subprocess.STDOUT,
            cwd=ROOT / "examples",
        )
        deadline = time.monotonic() + args["serve_timeout"]
        metrics: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            metrics = httpx.get(f"{url}/api/v1/metrics", timeout=10).json()
            if len(metrics) >= args["serve_steps"]:
                break
            if server.poll() is not None:
                raise RuntimeError(f"the {trainer} server exited; see {run_root / f'serve-{trainer}.log'}")
            time.sleep(2)
        wall = time.perf_counter() - t0
    finally:
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    table = Table(
        title=f"swarm serve --trainer {trainer} --engine {args['engine']}: {len(metrics)} steps in {wall:.0f} s"
    )
    for col in ("step", "episodes", "reward_mean", "loss", "grad_norm", "drift", "step_s"):
        table.add_column(col, justify="right")
    for m in metrics:
        table.add_row(
            str(m["step"]),
            str(m["episodes"]),
            f"{m['reward_mean']:.3f}",
            f"{m['loss']:.4f}",
            f"{m['grad_norm']:.3f}",
            f"{m['logprob_drift_mean']:.2e}",
            f"{m['time_s']['total_s']:.2f}",
        )
    console.print(table)
    return {"trainer": trainer, "steps": len(metrics), "wall_s": wall, "metrics": metrics}


def main(
    part: Annotated[str, typer.Option(help="batch | serve | both")] = "both",
    trainers: Annotated[str, typer.Option(help="Comma-separated: torch,verl")] = "torch,verl",
    model: Annotated[str | None, typer.Option(help="HF dir or GGUF (default: embedded)")] = None,
    device: Annotated[str, typer.Option()] = "cuda",
    engine: Annotated[str, typer.Option(help="serve part: hf | vllm")] = "vllm",
    steps: Annotated[int, typer.Option()] = 4,
    groups: Annotated[int, typer.Option()] = 4,
    group_size: Annotated[int, typer.Option()] = 4,
    completion: Annotated[int, typer.Option(help="Completion tokens per sample")] = 64,
    micro_batch_size: Annotated[int, typer.Option()] = 8,
    lr: Annotated[float, typer.Option()] = 1e-5,
    seed: Annotated[int, typer.Option()] = 0,
    serve_steps: Annotated[int, typer.Option()] = 3,
    serve_timeout: Annotated[float, typer.Option()] = 900.0,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    args = dict(locals())
    args["trainers"] = [t.strip() for t in trainers.split(",") if t.strip()]
    out: dict[str, Any] = {"args": {k: str(v) for k, v in args.items()}}
    if part in ("batch", "both"):
        out["batch"] = part_batch(args)
    if part in ("serve", "both"):
        run_root = Path(os.environ.get("OUT", "/tmp")) / "verl_step_runs"
        run_root.mkdir(parents=True, exist_ok=True)
        out["serve"] = [serve_run(t, args, run_root, 8700 + i) for i, t in enumerate(args["trainers"])]
        medians = {
            r["trainer"]: statistics.median(m["time_s"]["total_s"] for m in r["metrics"][1:] or r["metrics"])
            for r in out["serve"]
            if r["metrics"]
        }
        if {"torch", "verl"} <= set(medians):
            console.print(
                f"serve, median step (steps ≥ 2): verl {medians['verl']:.2f} s / torch {medians['torch']:.2f} s "
                f"= {medians['verl'] / medians['torch']:.2f}"
            )
        out["serve_median_step_s"] = medians
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    typer.run(main)
