"""Text-level merging (``MergeMode.TEXT``) on a think-stripping Qwen3-style template with the real tokenizer:
the turns of a conversation join one sample, which is the trajectory as sampled, and trains with the
gradient of the same sample built by hand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from tracking_sim import Sim, TemplateSetup

from swarm.tracking.merge import MergeMode, build_samples, visible_answer
from swarm.tracking.records import Sample
from swarm.train import TorchTrainer, TrainerConfig

TURNS = 3


def _decoder(setup: TemplateSetup) -> Any:
    return lambda ids: setup.tokenizer.decode(list(ids), skip_special_tokens=False)


def _think_chat(sim: Sim, turns: int = TURNS) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Think first."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"What is {k}+1?"})
        _, reply = sim.call(messages, sim.ids(f"<think>\n{k} plus one\n</think>\n\n{k + 1}"))
        messages.append(reply)


def _by_hand(sim: Sim) -> Sample:
    """The trajectory as sampled: first prompt, then each completion and the next turn's new tokens."""
    ids = sim.ids
    calls = sim.calls
    input_ids, mask, logprobs = (
        list(calls[0].prompt_ids),
        [0] * len(calls[0].prompt_ids),
        [0.0] * len(calls[0].prompt_ids),
    )
    for k, call in enumerate(calls):
        if k > 0:  # the template's text between turns: end of line, the user turn, the generation prompt
            delta = ids(f"\n<|im_start|>user\nWhat is {k}+1?<|im_end|>\n<|im_start|>assistant\n", eos=False)
            input_ids += delta
            mask += [0] * len(delta)
            logprobs += [0.0] * len(delta)
        input_ids += call.completion_ids
        mask += [1] * len(call.completion_ids)
        logprobs += call.logprobs
    return Sample(
        episode_id="ep",
        index=0,
        input_ids=input_ids,
        loss_mask=mask,
        behaviour_logprobs=logprobs,
        call_ids=[0] * len(input_ids),
        calls=[c.index for c in calls],
    )


def test_visible_answer_follows_the_qwen3_rule() -> None:
    assert visible_answer("<think>\nx\n</think>\n\n42<|im_end|>") == "42<|im_end|>"
    assert visible_answer("a</think>b</think>\nc") == "c"
    assert visible_answer("no thinking") == "no thinking"


def test_text_merge_joins_think_stripped_turns_into_one_sample(setups: dict[str, TemplateSetup]) -> None:
    setup = setups["qwen3"]
    sim = Sim(setup)
    _think_chat(sim)
    token_samples, token_stats = build_samples("ep", sim.calls)
    samples, stats = build_samples("ep", sim.calls, merge=MergeMode.TEXT, decode=_decoder(setup))
    assert token_stats.merge_ratio == 1.0 and len(token_samples) == TURNS and token_stats.text_merges == 0
    assert token_stats.token_breaks == TURNS - 1
    assert stats.merge_ratio == float(TURNS) and stats.samples == 1
    assert stats.text_merges == TURNS - 1 and stats.token_breaks == TURNS - 1
    (sample,) = samples
    expected = _by_hand(sim)
    assert sample.input_ids == expected.input_ids
    assert sample.loss_mask == expected.loss_mask
    assert sample.behaviour_logprobs == expected.behaviour_logprobs
    assert sample.calls == [0, 1, 2] and sample.weight == 1.0
    # every trained token is a token the engine sampled, <think> included; each exactly once
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m] == [
        t for c in sim.calls for t in c.completion_ids
    ]
    assert stats.trained_tokens == token_stats.trained_tokens
    assert setup.tokenizer.decode(sample.input_ids).count("<think>") == TURNS


def test_text_merge_changes_nothing_where_tokens_merge(setups: dict[str, TemplateSetup]) -> None:
    setup = setups["smollm2"]
    sim = Sim(setup)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be terse."}]
    for k in range(3):
        messages.append({"role": "user", "content": f"{k}+{k}?"})
        _, reply = sim.call(messages, sim.ids(f"It is {2 * k}."))
        messages.append(reply)
    sim.call([{"role": "user", "content": "unrelated"}], sim.ids("ok"))
    token = build_samples("ep", sim.calls)
    text = build_samples("ep", sim.calls, merge=MergeMode.TEXT, decode=_decoder(setup))
    assert [s.model_dump() for s in token[0]] == [s.model_dump() for s in text[0]]
    assert text[1].text_merges == 0 and text[1].samples == 2


def test_text_merge_needs_a_decoder(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["qwen3"])
    _think_chat(sim, 1)
    with pytest.raises(ValueError, match="decode"):
        build_samples("ep", sim.calls, merge=MergeMode.TEXT)


def _trainer_gradients(model: Any, samples: list[Sample], advantage: float) -> dict[str, torch.Tensor]:
    trainer = TorchTrainer(model, TrainerConfig(lr=0.0, max_grad_norm=None), pad_token_id=0)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    captured: dict[str, torch.Tensor] = {}

    def grab(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                captured[names[id(p)]] = p.grad.detach().clone()

    trainer.optimizer.register_step_pre_hook(grab)
    trainer.step(samples, [advantage] * len(samples))
    return captured


def test_text_merged_sample_trains_with_the_gradient_of_the_hand_built_one(
    setups: dict[str, TemplateSetup], tiny_model: Any
) -> None:
    setup = setups["qwen3"]
    sim = Sim(setup)
    _think_chat(sim)
    (merged,), _ = build_samples("ep", sim.calls, merge=MergeMode.TEXT, decode=_decoder(setup))
    advantage = 0.7
    got = _trainer_gradients(copy.deepcopy(tiny_model), [merged], advantage)
    # by hand: one update, so π_θ_old = π_θ (ratio 1) and ∇ loss = -A · mean over trained tokens of ∇ log π
    hand = _by_hand(sim)
    model = copy.deepcopy(tiny_model).train()
    ids = torch.tensor([hand.input_ids])
    logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    token_logp = logp.gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(hand.loss_mask[1:], dtype=torch.bool)
    (-advantage * token_logp[mask].mean()).backward()
    expected = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    for name, grad in got.items():
        assert torch.allclose(grad, expected[name], atol=1e-6, rtol=1e-4), name
    assert any(float(g.abs().max()) > 1e-4 for g in got.values())
