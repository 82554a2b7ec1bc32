"""Bench: prefix-merged against unmerged training on linear multi-turn episodes.

The merge rule is docs/ARCHITECTURE.md §Sample.

Builds ``--episodes`` synthetic episodes of ``--calls`` calls with the shape of real agent traffic (a
1–2k-token system + tools prefix, 100–300 tokens per turn, some tool-call turns, some completions with
non-canonical token splits), renders every request with :class:`~swarm.tracking.render.PromptRenderer`
(token splicing) and the embedded model's tokenizer, merges the calls with
:func:`~swarm.tracking.merge.build_samples`, then trains a random-init model of the embedded
architecture (SmolLM2-135M config, fp32) both ways:

- **unmerged**: every trainable call is its own sequence ``prompt + completion``, loss on its completion;
- **merged**: every sample is one sequence, loss on its mask.

Both minimise the same objective, ``J = -Σ_e (1/N_e) Σ_{t ∈ completions of e} log π(x_t | x_<t)``
(``N_e`` = trained tokens of episode ``e``; the merged coefficients come from
:func:`~swarm.tracking.merge.token_loss_weights`, i.e. the trainer contract of ``LossWeighting.EPISODE``),
so their gradients must agree to float precision; the bench reports the largest absolute difference.
Logits are computed only at target positions on both sides (as a trainer does).

Usage::

    .venv/bin/python bench/merge.py                     # full 135M model on CPU (a few minutes)
    .venv/bin/python bench/merge.py --layers 4 --repeats 1   # quick look
    .venv/bin/python bench/merge.py --device cuda

Measured 2026-11-30 (random-init SmolLM2-135M, 30 layers, fp32; seed 0, one 12-call episode unless noted):

=========================  ==============  ==============  ========================
setting                    tokens ratio    update speed-up  max |Δgrad| (max |grad|)
=========================  ==============  ==============  ========================
H200, median of 5          9.29× (45,916   8.12× (3.11 s   4.3e-07 (0.44)
                           → 4,943)        → 0.38 s)
H200, 4 episodes, seed 1   8.52×           7.46×           1.1e-06 (1.43)
CPU 16 threads, 1 repeat   9.29×           8.71× (108.7 s  3.9e-07 (0.44)
                                           → 12.5 s)
=========================  ==============  ==============  ========================
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import typer
from rich.console import Console
from rich.table import Table

from swarm.tracking.merge import aggregate_stats, build_samples, token_loss_weights
from swarm.tracking.records import CallRecord, FinishReason, Sample
from swarm.tracking.render import PromptRenderer
from swarm.tracking.toolcalls import parse_tool_calls

WORDS = [
    "the",
    "model",
    "agent",
    "tool",
    "call",
    "result",
    "value",
    "file",
    "line",
    "error",
    "test",
    "passes",
    "fails",
    "we",
    "should",
    "check",
    "compute",
    "sum",
    "list",
    "index",
    "return",
    "function",
    "output",
    "input",
    "number",
    "step",
    "plan",
    "next",
    "then",
    "because",
    "therefore",
    "answer",
    "query",
    "search",
    "page",
    "table",
    "row",
    "column",
    "data",
    "path",
    "read",
    "write",
    "update",
    "config",
    "server",
    "request",
    "response",
    "token",
    "prompt",
    "reward",
    "policy",
    "batch",
    "group",
    "sample",
    "merge",
    "prefix",
    "branch",
    "chain",
    "cache",
    "latency",
    "budget",
    "retry",
]
TOOL_NAMES = ["search", "read_file", "write_file", "run_tests", "calculator", "http_get"]

app = typer.Typer(add_completion=False)


def _words(rng: random.Random, n_tokens: int) -> str:
    """Random prose of roughly ``n_tokens`` tokens (about one token per common word)."""
    sentences = []
    count = 0
    while count < n_tokens:
        length = rng.randint(6, 16)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(length)).capitalize() + ".")
        count += length + 1
    return " ".join(sentences)


def _tools(rng: random.Random, target_tokens: int) -> list[dict[str, Any]]:
    per_tool = max(20, target_tokens // len(TOOL_NAMES))
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": _words(rng, per_tool),
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string"}},
                    "required": ["arg"],
                },
            },
        }
        for name in TOOL_NAMES
    ]


def _engine_ids(tokenizer: Any, rng: random.Random, text: str, eos_id: int) -> list[int]:
    """Completion ids for ``text`` as an engine might sample them: some words split non-canonically."""
    ids: list[int] = []
    for k, piece in enumerate(text.split(" ")):
        chunk = piece if k == 0 else " " + piece
        if len(chunk) > 3 and rng.random() < 0.1:
            cut = rng.randint(1, len(chunk) - 1)
            ids += tokenizer.encode(chunk[:cut], add_special_tokens=False)
            ids += tokenizer.encode(chunk[cut:], add_special_tokens=False)
        else:
            ids += tokenizer.encode(chunk, add_special_tokens=False)
    return [*ids, eos_id]


def build_episode(renderer: PromptRenderer, rng: random.Random, calls: int) -> list[CallRecord]:
    """One linear episode: system + tools prefix of 1–2k tokens, ``calls`` turns of 100–300 tokens."""
    tokenizer: Any = renderer.tokenizer
    eos_id = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    prefix = rng.randint(1000, 2000)
    tools = _tools(rng, prefix // 2)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _words(rng, prefix // 2)},
        {"role": "user", "content": _words(rng, 60)},
    ]
    records: list[CallRecord] = []
    for index in range(calls):
        turn = rng.randint(100, 300)
        completion_tokens = int(turn * 0.7)
        rendered = renderer.render(messages, tools, history=records)
        use_tool = rng.random() < 0.5
        text = _words(rng, completion_tokens if not use_tool else completion_tokens - 25)
        if use_tool:
            arguments = {"arg": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))}
            text += (
                "\n<tool_call>\n"
                + json.dumps({"name": rng.choice(TOOL_NAMES), "arguments": arguments})
                + "\n</tool_call>"
            )
        completion_ids = _engine_ids(tokenizer, rng, text, eos_id)
        returned = tokenizer.decode(completion_ids, skip_special_tokens=True)
        content, tool_calls = parse_tool_calls(returned)
        records.append(
            CallRecord(
                index=index,
                prompt_ids=rendered.prompt_ids,
                completion_ids=completion_ids,
                logprobs=[0.0] * len(completion_ids),  # not used: the bench compares gradients, not ratios
                finish_reason=FinishReason.TOOL_CALLS if tool_calls else FinishReason.STOP,
                text=content or "",
                tool_calls=tool_calls,
                splices=rendered.splices,
                splice_mismatches=rendered.splice_mismatches,
            )
        )
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            reply["tool_calls"] = tool_calls
            messages += [
                reply,
                {
                    "role": "tool",
                    "tool_call_id": tool_calls[0]["id"],
                    "content": _words(rng, turn - completion_tokens),
                },
            ]
        else:
            messages += [reply, {"role": "user", "content": _words(rng, turn - completion_tokens)}]
    return records


@dataclass
class Sequence_:
    """One training sequence: ids (T,) and a loss coefficient per position (T,)."""

    ids_T: list[int]
    coeff_T: list[float]


def unmerged_sequences(episodes: list[list[CallRecord]]) -> list[Sequence_]:
    out = []
    for calls in episodes:
        n_trained = sum(len(c.completion_ids) for c in calls if c.trainable)
        for c in calls:
            if c.trainable:
                coeff = [0.0] * len(c.prompt_ids) + [1.0 / n_trained] * len(c.completion_ids)
                out.append(Sequence_(c.prompt_ids + c.completion_ids, coeff))
    return out


def merged_sequences(samples: list[Sample]) -> list[Sequence_]:
    # LossWeighting contract: Σ_s Σ_t token_loss_weights(s)[t]·ℓ_t / Σ_s weight_s, with Σ_s weight_s = #episodes;
    # the bench's objective sums (not averages) over episodes, so the division is left out on both sides.
    return [Sequence_(s.input_ids, token_loss_weights(s)) for s in samples]


def _loss(model: Any, seq: Sequence_, device: str) -> torch.Tensor:
    """``-Σ_t coeff[t] · log π(ids[t] | ids[:t])`` with logits only at target positions."""
    targets = [t for t, c in enumerate(seq.coeff_T) if c != 0.0 and t > 0]
    ids_1T = torch.tensor([seq.ids_T], device=device)  # (1, T)
    hidden_TD = model.model(input_ids=ids_1T).last_hidden_state[0]  # (T, D)
    positions_N = torch.tensor([t - 1 for t in targets], device=device)
    logits_NV = model.lm_head(hidden_TD[positions_N])  # (N, V)
    target_N = torch.tensor([seq.ids_T[t] for t in targets], device=device)
    logp_N = torch.log_softmax(logits_NV, dim=-1).gather(-1, target_N[:, None])[:, 0]
    coeff_N = torch.tensor([seq.coeff_T[t] for t in targets], device=device)
    return -(coeff_N * logp_N).sum()


def train_step(model: Any, sequences: list[Sequence_], device: str) -> tuple[float, dict[str, torch.Tensor]]:
    """Zero grads, forward + backward every sequence (accumulating); seconds and the gradients."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    model.zero_grad(set_to_none=True)
    for seq in sequences:
        loss: Any = _loss(model, seq, device)
        loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return seconds, grads


@app.command()
def main(
    episodes: int = typer.Option(1, help="Episodes to build and train on."),
    calls: int = typer.Option(12, help="Calls (turns) per episode."),
    repeats: int = typer.Option(3, help="Timed repeats per variant (the median is reported)."),
    layers: int = typer.Option(0, help="Override the number of layers (0: the full config)."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    threads: int = typer.Option(0, help="torch CPU threads (0: torch's default)."),
    seed: int = typer.Option(0),
    model_dir: str = typer.Option(
        "", help="HF model dir for config + tokenizer (default: the embedded model)."
    ),
) -> None:
    """Merged vs unmerged: tokens through the trainer, forward + backward time, gradient agreement."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    console = Console()
    if threads:
        torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not model_dir:
        from swarm.engine.model_loading import resolve_model

        model_dir = str(resolve_model(None).directory)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    renderer = PromptRenderer(tokenizer)
    rng = random.Random(seed)
    episode_calls = [build_episode(renderer, rng, calls) for _ in range(episodes)]
    built = [build_samples(f"ep{k}", c) for k, c in enumerate(episode_calls)]
    samples = [s for ss, _ in built for s in ss]
    stats = aggregate_stats(st for _, st in built)

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    if layers:
        config.num_hidden_layers = layers
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(config)
    model = model.to(device=device, dtype=torch.float32).train()
    n_params = sum(p.numel() for p in model.parameters())

    unmerged = unmerged_sequences(episode_calls)
    merged = merged_sequences(samples)
    tokens_unmerged = sum(len(s.ids_T) for s in unmerged)
    tokens_merged = sum(len(s.ids_T) for s in merged)
    loss_tokens = sum(1 for s in merged for c in s.coeff_T if c)
    console.print(
        f"[bold]{episodes} episode(s) × {calls} calls[/]: {stats.samples} sample(s), merge ratio "
        f"{stats.merge_ratio:.1f}, splices {stats.splices}, splice mismatches {stats.splice_mismatches}, "
        f"prefix breaks {stats.prefix_breaks or 'none'}; model {n_params / 1e6:.0f}M params, "
        f"{config.num_hidden_layers} layers, fp32, {device}, {torch.get_num_threads()} threads"
    )

    train_step(model, merged, device)  # warm-up (allocator, kernels)
    times_merged, times_unmerged = [], []
    grads_merged = grads_unmerged = None
    for _ in range(repeats):
        seconds, grads_unmerged = train_step(model, unmerged, device)
        times_unmerged.append(seconds)
        seconds, grads_merged = train_step(model, merged, device)
        times_merged.append(seconds)
    assert grads_merged is not None and grads_unmerged is not None
    max_diff = max((grads_merged[n] - grads_unmerged[n]).abs().max().item() for n in grads_unmerged)
    max_grad = max(g.abs().max().item() for g in grads_unmerged.values())

    t_unmerged, t_merged = statistics.median(times_unmerged), statistics.median(times_merged)
    table = Table(title="Prefix merging: one training update (forward + backward)")
    table.add_column("metric")
    table.add_column("unmerged", justify="right")
    table.add_column("merged", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target", justify="right")
    table.add_row(
        "sequences", str(len(unmerged)), str(len(merged)), f"{len(unmerged) / len(merged):.1f}×", ""
    )
    table.add_row(
        "tokens through the trainer",
        f"{tokens_unmerged:,}",
        f"{tokens_merged:,}",
        f"{tokens_unmerged / tokens_merged:.2f}×",
        "≥ 8×",
    )
    table.add_row("loss tokens (identical)", f"{loss_tokens:,}", f"{loss_tokens:,}", "1.00×", "")
    table.add_row(
        f"update time, median of {repeats} (s)",
        f"{t_unmerged:.2f}",
        f"{t_merged:.2f}",
        f"{t_unmerged / t_merged:.2f}×",
        "≥ 6.25×",
    )
    table.add_row(
        "max |grad merged − grad unmerged|", "", f"{max_diff:.2e}", f"(max |grad| {max_grad:.2e})", "≤ 1e-5"
    )
    console.print(table)
    ok = tokens_unmerged / tokens_merged >= 8 and t_unmerged / t_merged >= 6.25 and max_diff <= 1e-5
    console.print("[green]all targets met[/]" if ok else "[red]a target was missed[/]")


if __name__ == "__main__":
    app()
