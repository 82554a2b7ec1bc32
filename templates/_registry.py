"""Discovering templates, loading their parts, and matching them against a user's sentence."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ._advice import Remedy, reward_patch
from ._errors import UnknownTemplateError
from ._meta import ParamTarget, ParamValue, TemplateMeta

PACKAGE_DIR = Path(__file__).resolve().parent
"""Folder of the ``templates`` package; each template is a sub-folder with a ``meta.py``."""


@dataclass(frozen=True)
class Template:
    """One template folder: metadata plus access to its modules."""

    meta: TemplateMeta
    """Typed metadata."""
    folder: Path
    """The template's source folder."""
    check_params: Callable[[dict[str, Any]], None] | None = None
    """Optional cross-parameter check from ``meta.py`` (raises ``TemplateParamError``)."""
    agents_for: Callable[[dict[str, Any]], list[str]] | None = None
    """Optional ``trainable_agents(params)`` from ``meta.py`` (multi-agent templates)."""
    calls_for: Callable[[dict[str, Any]], list[int]] | None = None
    """Optional ``model_calls(params)`` from ``meta.py`` (multi-turn templates): see `episode_calls`."""
    no_signal_for: Callable[..., Remedy | None] | None = None
    """Optional ``no_signal(params, tasks, *, all_zero)`` from ``meta.py``: see `no_signal`."""
    easier_for: Callable[[dict[str, Any]], str] | None = None
    """Optional ``easier(params)`` from ``meta.py``: see `easier`."""

    @property
    def name(self) -> str:
        """Template name (equal to the folder name)."""
        return self.meta.name

    def module(self, name: str) -> ModuleType:
        """Import ``templates.<template>.<name>`` (e.g. ``"reward"``, ``"data"``, ``"workflow"``)."""
        return importlib.import_module(f"{__package__}.{self.name}.{name}")

    def resolve(self, params: dict[str, Any] | None = None) -> dict[str, ParamValue]:
        """Complete, checked parameters: defaults overlaid with ``params``.

        Raises:
            TemplateParamError: Unknown name, invalid value or a broken cross-parameter rule.
        """
        resolved = self.meta.resolve(params)
        if self.check_params is not None:
            self.check_params(resolved)
        return resolved

    def trainable_agents(self, params: dict[str, Any] | None = None) -> list[str] | None:
        """Agent names a run with ``params`` trains (``None``: single-agent, everything trains).

        Raises:
            TemplateParamError: Invalid parameters.
        """
        return None if self.agents_for is None else self.agents_for(self.resolve(params))

    def episode_calls(self, params: dict[str, Any] | None = None) -> list[int] | None:
        """The token limit of each model call one episode makes at most: a multi-turn template's own
        ``model_calls(params)`` (every player's turns, trained or not, over the most rounds), else one call
        of its ``max_tokens`` parameter; ``None`` when the template says neither. What a planner may price
        an episode at before any run of the template was measured.

        Raises:
            TemplateParamError: Invalid parameters.
        """
        resolved = self.resolve(params)
        if self.calls_for is not None:
            return self.calls_for(resolved)
        cap = resolved.get("max_tokens")
        return [int(cap)] if isinstance(cap, int) and not isinstance(cap, bool) else None

    def reward_patch(self, params: dict[str, Any], part: str) -> Remedy | None:
        """New reward weights for an exploited reward part (`templates._advice.reward_patch`).

        Args:
            params: The workflow's current ``PARAMS``.
            part: The exploited part, or ``""`` for the train reward rising while the held-out one falls.

        Returns:
            The workflow parameters to change and why, or ``None`` (no weight to change).
        """
        return reward_patch(self.meta, params, part)

    def no_signal(
        self, params: dict[str, Any], tasks: list[dict[str, Any]] | None, *, all_zero: bool
    ) -> Remedy | None:
        """The template's remedy for groups whose attempts all earn the same reward (``all_zero``: all 0),
        from its ``meta.py`` hook ``no_signal``: other workflow parameters or easier/harder tasks.

        Args:
            params: The workflow's ``PARAMS``.
            tasks: The rows of ``tasks.jsonl`` (``None`` when not at hand).
            all_zero: The groups all earn 0 (else all the same positive reward).

        Returns:
            The remedy, or ``None`` when the template has none for this case.
        """
        return None if self.no_signal_for is None else self.no_signal_for(params, tasks, all_zero=all_zero)

    def easier(self, params: dict[str, Any]) -> str | None:
        """What to try on this template when the untrained model scores zero with ``params`` (a phrase
        such as ``"arithmetic level 2 or 1 (easier questions)"``), from its ``meta.py`` hook ``easier``;
        ``None`` when the template has none."""
        return None if self.easier_for is None else self.easier_for(params)

    def build_tasks(self, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run the data builder with the data parameters of ``params`` (defaults elsewhere).

        Returns:
            Task dicts, each with an ``id``.
        """
        resolved = self.resolve(params)
        data_params = {p.name: resolved[p.name] for p in self.meta.parameters if p.target == ParamTarget.DATA}
        tasks: list[dict[str, Any]] = self.module("data").build(**data_params)
        return tasks


def _template_dirs() -> list[Path]:
    return sorted(
        p for p in PACKAGE_DIR.iterdir() if (p / "meta.py").is_file() and not p.name.startswith("_")
    )


def _load(folder: Path) -> Template:
    meta_module = importlib.import_module(f"{__package__}.{folder.name}.meta")
    meta: TemplateMeta = meta_module.META
    if meta.name != folder.name:
        raise ValueError(f"template folder {folder.name!r} declares name {meta.name!r}")
    return Template(
        meta=meta,
        folder=folder,
        check_params=getattr(meta_module, "check_params", None),
        agents_for=getattr(meta_module, "trainable_agents", None),
        calls_for=getattr(meta_module, "model_calls", None),
        no_signal_for=getattr(meta_module, "no_signal", None),
        easier_for=getattr(meta_module, "easier", None),
    )


def list_templates() -> list[TemplateMeta]:
    """Metadata of every template, sorted by name."""
    return [_load(folder).meta for folder in _template_dirs()]


def _canonical(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def get_template(name: str) -> Template:
    """The template called ``name`` (hyphens and spaces are read as underscores: ``who-is-the-spy``).

    Raises:
        UnknownTemplateError: No such template.
    """
    wanted = _canonical(name)
    folders = _template_dirs()
    for folder in folders:
        if folder.name == wanted:
            return _load(folder)
    raise UnknownTemplateError(name, [f.name for f in folders])


def _tokens(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9@]+", " ", text.lower()).split()


def _contains(tokens: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def match_score(meta: TemplateMeta, sentence: str) -> float:
    """How well ``sentence`` asks for this template.

    Each keyword or the template name found in the sentence as a whole-word phrase adds
    ``1 + 0.5 * (words - 1)`` (longer phrases are more specific); the name adds 2 more. Keywords that
    normalise to the same words count once.

    Returns:
        A score >= 0 (0: no keyword matched).
    """
    tokens = _tokens(sentence)
    phrases = {tuple(_tokens(k)) for k in meta.keywords} - {()}
    name = tuple(_tokens(meta.name.replace("_", " ")))
    score = 2.0 if _contains(tokens, list(name)) else 0.0
    for phrase in phrases | {name}:
        if _contains(tokens, list(phrase)):
            score += 1.0 + 0.5 * (len(phrase) - 1)
    return score


def match(sentence: str) -> list[tuple[str, float]]:
    """Templates whose keywords occur in ``sentence``, best first.

    Args:
        sentence: A user request, e.g. ``"train who-is-the-spy"`` or ``"min stable batch size on AIME"``.

    Returns:
        ``(template name, score)`` pairs with score > 0, highest score first (ties by name).
    """
    scored = [(meta.name, match_score(meta, sentence)) for meta in list_templates()]
    return sorted((s for s in scored if s[1] > 0), key=lambda s: (-s[1], s[0]))
