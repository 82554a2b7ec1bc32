"""Prefix merging of recorded episodes into samples, on episodes rendered with real templates."""

from __future__ import annotations

from typing import Any

import pytest
from tracking_sim import Sim, TemplateSetup

from swarm.tracking.errors import MergeError
from swarm.tracking.merge import (
    LossWeighting,
    MergeStats,
    aggregate_stats,
    build_samples,
    call_sequences,
    token_loss_weights,
)
from swarm.tracking.records import CallRecord, FinishReason, Sample

ALL = ["smollm2", "llama3", "gemma", "qwen3"]


def _masked(sample: Sample) -> list[int]:
    return [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]


def _check_sample_against_calls(sample: Sample, calls: list[CallRecord]) -> None:
    """Every call on the chain is a prefix of the sample; masked tokens are exactly its completions."""
    by_index = {c.index: c for c in calls}
    assert (
        len(sample.input_ids)
        == len(sample.loss_mask)
        == len(sample.behaviour_logprobs)
        == len(sample.call_ids)
    )
    for index, ids in call_sequences(sample).items():
        call = by_index[index]
        assert ids == call.prompt_ids + call.completion_ids
        start = len(call.prompt_ids)
        assert sample.call_ids[start : start + len(call.completion_ids)] == [index] * len(call.completion_ids)


def _multi_turn(sim: Sim, turns: int, *, system: str = "You are terse.") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"Question {k}: what is {k}+{k}?"})
        _, reply = sim.call(messages, sim.ids(f"It is {2 * k}."))
        messages.append(reply)
    return messages


@pytest.mark.parametrize("name", ALL)
def test_linear_multi_turn_merges_into_one_sample(setups: dict[str, TemplateSetup], name: str) -> None:
    sim = Sim(setups[name])
    _multi_turn(sim, 4)
    samples, stats = build_samples("ep", sim.calls)
    assert len(samples) == 1
    (sample,) = samples
    last = sim.calls[-1]
    assert sample.input_ids == last.prompt_ids + last.completion_ids
    assert sample.calls == [0, 1, 2, 3] and sample.weight == 1.0
    assert _masked(sample) == [t for c in sim.calls for t in c.completion_ids]
    assert [lp for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if m] == [
        lp for c in sim.calls for lp in c.logprobs
    ]
    assert all(lp == 0.0 for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if not m)
    _check_sample_against_calls(sample, sim.calls)
    assert stats.calls == 4 and stats.samples == 1 and stats.merge_ratio == 4.0
    assert stats.prefix_breaks == {} and stats.splices == 0 + 1 + 2 + 3 and stats.splice_mismatches == 0
    assert stats.tokens_merged == len(sample.input_ids)
    assert stats.tokens_unmerged == sum(len(c.prompt_ids) + len(c.completion_ids) for c in sim.calls)
    assert stats.tokens_saved == stats.tokens_unmerged - stats.tokens_merged > 0
    assert stats.trained_tokens == sum(len(c.completion_ids) for c in sim.calls)


def test_think_stripping_starts_a_new_sample_per_turn(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["qwen3"])
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Think first."}]
    for k in range(3):
        messages.append({"role": "user", "content": f"What is {k}+1?"})
        _, reply = sim.call(messages, sim.ids(f"<think>\n{k} plus one\n</think>\n\n{k + 1}"))
        messages.append(reply)
    samples, stats = build_samples("ep", sim.calls)
    assert [s.calls for s in samples] == [[0], [1], [2]]
    assert stats.prefix_breaks == {"completion_rewritten": 2}
    assert stats.splice_mismatches == 0 + 1 + 2 and stats.splices == 0
    assert stats.merge_ratio == 1.0
    for sample in samples:
        _check_sample_against_calls(sample, sim.calls)
    # the rewritten history never fakes an extension: call 1's prompt does not contain call 0's completion
    first = sim.calls[0]
    assert sim.calls[1].prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] != (
        first.prompt_ids + first.completion_ids
    )


def test_think_kept_within_a_tool_loop_merges(setups: dict[str, TemplateSetup]) -> None:
    """Qwen3-style templates keep <think> after the last user turn: a tool loop inside one turn merges."""
    sim = Sim(setups["qwen3"], tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+3?"}]
    _, reply = sim.call(
        messages,
        sim.ids(
            '<think>\nuse add\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
        ),
    )
    messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "5"}]
    sim.call(messages, sim.ids("<think>\ndone\n</think>\n\n5"))
    samples, stats = build_samples("ep", sim.calls)
    assert [s.calls for s in samples] == [[0, 1]] and stats.splices == 1 and stats.prefix_breaks == {}


def test_interleaved_agents_give_two_samples(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    conv: dict[str, list[dict[str, Any]]] = {
        "a": [{"role": "system", "content": "You are the solver."}],
        "b": [{"role": "system", "content": "You are the critic."}],
    }
    for k in range(2):  # A1, B1, A2, B2
        for agent in ("a", "b"):
            conv[agent].append({"role": "user", "content": f"round {k} for {agent}"})
            _, reply = sim.call(conv[agent], sim.ids(f"{agent} says {k}"), agent=agent)
            conv[agent].append(reply)
    samples, stats = build_samples("ep", sim.calls)
    assert [(s.calls, s.agent) for s in samples] == [([0, 2], "a"), ([1, 3], "b")]
    assert stats.prefix_breaks == {} and stats.agent_switches == 3 and stats.merge_ratio == 2.0
    assert [s.weight for s in samples] == pytest.approx(
        [len(_masked(s)) / stats.trained_tokens for s in samples]
    )


def test_untrained_agent_tokens_stay_out_of_the_loss(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Propose."}]
    _, reply = sim.call(messages, sim.ids("Plan A."), agent="solver")
    messages += [reply, {"role": "user", "content": "Critic, respond."}]
    _, reply = sim.call(messages, sim.ids("Looks fine."), agent="critic", trainable=False)
    messages += [reply, {"role": "user", "content": "Solver, finish."}]
    sim.call(messages, sim.ids("Done."), agent="solver")
    (sample,), stats = build_samples("ep", sim.calls)
    assert sample.calls == [0, 1, 2]
    assert _masked(sample) == sim.calls[0].completion_ids + sim.calls[2].completion_ids
    critic = sim.calls[1]
    start = len(critic.prompt_ids)
    assert sample.loss_mask[start : start + len(critic.completion_ids)] == [0] * len(critic.completion_ids)
    assert sample.call_ids[start : start + len(critic.completion_ids)] == [1] * len(critic.completion_ids)
    assert stats.tokens_unmerged == sum(
        len(c.prompt_ids) + len(c.completion_ids) for c in sim.calls if c.trainable
    )


def test_only_untrained_chains_are_dropped(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    sim.call([{"role": "user", "content": "x"}], sim.ids("y"), agent="env", trainable=False)
    samples, stats = build_samples("ep", sim.calls)
    assert samples == [] and stats.untrained_chains == 1 and stats.samples == 0 and stats.merge_ratio == 0.0


@pytest.mark.parametrize("name", ["smollm2", "llama3"])
def test_truncated_middle_turn_resent_continues_token_exactly(
    setups: dict[str, TemplateSetup], name: str
) -> None:
    setup = setups[name]
    sim = Sim(setup)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Tell a story."}]
    _, reply = sim.call(messages, sim.ids("Once."))
    messages += [reply, {"role": "user", "content": "Longer."}]
    cut, reply = sim.call(messages, sim.ids("Once upon a time there", eos=False))  # max_tokens hit
    assert cut.finish_reason == FinishReason.LENGTH
    messages += [reply, {"role": "user", "content": "Go on."}]
    last, _ = sim.call(messages, sim.ids("was a cat."))
    (sample,), stats = build_samples("ep", sim.calls)
    assert sample.calls == [0, 1, 2] and stats.prefix_breaks == {}
    _check_sample_against_calls(sample, sim.calls)
    end = len(cut.prompt_ids) + len(cut.completion_ids)
    # the template closed the cut turn with its end token: a prompt token (mask 0) of the next call,
    # never a trained token the model did not sample
    assert sample.input_ids[end] == setup.eos_id
    assert sample.loss_mask[end] == 0 and sample.call_ids[end] == last.index


def test_truncated_turn_dropped_by_the_client_ends_its_chain(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Tell a story."}]
    sim.call(messages, sim.ids("Once upon a time there", eos=False))
    sim.call([*messages, {"role": "user", "content": "Please answer in one line."}], sim.ids("A cat."))
    samples, stats = build_samples("ep", sim.calls)
    assert [s.calls for s in samples] == [[0], [1]]
    assert stats.prefix_breaks == {"history_edited": 1}  # the cut turn (and its generation prompt) dropped
    assert sorted(t for s in samples for t in _masked(s)) == sorted(
        t for c in sim.calls for t in c.completion_ids
    )


def test_resampled_choices_share_the_prefix_and_train_it_once(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Pick a number."}]
    _, reply = sim.call(messages, sim.ids("Seven."))
    messages += [reply, {"role": "user", "content": "Another?"}]
    _, choice0 = sim.call(messages, sim.ids("Three."))  # choice 0
    sim.call(messages, sim.ids("Nine."))  # choice 1 (n=2): same prompt
    # the client continues with choice 0 (not the latest call): not another break
    sim.call([*messages, choice0, {"role": "user", "content": "Ok."}], sim.ids("Fine."))
    samples, stats = build_samples("ep", sim.calls)
    assert [s.calls for s in samples] == [[0, 1, 3], [0, 2]]
    assert stats.prefix_breaks == {"resampled": 1}
    assert _masked(samples[0]) == [t for k in (0, 1, 3) for t in sim.calls[k].completion_ids]
    assert _masked(samples[1]) == sim.calls[2].completion_ids  # call 0 already trained in sample 0
    for sample in samples:
        _check_sample_against_calls(sample, sim.calls)


def test_break_causes_history_edit_and_new_context(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    system = "You are a careful assistant. " * 20
    messages = _multi_turn(sim, 3, system=system)
    # the agent summarises its history: keeps the system prompt, drops the turns
    sim.call(
        [messages[0], {"role": "user", "content": "Summary: three sums done. Next: 9+9?"}], sim.ids("18.")
    )
    # a sub-agent under the same name with its own system prompt
    sim.call([{"role": "system", "content": "Sub-agent."}, {"role": "user", "content": "hi"}], sim.ids("ok"))
    samples, stats = build_samples("ep", sim.calls)
    assert [s.calls for s in samples] == [[0, 1, 2], [3], [4]]
    assert stats.prefix_breaks == {"history_edited": 1, "new_context": 1}


def test_loss_weighting_modes(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["qwen3"])
    messages: list[dict[str, Any]] = []
    for k, answer in enumerate(
        ["<think>\nshort\n</think>\n\n1", "<think>\na much longer thought here\n</think>\n\n22"]
    ):
        messages.append({"role": "user", "content": f"q{k}"})
        _, reply = sim.call(messages, sim.ids(answer))
        messages.append(reply)
    n = [len(c.completion_ids) for c in sim.calls]
    episode, _ = build_samples("ep", sim.calls)
    assert [s.weight for s in episode] == pytest.approx([n[0] / sum(n), n[1] / sum(n)])
    assert sum(s.weight for s in episode) == pytest.approx(1.0)
    per_sample, _ = build_samples("ep", sim.calls, LossWeighting.SAMPLE)
    assert [s.weight for s in per_sample] == [1.0, 1.0]
    per_token, _ = build_samples("ep", sim.calls, LossWeighting.TOKEN)
    assert [s.weight for s in per_token] == [float(n[0]), float(n[1])]
    # episode mode: every trained token of the episode gets coefficient 1 / N_e, however it was split
    coefficients = [w for s in episode for w, m in zip(token_loss_weights(s), s.loss_mask, strict=True) if m]
    assert coefficients == pytest.approx([1 / sum(n)] * sum(n))
    merged_sim = Sim(setups["smollm2"])
    _multi_turn(merged_sim, 2)
    (merged,), _ = build_samples("ep2", merged_sim.calls)
    total = sum(merged.loss_mask)
    assert [
        w for w, m in zip(token_loss_weights(merged), merged.loss_mask, strict=True) if m
    ] == pytest.approx([1 / total] * total)


def test_aggregate_stats_over_a_batch(setups: dict[str, TemplateSetup]) -> None:
    stats: list[MergeStats] = []
    for name in ("smollm2", "qwen3"):
        sim = Sim(setups[name])
        messages: list[dict[str, Any]] = []
        for k in range(3):
            messages.append({"role": "user", "content": f"q{k}"})
            _, reply = sim.call(messages, sim.ids(f"<think>\nt{k}\n</think>\n\na{k}"))
            messages.append(reply)
        stats.append(build_samples(name, sim.calls)[1])
    total = aggregate_stats(stats)
    assert total.episodes == 2 and total.calls == 6 and total.samples == 1 + 3
    assert total.merge_ratio == pytest.approx(6 / 4)
    assert total.prefix_breaks == {"completion_rewritten": 2}
    assert total.tokens_saved == sum(s.tokens_saved for s in stats)
    assert aggregate_stats([]).merge_ratio == 0.0


def test_inconsistent_records_raise_merge_error() -> None:
    good = CallRecord(
        index=0, prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5], finish_reason=FinishReason.STOP
    )
    bad = good.model_copy(update={"index": 1, "logprobs": []})
    with pytest.raises(MergeError, match="1 completion ids") as info:
        build_samples("ep", [good, bad])
    assert isinstance(info.value, ValueError) and info.value.call_index == 1
    with pytest.raises(MergeError, match="duplicate"):
        build_samples("ep", [good, good])
    assert build_samples("ep", []) == ([], MergeStats(calls=0))


def test_calls_in_any_order_give_the_same_samples(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["gemma"])
    _multi_turn(sim, 3)
    assert build_samples("ep", list(reversed(sim.calls))) == build_samples("ep", sim.calls)


def _record(
    index: int, prompt: list[int], completion: list[int], agent: str = "a", trainable: bool = True
) -> CallRecord:
    return CallRecord(
        index=index,
        agent=agent,
        trainable=trainable,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-1.0] * len(completion),
        finish_reason=FinishReason.STOP,
    )


def test_the_worked_example_of_the_module_docstring() -> None:
    S, U1, X0, S_, V1, Y1, R1, X2, U2, X3, U3, X4 = (
        [1, 2, 3],
        [4],
        [5, 6],
        [7, 8],
        [9],
        [10],
        [11],
        [12],
        [13],
        [14],
        [15],
        [16],
    )
    X0_, X2_, X3_ = [17], [18], [19]  # the same turns with their <think> blocks stripped
    calls = [
        _record(0, S + U1, X0),
        _record(1, S_ + V1, Y1, agent="b", trainable=False),
        _record(2, S + U1 + X0 + R1, X2),
        _record(3, S + U1 + X0 + R1 + X2 + U2, X3),
        _record(4, S + U1 + X0_ + R1 + X2_ + U2 + X3_ + U3, X4),
    ]
    samples, stats = build_samples("ep", calls)
    assert [(s.index, s.calls) for s in samples] == [(0, [0, 2, 3]), (1, [4])]
    assert samples[0].input_ids == S + U1 + X0 + R1 + X2 + U2 + X3
    assert _masked(samples[0]) == X0 + X2 + X3 and _masked(samples[1]) == X4
    assert stats.untrained_chains == 1 and stats.prefix_breaks == {"completion_rewritten": 1}
    assert stats.agent_switches == 2
