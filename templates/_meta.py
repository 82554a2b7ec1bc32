"""Typed metadata of a task template: what it is, its parameters and what the model must be able to do."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ._errors import TemplateParamError

ParamValue = bool | int | float | str | None


class ParamTarget(StrEnum):
    """Which part of a rendered template a parameter configures."""

    WORKFLOW = "workflow"
    """Substituted into the ``PARAMS`` dict of ``workflow.py`` (sampling settings, game rules...)."""
    DATA = "data"
    """Passed to the data builder that writes ``tasks.jsonl`` (dataset choice, size, seed, level...)."""


PartRole = Literal["goal", "shaping", "violation", "format"]
"""What a reward part is: ``goal`` (what the task wants, e.g. a win or a correct answer), ``shaping`` (a
bonus paid on its own, e.g. countdown's format reward), ``violation`` (a rate the reward penalises,
e.g. leaking one's word) or ``format`` (a precondition of the goal, not paid on its own)."""


class ParamSpec(BaseModel):
    """One template parameter with its type, default and allowed range."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Identifier used in ``PARAMS`` and on the command line."""
    type: Literal["int", "float", "bool", "str"]
    """Value type; ``None`` is accepted only where ``nullable`` is set."""
    default: ParamValue
    """Value used when the caller gives none."""
    description: str
    """One line for humans and for the planner."""
    target: ParamTarget = ParamTarget.WORKFLOW
    """Where the value goes when the template is rendered."""
    minimum: float | None = None
    """Inclusive lower bound (numbers only)."""
    maximum: float | None = None
    """Inclusive upper bound (numbers only)."""
    choices: tuple[str, ...] | None = None
    """Allowed values (strings only)."""
    nullable: bool = False
    """Whether ``None`` is allowed (e.g. "same server" for an optional endpoint URL)."""
    phrases: tuple[str, ...] = ()
    """Regular expressions a request writes right before this parameter's value (``"level\\s*"``,
    ``"difficulty\\s*"``), read by a3r's offline planner before the generic forms (``name=value``, the
    name in words then a number)."""
    counts: str | None = None
    """For a count: a regular expression of the things it counts as a request writes them (``players?``),
    so that a request's "6 players" or "two spies" sets it (a3r's offline planner)."""

    @model_validator(mode="after")
    def _default_is_valid(self) -> ParamSpec:
        self.coerce(self.default, template="<spec>")
        return self

    def coerce(self, value: Any, *, template: str) -> ParamValue:
        """Check ``value`` against this spec and return it converted to the declared type.

        Args:
            value: The raw value (from JSON, a CLI string or Python).
            template: Template name, used in the error message.

        Returns:
            The value as ``bool``/``int``/``float``/``str`` (or ``None`` when nullable).

        Raises:
            TemplateParamError: Wrong type, out of range or not among the choices.
        """

        def fail(message: str) -> TemplateParamError:
            return TemplateParamError(template, self.name, message)

        if value is None:
            if self.nullable:
                return None
            raise fail("may not be None")
        out: ParamValue
        if self.type == "bool":
            if isinstance(value, str) and value.lower() in {
                "true",
                "false",
                "1",
                "0",
                "yes",
                "no",
                "on",
                "off",
            }:
                out = value.lower() in {"true", "1", "yes", "on"}
            elif isinstance(value, bool):
                out = value
            else:
                raise fail(f"expected true or false (true/false, yes/no, on/off or 1/0), got {value!r}")
        elif self.type == "int":
            if isinstance(value, bool):
                raise fail(f"expected an int, got {value!r}")
            if isinstance(value, int):
                out = value
            elif (isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip())) or (
                isinstance(value, float) and value.is_integer()
            ):
                out = int(value)
            else:
                raise fail(f"expected an int, got {value!r}")
        elif self.type == "float":
            if isinstance(value, bool):
                raise fail(f"expected a number, got {value!r}")
            try:
                out = float(value)
            except (TypeError, ValueError):
                raise fail(f"expected a number, got {value!r}") from None
        else:
            if not isinstance(value, str):
                raise fail(f"expected a string, got {value!r}")
            out = value
        if isinstance(out, int | float) and not isinstance(out, bool):
            if self.minimum is not None and out < self.minimum:
                raise fail(f"{out} is below the minimum {self.minimum:g}")
            if self.maximum is not None and out > self.maximum:
                raise fail(f"{out} is above the maximum {self.maximum:g}")
        if self.choices is not None and out not in self.choices:
            raise fail(f"{out!r} is not one of {', '.join(self.choices)}")
        return out


class TemplateMeta(BaseModel):
    """Metadata of one task template, read by the registry, the planner and the coder agent."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Template name, equal to its folder name (``who_is_the_spy``, ``math``...)."""
    title: str
    """Short human title."""
    description: str
    """What the task is and what a training run on it shows."""
    keywords: tuple[str, ...]
    """Lower-case words and phrases a user might say to mean this template (used by :func:`match`)."""
    capabilities: tuple[str, ...]
    """What the model must be able to do (e.g. "follow a short answer format", "multi-turn chat")."""
    parameters: tuple[ParamSpec, ...] = Field(default_factory=tuple)
    """Parameters with defaults and ranges."""
    multi_agent: bool = False
    """Whether episodes have several named agents (the OpenAI ``user`` field names the agent)."""
    reward_parts: dict[str, PartRole] = Field(default_factory=dict)
    """The episode metrics (``Result.metrics``) the reward is made of, with their role: a3r's report
    draws a curve of each, and its analyst reads a ``violation`` that rises, or a ``shaping`` bonus
    that rises while the ``goal`` does not, as the reward being exploited."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The smallest and largest episode reward the template's reward can pay: a3r clips the intervals of
    reward effects to what this range allows (`a3r.study.effects`)."""
    defaults_evidence: str | None = None
    """One line on where the defaults come from when measurements chose them (what was measured, and the
    file that holds the numbers); ``a3r vibe --dry-run`` prints it under the parameters."""
    reward_weights: dict[str, str] = Field(default_factory=dict)
    """The workflow parameter that weighs each ``violation`` or ``shaping`` part in the reward (part →
    parameter: a violation's penalty, a shaping part's bonus): what a reward patch changes when the part
    is exploited (`templates.Template.reward_patch`)."""
    reward_patch_reason: str | None = None
    """One sentence on why the reward patch closes the exploit, quoted in the patch's rationale."""
    starter: str | None = None
    """How to run this template as a first task a small model gets reward on (``"at level 1"``): advice to
    a user whose model scores zero on another task names it."""

    @model_validator(mode="after")
    def _weights_are_parameters(self) -> TemplateMeta:
        names = {p.name for p in self.parameters}
        for part, param in self.reward_weights.items():
            if self.reward_parts.get(part) not in ("violation", "shaping"):
                raise ValueError(
                    f"reward_weights: {part!r} is not a violation or shaping part of reward_parts"
                )
            if param not in names:
                raise ValueError(f"reward_weights: {param!r} (weight of {part!r}) is not a parameter")
        return self

    def param(self, name: str) -> ParamSpec:
        """The spec of parameter ``name``.

        Raises:
            TemplateParamError: No such parameter.
        """
        for spec in self.parameters:
            if spec.name == name:
                return spec
        known = ", ".join(p.name for p in self.parameters)
        raise TemplateParamError(self.name, name, f"unknown parameter (known: {known})")

    def defaults(self, target: ParamTarget | None = None) -> dict[str, ParamValue]:
        """Default values of all parameters, or of those for one ``target``."""
        return {p.name: p.default for p in self.parameters if target is None or p.target == target}

    def resolve(self, params: dict[str, Any] | None = None) -> dict[str, ParamValue]:
        """Defaults overlaid with ``params``, each value checked and converted.

        Args:
            params: Caller's values by parameter name (may be ``None`` or partial).

        Returns:
            A complete dict with one value per parameter.

        Raises:
            TemplateParamError: A name is unknown or a value is invalid.
        """
        resolved = self.defaults()
        for key, value in (params or {}).items():
            resolved[key] = self.param(key).coerce(value, template=self.name)
        return resolved
