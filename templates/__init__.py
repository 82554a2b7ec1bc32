"""Task templates: what the coder agent starts from and what ``a3r vibe`` trains.

Each template is a folder (``math``, ``arithmetic``, ``countdown``, ``who_is_the_spy``) with
``meta.py`` (typed :class:`TemplateMeta`), ``workflow.py`` (``async def run(task, llm)`` using only an
OpenAI-compatible client), ``reward.py`` (pure reward functions and a ``self_check``), ``data.py`` (a
JSONL task builder) and a README. This front lists, loads, matches, renders and validates them.
"""

from ._errors import (
    TemplateError,
    TemplateParamError,
    TemplateRenderError,
    TemplateValidationError,
    UnknownTemplateError,
)
from ._meta import ParamSpec, ParamTarget, TemplateMeta
from ._registry import Template, get_template, list_templates, match, match_score
from ._render import RenderedTemplate, ValidationReport, render, substitute_params, validate

__all__ = [
    "ParamSpec",
    "ParamTarget",
    "RenderedTemplate",
    "Template",
    "TemplateError",
    "TemplateMeta",
    "TemplateParamError",
    "TemplateRenderError",
    "TemplateValidationError",
    "UnknownTemplateError",
    "ValidationReport",
    "get_template",
    "list_templates",
    "match",
    "match_score",
    "render",
    "substitute_params",
    "validate",
]
