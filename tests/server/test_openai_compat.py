"""The OpenAI-compatible surface, driven by the official SDKs against a real server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import torch
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI

from swarm.client import AsyncSwarmClient, SwarmClient

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def recompute_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """Naive reference: one unpadded forward pass, log_softmax, gather (fp32)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits.float()
    logprobs = torch.log_softmax(logits[0, len(prompt_ids) - 1 : -1], dim=-1)
    return logprobs.gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def test_models_list(server: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("models") as ep:
        models = OpenAI(base_url=ep.base_url, api_key=ep.api_key).models.list()
        assert [m.id for m in models.data] == [ep.model]
        ep.finish(0.0)


def test_sync_sdk_records_token_exact_call(server: Any, tokenizer: Any, tiny_model: Any) -> None:
    with SwarmClient(server.url) as client:
        with client.episode("sync") as ep:
            oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
            reply = oa.chat.completions.create(
                model=ep.model,
                messages=QUESTION,
                max_tokens=12,
                temperature=1.0,
                seed=7,
                logprobs=True,
                top_logprobs=3,
            )
            ep.finish(1.0)
        view = client.get_episode(ep.id)
    assert view.status == "finished" and view.reward == 1.0
    (call,) = view.calls
    choice = reply.choices[0]
    # the record is what the engine produced: ids decode to the returned text
    assert tokenizer.decode(call.completion_ids, skip_special_tokens=True).startswith(choice.message.content)
    assert call.text == choice.message.content
    assert reply.usage.prompt_tokens == len(call.prompt_ids)
    assert reply.usage.completion_tokens == len(call.completion_ids)
    # the prompt is the model's chat template rendered by the server
    expected = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(call.prompt_ids, skip_special_tokens=False) == expected
    # logprobs: same values on the wire and in the record, and equal to a forward recompute (fp32)
    wire = [t.logprob for t in choice.logprobs.content]
    assert wire == pytest.approx(call.logprobs, abs=0)
    assert all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    ref = recompute_logprobs(tiny_model, call.prompt_ids, call.completion_ids)
    assert torch.allclose(ref, torch.tensor(call.logprobs), atol=1e-4)
    assert call.sampling["seed"] == 7 and call.sampling["temperature"] == 1.0


def test_seed_is_reproducible_and_n_choices(server: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("seed") as ep:
        oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
        a = oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=8, seed=123)
        b = oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=8, seed=123)
        many = oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=8, n=3, seed=5)
        ep.finish(0.5)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert len(many.choices) == 3 and [c.index for c in many.choices] == [0, 1, 2]
    with SwarmClient(server.url) as client:
        assert (
            len(client.get_episode(ep.id, api_key=ep.api_key).calls) == 5
        )  # every choice is its own call record


def test_max_tokens_gives_length_and_stop_strings_cut_text(server: Any, tokenizer: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("limits") as ep:
        oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
        short = oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=3, temperature=0)
        assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
        longer = oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=12, temperature=0)
        text = longer.choices[0].message.content
        stop = text[4:6]
        cut = oa.chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=12, temperature=0, stop=[stop]
        )
        ep.finish(0.0)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.find(stop)]


async def test_async_sdk_and_streaming(server: Any) -> None:
    async with AsyncSwarmClient(server.url) as client:
        async with client.episode("async") as ep:
            oa = AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key)
            plain = await oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=10, seed=1)
            stream = await oa.chat.completions.create(
                model=ep.model,
                messages=QUESTION,
                max_tokens=10,
                seed=1,
                stream=True,
                stream_options={"include_usage": True},
            )
            pieces, finish, usage = [], None, None
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    pieces.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
            await ep.finish(0.25)
        view = await client.get_episode(ep.id)
    assert "".join(pieces) == plain.choices[0].message.content  # same seed, same text
    assert finish == plain.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == len(view.calls[1].completion_ids)
    assert view.calls[1].completion_ids == view.calls[0].completion_ids  # streamed call recorded too


def test_langchain_chat_openai(server: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("langchain") as ep:
        llm = ChatOpenAI(
            base_url=ep.base_url, api_key=ep.api_key, model=ep.model, max_tokens=8, temperature=0
        )
        message = llm.invoke("Say hi")
        ep.finish(1.0)
        view = client.get_episode(ep.id)
    assert len(view.calls) == 1 and message.content == view.calls[0].text


def test_raw_http_multi_turn_merges_into_one_sample(server: Any) -> None:
    with SwarmClient(server.url) as client:
        ep = client.begin("raw")
        headers = {"Authorization": f"Bearer {ep.api_key}"}
        messages: list[dict[str, Any]] = list(QUESTION)
        for turn in range(3):
            r = httpx.post(
                f"{ep.base_url}/chat/completions",
                json={"model": ep.model, "messages": messages, "max_tokens": 6, "seed": turn},
                headers=headers,
            )
            assert r.status_code == 200, r.text
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"and turn {turn}?"}]
        ep.finish(1.0)
        view = client.get_episode(ep.id)
    assert view.merge.calls == 3 and view.merge.samples == 1  # token splicing made every turn extend the last
    (sample,) = view.samples
    calls = view.calls
    assert sample.input_ids[: len(calls[-1].prompt_ids)] == calls[-1].prompt_ids
    assert sum(sample.loss_mask) == sum(len(c.completion_ids) for c in calls)


async def test_sixteen_concurrent_episodes_are_batched(server: Any) -> None:
    engine = server.runtime.engine
    before = engine.batches

    async def one(i: int, client: AsyncSwarmClient) -> str:
        async with client.episode(f"conc-{i % 4}", metadata={"i": i}) as ep:
            oa = AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key)
            r = await oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=16, seed=i)
            await ep.finish(float(i))
            return r.choices[0].message.content or ""

    async with AsyncSwarmClient(server.url) as client:
        texts = await asyncio.gather(*(one(i, client) for i in range(16)))
    assert len(texts) == 16
    assert engine.batches - before < 16  # concurrent requests shared generate batches


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("presence_penalty", 0.5, False),
        ("frequency_penalty", -1.0, False),
        ("logit_bias", {"42": 5.0}, False),
        ("response_format", {"type": "json_object"}, False),
        ("presence_penalty", 0, True),
        ("logit_bias", {}, True),
        ("response_format", {"type": "text"}, True),
    ],
)
def test_sampling_options_the_server_cannot_honour_are_refused_not_ignored(
    server: Any, field: str, value: Any, accepted: bool
) -> None:
    with SwarmClient(server.url) as client, client.episode("unsupported") as ep:
        answer = httpx.post(
            f"{ep.base_url}/chat/completions",
            json={"model": ep.model, "messages": QUESTION, "max_tokens": 2, field: value},
            headers={"Authorization": f"Bearer {ep.api_key}"},
        )
        ep.finish(0.0)
    if accepted:
        assert answer.status_code == 200, answer.text
    else:
        error = answer.json()["error"]
        assert answer.status_code == 422 and error["param"] == field and "not supported" in error["message"]
        assert "Value error" not in error["message"]


def test_episode_bodies_are_checked_and_abort_needs_none(server: Any) -> None:
    with SwarmClient(server.url) as client:
        ep = client.begin("bodies")
        finish = f"{server.url}/api/v1/episodes/{ep.id}/finish"
        key = {"Authorization": f"Bearer {ep.api_key}"}
        for body, param in [
            ({"reward": "1"}, "reward"),
            ({"reward": True}, "reward"),
            ({"reward": 1e300}, "reward"),
        ]:
            refused = httpx.post(finish, json=body, headers=key)
            assert refused.status_code == 422 and refused.json()["error"]["param"] == param, body
        garbage = httpx.post(finish, content=b"not json", headers={**key, "content-type": "application/json"})
        assert (
            garbage.status_code == 400 and "the body is not valid JSON" in garbage.json()["error"]["message"]
        )
        aborted = httpx.post(f"{server.url}/api/v1/episodes/{ep.id}/abort", headers=key)  # no body at all
        assert aborted.status_code == 200 and aborted.json()["status"] == "aborted"
        assert client.get_episode(ep.id).reason == "aborted by client"


def test_a_seed_beyond_64_bits_is_refused_and_does_not_fail_other_calls(server: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("seeds") as ep:
        url, headers = f"{ep.base_url}/chat/completions", {"Authorization": f"Bearer {ep.api_key}"}
        body = {"model": ep.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        refused = httpx.post(url, json={**body, "seed": 2**64}, headers=headers)
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "seed"
        largest = httpx.post(url, json={**body, "seed": 2**63 - 1 - 16, "n": 16}, headers=headers)
        assert largest.status_code == 200 and len(largest.json()["choices"]) == 16
        ep.finish(0.0)


def test_answers_carry_server_timing(server: Any) -> None:
    """A non-streamed answer says where its time went (W3C Server-Timing, ms): engine + server = total,
    and the engine part is at least the time the engine reports for the call."""
    with SwarmClient(server.url) as client, client.episode("timing") as ep:
        raw = OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.with_raw_response.create(
            model=ep.model, messages=QUESTION, max_tokens=8, seed=3
        )
        anthropic = httpx.post(
            f"{server.url}/v1/messages",
            json={"model": ep.model, "max_tokens": 4, "messages": QUESTION},
            headers={"x-api-key": ep.api_key},
        )
        ep.finish(0.0)
        call = client.get_episode(ep.id).calls[0]
    for header in (raw.headers["server-timing"], anthropic.headers["server-timing"]):
        parts = dict(item.strip().split(";dur=") for item in header.split(","))
        engine, rest, total = (float(parts[name]) for name in ("engine", "server", "total"))
        assert engine > 0 and rest >= 0 and abs(engine + rest - total) < 0.2, header
    first = dict(item.strip().split(";dur=") for item in raw.headers["server-timing"].split(","))
    assert float(first["engine"]) >= 1e3 * call.generate_s * 0.99, (first, call.generate_s)
