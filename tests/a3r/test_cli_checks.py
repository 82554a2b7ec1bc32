"""What ``a3r vibe`` and ``a3r research`` say before running anything: where each planned value comes
from, and the one-line refusals of values they cannot honour (through the real CLI, offline)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app, main
from a3r.providers import OfflineProvider
from tests.a3r.planner_states import offline_context


def _invoke(tmp_path: Path, *args: str) -> tuple[int, str]:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    result = CliRunner().invoke(app, [*args, *common])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("request_text", "warned"),
    [
        ("train arithmetic temperature=0", True),
        ("train arithmetic with temperature 0", True),  # the README's zero-signal patch example
        ("train arithmetic temperature=0.05", True),
        ("train arithmetic temperature=0.6", False),
    ],
)
def test_vibe_warns_at_a_temperature_grpo_cannot_train_at(
    tmp_path: Path, request_text: str, warned: bool
) -> None:
    # found by a fresh user: vibe planned GRPO at temperature 0 without a word, while research refuses it
    code, output = _invoke(tmp_path, "vibe", request_text, "--dry-run")
    assert code == 0, output  # allowed: the analyst diagnoses the zero signal and patches the temperature
    lines = [line for line in output.splitlines() if line.startswith("  warning: a sampling temperature of")]
    assert len(lines) == int(warned)
    assert not warned or "zero advantage" in lines[0]


def test_a_dry_run_says_which_parameters_the_request_gave(tmp_path: Path) -> None:
    code, output = _invoke(tmp_path, "vibe", "train who is the spy with 6 players", "--dry-run")
    assert code == 0, output
    assert "    n_players = 6  (set by the plan; template default 3)" in output
    assert (
        "    tell_roles = false  (template default)" in output
    )  # as a request writes it, not Python's False
    why = next(line for line in output.splitlines() if line.startswith("  why: "))
    assert "parameters read from the request: n_players = 6; template defaults: describe_max_tokens," in why
    assert "tell_roles" in why.split("template defaults: ")[1]
    code, output = _invoke(tmp_path, "vibe", "train who is the spy hide_leaks=false", "--dry-run")
    assert code == 0, output
    assert "    hide_leaks = false  (set by the plan; template default true)" in output
    assert "parameters read from the request: hide_leaks = false;" in output
    code, output = _invoke(tmp_path, "research", "best temperature on who is the spy", "--dry-run")
    assert code == 0, output
    assert "    n_players = 3  (template default)" in output
    assert "    temperature =" not in output  # the swept knob: each run sets its own value


def _console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    """Run the ``a3r`` console script in process on ``args``: its exit code and what it wrote."""
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    monkeypatch.setattr(sys, "argv", ["a3r", *args, *common])
    with pytest.raises(SystemExit) as ended:
        main()
    captured = capsys.readouterr()
    return int(ended.value.code or 0), captured.out + captured.err


def test_budgets_that_are_not_finite_positive_numbers_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    question = "find the best KL coefficient on arithmetic"
    for value in ("inf", "nan", "-1", "0", "1e309"):
        code, output = _console(
            tmp_path, monkeypatch, capsys, "research", question, "--dry-run", f"--budget-minutes={value}"
        )
        assert code == 2 and output.count("\n") == 1, (value, output)
        assert output.startswith("error: Invalid value for '--budget-minutes'"), output
    code, output = _console(
        tmp_path, monkeypatch, capsys, "research", question, "--dry-run", "--budget-minutes=inf"
    )
    assert (
        output
        == "error: Invalid value for '--budget-minutes': inf is not a finite number (see 'a3r research --help')\n"
    )
    code, output = _console(
        tmp_path, monkeypatch, capsys, "vibe", "train arithmetic", "--dry-run", "--hang-after", "inf"
    )
    assert code == 2 and "'--hang-after': inf is not a finite number" in output
    # found by a fresh user: nan was "Input should be greater than or equal to 0.1"
    for option, value, said in (
        ("--budget-minutes", "nan", "nan is not a finite number"),
        ("--hang-after", "nan", "nan is not a finite number"),
        ("--budget-minutes", "0.05", "Input should be greater than or equal to 0.1"),
        ("--hang-after", "0.5", "Input should be greater than or equal to 1"),
    ):
        code, output = _console(
            tmp_path, monkeypatch, capsys, "vibe", "train arithmetic", "--dry-run", option, value
        )
        assert code == 2 and output.startswith(f"error: Invalid value for '{option}': {said} ("), output


def test_research_help_gives_the_budget_default() -> None:
    # A real process: a3r's help is click's plain listing, which CliRunner forces to 80 columns.
    import os
    import subprocess

    code = "from a3r.app.cli import main; main()"
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-c", code, "research", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if "--budget-minutes" in line)
    assert "Wall-time budget of the whole thread in minutes" in line and "[default: 60.0]" in line


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("train who is the spy with tell roles true", True),
        ("train who is the spy tell_roles=yes", True),
        ("train who is the spy with tell_roles on", True),
        ("train who is the spy with Tell-Roles: off", False),
        ("train who is the spy, tell roles no", False),
        ("train who is the spy", False),  # not named: the template's default
    ],
)
def test_true_false_parameters_are_read_from_words(request_text: str, expected: bool) -> None:
    plan = OfflineProvider().plan(request_text, mode="vibe")
    assert plan.params["tell_roles"] is expected


def test_a_true_false_parameter_without_a_value_is_refused_in_one_line(tmp_path: Path) -> None:
    code, output = _invoke(tmp_path, "vibe", "train who is the spy with tell roles", "--dry-run")
    assert code == 1 and output == (
        "error: 'tell_roles' is a true/false parameter of who_is_the_spy: write its value after it "
        "(tell_roles=true, 'tell roles off'; one of true, false, yes, no, on, off)\n"
    )


def test_more_held_out_tasks_than_an_evaluation_can_have_are_refused_or_capped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    question = "find min stable batch size on AIME"
    code, output = _console(
        tmp_path, monkeypatch, capsys, "research", question, "--dry-run", "--eval-tasks", "100000"
    )
    assert code == 2 and output == (
        "error: Invalid value for '--eval-tasks': Input should be less than or equal to 256 "
        "(see 'a3r research --help')\n"
    )
    # AIME's 60 problems: the held-out split is the last quarter, 15 tasks, whatever was asked
    code, output = _invoke(tmp_path, "research", question, "--dry-run", "--eval-tasks", "40")
    assert code == 0, output
    assert (
        "  note: --eval-tasks 40, but the math template's held-out split has 15 tasks (a quarter of its tasks): "
        "every evaluation runs those 15" in output
    )
    assert "(up to 60 attempts)" in output  # the preflight: 15 tasks × 4 attempts, not 40 × 4


def test_the_coder_writes_at_most_the_held_out_split_and_says_so(tmp_path: Path) -> None:
    from a3r.graph import build_graph, open_checkpointer
    from a3r.graph.coder import heldout_capacity
    from memory import Store

    assert (
        heldout_capacity(OfflineProvider().plan("train arithmetic", mode="vibe")) == 1_000_000
    )  # a generator
    with Store(tmp_path / "memory.db") as store:
        ctx = dataclasses.replace(offline_context(tmp_path, store), eval_tasks=40)
        graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"), interrupt_before=["runner"])
        config = {"configurable": {"thread_id": "t"}}
        request = {"request": "find min stable batch size on AIME", "mode": "research"}
        chunks = list(graph.stream(request, config, context=ctx))  # type: ignore[call-overload]
        assert [name for chunk in chunks for name in chunk] == ["planner", "coder", "__interrupt__"]
        ws = Path(graph.get_state(config).values["workspace"])  # type: ignore[arg-type]
        assert len((ws / "heldout.jsonl").read_text().splitlines()) == 15
        events = [e.message for e in store.events()]
        assert any(
            "held-out 15 of the 40 asked (--eval-tasks): the template's held-out split has no more" in m
            for m in events
        ), events


def test_a_command_line_value_of_the_swept_setting_is_refused_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refusal = (
        "error: the study varies KL coefficient β (kl_coef ∈ {0, 0.01, 0.1, 1}): the fixed kl_coef = 0.1 given "
        "on the command line would be replaced by each run's value; drop it, or ask a question about another "
        "setting\n"
    )
    question = "find the best KL coefficient on arithmetic"
    for extra in (["--dry-run"], []):  # the dry run, and before a thread or a store exists
        code, output = _invoke(tmp_path, "research", question, "--serve-option", "kl-coef=0.1", *extra)
        assert (code, output) == (1, refusal)
    assert not (tmp_path / ".a3r").exists() and not (tmp_path / "memory.db").exists()
    code, output = _invoke(
        tmp_path,
        "research",
        "find min stable batch size on arithmetic",
        "--serve-option",
        "kl-coef=0.1",
        "--dry-run",
    )
    assert code == 0 and "kl_coef=0.1" in output  # another setting: kept for every run


def test_the_planner_node_records_the_temperature_warning(tmp_path: Path) -> None:
    from langgraph.runtime import Runtime

    from a3r.graph.planner import planner
    from memory import Store

    state = {"request": "train arithmetic temperature=0", "mode": "vibe", "overrides": {}}
    with Store(tmp_path / "memory.db") as store:
        planner(state, Runtime(context=offline_context(tmp_path, store)))  # type: ignore[arg-type]
        events = [e.message for e in store.events()]
    assert sum(m.startswith("warning: a sampling temperature of 0 (< 0.1)") for m in events) == 1, events


def test_the_planner_node_refuses_the_swept_setting_among_the_overrides(tmp_path: Path) -> None:
    from langgraph.runtime import Runtime

    from a3r.errors import PlanError
    from a3r.graph.planner import planner
    from memory import Store

    state = {
        "request": "find the best KL coefficient on arithmetic",
        "mode": "research",
        "overrides": {"kl_coef": 0.1},
    }
    with (
        Store(tmp_path / "memory.db") as store,
        pytest.raises(PlanError, match=r"the study varies KL coefficient"),
    ):
        planner(state, Runtime(context=offline_context(tmp_path, store)))  # type: ignore[arg-type]


def test_the_plan_line_of_a_sweep_shows_the_varied_values(tmp_path: Path) -> None:
    # found by a fresh user: an lr study's log said "lr=0.0002", a value no run of the study uses
    from langgraph.runtime import Runtime

    from a3r.graph.planner import planner
    from memory import Store

    state = {"request": "find the best lr on arithmetic", "mode": "research", "overrides": {}}
    with Store(tmp_path / "memory.db") as store:
        result = planner(state, Runtime(context=offline_context(tmp_path, store)))  # type: ignore[arg-type]
        (line,) = [entry for entry in result.update["log"] if entry.startswith("plan (")]  # type: ignore[index]
    assert "lr ∈ {1e-05, 0.0001, 0.001} (varied)" in line and "lr=0.0002" not in line
