"""LLM providers of the research agent: Anthropic, OpenAI-compatible, and offline.

Every provider answers the same three questions through pydantic schemas (`a3r.study.plans`):

- `ResearchProvider.plan`: a user's request → `PlanDraft` (template, parameters, settings,
  pre-registered hypotheses, and for research questions the sweep and the definition of "stable");
- `ResearchProvider.write_code`: task code for a request no template covers → `GeneratedCode` (again,
  repaired, after a `CodeFailure`: the coder shows the provider its failed check);
- `ResearchProvider.propose_patch`: a diagnosis plus the workspace files → `PatchDraft` or ``None``.

`ChatProvider` asks a LangChain chat model for these with ``with_structured_output``; `chat_model`
builds ``ChatAnthropic`` or ``ChatOpenAI`` (any OpenAI-compatible endpoint: OpenAI, a local vLLM or
Ollama via ``base_url``) from a typed `ProviderConfig`. API keys are `SecretStr`s read from the
environment by `ProviderConfig.from_env`; they are never logged, stored or put in an error message.

`OfflineProvider` needs no network: it matches the request against the template registry by keywords,
reads parameters from the sentence, plans the research questions it can parse (minimal stable value,
best value, A vs B and effect of a change, over a training setting or a template knob; true/false knobs
as A vs B or effect-of only) and proposes rule-based patches. It is honest about its limits: a request no
template covers, or one naming two tasks, raises `OfflineUnsupported` in one line naming what is needed.
Every provider's plan passes `a3r.study.request.check_request`: a ``name=value`` pair of the request
that the plan does not use is refused with the nearest names.
"""

from __future__ import annotations

from a3r.providers.chat import ChatProvider, chat_model
from a3r.providers.config import ProviderConfig, ProviderKind
from a3r.providers.offline import OfflineProvider, read_params
from a3r.providers.protocol import CodeFailure, Mode, ResearchProvider

__all__ = [
    "ChatProvider",
    "CodeFailure",
    "Mode",
    "OfflineProvider",
    "ProviderConfig",
    "ProviderKind",
    "ResearchProvider",
    "chat_model",
    "make_provider",
    "read_params",
]


def make_provider(config: ProviderConfig) -> ResearchProvider:
    """The provider for ``config`` (offline, or a `ChatProvider` over `chat_model`)."""
    if config.kind is ProviderKind.offline:
        return OfflineProvider()
    return ChatProvider(chat_model(config), name=f"{config.kind.value}:{config.model or 'default'}")
