"""``swarm run`` and ``swarm top``: user mistakes end in one readable line; real runs against a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from swarm.cli import app
from swarm.protocol import EpisodeStatus
from swarm.run_options import RunOptions, RunOptionsError
from tests.client.conftest import CHAT_WORKFLOW, episodes_of, write_jsonl, write_workflow

cli = CliRunner()


def _one_error_line(output: str, needle: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error:") and needle in lines[0], output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("missing-workflow", "missing.py: no such file"),
        ("no-run", "defines no 'async def run"),
        ("bad-jsonl", "data.jsonl:2: invalid JSON"),
        ("bad-server", "--server ftp://x: expected URL or NAME=URL"),
        ("eval-without-dataset", "--eval-every needs --eval-dataset"),
        ("bad-group-size", "--group-size: Input should be greater than or equal to 1"),
        ("bad-episode-timeout", "--episode-timeout: Input should be greater than 0"),
        ("bad-heartbeat", "--heartbeat: Input should be greater than 0"),
    ],
)
def test_user_mistakes(tmp_path: Path, setup: str, needle: str) -> None:
    workflow = write_workflow(tmp_path, "async def run(task, llm):\n    return 1.0\n")
    data = write_jsonl(tmp_path / "data.jsonl", [{"id": "a"}])
    args = ["run", str(workflow), "--server", "http://127.0.0.1:9", "--dataset", str(data)]
    if setup == "missing-workflow":
        args[1] = str(tmp_path / "missing.py")
    elif setup == "no-run":
        args[1] = str(write_workflow(tmp_path, "x = 1\n", name="norun.py"))
    elif setup == "bad-jsonl":
        data.write_text('{"id": "a"}\n{"id": \n')
    elif setup == "bad-server":
        args[3] = "ftp://x"
    elif setup == "eval-without-dataset":
        args += ["--eval-every", "2"]
    elif setup == "bad-group-size":
        args += ["--group-size", "0"]
    elif setup == "bad-episode-timeout":
        args += ["--episode-timeout", "0"]
    elif setup == "bad-heartbeat":
        args += ["--heartbeat", "-1"]
    result = cli.invoke(app, args)
    assert result.exit_code == 1
    _one_error_line(result.output, needle)


def test_run_against_a_server_then_resume(client_server, tmp_path: Path) -> None:
    workflow = write_workflow(tmp_path, CHAT_WORKFLOW)
    data = write_jsonl(
        tmp_path / "data.jsonl", [{"id": f"c{i}", "question": "2+2?", "value": 1.0} for i in range(3)]
    )
    state = tmp_path / "state"
    args = ["run", str(workflow), "--server", client_server.url, "--dataset", str(data), "--group-size", "2"]
    args += ["--concurrency", "3", "--max-tasks", "2", "--client-id", "cli-run", "--state-dir", str(state)]
    result = cli.invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "finished" in result.output and "4" in result.output
    assert sorted(e.task_id for e in episodes_of(client_server, "cli-run")) == ["c0", "c0", "c1", "c1"]
    progress = [json.loads(line) for line in (state / "progress.jsonl").read_text().splitlines()]
    assert len(progress) == 4
    # same command again: everything is done, nothing new is opened
    again = cli.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert len(episodes_of(client_server, "cli-run")) == 4
    assert "resumed (skipped)" in again.output
    # --fresh forgets the progress and runs the slots again
    fresh = cli.invoke(app, [*args, "--fresh", "--no-progress"])
    assert fresh.exit_code == 0
    finished = [e for e in episodes_of(client_server, "cli-run") if e.status is EpisodeStatus.FINISHED]
    assert len(finished) == 8


def test_top_once_prints_one_frame(client_server) -> None:
    result = cli.invoke(app, ["top", client_server.url, "--once"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"swarm top {client_server.url}" in out
    for word in ("state", "policy step", "episodes", "finished", "clients", "reward mean per step"):
        assert word in out, word


def test_top_off_a_terminal_prints_one_frame(client_server) -> None:
    result = cli.invoke(app, ["top", client_server.url])  # the runner's output is not a terminal
    assert result.exit_code == 0, result.output
    assert result.output.count(f"swarm top {client_server.url}") == 1


def test_top_once_unreachable_server() -> None:
    result = cli.invoke(app, ["top", "http://127.0.0.1:9", "--once"])
    assert result.exit_code == 1
    _one_error_line(result.output, "cannot reach http://127.0.0.1:9")


def test_run_against_an_unreachable_server(tmp_path: Path) -> None:
    workflow = write_workflow(tmp_path, "async def run(task, llm):\n    return 1.0\n")
    data = write_jsonl(tmp_path / "data.jsonl", [{"id": "a"}])
    result = cli.invoke(app, ["run", str(workflow), "--server", "http://127.0.0.1:9", "--dataset", str(data)])
    assert result.exit_code == 1
    _one_error_line(result.output, "cannot reach http://127.0.0.1:9: ConnectError")


def test_sparkline_scales_min_to_max() -> None:
    from swarm.client._dashboard import sparkline

    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▁▁"
    assert sparkline([0.0, float("nan"), 1.0]) == "▁ █"
    assert sparkline([]) == ""
    assert len(sparkline([float(i) for i in range(100)], width=60)) == 60


def test_a_run_where_no_episode_finishes_exits_1(client_server, tmp_path: Path) -> None:
    workflow = write_workflow(tmp_path, "async def run(task, llm):\n    raise KeyError('reward')\n")
    data = write_jsonl(tmp_path / "data.jsonl", [{"id": "a"}])
    args = ["run", str(workflow), "--server", client_server.url, "--dataset", str(data)]
    result = cli.invoke(
        app, [*args, "--group-size", "1", "--state-dir", str(tmp_path / "s"), "--no-progress"]
    )
    assert result.exit_code == 1, result.output
    assert "error: no episode finished (1 failed; the reasons are printed above)" in result.output
    assert "train reward mean │ -" in result.output or "train reward mean  -" in result.output


def test_run_is_generated_from_its_options_model() -> None:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    params = {p.name: p for p in command.params}
    assert list(params) == list(RunOptions.model_fields)
    for name, info in RunOptions.model_fields.items():
        assert params[name].help == info.description, name
    assert params["group_size"].default == 4 and params["server"].required and params["dataset"].required
    assert params["fresh"].opts == ["--fresh"] and params["client_token"].envvar == "SWARM_CLIENT_TOKEN"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"server": ["a=http://x", "a=http://y"]}, "--server a=http://y: the name 'a' is given twice"),
        ({"server": ["http://x", "b=http://y"]}, "--server: name every server (NAME=URL)"),
        ({"infra_retries": -1}, "--infra-retries: Input should be greater than or equal to 0"),
        ({"trainable_agent": ["a", ""], "max_tasks": 0}, "--max-tasks: Input should be greater than"),
    ],
)
def test_run_options_name_the_flag(values: dict[str, object], message: str) -> None:
    options = RunOptions.model_validate(
        {"workflow": "w.py:Agent", "server": ["http://x"], "dataset": "d", **values}
    )
    with pytest.raises(RunOptionsError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        options.check()
        options.runner_config()
    assert options.workflow_name == "w"
