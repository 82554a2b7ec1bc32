"""Providers backed by a chat model: Anthropic or any OpenAI-compatible endpoint.

`ChatProvider` asks a LangChain chat model for plans, code and patches with ``with_structured_output``;
`chat_model` builds ``ChatAnthropic`` or ``ChatOpenAI`` (OpenAI, a local vLLM or Ollama via
``base_url``) from a typed `ProviderConfig`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, SecretStr, ValidationError

import templates
from a3r.errors import ProviderConfigError, ProviderError
from a3r.providers.config import ProviderConfig, ProviderKind
from a3r.providers.protocol import CodeFailure, Mode
from a3r.study.analysis import Diagnosis
from a3r.study.plans import (
    GeneratedCode,
    PatchDraft,
    PlanDraft,
    check_plan,
)
from a3r.study.request import check_request
from a3r.study.settings import SETTINGS
from a3r.study.teacher import read_teacher

__all__ = ["ChatProvider", "chat_model", "describe_templates", "repair_prompt"]

_S = TypeVar("_S", bound=BaseModel)


def chat_model(config: ProviderConfig) -> BaseChatModel:
    """The LangChain chat model for an Anthropic or OpenAI-compatible config.

    Raises:
        ProviderConfigError: ``config.kind`` is ``offline`` (no chat model).
    """
    if config.kind is ProviderKind.anthropic:
        from langchain_anthropic import ChatAnthropic

        anthropic_kwargs: dict[str, Any] = {
            "model": config.model or "claude-sonnet-4-6",
            "timeout": config.timeout_s,
            "max_retries": config.max_retries,
            "max_tokens": 4096,
            "api_key": config.api_key or SecretStr(""),
        }
        if config.base_url:
            anthropic_kwargs["base_url"] = config.base_url
        if config.temperature is not None:
            anthropic_kwargs["temperature"] = config.temperature
        return ChatAnthropic(**anthropic_kwargs)
    if config.kind is ProviderKind.openai:
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model=config.model or "gpt-4o-mini",
            temperature=config.temperature,  # None: the server's default
            timeout=config.timeout_s,
            max_retries=config.max_retries,
            base_url=config.base_url,
            api_key=config.api_key or SecretStr("EMPTY"),
        )
    raise ProviderConfigError("the offline provider has no chat model")


def _catalogue() -> str:
    lines = []
    for meta in templates.list_templates():
        params = ", ".join(
            f"{p.name}: {p.type} = {p.default!r}" + (f" in {list(p.choices)}" if p.choices else "")
            for p in meta.parameters
        )
        lines.append(f"- {meta.name}: {meta.title}. {meta.description} Parameters: {params}.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ chat
PLAN_SYSTEM = (
    """You are the planner of A3R, an agent that runs reinforcement-learning experiments on LLMs
(GRPO on a swarm server). Given a user's request, choose a task template from the catalogue (or null if none
fits), its parameters, training settings, and hypotheses registered BEFORE any run, each with an expected
outcome and a decision rule fixed in advance. For research questions (mode "research") give a staged sweep
over ONE setting (variable: one of """
    + ", ".join(SETTINGS)
    + """, or a numeric or boolean workflow
parameter of the template) with a goal: min_stable, best, a_vs_b (coarse = [A, B]) or effect_of (coarse =
[reference, changed]); coarse values (powers of two for sizes), at least 2 seeds, and for stability
questions an operational definition of "stable" (StabilityCriterion). A request that distils a teacher (a
URL or a checkpoint directory) sets training.teacher to it and training.distill to true; a research question
comparing distillation with GRPO alone varies distill (0: GRPO alone, 1: distillation). Keep budgets small:
CPU training, a few steps.

Template catalogue:
{catalogue}"""
)

CODE_SYSTEM = """Write the task code for an A3R training run. workflow.py must define
`async def run(task, llm)` returning a float reward or `swarm.client.workflow.Result`, use only the OpenAI
chat-completions API through `llm.openai()` and `llm.model`, and contain a `# <params>` ... `# </params>` block
defining `PARAMS: dict[str, Any] = {{...}}`. reward.py must define pure reward functions and
`self_check(tasks) -> list[str]` (gold answers earn full reward, garbage earns 0). Give at least 8 tasks, each
with a unique "id"."""

PATCH_SYSTEM = """You fix problems in A3R training runs. You may change exactly one of these workspace files:
{allowed}. Never change evaluators, held-out data or limits. Return the complete new content of the file and a
rationale that cites the evidence."""


class ChatProvider:
    """Provider backed by a LangChain chat model (structured outputs with pydantic schemas).

    Args:
        model: A chat model supporting ``with_structured_output`` (``ChatAnthropic``, ``ChatOpenAI``, or a
            fake chat model in tests).
        name: Shown in logs and stored as ``proposed_by`` of patches.
    """

    def __init__(self, model: BaseChatModel, name: str = "llm") -> None:
        self.model = model
        self.name = name

    def _ask(self, schema: type[_S], system: str, user: str) -> _S:
        try:
            runnable = self.model.with_structured_output(schema)
            answer = runnable.invoke([SystemMessage(content=system), HumanMessage(content=user)])
        except Exception as exc:  # SDK errors vary by provider; the message never holds the key
            raise ProviderError(f"{self.name}: {type(exc).__name__}: {str(exc)[:500]}") from exc
        if isinstance(answer, schema):
            return answer
        try:
            return schema.model_validate(answer)
        except ValidationError as exc:
            raise ProviderError(
                f"{self.name}: answer does not fit {schema.__name__}: {exc.error_count()} errors"
            ) from None

    def plan(self, request: str, *, mode: Mode) -> PlanDraft:
        """Ask the model for a `PlanDraft` and check it against the registry.

        Raises:
            ProviderError: The call failed or the answer does not fit the schema.
            PlanError: The plan names an unknown template or invalid parameters, or does not answer the
                request (`a3r.study.request.check_request`: two tasks named, a ``name=value`` pair of
                the request unknown or not used).
        """
        draft = self._ask(
            PlanDraft,
            PLAN_SYSTEM.format(catalogue=_catalogue()),
            f"Mode: {mode}. Request: {request}",
        )
        if mode == "research" and draft.kind != "research":
            draft = draft.model_copy(update={"kind": "research"})
        teacher, _ = read_teacher(request)
        if teacher is not None and draft.training.teacher is not None:  # as a3r reads it (an absolute path)
            draft = draft.model_copy(
                update={"training": draft.training.model_copy(update={"teacher": teacher})}
            )
        return check_request(request, check_plan(draft))

    def write_code(
        self, request: str, plan: PlanDraft, *, failure: CodeFailure | None = None
    ) -> GeneratedCode:
        """Ask the model for new task code (validated later by the coder in a subprocess); with
        ``failure``, show it its failed code and the failed check (`repair_prompt`) and ask for the
        whole corrected code."""
        user = f"Request: {request}\nObjective: {plan.objective}"
        if failure is not None:
            user += "\n\n" + repair_prompt(failure)
        return self._ask(GeneratedCode, CODE_SYSTEM, user)

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """Ask the model for a fix; its target is checked against the allow-list by the caller."""
        from a3r.study.patches import PATCHABLE

        shown = "\n\n".join(f"=== {name} ===\n{text[:6000]}" for name, text in sorted(files.items()))
        user = (
            f"Template: {template}\nDiagnosis ({diagnosis.kind.value}): {diagnosis.summary}\n"
            f"Evidence: {json.dumps(diagnosis.evidence)}\n\nFiles:\n{shown}"
        )
        draft = self._ask(PatchDraft, PATCH_SYSTEM.format(allowed=", ".join(sorted(PATCHABLE))), user)
        current = files.get(draft.file)
        return None if current is not None and current == draft.new_content else draft


REPAIR_TASKS_SHOWN = 5
"""Tasks of the failed code shown in a repair prompt (all of them travel back in the answer)."""


def repair_prompt(failure: CodeFailure) -> str:
    """What the model sees to repair its code: the failed check (step and its full output: the
    traceback or the failing self-checks), then the failed files and the first tasks."""
    code = failure.code
    tasks = "\n".join(json.dumps(t, ensure_ascii=False) for t in code.tasks[:REPAIR_TASKS_SHOWN])
    return (
        f"Your code (attempt {failure.attempt}) failed its check at step '{failure.step}':\n"
        f"{failure.detail.strip()[-4000:]}\n\n"
        f"=== workflow.py ===\n{code.workflow}\n=== reward.py ===\n{code.reward}\n"
        f"=== tasks ({len(code.tasks)}; the first {min(len(code.tasks), REPAIR_TASKS_SHOWN)}) ===\n{tasks}\n\n"
        "Fix the cause of this failure and return the complete corrected workflow, reward and tasks."
    )


def describe_templates(names: Sequence[str] | None = None) -> str:
    """The template catalogue as text (the planner's prompt section), optionally of some templates."""
    text = _catalogue()
    if names is None:
        return text
    return "\n".join(line for line in text.splitlines() if any(line.startswith(f"- {n}:") for n in names))
