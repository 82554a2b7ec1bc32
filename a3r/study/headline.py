"""The one plain line a person reads first: its verdict label, what changed, by how much, its interval
and the command that would settle it, in at most `MAX_CHARS` characters, command included.

Built from a finding's evidence (the JSON the reporter records: ``held_out_effect`` and ``effect``, each an
`a3r.study.effects.Effect` dumped to a dict), so the report, ``a3r findings``, the CLI's end of a thread and
the TUI word it alike without loading the statistics (this module imports no SciPy). A finding without
such evidence (a sweep's conclusion) gets the first clause of its statement.

`verdict_label` is the one source of a finding's label (``confirmed``, ``refuted``, ``unconfirmed``, ``not
run``, with the held-out verdict beside it where that differs: ``unconfirmed, held-out refuted``): the
line, the vibe derivation (`a3r.graph.reporter`), the status columns of ``a3r findings``, the report's
findings and the TUI all print it.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from a3r.study.wording import counted, unit_noun
from memory import FindingStatus

if TYPE_CHECKING:
    from memory import FindingPublic

__all__ = [
    "LABELS",
    "MAX_CHARS",
    "NOT_RUN",
    "budget_advice",
    "conclusion_line",
    "evidence_lines",
    "headline",
    "settle_command",
    "verdict_label",
]

MAX_CHARS = 160
"""The most characters of the whole line, the settling command included."""

NOT_RUN = "not run"
"""The label of a finding nothing ran for (no trainer step, no configuration): no evidence either way."""
LABELS = ("confirmed", "refuted", "unconfirmed", NOT_RUN)
"""The verdict vocabulary, the first word(s) of every label (`verdict_label`)."""

_JUDGED = ("effect", "train reward Δ")
"""The evidence key of the effect the finding's status was judged on, and how the line names it."""
_HELD_OUT = ("held_out_effect", "held-out Δ")
"""The held-out comparison (after − before), added to the line after the judged effect (or standing for
it if alone)."""


_BUDGET = re.compile(r"--budget-minutes (\d+(?:\.\d+)?)")
"""The budget a stopped or not-run derivation advises (`budget_advice`), which its line's command asks."""


def budget_advice(budget_s: float) -> str:
    """What a derivation says when the budget stopped the study before its evidence: ``give
    --budget-minutes N or more`` with N twice the budget it had (whole minutes, at least 1), which the
    one-line verdict turns into the command that would let it run (``a3r vibe '…' --budget-minutes N``).

    Args:
        budget_s: The wall-time budget the study had, in seconds.
    """
    return f"give --budget-minutes {max(1, math.ceil(2 * budget_s / 60))} or more"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _parsed(evidence: str | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    parsed: Any = evidence
    if isinstance(evidence, str):
        try:
            parsed = json.loads(evidence)
        except ValueError:
            return None
    return parsed if isinstance(parsed, Mapping) else None


def _effects(parsed: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """(judged effect, held-out effect) of a finding's evidence; the held-out stands as judged when it is
    the only one."""
    if parsed is None:
        return None, None
    judged, held_out = (parsed.get(key) for key in (_JUDGED[0], _HELD_OUT[0]))
    judged = judged if isinstance(judged, Mapping) else None
    held_out = held_out if isinstance(held_out, Mapping) else None
    return (judged, held_out) if judged is not None else (held_out, None)


def _estimated(effect: Mapping[str, Any] | None) -> bool:
    return effect is not None and math.isfinite(_number(effect.get("estimate")))


def _nothing_ran(parsed: Mapping[str, Any] | None, judged: Mapping[str, Any] | None, held_out: Any) -> bool:
    """Whether the evidence says nothing ran: no trainer step behind the judged effect (and no held-out
    comparison), a configuration none of whose runs ran, or a sweep none of whose configurations did."""
    if parsed is None:
        return False
    if judged is not None:
        return not _number(judged.get("n")) and not _estimated(judged) and not _estimated(held_out)
    if parsed.get("not_run"):
        return True
    configs = parsed.get("configs")
    return isinstance(configs, list) and not any(isinstance(c, Mapping) and c.get("seeds") for c in configs)


def verdict_label(status: str, evidence: str | Mapping[str, Any] | None) -> str:
    """A finding's verdict label, the one every surface prints (line, derivation, status columns).

    Args:
        status: The finding's stored status (`memory.FindingStatus` value: what its decision rule gave).
        evidence: The finding's evidence: its JSON text, the parsed dict, or ``None``.

    Returns:
        ``not run`` when the status is ``not_run`` or (a store written before that status) the evidence
        shows nothing ran; else ``status``, followed by the held-out
        comparison's verdict where it differs from it (``unconfirmed, held-out refuted``).
    """
    if status == FindingStatus.not_run:
        return NOT_RUN
    parsed = _parsed(evidence)
    judged, held_out = _effects(parsed)
    if _nothing_ran(parsed, judged, held_out):
        return NOT_RUN
    held = held_out.get("verdict") if held_out is not None and _estimated(held_out) else None
    return f"{status}, held-out {held}" if held and held != status else status


def settle_command(effect: Mapping[str, Any], *, question: str, kind: str) -> str | None:
    """What would settle an unconfirmed effect: an ``a3r`` command where one asks for the missing units,
    else how many more units; ``None`` when settled or when no number of units would (``more_needed``
    empty).

    Over steps (a vibe run): the same request trained for ``n + more_needed`` steps (``a3r vibe …
    --steps``); over seeds: the question replicated on ``n + more_needed`` seeds (``a3r research …
    --seeds``); over episodes (held-out attempts, no flag asks for more): ``≈ K more episodes``.
    """
    command = _settle_parts(effect, kind=kind)
    if command is None:
        return None
    head, tail = command
    return f"{head} {shlex.quote(question)} {tail}" if head else tail


def _settle_parts(effect: Mapping[str, Any], *, kind: str) -> tuple[str, str] | None:
    """The settling command split around the question: (``a3r vibe``, ``--steps 24``); (``""``, the
    whole text) where no command asks for it; ``None`` where nothing would settle it."""
    more = effect.get("more_needed")
    if effect.get("verdict") != "unconfirmed" or not isinstance(more, int) or more <= 0:
        return None
    n = _number(effect.get("n"))
    total = more + (int(n) if math.isfinite(n) else 0)
    unit = str(effect.get("unit", ""))
    if unit == "steps" and kind != "research":
        return "a3r vibe", f"--steps {total}"
    if unit == "seeds":
        return "a3r research", f"--seeds {max(total, 2)}"
    return "", f"≈ {more} more {unit_noun(more, unit)}"


def _signed(value: float, digits: int) -> str:
    return f"{value:+.{digits}f}"


def _effect_text(what: str, effect: Mapping[str, Any], *, digits: int, ci: bool) -> str:
    """``train reward Δ +0.120 (95% CI -0.050…+0.300)``: the estimate and its interval, no verdict (the
    label carries it)."""
    estimate, low, high = (_number(effect.get(k)) for k in ("estimate", "low", "high"))
    if not math.isfinite(estimate):
        return f"{what} not estimated"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{what} {_signed(estimate, digits)}"
    interval = f"{_signed(low, digits)}…{_signed(high, digits)}"
    return f"{what} {_signed(estimate, digits)} ({'95% CI ' if ci else ''}{interval})"


def _budget_parts(statement: str, *, kind: str) -> tuple[str, str] | None:
    """The settling command of a derivation that advises a budget (`budget_advice`): the same request
    with that ``--budget-minutes``; ``None`` where it advises none."""
    found = _BUDGET.search(statement)
    if found is None:
        return None
    return f"a3r {'research' if kind == 'research' else 'vibe'}", f"--budget-minutes {found.group(1)}"


def _commands(settle: tuple[str, str] | None, question: str) -> list[str]:
    """The settling command's forms, longest first: the request quoted, then named; none without one."""
    if settle is None:
        return [""]
    head, tail = settle
    if not head:
        return [f"; settle: {tail}"]
    return [f"; settle: {head} {shlex.quote(question)} {tail}", f"; settle: {head} <same request> {tail}"]


_PATH_NOTE = re.compile(r"\s*\((?:[\w ]+: )?~?/[^()]*\)")
"""A parenthesised path in a reason (``(log: /…/coarse-batch_size=1-s0.server.log)``), left out of the
one-line verdict when the line does not fit."""


def _first_clause(
    label: str, statement: str, settle: tuple[str, str] | None = None, question: str = ""
) -> str:
    """The statement's first clause, then the settling command (`_budget_parts`) where the derivation
    advises one, cut at `MAX_CHARS` (the clause gives way, never the command); a verdict word it starts
    with (``refuted: …``) is replaced by ``label``, so the line never contradicts the finding's status."""
    line = statement.split(". ")[0].split("; ")[0].strip()
    word, sep, rest = line.partition(": ")
    if sep and word in LABELS:
        line = f"{label}: {rest}"
    commands = _commands(settle, question)
    command = next((c for c in commands if len(line) + len(c) <= MAX_CHARS), commands[-1])
    room = MAX_CHARS - len(command)
    if len(line) > room:  # the reason gives way, never a path: the derivation keeps the run dir
        line = _PATH_NOTE.sub("", line)
    return (line if len(line) <= room else _cut(line, room - 1) + "…") + command


def _cut(line: str, width: int) -> str:
    """``line`` cut to at most ``width`` characters at a word boundary: before a word it would cut in the
    middle (fresh-s5 #14: a verdict line ended "unde…; settle: …") and before a path, and without the separator left dangling at the end."""
    cut = line[:width]
    if len(line) <= width:
        return cut.rstrip()
    start = cut.rfind(" ") + 1
    word = line[start:].split(" ", 1)[0]
    if start > 0 and (len(cut) - start < len(word) or "/" in word):
        cut = cut[:start]
    return cut.rstrip(" ;,:(")


def _candidates(
    label: str,
    judged: tuple[str, Mapping[str, Any]],
    held_out: Mapping[str, Any] | None,
    settle: tuple[str, str] | None,
    question: str,
) -> Iterator[str]:
    """The line from the most to the least detailed: three then two decimals, the held-out interval
    without its repeated ``95% CI``; then the request in the command named, not quoted (a long request
    would crowd out the numbers); last the held-out numbers left to the label."""
    commands = _commands(settle, question)
    what, effect = judged
    both: list[str] = []
    alone: list[str] = []
    for digits in (3, 2):
        first = _effect_text(what, effect, digits=digits, ci=True)
        alone.append(f"{label}: {first}")
        if held_out is not None:
            both += [
                f"{label}: {first}; {_effect_text(_HELD_OUT[1], held_out, digits=digits, ci=ci)}"
                for ci in (True, False)
            ]
    for body in (both, alone):
        for command in commands:
            yield from (text + command for text in body)


def headline(
    statement: str, evidence: str | Mapping[str, Any] | None, *, question: str, kind: str, status: str
) -> str:
    """The one plain line of a finding (or of a study's conclusion, with its finding's evidence).

    Args:
        statement: The finding's statement (the derivation, shown below the line).
        evidence: The finding's evidence: its JSON text, the parsed dict, or ``None``.
        question: The study's question or request (what the settling command asks again).
        kind: The study's kind (``vibe``, ``research``): which command settles it.
        status: The finding's stored status (`memory.FindingStatus` value), the base of its label.

    Returns:
        At most `MAX_CHARS` characters, led by `verdict_label`: e.g. ``confirmed: train reward Δ +0.310
        (95% CI +0.120…+0.500); held-out Δ +0.220 (95% CI +0.146…+0.293)`` (Δ: the change over training
        steps; held-out after − before); for an unconfirmed effect ``…;
        settle: a3r vibe 'train who-is-the-spy' --steps 24`` (or ``…; settle: ≈ 40 more episodes`` where
        no flag asks for them; the held-out effect's where the judged one has none; ``…; settle: a3r vibe
        '…' --budget-minutes 14`` where the derivation advises a budget, `budget_advice`). A finding
        without effect evidence: its statement's first clause (and that budget command).
    """
    parsed = _parsed(evidence)
    label = verdict_label(status, parsed)
    judged, held_out = _effects(parsed)
    if judged is None:
        return _first_clause(label, statement, _budget_parts(statement, kind=kind), question)
    what = _JUDGED[1] if parsed is not None and parsed.get(_JUDGED[0]) is judged else _HELD_OUT[1]
    settle = (
        _settle_parts(judged, kind=kind)
        or (_settle_parts(held_out, kind=kind) if held_out is not None else None)
        or _budget_parts(statement, kind=kind)
    )
    last = ""
    for line in _candidates(label, (what, judged), held_out, settle, question):
        if len(line) <= MAX_CHARS:
            return line
        last = line
    return _cut(last, MAX_CHARS - 1) + "…"  # no form fits: unreachable for labels and numbers


def conclusion_line(conclusion: str, findings: Iterable[FindingPublic], *, question: str, kind: str) -> str:
    """The one plain line of a study's conclusion: `headline` of the finding recorded with the same
    statement (its evidence and status), or of the bare conclusion (``unconfirmed``) when none was."""
    finding = next((f for f in findings if f.statement == conclusion), None)
    evidence, status = (finding.evidence, finding.status.value) if finding else (None, "unconfirmed")
    return headline(conclusion, evidence, question=question, kind=kind, status=status)


def _effect_line(what: str, effect: Mapping[str, Any], *, verdict: bool = True) -> str:
    estimate, low, high = (_number(effect.get(k)) for k in ("estimate", "low", "high"))
    judged = f", {effect.get('verdict', 'unconfirmed')}" if verdict else ""
    if not math.isfinite(estimate):
        return f"{what}: not estimated{judged}"
    interval = f" (95% CI {low:+.3f} … {high:+.3f})" if math.isfinite(low) and math.isfinite(high) else ""
    return f"{what}: {estimate:+.3f}{interval}{judged}"


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
