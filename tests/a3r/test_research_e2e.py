"""``a3r research`` end to end through its command line on a tiny model, within a small budget: the
offline plan, the rendered template, a real ``swarm serve`` subprocess over a saved tiny model, the
preflight's held-out evaluation with its sequential futility test, the verdict and the report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from a3r.study.sequential import SignalRule
from memory import Store, StudyStatus
from tests.conftest import build_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture()
def tiny_dir(tmp_path: Path, embedded_source: Any, tokenizer: Any) -> Path:
    """The tiny random model and the real tokenizer saved as a model folder (``swarm serve --model``)."""
    folder = tmp_path / "tiny-model"
    build_tiny_model(embedded_source, seed=5).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_research_reaches_its_zero_signal_verdict_within_budget(tmp_path: Path, tiny_dir: Path) -> None:
    budget_s = 120.0
    args = ["research", "find min stable batch size on arithmetic", "--model", str(tiny_dir)]
    # a budget of 3 min: below the ≈ 2.9 min its cheapest configuration and the preflight need at the
    # assumed speed, the study is refused before it starts (issue 33, part 5); it still ends in 2 min
    args += ["--eval-tasks", "8", "--budget-minutes", "3"]
    args += ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    wall = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert wall < budget_s
    output = result.output
    # The random tiny model never answers an arithmetic question: the preflight stops at the first look
    # that can decide (8 held-out tasks × 4 attempts planned), and the thread ends with the bound.
    test = SignalRule().test(4, 32)
    assert test.first_stop == 28
    assert (
        "stopped before the sweep: the untrained model gets too little signal for GRPO on arithmetic"
        in output
    )
    assert "held-out success rate below" in output and "scores zero" not in output
    assert "the test stopped after" in output and "of 32 planned attempts" in output
    assert "≥ 0.159" in output and "--force" in output
    with Store(tmp_path / "memory.db") as store:
        (study,) = store.studies()
        assert study.status is StudyStatus.abandoned
        (run,) = store.study_runs(study.id)
        assert run.name == "preflight"
    (evaluated,) = (tmp_path / ".a3r" / "studies").glob("*/runs/preflight/eval.jsonl")
    records = [json.loads(line) for line in evaluated.read_text().splitlines()]
    assert 28 <= len(records) <= 32 and all(r["reward"] == 0.0 for r in records)
    (report,) = (tmp_path / ".a3r").rglob("report.md")
    assert "the test stopped after" in report.read_text()
