"""The one plain line a person reads first: what changed, by how much, its interval, whether it is
confirmed, and the command that would settle it (at most `MAX_CHARS` characters where the command fits).

Built from a finding's evidence (the JSON the reporter records: ``held_out_effect`` and ``effect``, each an
`a3r.study.effects.Effect` dumped to a dict), so the report, ``a3r findings`` and the TUI word it alike
without loading the statistics (this module imports no SciPy). A finding without such evidence (a
sweep's conclusion) gets the first clause of its statement, cut at `MAX_CHARS`.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from typing import Any

from a3r.study.wording import counted

__all__ = ["MAX_CHARS", "evidence_lines", "headline", "settle_command"]

MAX_CHARS = 160
"""The most characters of the line before its command (the command is never cut: it must run)."""

_JUDGED = ("effect", "train reward change")
"""The evidence key of the effect the finding's status was judged on, and how the line names it."""
_HELD_OUT = ("held_out_effect", "held-out after − before")
"""The held-out comparison, added to the line after the judged effect (or standing for it if alone)."""


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def settle_command(effect: Mapping[str, Any], *, question: str, kind: str) -> str | None:
    """What would settle an unconfirmed effect: an ``a3r`` command where one asks for the missing units,
    else how many more units; ``None`` when settled or when no number of units would (``more_needed``
    empty).

    Over steps (a vibe run): the same request trained for ``n + more_needed`` steps (``a3r vibe …
    --steps``); over seeds: the question replicated on ``n + more_needed`` seeds (``a3r research …
    --seeds``); over episodes (held-out attempts, no flag asks for more): ``≈ K more episodes``.
    """
    more = effect.get("more_needed")
    if effect.get("verdict") != "unconfirmed" or not isinstance(more, int) or more <= 0:
        return None
    n = _number(effect.get("n"))
    total = more + (int(n) if math.isfinite(n) else 0)
    unit = str(effect.get("unit", ""))
    if unit == "steps" and kind != "research":
        return f"a3r vibe {shlex.quote(question)} --steps {total}"
    if unit == "seeds":
        return f"a3r research {shlex.quote(question)} --seeds {max(total, 2)}"
    return f"≈ {counted(more, unit)} more"


def _effect_line(what: str, effect: Mapping[str, Any], *, verdict: bool = True) -> str:
    estimate, low, high = (_number(effect.get(k)) for k in ("estimate", "low", "high"))
    judged = f", {effect.get('verdict', 'unconfirmed')}" if verdict else ""
    if not math.isfinite(estimate):
        return f"{what}: not estimated{judged}"
    interval = f" (95% CI {low:+.3f} … {high:+.3f})" if math.isfinite(low) and math.isfinite(high) else ""
    return f"{what}: {estimate:+.3f}{interval}{judged}"


def _first_clause(statement: str) -> str:
    clause = statement.split(". ")[0].split("; ")[0].strip()
    return clause if len(clause) <= MAX_CHARS else clause[: MAX_CHARS - 1].rstrip() + "…"


def headline(statement: str, evidence: str | Mapping[str, Any] | None, *, question: str, kind: str) -> str:
    """The one plain line of a finding (or of a study's conclusion, with its finding's evidence).

    Args:
        statement: The finding's statement (the derivation, shown below the line).
        evidence: The finding's evidence: its JSON text, the parsed dict, or ``None``.
        question: The study's question or request (what the settling command asks again).
        kind: The study's kind (``vibe``, ``research``): which command settles it.

    Returns:
        E.g. ``train reward change: +0.31 (95% CI +0.12 … +0.50), confirmed; held-out after − before:
        +0.220 (95% CI +0.146 … +0.293)`` (the verdict is the judged effect's, as the finding's status);
        for an unconfirmed effect ``…; settle: a3r vibe 'train who-is-the-spy' --steps 24`` (or
        ``…; settle: ≈ 40 more episodes`` where no flag asks for them).
    """
    parsed: Any = evidence
    if isinstance(evidence, str):
        try:
            parsed = json.loads(evidence)
        except ValueError:
            parsed = None
    if not isinstance(parsed, Mapping):
        return _first_clause(statement)
    judged, held_out = (parsed.get(key) for key in (_JUDGED[0], _HELD_OUT[0]))
    if isinstance(judged, Mapping):
        line = _effect_line(_JUDGED[1], judged)
    elif isinstance(held_out, Mapping):
        judged, held_out = held_out, None
        line = _effect_line(_HELD_OUT[1], judged)
    else:
        return _first_clause(statement)
    if isinstance(held_out, Mapping):
        line += "; " + _effect_line(_HELD_OUT[1], held_out, verdict=False)
    command = settle_command(judged, question=question, kind=kind)
    return f"{line[:MAX_CHARS]}; settle: {command}" if command else line[:MAX_CHARS]


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else "–"
    if isinstance(value, list):
        return counted(len(value), "points")
    if isinstance(value, Mapping):
        return ", ".join(
            f"{k} {_value_text(v)}" for k, v in value.items() if not isinstance(v, Mapping | list)
        )
    return "–" if value is None else str(value)


def evidence_lines(evidence: str) -> list[str]:
    """A finding's evidence, one readable line per entry, for a person (not raw JSON with ``NaN``):
    an effect as ``name: +0.100 (95% CI …), confirmed, over 16 episodes``, a curve as its point count,
    a number at four significant digits, a missing number as ``–``. Evidence that is not JSON is its
    own single line."""
    try:
        parsed = json.loads(evidence)
    except ValueError:
        return [evidence] if evidence else []
    if not isinstance(parsed, Mapping):
        return [_value_text(parsed)]
    lines = []
    for key, value in parsed.items():
        if isinstance(value, Mapping) and "estimate" in value:
            units = (
                f", over {counted(int(_number(value.get('n'))), str(value.get('unit')))}"
                if value.get("n")
                else ""
            )
            lines.append(_effect_line(key, value) + units)
        else:
            lines.append(f"{key}: {_value_text(value)}")
    return lines
