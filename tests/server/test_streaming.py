"""``stream=true``: tokens are sent as they are sampled, and the record is the same as without streaming."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from openai import OpenAI

from swarm.client import SwarmClient
from swarm.engine import HFEngine
from tests.conftest import wait_for

QUESTION = [{"role": "user", "content": "Count to ten."}]


def _events(response: httpx.Response) -> Iterator[dict[str, Any] | str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def _stream(ep: Any, **body: Any) -> httpx.Response:
    payload = {"model": ep.model, "messages": QUESTION, "stream": True, **body}
    request = httpx.Request(
        "POST",
        f"{ep.base_url}/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {ep.api_key}"},
    )
    return httpx.Client(timeout=60).send(request, stream=True)


def test_tokens_stream_while_the_engine_samples(server: Any, tiny_engine: HFEngine) -> None:
    with SwarmClient(server.url) as client, client.episode("live") as ep:
        response = _stream(ep, max_tokens=1500, temperature=1.0, seed=11, logprobs=True, top_logprobs=2)
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        content, tokens, finish, sampling_when_first_text = [], [], None, None
        for event in _events(response):
            if event == "[DONE]":
                break
            assert isinstance(event, dict) and "error" not in event, event
            (choice,) = event["choices"]
            piece = choice["delta"].get("content")
            if piece and sampling_when_first_text is None:
                free = tiny_engine.lock.acquire(blocking=False)  # the worker holds it while sampling
                if free:
                    tiny_engine.lock.release()
                sampling_when_first_text = not free
            content.append(piece or "")
            tokens += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
        else:
            raise AssertionError("the stream ended without [DONE]")
        response.close()
        ep.finish(0.0)
        (call,) = client.get_episode(ep.id).calls
    assert sampling_when_first_text, "text arrived only after the completion was sampled"
    assert "".join(content) == call.text and len(call.completion_ids) > 100
    assert [t["logprob"] for t in tokens] == call.logprobs  # one logprob per sampled token, as recorded
    assert all(len(t["top_logprobs"]) == 2 for t in tokens)
    assert finish == call.finish_reason.value


def test_streamed_choices_and_stop_strings_match_the_plain_answer(server: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("stop") as ep:
        oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
        answer = {"model": ep.model, "messages": QUESTION, "max_tokens": 40, "temperature": 1.0, "seed": 9}
        full = oa.chat.completions.create(**answer).choices[0].message.content
        stop = full[10:14]  # a 4-character stop string inside the answer
        plain = oa.chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=40, temperature=1.0, seed=5, n=2
        )
        streamed: dict[int, list[str]] = {0: [], 1: []}
        finishes: dict[int, str] = {}
        for chunk in oa.chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=40, temperature=1.0, seed=5, n=2, stream=True
        ):
            for choice in chunk.choices:
                streamed[choice.index].append(choice.delta.content or "")
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
        cut = "".join(
            c.choices[0].delta.content or ""
            for c in oa.chat.completions.create(**answer, stop=[stop], stream=True)
            if c.choices
        )
        ep.finish(0.0)
    assert ["".join(streamed[i]) for i in (0, 1)] == [c.message.content for c in plain.choices]
    assert finishes == {c.index: c.finish_reason for c in plain.choices}
    assert cut == full[: full.find(stop)] and len(cut) >= 4


def test_a_bad_streaming_request_fails_before_the_stream(server: Any) -> None:
    with SwarmClient(server.url) as client, client.episode("bad") as ep:
        response = _stream(ep, model="no-such-model", max_tokens=4)
        response.read()
        ep.finish(0.0)
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_an_episode_aborted_mid_stream_stops_sampling_and_ends_the_stream_with_an_error(
    server: Any, tiny_engine: HFEngine
) -> None:
    with SwarmClient(server.url) as client:
        ep = client.begin("aborted")
        response = _stream(ep, max_tokens=4000, temperature=1.0, seed=2, logprobs=True)
        stream = _events(response)
        events = list(_take_until_first_text(stream))
        ep.abort("stopped by the test")
        events += list(stream)
        response.close()
        assert client.get_episode(ep.id).status == "aborted" and client.get_episode(ep.id).calls == []
    assert "[DONE]" not in events
    (error,) = [e for e in events if isinstance(e, dict) and "error" in e]
    assert "ended while this call was running" in error["error"]["message"]
    sampled = sum(
        len(e["choices"][0].get("logprobs", {}).get("content", [])) for e in events if "choices" in e
    )
    assert 0 < sampled < 4000  # the engine stopped the row when the episode ended
    assert tiny_engine.lock.acquire(timeout=5)  # and is free again
    tiny_engine.lock.release()


def _take_until_first_text(events: Iterator[dict[str, Any] | str]) -> Iterator[dict[str, Any] | str]:
    for event in events:
        yield event
        if isinstance(event, dict) and event["choices"] and event["choices"][0]["delta"].get("content"):
            return


def test_a_client_that_leaves_mid_stream_cancels_its_call(server: Any, tiny_engine: HFEngine) -> None:
    with SwarmClient(server.url) as client:
        ep = client.begin("left")
        response = _stream(ep, max_tokens=4000, temperature=1.0, seed=4)
        list(_take_until_first_text(_events(response)))
        response.close()  # the agent went away: nobody will read this answer
        # Finishing is refused while the call runs (409) and accepted once it is cancelled; the engine
        # stops the row (it would sample 4000 tokens otherwise) and nothing is recorded.
        finish = f"{server.url}/api/v1/episodes/{ep.id}/finish"
        key = {"Authorization": f"Bearer {ep.api_key}"}
        wait_for(
            lambda: httpx.post(finish, json={"reward": 1.0}, headers=key).status_code == 200,
            20,
            "the call to end",
        )
        assert tiny_engine.lock.acquire(timeout=5)
        tiny_engine.lock.release()
        assert client.get_episode(ep.id).calls == []


def test_finishing_an_episode_while_its_call_streams_is_refused_and_loses_nothing(server: Any) -> None:
    with SwarmClient(server.url) as client:
        ep = client.begin("early-finish")
        response = _stream(ep, max_tokens=300, temperature=1.0, seed=6)
        stream = _events(response)
        list(_take_until_first_text(stream))
        early = httpx.post(
            f"{server.url}/api/v1/episodes/{ep.id}/finish",
            json={"reward": 1.0},
            headers={"Authorization": f"Bearer {ep.api_key}"},
        )
        assert early.status_code == 409 and "still being sampled" in early.json()["error"]["message"]
        rest = list(stream)  # the answer completes and is recorded
        response.close()
        assert rest[-1] == "[DONE]"
        ep.finish(1.0)
        view = client.get_episode(ep.id)
    assert view.status == "finished" and len(view.calls) == 1
