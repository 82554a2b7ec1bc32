"""LLM providers of the research agent: Anthropic, OpenAI-compatible, and offline.

Every provider answers the same three questions through pydantic schemas (`a3r.plans`):

- `ResearchProvider.plan`: a user's request → `PlanDraft` (template, parameters, settings,
  pre-registered hypotheses, and for research questions the sweep and the definition of "stable");
- `ResearchProvider.write_code`: task code for a request no template covers → `GeneratedCode`;
- `ResearchProvider.propose_patch`: a diagnosis plus the workspace files → `PatchDraft` or ``None``.

`ChatProvider` asks a LangChain chat model for these with ``with_structured_output``; `chat_model`
builds ``ChatAnthropic`` or ``ChatOpenAI`` (any OpenAI-compatible endpoint: OpenAI, a local vLLM or
Ollama via ``base_url``) from a typed `ProviderConfig`. API keys are `SecretStr`s read from the
environment by `ProviderConfig.from_env`; they are never logged, stored or put in an error message.

`OfflineProvider` needs no network: it matches the request against the template registry by keywords,
reads parameters from the sentence, plans research questions it knows (minimal stable batch or group
size, best learning rate) and proposes rule-based patches. It is honest about its limits: a request no
template covers raises `OfflineUnsupported` naming what is needed (an LLM provider).
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeVar, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

import templates
from a3r.analysis import Diagnosis, DiagnosisKind
from a3r.errors import OfflineUnsupported, PlanError, ProviderConfigError, ProviderError
from a3r.plans import (
    GeneratedCode,
    HypothesisDraft,
    PatchDraft,
    PlanDraft,
    StabilityCriterion,
    SweepSpec,
    TrainingSettings,
    check_plan,
)

__all__ = [
    "ChatProvider",
    "OfflineProvider",
    "ProviderConfig",
    "ProviderKind",
    "ResearchProvider",
    "chat_model",
    "make_provider",
    "read_params",
]

Mode = Literal["vibe", "research"]
_S = TypeVar("_S", bound=BaseModel)

NEEDS_LLM = (
    "an LLM provider: pass --provider anthropic (with ANTHROPIC_API_KEY set) or --provider openai "
    "(with OPENAI_API_KEY set; --base-url for a local vLLM or Ollama server)"
)


class ProviderKind(StrEnum):
    """Which provider plans and writes code."""

    offline = "offline"
    """Deterministic planning from templates; no network."""
    anthropic = "anthropic"
    """Anthropic Messages API (``ANTHROPIC_API_KEY``)."""
    openai = "openai"
    """OpenAI-compatible chat completions (``OPENAI_API_KEY``, optional base URL)."""


class ProviderConfig(BaseModel):
    """Typed provider settings (build with `from_env` to read keys from the environment).

    Attributes:
        kind: Provider kind.
        model: Model name (default per kind: ``claude-sonnet-4-6``, ``gpt-4o-mini``).
        base_url: Endpoint root (OpenAI-compatible: ``http://host:8000/v1``; Anthropic: proxy root).
        api_key: The secret (never printed: `SecretStr`).
        temperature: Sampling temperature of planning calls (``None``: the model's default; some newer
            models accept no other).
        timeout_s: Per-request timeout in seconds.
        max_retries: SDK retries of transient errors.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProviderKind = ProviderKind.offline
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=2, ge=0)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError("base_url must start with http:// or https:// and name a host")
        return value

    @classmethod
    def from_env(
        cls,
        kind: ProviderKind | str,
        *,
        model: str | None = None,
        base_url: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ProviderConfig:
        """Settings for ``kind`` with the API key (and OpenAI base URL) taken from the environment.

        Reads ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL``) or ``OPENAI_API_KEY`` (and
        ``OPENAI_BASE_URL``). A local OpenAI-compatible server given by ``base_url`` needs no key.

        Raises:
            ProviderConfigError: Unknown kind, a missing key, or a malformed base URL.
        """
        env = os.environ if environ is None else environ
        try:
            provider = ProviderKind(kind)
        except ValueError:
            raise ProviderConfigError(
                f"unknown provider {kind!r}; choose one of {', '.join(k.value for k in ProviderKind)}"
            ) from None
        key: str | None = None
        if provider is ProviderKind.anthropic:
            key = env.get("ANTHROPIC_API_KEY")
            base_url = base_url or env.get("ANTHROPIC_BASE_URL")
            if not key:
                raise ProviderConfigError("the anthropic provider needs ANTHROPIC_API_KEY in the environment")
        elif provider is ProviderKind.openai:
            key = env.get("OPENAI_API_KEY")
            base_url = base_url or env.get("OPENAI_BASE_URL")
            if not key and base_url is None:
                raise ProviderConfigError(
                    "the openai provider needs OPENAI_API_KEY in the environment (or --base-url of a local server)"
                )
        try:
            return cls(
                kind=provider,
                model=model,
                base_url=base_url,
                api_key=SecretStr(key) if key else None,
            )
        except ValidationError as exc:
            raise ProviderConfigError(
                "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
            ) from None


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


class ResearchProvider(Protocol):
    """What the graph's nodes ask of a provider."""

    name: str

    def plan(self, request: str, *, mode: Mode) -> PlanDraft:
        """A checked plan (`a3r.plans.check_plan`) for ``request``."""
        ...

    def write_code(self, request: str, plan: PlanDraft) -> GeneratedCode:
        """Task code for a request no template covers."""
        ...

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """A fix for ``diagnosis`` as the new content of one patchable file, or ``None``."""
        ...


# ------------------------------------------------------------------------------------------ helpers
_PARAMS_LITERAL = re.compile(r"# <params>[^\n]*\n(.*?)# </params>", re.DOTALL)


def read_params(workflow_source: str) -> dict[str, Any]:
    """The ``PARAMS`` dict of a rendered workflow (the ``# <params>`` block), read without importing.

    Raises:
        ValueError: No params block, or it is not a literal dict.
    """
    match = _PARAMS_LITERAL.search(workflow_source)
    if match is None:
        raise ValueError("workflow has no '# <params>' block")
    tree = ast.parse(match.group(1))
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is not None:
            literal = ast.literal_eval(value)
            if isinstance(literal, dict):
                return cast(dict[str, Any], literal)
    raise ValueError("the params block holds no literal dict")


_NUMBER = r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)"


def _find_number(text: str, *patterns: str) -> float | None:
    for pattern in patterns:
        match = re.search(pattern.replace("NUM", _NUMBER), text)
        if match:
            return float(match.group(1))
    return None


def _catalogue() -> str:
    lines = []
    for meta in templates.list_templates():
        params = ", ".join(
            f"{p.name}: {p.type} = {p.default!r}" + (f" in {list(p.choices)}" if p.choices else "")
            for p in meta.parameters
        )
        lines.append(f"- {meta.name}: {meta.title}. {meta.description} Parameters: {params}.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ offline
class OfflineProvider:
    """Deterministic provider: keyword-matched templates, parsed parameters, rule-based patches.

    Research questions understood: the minimal stable batch size or group size (a staged sweep of
    powers of two with the `StabilityCriterion`) and the best learning rate.
    """

    name = "offline"

    def plan(self, request: str, *, mode: Mode) -> PlanDraft:
        """Plan ``request`` from the template registry.

        Raises:
            OfflineUnsupported: No template matches the request, or a research question the offline
                planner does not know; the message names what is needed (an LLM provider).
            PlanError: A parameter read from the request is out of the template's range.
        """
        text = request.lower()
        matches = templates.match(request)
        if not matches:
            known = ", ".join(m.name for m in templates.list_templates())
            raise OfflineUnsupported(
                f"no task template covers {request!r} (templates: {known}); writing a new workflow, reward "
                f"and data builder needs {NEEDS_LLM}"
            )
        name = matches[0][0]
        template = templates.get_template(name)
        params = self._template_params(template.meta, text)
        training = self._training(text)
        kind: Literal["train", "research"] = "research" if mode == "research" else "train"
        hypotheses: list[HypothesisDraft]
        sweep: SweepSpec | None = None
        stability: StabilityCriterion | None = None
        if kind == "research":
            sweep, stability, hypotheses, objective = self._research_design(text, training)
            seeds = max(stability.min_seeds if stability else 2, len(training.seeds))
            training = training.model_copy(update={"seeds": list(range(seeds))})
        else:
            objective = f"train the policy on the {name} template"
            hypotheses = [
                HypothesisDraft(
                    statement=f"GRPO training on {name} raises the mean training reward",
                    expected_outcome=(
                        "mean train reward over the last 2 steps exceeds the mean over the first 2 steps"
                    ),
                    decision_rule=(
                        "confirmed if last-2-steps mean reward - first-2-steps mean reward > 0 on every seed; "
                        "refuted if it is < 0 on every seed; otherwise unconfirmed"
                    ),
                )
            ]
        draft = PlanDraft(
            kind=kind,
            template=name,
            params=params,
            objective=objective,
            training=training,
            hypotheses=hypotheses,
            sweep=sweep,
            stability=stability,
            rationale=(
                f"template {name!r} matched the request by keywords (score {matches[0][1]:g}); parameters "
                f"read from the request: {sorted(params) or 'none'}"
            ),
        )
        return check_plan(draft)

    @staticmethod
    def _template_params(meta: templates.TemplateMeta, text: str) -> dict[str, Any]:
        params: dict[str, Any] = {}
        names = {p.name for p in meta.parameters}
        if "level" in names:
            level = _find_number(text, r"level\s*NUM", r"difficulty\s*NUM")
            if level is not None:
                params["level"] = int(level)
        if "temperature" in names:
            temperature = _find_number(text, r"temperature\s*(?:of|=|:)?\s*NUM")
            if temperature is not None:
                params["temperature"] = temperature
        if "max_tokens" in names:
            max_tokens = _find_number(text, r"max[ _-]?tokens\s*(?:of|=|:)?\s*NUM")
            if max_tokens is not None:
                params["max_tokens"] = int(max_tokens)
        if "dataset" in names:
            for pattern, value in (
                (r"aime\s*(?:20)?24", "aime24"),
                (r"aime\s*(?:20)?25", "aime25"),
                (r"\baime\b", "aime"),
                (r"\bgsm8?k?\b", "gsm8k"),
            ):
                if re.search(pattern, text):
                    params["dataset"] = value
                    break
        if "n_tasks" in names:
            n_tasks = _find_number(text, r"NUM\s*tasks")
            if n_tasks is not None:
                params["n_tasks"] = int(n_tasks)
        for spec in meta.parameters:  # explicit "name=value" pairs win
            match = re.search(rf"\b{re.escape(spec.name)}\s*=\s*([^\s,;]+)", text)
            if match:
                params[spec.name] = match.group(1)
        try:
            return dict(meta.resolve(params))
        except templates.TemplateParamError as exc:
            raise PlanError(str(exc)) from None

    @staticmethod
    def _training(text: str) -> TrainingSettings:
        values: dict[str, Any] = {}
        steps = _find_number(text, r"NUM\s*(?:training\s*)?steps", r"steps?\s*(?:=|:)?\s*NUM")
        if steps is not None:
            values["steps"] = int(steps)
        batch = _find_number(text, r"batch[ _-]?size\s*(?:of|=|:)?\s*NUM")
        if batch is not None:
            values["batch_size"] = int(batch)
        group = _find_number(text, r"group[ _-]?size\s*(?:of|=|:)?\s*NUM")
        if group is not None:
            values["group_size"] = int(group)
        lr = _find_number(text, r"(?:\blr|learning rate)\s*(?:of|=|:)?\s*NUM")
        if lr is not None:
            values["lr"] = lr
        seeds = _find_number(text, r"NUM\s*seeds", r"seeds\s*(?:=|:)\s*NUM")
        if seeds is not None:
            values["seeds"] = list(range(int(seeds)))
        try:
            return TrainingSettings(**values)
        except ValidationError as exc:
            raise PlanError(
                "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
            ) from None

    @staticmethod
    def _research_design(
        text: str, training: TrainingSettings
    ) -> tuple[SweepSpec, StabilityCriterion | None, list[HypothesisDraft], str]:
        stability = StabilityCriterion(last_k=max(1, min(3, training.steps // 2)))
        if re.search(r"batch[ _-]?size", text) and re.search(r"\b(min|minimum|smallest|lowest)\b", text):
            sweep = SweepSpec(variable="batch_size", coarse=[1, 2, 4, 8], goal="min_stable")
            what = "batch size B (GRPO groups per step)"
        elif re.search(r"group[ _-]?size", text) and re.search(r"\b(min|minimum|smallest|lowest)\b", text):
            sweep = SweepSpec(variable="group_size", coarse=[2, 4, 8], goal="min_stable")
            what = "group size G (episodes per task)"
        elif re.search(r"\b(lr|learning rate)\b", text) and re.search(r"\b(best|optimal|good)\b", text):
            # LoRA's best rate sits ~10x above full fine-tuning's (Schulman et al. 2025, "LoRA Without Regret").
            rates = [1e-5, 1e-4, 1e-3] if training.lora_rank else [1e-6, 1e-5, 1e-4]
            sweep = SweepSpec(variable="lr", coarse=rates, refine=False, goal="best")
            hypotheses = [
                HypothesisDraft(
                    statement="among the swept learning rates one gives the highest held-out mean reward",
                    expected_outcome="a learning rate whose mean reward over seeds exceeds the others",
                    decision_rule=(
                        "the best lr is the one with the highest mean held-out reward over >= 2 seeds; the claim "
                        "is confirmed if its 95% interval does not overlap the runner-up's"
                    ),
                )
            ]
            return sweep, None, hypotheses, "find the best learning rate"
        else:
            raise OfflineUnsupported(
                "the offline planner answers these research questions: the minimal stable batch size, the "
                "minimal stable group size and the best learning rate; this question needs " + NEEDS_LLM
            )
        values = ", ".join(f"{v:g}" for v in sweep.coarse)
        hypotheses = [
            HypothesisDraft(
                statement=f"there is a smallest stable {what} among {{{values}}}, and smaller values are unstable",
                expected_outcome=(
                    f"configurations at or above some value are stable on every seed, those below are not; "
                    f"stability: {stability.describe()}"
                ),
                decision_rule=(
                    f"B* = the smallest swept value whose every seed (>= {stability.min_seeds}) is stable while "
                    "the next smaller swept value is not; confirmed when found after refinement, refuted when no "
                    "swept value is stable"
                ),
            )
        ]
        return sweep, stability, hypotheses, f"find the minimal stable {what}"

    def write_code(self, request: str, plan: PlanDraft) -> GeneratedCode:
        """Always raises: the offline provider writes no new code.

        Raises:
            OfflineUnsupported: Naming what is needed.
        """
        raise OfflineUnsupported(
            f"writing new task code for {request!r} needs {NEEDS_LLM}; the offline provider only renders templates"
        )

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """Rule-based fixes of the workflow's ``PARAMS`` (and arithmetic data) for zero-signal groups.

        Rules, in order: identical completions within a group at a low sampling temperature → raise it
        to 1.0; all attempts fail with the few-shot example off → turn it on; all attempts fail on
        arithmetic above level 1 → rebuild ``tasks.jsonl`` one level easier; all attempts get the same
        positive reward on arithmetic below level 5 → one level harder. Other diagnoses get ``None``
        (code fixes need an LLM provider).
        """
        if diagnosis.kind is not DiagnosisKind.zero_signal or "workflow.py" not in files:
            return None
        workflow = files["workflow.py"]
        try:
            params = read_params(workflow)
        except (ValueError, SyntaxError):
            return None
        evidence = diagnosis.evidence
        all_zero = int(evidence.get("all_zero_groups", 0)) >= int(evidence.get("all_same_positive_groups", 0))
        temperature = params.get("temperature")
        if isinstance(temperature, int | float) and temperature < 0.7:
            new = templates.substitute_params(workflow, {**params, "temperature": 1.0})
            return PatchDraft(
                file="workflow.py",
                new_content=new,
                rationale=(
                    f"{diagnosis.summary}. Sampling temperature is {temperature:g}: the G attempts of a task are "
                    "(nearly) identical, so their rewards are equal and GRPO advantages vanish. Raising the "
                    "temperature to 1.0 makes attempts differ."
                ),
            )
        if all_zero and params.get("fewshot") is False:
            new = templates.substitute_params(workflow, {**params, "fewshot": True})
            return PatchDraft(
                file="workflow.py",
                new_content=new,
                rationale=f"{diagnosis.summary}. Every attempt fails; a solved example shows the answer format.",
            )
        if template == "arithmetic" and "tasks.jsonl" in files:
            rows = [json.loads(line) for line in files["tasks.jsonl"].splitlines() if line.strip()]
            level = int(rows[0].get("level", 1)) if rows else 1
            target = level - 1 if all_zero else level + 1
            if 1 <= target <= 5 and target != level:
                tasks = templates.get_template("arithmetic").build_tasks(
                    {"level": target, "n_tasks": len(rows), "seed": 0}
                )
                new = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks)
                direction = "easier" if all_zero else "harder"
                return PatchDraft(
                    file="tasks.jsonl",
                    new_content=new,
                    rationale=(
                        f"{diagnosis.summary}. Level {level} is too {'hard' if all_zero else 'easy'} for this "
                        f"model; level {target} tasks ({direction}) give groups with mixed rewards."
                    ),
                )
        return None


# ------------------------------------------------------------------------------------------ chat
PLAN_SYSTEM = """You are the planner of A3R, an agent that runs reinforcement-learning experiments on LLMs
(GRPO on a swarm server). Given a user's request, choose a task template from the catalogue (or null if none
fits), its parameters, training settings, and hypotheses registered BEFORE any run, each with an expected
outcome and a decision rule fixed in advance. For research questions (mode "research") give a staged sweep
(coarse values, powers of two for sizes) with at least 2 seeds, and for stability questions an operational
definition of "stable" (StabilityCriterion). Keep budgets small: CPU training, a few steps.

Template catalogue:
{catalogue}"""

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
            PlanError: The plan names an unknown template or invalid parameters.
        """
        draft = self._ask(
            PlanDraft,
            PLAN_SYSTEM.format(catalogue=_catalogue()),
            f"Mode: {mode}. Request: {request}",
        )
        if mode == "research" and draft.kind != "research":
            draft = draft.model_copy(update={"kind": "research"})
        return check_plan(draft)

    def write_code(self, request: str, plan: PlanDraft) -> GeneratedCode:
        """Ask the model for new task code (validated later by the coder in a subprocess)."""
        return self._ask(GeneratedCode, CODE_SYSTEM, f"Request: {request}\nObjective: {plan.objective}")

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """Ask the model for a fix; its target is checked against the allow-list by the caller."""
        from a3r.patches import PATCHABLE

        shown = "\n\n".join(f"=== {name} ===\n{text[:6000]}" for name, text in sorted(files.items()))
        user = (
            f"Template: {template}\nDiagnosis ({diagnosis.kind.value}): {diagnosis.summary}\n"
            f"Evidence: {json.dumps(diagnosis.evidence)}\n\nFiles:\n{shown}"
        )
        draft = self._ask(PatchDraft, PATCH_SYSTEM.format(allowed=", ".join(sorted(PATCHABLE))), user)
        current = files.get(draft.file)
        return None if current is not None and current == draft.new_content else draft


def make_provider(config: ProviderConfig) -> ResearchProvider:
    """The provider for ``config`` (offline, or a `ChatProvider` over `chat_model`)."""
    if config.kind is ProviderKind.offline:
        return OfflineProvider()
    return ChatProvider(chat_model(config), name=f"{config.kind.value}:{config.model or 'default'}")


def describe_templates(names: Sequence[str] | None = None) -> str:
    """The template catalogue as text (the planner's prompt section), optionally of some templates."""
    text = _catalogue()
    if names is None:
        return text
    return "\n".join(line for line in text.splitlines() if any(line.startswith(f"- {n}:") for n in names))
