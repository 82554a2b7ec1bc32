"""The one plain line (`a3r.study.headline`): at most 160 characters with its settling command, over every
kind of verdict a study records; and one label per finding on every surface (line, derivation, report,
``a3r findings``, the TUI's findings)."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from a3r.app.tui._findings_screen import _status_cell
from a3r.study.headline import LABELS, MAX_CHARS, NOT_RUN, headline, verdict_label
from a3r.study.report import _findings_and_patches
from memory import FindingStatus, Store

NAN = math.nan


def _effect(
    verdict: str, *, unit: str = "steps", n: int = 6, more: int | None = None, **numbers: float
) -> dict:
    values = {"estimate": 0.1234, "low": 0.0123, "high": 0.2345} | numbers
    return {**values, "verdict": verdict, "n": n, "unit": unit, "more_needed": more}


def _shown(value: float, line: str) -> bool:
    return f"{value:+.3f}" in line or f"{value:+.2f}" in line


QUESTIONS = (
    "train arithmetic",
    "train who-is-the-spy with 4 players and a leak penalty of 0.5 on Qwen3-0.6B at lr 1e-5, KL 0.01, "
    "B 16 and G 8, and tell me whether the civilians learn to vote out the spy",
    "what's the smallest learning_rate at which the countdown_long_template_name_with_many_words stays stable",
)
EFFECTS = {
    "confirmed": _effect("confirmed"),
    "refuted": _effect("refuted", estimate=-0.0123, low=-0.0456, high=0.001),
    "unconfirmed over steps": _effect("unconfirmed", more=18),
    "unconfirmed over seeds": _effect("unconfirmed", unit="seeds", n=3, more=1234),
    "unconfirmed over episodes": _effect("unconfirmed", unit="episodes", n=64, more=9999),
    "out of reach": _effect("unconfirmed", more=None),
    "not estimated": _effect("unconfirmed", estimate=NAN, low=NAN, high=NAN),
    "no interval": _effect("unconfirmed", low=NAN, high=NAN, more=3),
    "large numbers": _effect("unconfirmed", estimate=-1234.5678, low=-98765.4321, high=87654.321, more=99),
    "not run": _effect("unconfirmed", n=0, estimate=NAN, low=NAN, high=NAN),
}
HELD_OUT = {
    "none": None,
    "agrees": _effect("confirmed", unit="episodes", n=32),
    "refuted": _effect("refuted", unit="episodes", n=32, estimate=-0.01, low=-0.04, high=0.02),
    "large": _effect("unconfirmed", unit="episodes", n=32, estimate=-1234.5, low=-5678.9, high=3456.7),
}


@pytest.mark.parametrize("kind", ["vibe", "research"])
def test_every_line_fits_with_its_command(kind: str) -> None:
    """Found by a fresh user: the line was 177 characters, its command appended after the cap. Over every
    judged verdict × held-out comparison × request length × status: ≤ 160 characters, led by the label,
    the estimate and its interval in it when there is one, and a settling command when one exists."""
    for (name, effect), held_out, question, status in itertools.product(
        EFFECTS.items(), HELD_OUT.values(), QUESTIONS, [s.value for s in FindingStatus]
    ):
        evidence = {"curve": [[1, 0.2]], "effect": effect, "held_out_effect": held_out}
        line = headline("a derivation", json.dumps(evidence), question=question, kind=kind, status=status)
        case = f"{name} / {held_out} / {question[:20]} / {status}: {line}"
        assert len(line) <= MAX_CHARS, case
        assert line.startswith(verdict_label(status, evidence) + ": "), case
        for key in ("estimate", "low", "high"):
            if math.isfinite(effect[key]):  # at three decimals, or two where three leave no room
                assert _shown(effect[key], line), (key, case)
        if effect["more_needed"] and effect["verdict"] == "unconfirmed":
            assert "; settle: " in line, case
            total = effect["n"] + effect["more_needed"]
            if effect["unit"] == "steps" and kind == "vibe":
                assert line.endswith(f" --steps {total}") and "a3r vibe " in line, case
            elif effect["unit"] == "seeds":
                assert line.endswith(f" --seeds {total}") and "a3r research " in line, case
            elif effect["unit"] == "episodes":
                assert line.endswith(f"≈ {effect['more_needed']} more episodes"), case


def test_a_short_request_is_quoted_whole_and_a_long_one_is_named() -> None:
    evidence = {"effect": EFFECTS["unconfirmed over steps"], "held_out_effect": HELD_OUT["refuted"]}
    short = headline("d", evidence, question=QUESTIONS[0], kind="vibe", status="unconfirmed")
    assert short == (
        "unconfirmed, held-out refuted: train reward Δ +0.123 (95% CI +0.012…+0.234); held-out Δ -0.010 "
        "(-0.040…+0.020); settle: a3r vibe 'train arithmetic' --steps 24"
    )
    long = headline("d", evidence, question=QUESTIONS[1], kind="vibe", status="unconfirmed")
    assert long.endswith("; settle: a3r vibe <same request> --steps 24") and "held-out Δ -0.010" in long


@pytest.mark.parametrize(
    "statement",
    [
        "refuted: no learning_rate that ran (0.0001, 0.001) was stable on every seed; the largest failing …",
        "measured: " + "countdown_long_template_name_with_many_words " * 6,
        "not run: no configuration ran; " + "seed 0: cancelled by the budget " * 8,
    ],
)
def test_a_finding_without_effects_reads_as_its_first_clause_within_the_cap(statement: str) -> None:
    line = headline(
        statement, {"configs": [{"seeds": [0]}]}, question="q", kind="research", status="unconfirmed"
    )
    assert len(line) <= MAX_CHARS
    word = statement.split(":")[0]
    # a verdict word of the statement gives way to the finding's label; other statements keep their words
    assert line.startswith("unconfirmed: " if word in LABELS else f"{word}: ")


def test_a_first_clause_too_long_for_the_line_is_cut_at_a_word_boundary() -> None:
    """fresh-s5 #14: the verdict line was cut mid-word ("… is unde…; settle: a3r research …")."""
    statement = (
        "unconfirmed: batch_size=1 is undecided (1/1 seed that ran stable) and batch_size=2 is undecided "
        "(1/2 seeds that ran stable) so no configuration that ran has a stability verdict yet; more. "
        "The budget ran out for 3 runs: --budget-minutes 12 would have run them"
    )
    line = headline(
        statement, None, question="find min stable batch size", kind="research", status="unconfirmed"
    )
    assert len(line) <= MAX_CHARS and "; settle: a3r research" in line
    head = line.split("…")[0]
    assert "…" in line and statement.startswith(head) and statement[len(head)] in " ;,("  # a whole word


LABEL_CASES = {
    "confirmed": ("confirmed", {"effect": _effect("confirmed"), "held_out_effect": HELD_OUT["agrees"]}),
    "refuted": ("refuted", {"effect": EFFECTS["refuted"], "held_out_effect": HELD_OUT["refuted"]}),
    "unconfirmed": ("unconfirmed", {"effect": EFFECTS["unconfirmed over steps"], "held_out_effect": None}),
    "unconfirmed, held-out refuted": (
        "unconfirmed",
        {"effect": EFFECTS["unconfirmed over steps"], "held_out_effect": HELD_OUT["refuted"]},
    ),
    NOT_RUN: ("unconfirmed", {"effect": EFFECTS["not run"], "held_out_effect": None}),
    f"{NOT_RUN} (a configuration)": ("unconfirmed", {"value": 0.1, "runs": ["s0"], "not_run": ["s0: cut"]}),
    f"{NOT_RUN} (a sweep)": ("unconfirmed", {"configs": [{"value": 0.1, "seeds": []}]}),
    # the status a3r stores now (issue 33): the label follows it, whatever the evidence holds; the rows
    # above are stores written before it, told apart by their evidence
    f"{NOT_RUN} (stored as not_run)": ("not_run", {"value": 0.1}),
}


def _statement(label: str, evidence: dict) -> str:
    """As the reporter words it: a vibe hypothesis, or a sweep's conclusion or configuration."""
    return f"{'hypothesis ' if 'effect' in evidence else ''}{label}: a derivation with every number in it"


def test_every_surface_prints_the_one_label(tmp_path: Path) -> None:
    """Found by a fresh user: the line left out the held-out verdict, the derivation said "refuted" and
    the status column "unconfirmed" for one study. One function gives the label; the line, the report's
    findings, ``a3r findings`` and the TUI's status cell print it."""
    db = tmp_path / "memory.db"
    expected: dict[int, str] = {}
    with Store(db) as store:
        study = store.create_study("train arithmetic", kind="vibe")
        for name, (status, evidence) in LABEL_CASES.items():
            label = name.split(" (")[0]
            assert verdict_label(status, evidence) == label, name
            finding = store.add_finding(
                study.id,
                statement=_statement(label, evidence),
                evidence=json.dumps(evidence),
                confidence=0.5,
                status=status,
            )
            expected[finding.id] = label
        findings = store.findings(study.id)
        report = "\n".join(_findings_and_patches(findings, [], study))
    for f in findings:
        label = expected[f.id]
        line = headline(f.statement, f.evidence, question=study.question, kind="vibe", status=f.status.value)
        assert line.startswith(f"{label}: "), line
        assert f"{label}: " in f.statement  # the derivation (as the reporter writes it)
        assert f"** [{label}, confidence" in report
        assert _status_cell(f).plain == label
    table = CliRunner().invoke(app, ["findings", "--store", str(db)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    for finding_id, label in expected.items():
        row = next(r for r in table.output.splitlines() if re.match(rf"^│ {finding_id} +│", r))
        assert f"│ {label}" in row, row


def test_a_thread_ends_with_its_verdict_line_before_its_conclusion(tmp_path: Path, capsys: Any) -> None:
    """``a3r vibe`` / ``research`` print the one plain line first (the study's conclusion finding, read
    by `conclusion_line` as the report and the TUI read it), then the derivation."""
    from a3r.app.commands import _finish
    from a3r.app.session import Step
    from a3r.study.headline import conclusion_line

    conclusion = "hypothesis unconfirmed, held-out refuted: a derivation with every number in it"
    evidence = LABEL_CASES["unconfirmed, held-out refuted"][1]
    with Store(tmp_path / "memory.db") as store:
        study = store.create_study("train arithmetic", kind="vibe")
        store.add_finding(study.id, statement=conclusion, evidence=json.dumps(evidence), confidence=0.3)
        verdict = conclusion_line(conclusion, store.findings(study.id), question=study.question, kind="vibe")
    assert verdict.startswith("unconfirmed, held-out refuted: train reward Δ ") and len(verdict) <= MAX_CHARS
    assert conclusion_line("no finding of it", [], question="q", kind="vibe") == "no finding of it"
    _finish(Step(thread_id="t", status="done", conclusion=conclusion, verdict=verdict, study_id=study.id))
    out = capsys.readouterr().out
    assert out.index(f"verdict: {verdict}") < out.index(f"conclusion: {conclusion}")
