"""Property-based tests (hypothesis) of prefix merging and token splicing."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracking_sim import Sim, TemplateSetup

from swarm.tracking.merge import LossWeighting, build_samples, call_sequences
from swarm.tracking.records import CallRecord, FinishReason

TOKENS = st.integers(min_value=0, max_value=4)  # a tiny vocabulary makes accidental prefixes likely


@st.composite
def episodes(draw: st.DrawFn) -> list[CallRecord]:
    """Random episodes: calls that extend, branch from, resample or ignore earlier calls."""
    calls: list[CallRecord] = []
    for index in range(draw(st.integers(min_value=1, max_value=9))):
        fulls = [c.prompt_ids + c.completion_ids for c in calls]
        mode = draw(st.sampled_from(["root", "extend", "branch", "resample"])) if calls else "root"
        if mode == "root":
            prompt = draw(st.lists(TOKENS, min_size=1, max_size=6))
        else:
            parent = draw(st.integers(min_value=0, max_value=len(calls) - 1))
            if mode == "extend":
                prompt = fulls[parent] + draw(st.lists(TOKENS, max_size=4))
            elif mode == "branch":
                cut = draw(st.integers(min_value=0, max_value=len(fulls[parent])))
                prompt = fulls[parent][:cut] + draw(st.lists(TOKENS, min_size=1, max_size=4))
            else:
                prompt = list(calls[parent].prompt_ids)
        completion = draw(st.lists(TOKENS, max_size=5))
        logprobs = draw(st.lists(st.floats(-20, 0), min_size=len(completion), max_size=len(completion)))
        calls.append(
            CallRecord(
                index=index,
                agent=draw(st.sampled_from(["a", "b"])),
                trainable=draw(st.booleans()),
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=logprobs,
                finish_reason=FinishReason.STOP,
            )
        )
    return calls


@settings(max_examples=300, deadline=None)
@given(calls=episodes(), weighting=st.sampled_from(list(LossWeighting)))
def test_merging_preserves_the_multiset_of_trainable_tokens(
    calls: list[CallRecord], weighting: LossWeighting
) -> None:
    samples, stats = build_samples("ep", calls, weighting)
    trained = Counter(
        (s.call_ids[t], s.input_ids[t], s.behaviour_logprobs[t])
        for s in samples
        for t, m in enumerate(s.loss_mask)
        if m
    )
    expected = Counter(
        (c.index, tok, lp)
        for c in calls
        if c.trainable
        for tok, lp in zip(c.completion_ids, c.logprobs, strict=True)
    )
    assert trained == expected
    assert stats.trained_tokens == sum(expected.values())
    assert stats.samples == len(samples) and stats.calls == len(calls)
    if samples and weighting is LossWeighting.EPISODE:
        assert abs(sum(s.weight for s in samples) - 1.0) < 1e-9


@settings(max_examples=300, deadline=None)
@given(calls=episodes())
def test_splitting_a_sample_at_call_boundaries_gives_back_each_call(calls: list[CallRecord]) -> None:
    by_index = {c.index: c for c in calls}
    samples, _ = build_samples("ep", calls)
    for sample in samples:
        pieces = call_sequences(sample)
        assert list(pieces) == sample.calls
        for index, ids in pieces.items():
            assert ids == by_index[index].prompt_ids + by_index[index].completion_ids
        for a, b in zip(sample.calls, sample.calls[1:], strict=False):  # a chain is a chain of extensions
            full_a = by_index[a].prompt_ids + by_index[a].completion_ids
            assert by_index[b].prompt_ids[: len(full_a)] == full_a and a < b
        for t, m in enumerate(sample.loss_mask):  # masked tokens lie in their call's completion span
            if m:
                call = by_index[sample.call_ids[t]]
                assert len(call.prompt_ids) <= t < len(call.prompt_ids) + len(call.completion_ids)


WORDS = st.sampled_from(["hello", "world", "4", "+", "=", "naïve", "日本", "tool", "<b>", "x_y", "!", "   "])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["smollm2", "llama3", "gemma", "qwen3"]),
    replies=st.lists(st.lists(WORDS, min_size=1, max_size=6), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=6),
)
def test_spliced_prompts_extend_every_earlier_call(
    setups: dict[str, TemplateSetup], name: str, replies: list[list[str]], cuts: list[int]
) -> None:
    """Random replies, tokenized in random character chunks (non-canonical ids), always merge."""
    setup = setups[name]
    sim = Sim(setup)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for k, words in enumerate(replies):
        text = " ".join(words).strip() or "ok"
        bounds = sorted({c for c in cuts if c < len(text)})
        chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
        ids = [t for chunk in chunks for t in setup.tokenizer.encode(chunk, add_special_tokens=False)]
        messages.append({"role": "user", "content": f"turn {k}"})
        _, reply = sim.call(messages, [*ids, setup.eos_id])
        messages.append(reply)
    samples, stats = build_samples("ep", sim.calls)
    assert [s.calls for s in samples] == [list(range(len(replies)))]
    assert stats.splice_mismatches == 0 and stats.splices == sum(range(len(replies)))
    for call in sim.calls:
        assert (
            setup.tokenizer.decode(call.prompt_ids, skip_special_tokens=False)
            == sim.render(messages[: 2 * call.index + 2]).text
        )
