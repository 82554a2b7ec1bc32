"""Chat templates the tracker ships, and the choice of template for a tokenizer.

The embedded SmolLM2-135M-Instruct GGUF carries a plain ChatML template that ignores ``tools`` and cannot
render an assistant message whose content is ``None`` (a tool-call turn). :data:`CHATML_TOOLS_TEMPLATE`
extends it in the Hermes / Qwen2.5 style that SmolLM2 was trained on for function calling: tool
signatures in the system turn inside ``<tools>``, calls as ``<tool_call>`` JSON blocks, results as
``<tool_response>`` in a user turn. For conversations without tools it renders exactly what the original
template renders (same default system prompt), so nothing changes for plain chat.
"""

from __future__ import annotations

from typing import Any

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CHATML_TOOLS_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_text = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_text = '" + SMOLLM2_DEFAULT_SYSTEM + "' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- if tool_call['function'] is defined -%}{%- set call = tool_call['function'] -%}"
    "{%- else -%}{%- set call = tool_call -%}{%- endif -%}"
    "{%- if not loop.first or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (call['name'] | tojson) + ', \"arguments\": ' "
    "+ (call['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""Tool-capable ChatML template, identical to SmolLM2's own template on tool-free conversations."""


def supports_tools(chat_template: str) -> bool:
    """Whether a Jinja chat template reads ``tools`` or ``tool_calls`` (a heuristic on its source)."""
    return "tools" in chat_template or "tool_calls" in chat_template


def resolve_chat_template(tokenizer: Any, chat_template: str | None = None) -> str | None:
    """Pick the chat template to render prompts with.

    Args:
        tokenizer: A Hugging Face tokenizer (its ``chat_template`` attribute is read).
        chat_template: An explicit template; returned unchanged when given.

    Returns:
        ``chat_template`` if given; :data:`CHATML_TOOLS_TEMPLATE` if the tokenizer's own template is the
        tool-less SmolLM2 ChatML template; otherwise the tokenizer's template (``None`` if it has none).
    """
    if chat_template is not None:
        return chat_template
    own: str | None = getattr(tokenizer, "chat_template", None)
    if own is not None and not isinstance(own, str):
        own = None  # a dict of named templates: let transformers choose ("default")
    if own and "<|im_start|>" in own and SMOLLM2_DEFAULT_SYSTEM in own and not supports_tools(own):
        return CHATML_TOOLS_TEMPLATE
    return own
