"""Prompt rendering with token splicing, across chat-template families, with the real SmolLM2 tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chat_templates_for_tests import GEMMA_STYLE
from tracking_sim import Sim, TemplateSetup

from swarm.tracking.chat_templates import CHATML_TOOLS_TEMPLATE, resolve_chat_template
from swarm.tracking.errors import PromptError
from swarm.tracking.render import PromptRenderer, to_template_messages

ALL = ["smollm2", "llama3", "gemma", "qwen3"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


def test_gguf_tokenizer_carries_a_toolless_chatml_template(smol_tokenizer: Any) -> None:
    own = smol_tokenizer.chat_template
    assert isinstance(own, str) and "<|im_start|>" in own and "tool" not in own
    assert resolve_chat_template(smol_tokenizer) == CHATML_TOOLS_TEMPLATE
    assert resolve_chat_template(smol_tokenizer, "{{ x }}") == "{{ x }}"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"},
        ],
    ],
)
def test_tools_template_equals_smollm2_template_without_tools(
    smol_tokenizer: Any, messages: list[dict[str, Any]]
) -> None:
    own = smol_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ours = smol_tokenizer.apply_chat_template(
        messages, chat_template=CHATML_TOOLS_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert ours == own


@pytest.mark.parametrize("name", ALL)
def test_first_turn_is_the_canonical_tokenization(setups: dict[str, TemplateSetup], name: str) -> None:
    setup = setups[name]
    messages = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    rendered = setup.renderer().render(messages)
    assert rendered.prompt_ids == setup.tokenizer.encode(rendered.text, add_special_tokens=False)
    assert rendered.splices == rendered.splice_mismatches == 0
    if name == "smollm2":
        assert rendered.text == setup.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )


@pytest.mark.parametrize("name", ALL)
def test_non_canonical_split_survives_two_turns(setups: dict[str, TemplateSetup], name: str) -> None:
    setup = setups[name]
    tok = setup.tokenizer
    he, llo = tok.encode("he", add_special_tokens=False), tok.encode("llo", add_special_tokens=False)
    assert he + llo != tok.encode("hello", add_special_tokens=False)  # the split really is non-canonical
    sim = Sim(setup)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Greet."},
        {"role": "user", "content": "Say hi"},
    ]
    first, reply = sim.call(messages, [*he, *llo, setup.eos_id])
    assert reply["content"] == "hello"
    messages += [reply, {"role": "user", "content": "Again"}]
    second, reply2 = sim.call(messages, sim.ids("hello again"))
    # the new prompt extends the first call token-exactly, so the engine sees "he"+"llo" again
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )
    assert second.splices == 1 and second.splice_mismatches == 0
    naive = tok.encode(sim.render(messages).text, add_special_tokens=False)
    assert naive != second.prompt_ids  # re-tokenizing the text would have drifted
    messages += [reply2, {"role": "user", "content": "Bye"}]
    rendered = sim.render(messages)
    full_second = second.prompt_ids + second.completion_ids
    assert rendered.prompt_ids[: len(full_second)] == full_second
    assert rendered.splices == 2 and rendered.spliced_calls == [0, 1]
    assert tok.decode(rendered.prompt_ids, skip_special_tokens=False) == rendered.text


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_tool_call_turns_are_spliced(setups: dict[str, TemplateSetup], name: str) -> None:
    sim = Sim(setups[name], tools=TOOLS)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2+3? Then 5+7."},
    ]
    call_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    first, reply = sim.call(messages, sim.ids(call_text))
    assert reply["content"] is None and first.finish_reason == "tool_calls"
    tool_call = reply["tool_calls"][0]
    assert json.loads(tool_call["function"]["arguments"]) == {"a": 2, "b": 3}
    messages += [reply, {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}]
    second_text = 'Now the second.\n<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 7}}\n</tool_call>'
    second, reply2 = sim.call(messages, sim.ids(second_text))
    assert reply2["content"] == "Now the second."
    assert second.splices == 1
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )
    messages += [reply2, {"role": "tool", "tool_call_id": reply2["tool_calls"][0]["id"], "content": "12"}]
    third = sim.render(messages)
    assert third.splices == 2 and third.splice_mismatches == 0
    assert third.prompt_ids[: len(second.prompt_ids) + len(second.completion_ids)] == (
        second.prompt_ids + second.completion_ids
    )


def test_reformatted_tool_call_is_a_counted_mismatch_not_a_rewrite(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"], tools=TOOLS)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+3?"}]
    # compact JSON: parses to the same call, but the template renders it with ", " and ": " separators
    _, reply = sim.call(messages, sim.ids('<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'))
    messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "5"}]
    rendered = sim.render(messages)
    assert rendered.splices == 0 and rendered.splice_mismatches == 1
    assert rendered.prompt_ids == setups["smollm2"].tokenizer.encode(rendered.text, add_special_tokens=False)
    assert '{"name": "add", "arguments": {"a": 2, "b": 3}}' in rendered.text


def test_trimmed_content_is_a_mismatch_and_the_text_stays_the_templates(
    setups: dict[str, TemplateSetup],
) -> None:
    setup = setups["llama3"]
    sim = Sim(setup)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    _, reply = sim.call(messages, sim.ids(" hello"))  # the template trims the leading space away
    messages += [reply, {"role": "user", "content": "Again"}]
    rendered = sim.render(messages)
    assert rendered.splices == 0 and rendered.splice_mismatches == 1
    assert setup.tokenizer.decode(rendered.prompt_ids, skip_special_tokens=False) == rendered.text
    assert "<|end_header_id|>\n\nhello<|eot_id|>" in rendered.text


def test_stop_string_removed_is_a_mismatch(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count"}]
    record, _ = sim.call(messages, sim.ids("1 2 3 STOP", eos=False))
    record.text = "1 2 3 "  # the server returned the text up to the stop string
    messages += [{"role": "assistant", "content": "1 2 3 "}, {"role": "user", "content": "More"}]
    rendered = sim.render(messages)
    assert (rendered.splices, rendered.splice_mismatches) == (0, 1)


def test_edited_message_is_not_spliced_and_not_counted(setups: dict[str, TemplateSetup]) -> None:
    sim = Sim(setups["smollm2"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    sim.call(messages, sim.ids("hello"))
    messages += [{"role": "assistant", "content": "hello there"}, {"role": "user", "content": "Again"}]
    rendered = sim.render(messages)
    assert (rendered.splices, rendered.splice_mismatches) == (0, 0)


def test_prefers_the_call_that_produced_the_span(setups: dict[str, TemplateSetup]) -> None:
    setup = setups["smollm2"]
    tok = setup.tokenizer
    sim = Sim(setup)
    hello_split = [*tok.encode("he", add_special_tokens=False), *tok.encode("llo", add_special_tokens=False)]
    first_messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    first, reply = sim.call(first_messages, [*hello_split, setup.eos_id])
    other = [{"role": "system", "content": "Another agent."}, {"role": "user", "content": "Hi"}]
    sim.call(other, sim.ids("hello"), agent="b")  # same text, canonical ids, later call
    rendered = sim.render([*first_messages, reply, {"role": "user", "content": "Again"}])
    assert rendered.spliced_calls == [first.index]
    assert rendered.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids
    )


def test_message_conversion() -> None:
    converted = to_template_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"k": 1}'}}
                ],
            },
            {"role": "tool", "content": "1", "tool_call_id": "x", "name": "f"},
        ]
    )
    assert converted == [
        {"role": "system", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": {"k": 1}}}],
        },
        {"role": "tool", "content": "1", "tool_call_id": "x", "name": "f"},
    ]


@pytest.mark.parametrize(
    ("messages", "tools", "needle"),
    [
        ([], None, "non-empty"),
        ([{"role": "wizard", "content": "x"}], None, "role"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            None,
            "text parts",
        ),
        ([{"role": "user", "content": 3}], None, "content"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
            None,
            "not valid JSON",
        ),
        ([{"role": "assistant", "tool_calls": [{"function": {}}]}], None, "function.name"),
        (["hello"], None, "object"),
    ],
)
def test_bad_requests_raise_prompt_error(
    setups: dict[str, TemplateSetup], messages: list[Any], tools: Any, needle: str
) -> None:
    with pytest.raises(PromptError, match=needle) as info:
        setups["smollm2"].renderer().render(messages, tools)
    assert isinstance(info.value, ValueError)


def test_template_failures_raise_prompt_error(smol_tokenizer: Any) -> None:
    gemma = PromptRenderer(smol_tokenizer, GEMMA_STYLE)
    with pytest.raises(PromptError, match="alternate"):
        gemma.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    toolless = PromptRenderer(smol_tokenizer, smol_tokenizer.chat_template)
    with pytest.raises(PromptError, match="cannot render tools"):
        toolless.render([{"role": "user", "content": "a"}], TOOLS)


def test_prefers_the_requesting_agents_call_among_equal_texts(setups: dict[str, TemplateSetup]) -> None:
    setup = setups["smollm2"]
    tok = setup.tokenizer
    sim = Sim(setup)
    split = [*tok.encode("o", add_special_tokens=False), *tok.encode("k", add_special_tokens=False)]
    a, _ = sim.call([{"role": "user", "content": "a?"}], [*split, setup.eos_id], agent="a")
    b, _ = sim.call([{"role": "user", "content": "b?"}], sim.ids("ok"), agent="b")
    assert a.text == b.text == "ok" and a.completion_ids != b.completion_ids
    # a new conversation that quotes "ok": neither call's prompt matches, so the agent decides
    messages = [
        {"role": "user", "content": "c?"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "d"},
    ]
    assert sim.render(messages, agent="a").spliced_calls == [a.index]
    assert sim.render(messages, agent="b").spliced_calls == [b.index]
    assert sim.render(messages).spliced_calls == [b.index]  # no agent given: the most recent call
