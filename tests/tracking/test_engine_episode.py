"""End to end with a real engine: a tiny random model of the embedded architecture samples arbitrary
token sequences (rarely the tokenizer's canonical split); rendering with splicing still chains every
turn into one sample, while naive re-tokenization would have drifted."""

from __future__ import annotations

from typing import Any

from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams
from swarm.tracking.merge import build_samples, call_sequences
from swarm.tracking.records import CallRecord
from swarm.tracking.render import PromptRenderer


async def test_sampled_multi_turn_episode_merges_token_exactly(
    tiny_engine: HFEngine, smol_tokenizer: Any
) -> None:
    renderer = PromptRenderer(smol_tokenizer)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    calls: list[CallRecord] = []
    drifted = 0
    for turn in range(4):
        messages.append({"role": "user", "content": f"Turn {turn}: say something."})
        rendered = renderer.render(messages, history=calls)
        naive = smol_tokenizer.encode(rendered.text, add_special_tokens=False)
        drifted += naive != rendered.prompt_ids
        (completion,) = await tiny_engine.generate(
            rendered.prompt_ids, SamplingParams(max_tokens=8, seed=turn)
        )
        calls.append(
            CallRecord(
                index=turn,
                prompt_ids=rendered.prompt_ids,
                completion_ids=completion.ids,
                logprobs=completion.logprobs,
                finish_reason=completion.finish_reason,
                text=completion.text,
                splices=rendered.splices,
                splice_mismatches=rendered.splice_mismatches,
            )
        )
        messages.append({"role": "assistant", "content": completion.text})
    assert drifted > 0  # the sampled ids are not what re-tokenizing the text gives
    (sample,), stats = build_samples("ep", calls)
    assert sample.calls == [0, 1, 2, 3] and stats.prefix_breaks == {} and stats.splice_mismatches == 0
    assert stats.splices == 0 + 1 + 2 + 3
    for index, ids in call_sequences(sample).items():
        assert ids == calls[index].prompt_ids + calls[index].completion_ids
    masked = [lp for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if m]
    assert masked == [lp for c in calls for lp in c.logprobs]


async def test_the_encode_cache_gives_the_same_ids_and_encodes_only_the_new_text(
    tiny_engine: HFEngine, smol_tokenizer: Any, monkeypatch: Any
) -> None:
    """Each call re-renders the episode; with the cache it tokenizes only what came since the previous
    call, and every prompt is id for id the uncached renderer's."""
    encoded: list[str] = []
    encode = smol_tokenizer.encode

    def counting(text: str, **kwargs: Any) -> Any:
        encoded.append(text)
        return encode(text, **kwargs)

    monkeypatch.setattr(smol_tokenizer, "encode", counting)
    rendered_texts: list[str] = []
    apply = smol_tokenizer.apply_chat_template

    def counting_renders(*args: Any, **kwargs: Any) -> Any:
        rendered_texts.append(text := apply(*args, **kwargs))
        return text

    monkeypatch.setattr(smol_tokenizer, "apply_chat_template", counting_renders)
    cached, plain = PromptRenderer(smol_tokenizer), PromptRenderer(smol_tokenizer, cache_chars=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    calls: list[CallRecord] = []
    previous = ""
    for turn in range(4):
        messages.append({"role": "user", "content": f"Turn {turn}: say something."})
        encoded.clear()
        rendered_texts.clear()
        rendered = cached.render(messages, history=calls)
        new = "".join(encoded)
        assert rendered_texts == [rendered.text]  # the prefixes are earlier calls' prompts: cached
        assert rendered == plain.render(messages, history=calls)
        if turn:  # the previous prompt and completion came from the cache and the record
            assert rendered.splices == turn and 0 < len(new) <= len(rendered.text) - len(previous)
        previous = rendered.text
        (completion,) = await tiny_engine.generate(
            rendered.prompt_ids, SamplingParams(max_tokens=8, seed=turn)
        )
        calls.append(
            CallRecord(
                index=turn,
                prompt_ids=rendered.prompt_ids,
                completion_ids=completion.ids,
                logprobs=completion.logprobs,
                finish_reason=completion.finish_reason,
                text=completion.text,
            )
        )
        messages.append({"role": "assistant", "content": completion.text})
    encoded.clear()  # the next episode of the group: its first prompt is rendered and tokenized already
    rendered_texts.clear()
    first = cached.render(messages[:2])
    assert encoded == rendered_texts == [] and first == plain.render(messages[:2])
    dated = PromptRenderer(smol_tokenizer, "{{ strftime_now('%d %b %Y') }}{{ messages[0].content }}")
    rendered_texts.clear()  # a template that reads the date is rendered every time
    assert dated.render(messages[:1]) == dated.render(messages[:1]) and len(rendered_texts) == 2

    small = PromptRenderer(smol_tokenizer, cache_chars=120)  # bounded: the oldest texts go first
    for turn in range(4):
        assert small.render(messages[: 2 * turn + 2], history=calls) == plain.render(
            messages[: 2 * turn + 2], history=calls
        )
        assert 0 < small._encoded.chars <= 120
