"""What a template advises when a run goes wrong: a reward patch for an exploited part, a remedy for
groups with no signal, and what to try when the model scores zero.

The reward patch follows the roles of the template's reward parts (`TemplateMeta.reward_parts`) and the
parameters that weigh them (`TemplateMeta.reward_weights`): a ``violation`` rising makes its penalty
dearer (doubled, at least the template's default, at most the parameter's maximum), a ``shaping`` bonus
rising while the goal does not is switched off (0). The held-out evaluator keeps the original weights,
so the patched run is still judged by the template's reward. The other two come from per-template hooks
in ``meta.py`` (`templates.Template.no_signal`, `templates.Template.easier`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._meta import ParamValue, TemplateMeta


@dataclass(frozen=True)
class Remedy:
    """New parameter values for a run, and why."""

    reason: str
    """One or two sentences for the patch's rationale."""
    workflow: dict[str, ParamValue] = field(default_factory=dict)
    """Workflow parameters to set in ``workflow.py``'s ``PARAMS`` (name → new value)."""
    data: dict[str, ParamValue] = field(default_factory=dict)
    """Data parameters to rebuild ``tasks.jsonl`` with (empty: the tasks stay)."""


def _weight_change(role: str, current: float, default: float, maximum: float | None) -> float | None:
    """The patched value of a part's weight, or ``None`` when it already closes the exploit."""
    if role == "violation":
        ceiling = 1.0 if maximum is None else maximum
        return round(min(ceiling, max(2 * current, default)), 4) if current < ceiling else None
    return 0.0 if current > 0 else None


def reward_patch(meta: TemplateMeta, params: dict[str, Any], part: str) -> Remedy | None:
    """The reward patch of an exploited part (see the module docstring).

    Args:
        meta: The template's metadata.
        params: The workflow's current ``PARAMS``.
        part: The exploited part (a ``reward_parts`` name), or ``""`` when the exploit shows only as the
            train reward rising while the held-out reward falls: then every weighted part is patched.

    Returns:
        The new weights with the template's reason, or ``None`` when the template weighs no such part
        or every weight already closes the exploit.
    """
    weights = meta.reward_weights
    chosen = [part] if part in weights else [] if part else list(weights)
    changes: dict[str, ParamValue] = {}
    for name in chosen:
        param = meta.param(weights[name])
        current = params.get(param.name)
        if not isinstance(current, int | float) or not isinstance(param.default, int | float):
            continue
        new = _weight_change(meta.reward_parts[name], float(current), float(param.default), param.maximum)
        if new is not None:
            changes[param.name] = new
    if not changes:
        return None
    return Remedy(reason=meta.reward_patch_reason or "", workflow=changes)
