"""LoRA tenants on every engine that can run here (`Engine.serve_adapter`, `SamplingParams.adapter`).

CI runs ``hf`` (CPU, the real embedded model). The ``vllm`` parameter needs vLLM and a CUDA GPU and is
skipped, with the reason, where either is missing; on the H200 the same file runs both (bench/README.md,
LoRA tenants).

What every engine promises:
- requests of different adapters (and of none: the base) are sampled concurrently, each with its own
  adapter: its recorded logprobs are those of the peft forward with that adapter;
- each completion carries its adapter's policy version;
- after ``serve_adapter`` with new weights (a tenant's step) that adapter samples the new weights as the
  new version, and the other adapters are unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from swarm.engine import HFEngine, ModelSource, load_model
from swarm.engine.base import Completion, SamplingParams
from swarm.train.adapters import add_adapter
from swarm.train.config import LoraSettings
from tests.conftest import vllm_skip_reason

LORA = LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
TOLERANCE = {"hf": 1e-4, "vllm": 0.15}
"""Mean |recorded − reference| logprob over a completion: hf samples from the reference module itself
(fp32); vLLM serves LoRA in bf16 only (its punica kernels), against the bf16 transformers forward of its
trainer copy. Measured on the H200 (2026-12-05): single tokens differ by up to 0.12, and the mean over an
8-token greedy completion was 0.068 and 0.084 for two adapter rows (a 0.05 bound failed on both), so
the bound is 0.15: it catches a gross error (no adapter, a stale version, a wrong scale), not bf16
rounding. What proves each row used its own adapter and version is relative and does not depend on
it: the recorded logprobs are more than twice nearer the row's own adapter (and version) than any
other's. Every gap is printed (``pytest -rP`` shows them) so a GPU run records them."""

ENGINES = [
    pytest.param("hf", marks=pytest.mark.slow),
    pytest.param(
        "vllm",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(vllm_skip_reason() is not None, reason=str(vllm_skip_reason())),
        ],
    ),
]


def _perturb(model: Any, name: str, seed: int) -> None:
    """Non-zero B matrices of adapter ``name`` (peft starts them at zero: the adapter would be the base).

    Scale 0.15: the adapters must move logprobs well beyond vLLM's bf16 rounding (a mean gap of up to
    0.084 on the H200) for the relative checks to tell them apart; at 0.05 two adapters' forwards were
    only 0.16-0.19 apart on some prompts (hf), under twice that rounding."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, param in model.named_parameters():
            if "lora_B" in key and f".{name}." in key:
                noise = torch.randn(param.shape, generator=generator) * 0.15
                param.copy_(noise.to(param.dtype))


@pytest.fixture(scope="module", params=ENGINES)
def served(request: pytest.FixtureRequest, embedded_source: ModelSource) -> Iterator[tuple[Any, Any, str]]:
    if request.param == "hf":
        model, tok = load_model(embedded_source)
        engine: Any = HFEngine(model, tok, embedded_source.name)
    else:
        from swarm.engine.vllm import VLLMEngine

        engine = VLLMEngine(
            embedded_source, dtype="bfloat16", gpu_memory_utilization=0.25, max_loras=2, max_lora_rank=LORA.r
        )
    peft = add_adapter(engine.trainable_module(), "alpha", LORA, seed=1)
    peft = add_adapter(peft, "beta", LORA, seed=2)
    _perturb(peft, "alpha", 1)
    _perturb(peft, "beta", 2)
    engine.serve_adapter("alpha", peft, 1)
    engine.serve_adapter("beta", peft, 1)
    yield engine, peft, request.param
    engine.close()


def _load(model: Any, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key in weights:
                param.copy_(weights[key])


def _prompt(engine: Any, text: str) -> list[int]:
    encoded = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return [int(i) for i in encoded["input_ids"]]


@torch.no_grad()
def _reference(peft: Any, prompt: list[int], completion: Completion, adapter: str | None) -> list[float]:
    """log_softmax of the peft forward with ``adapter`` at each completion id (fp32)."""
    device = next(peft.parameters()).device
    ids = torch.tensor([prompt + completion.ids], device=device)
    logits = peft(input_ids=ids, adapter_names=[adapter or "__base__"]).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(completion.ids, device=device)[:, None])[:, 0].tolist()


async def _together(engine: Any, prompts: list[list[int]], adapters: list[str | None]) -> list[Completion]:
    params = [SamplingParams(temperature=0.0, max_tokens=8, adapter=a) for a in adapters]
    answers = await asyncio.gather(*(engine.generate(p, q) for p, q in zip(prompts, params, strict=True)))
    return [a[0] for a in answers]


def _gap(reference: list[float], recorded: list[float]) -> float:
    """Mean absolute logprob difference over the completion's tokens."""
    return sum(abs(a - b) for a, b in zip(reference, recorded, strict=True)) / len(recorded)


def test_each_request_samples_its_own_adapter(served: tuple[Any, Any, str]) -> None:
    engine, peft, kind = served
    prompts = [_prompt(engine, t) for t in ("Name a colour.", "Count to three.", "Say hello.")]
    adapters: list[str | None] = ["alpha", "beta", None]
    completions = asyncio.run(_together(engine, prompts, adapters))
    assert [c.policy_version for c in completions] == [1, 1, 0]
    for prompt, adapter, completion in zip(prompts, adapters, completions, strict=True):
        assert completion.ids
        own = _gap(_reference(peft, prompt, completion, adapter), completion.logprobs)
        print(f"{kind}: {adapter or 'base'} row, mean gap to its own forward {own:.4f}")
        assert own < TOLERANCE[kind], (adapter, own)
        # each row sampled its own adapter: every other adapter's forward is farther from what it recorded
        for other in {"alpha", "beta", None} - {adapter}:
            farther = _gap(_reference(peft, prompt, completion, other), completion.logprobs)
            print(f"{kind}: {adapter or 'base'} row, mean gap to {other or 'base'}'s forward {farther:.4f}")
            assert farther > 2 * own, (adapter, other, own, farther)


def test_a_new_adapter_version_is_served_and_the_others_are_unchanged(served: tuple[Any, Any, str]) -> None:
    engine, peft, kind = served
    prompt = _prompt(engine, "Name a colour.")
    before = asyncio.run(_together(engine, [prompt, prompt], ["alpha", "beta"]))
    old_alpha = {k: v.detach().clone() for k, v in peft.named_parameters() if ".alpha." in k}
    _perturb(peft, "alpha", 11)
    engine.serve_adapter("alpha", peft, 2)
    # the same prompt again: its cached prompt blocks of version 1 must not serve version 2
    after = asyncio.run(_together(engine, [prompt, prompt], ["alpha", "beta"]))
    assert [c.policy_version for c in after] == [2, 1]
    new_gap = _gap(_reference(peft, prompt, after[0], "alpha"), after[0].logprobs)
    print(f"{kind}: alpha version 2, mean gap to its own forward {new_gap:.4f}")
    assert new_gap < TOLERANCE[kind]
    new_alpha = {k: v.detach().clone() for k, v in peft.named_parameters() if ".alpha." in k}
    _load(peft, old_alpha)
    old_gap = _gap(_reference(peft, prompt, after[0], "alpha"), after[0].logprobs)
    _load(peft, new_alpha)
    print(f"{kind}: alpha version 2's completion, mean gap to version 1's forward {old_gap:.4f}")
    assert old_gap > 2 * new_gap, "version 2's completion is no nearer version 2 than version 1"
    assert after[1].ids == before[1].ids
    assert _gap(before[1].logprobs, after[1].logprobs) < TOLERANCE[kind]
