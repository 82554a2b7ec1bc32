"""Template registry: listing, metadata, parameters, matching, rendering and validation."""

import ast
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import templates
from templates import (
    ParamTarget,
    TemplateParamError,
    TemplateRenderError,
    TemplateValidationError,
    UnknownTemplateError,
    get_template,
    list_templates,
    match,
    render,
    validate,
)

NAMES = ["arithmetic", "countdown", "math", "werewolves", "who_is_the_spy"]


def test_exported_names():
    assert sorted(templates.__all__) == sorted(
        [
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
    )


def test_list_and_get():
    metas = list_templates()
    assert [m.name for m in metas] == NAMES
    assert all(m.keywords and m.capabilities and m.description for m in metas)
    assert get_template("who-is-the-spy").name == "who_is_the_spy"
    assert get_template(" Who is the spy ").meta.multi_agent
    with pytest.raises(UnknownTemplateError, match="available: arithmetic") as info:
        get_template("chess")
    assert isinstance(info.value, KeyError)


@pytest.mark.parametrize("name", NAMES)
def test_workflow_params_block_holds_the_metadata_defaults(name):
    template = get_template(name)
    assert template.meta.defaults(ParamTarget.WORKFLOW) == template.module("workflow").PARAMS
    readme = template.folder / "README.md"
    assert readme.is_file() and name.replace("_", " ") in readme.read_text().lower().replace("-", " ")


def test_param_validation():
    spy = get_template("who_is_the_spy")
    assert spy.resolve({"n_players": "6", "tell_roles": "yes"})["n_players"] == 6
    cases = [
        ({"n_players": 2}, "below the minimum"),
        ({"n_players": 9}, "above the maximum"),
        ({"n_players": 4.5}, "expected an int"),
        # found by a fresh user: "expected a bool, got 'maybe'" named no word that works
        (
            {"tell_roles": "maybe"},
            r"expected true or false \(true/false, yes/no, on/off or 1/0\), got 'maybe'",
        ),
        ({"train_roles": "judge"}, "not one of"),
        ({"colour": "red"}, "unknown parameter"),
        ({"n_players": 4, "n_spies": 2}, "fewer than half"),
        ({"describe_max_tokens": None}, "may not be None"),
    ]
    for params, message in cases:
        with pytest.raises(TemplateParamError, match=message) as info:
            spy.resolve(params)
        assert isinstance(info.value, ValueError)
    assert spy.resolve({"opponent_base_url": None})["opponent_base_url"] is None


@pytest.mark.parametrize(
    ("sentence", "best"),
    [
        ("train who-is-the-spy", "who_is_the_spy"),
        ("RL on the undercover social deduction game with 6 players", "who_is_the_spy"),
        ("find min stable batch size on AIME", "math"),
        ("does GRPO improve GSM8K pass@k?", "math"),
        ("sanity check training on single digit addition", "arithmetic"),
        ("countdown: reach a target number", "countdown"),
    ],
)
def test_match_ranks_the_intended_template_first(sentence, best):
    ranked = match(sentence)
    assert ranked and ranked[0][0] == best
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(ranked))


def test_match_returns_nothing_for_unrelated_requests():
    assert match("write me a poem about the sea") == []


@pytest.mark.parametrize("name", NAMES)
def test_render_then_validate(tmp_path, name):
    out = tmp_path / name
    rendered = render(name, {}, out)
    report = validate(out)
    assert report.ok, report
    assert report.tasks > 0
    assert json.loads(rendered.params.read_text())["template"] == name
    assert {"workflow.py", "reward.py", "data.py", "tasks.jsonl", "README.md", "test_template.py"} <= {
        p.name for p in out.iterdir()
    }


_WORKSPACE_CHECK = """
import json, sys
from swarm.client import load_workflow
import templates
run = load_workflow("workflow.py")
shared = sorted(m for m in sys.modules if m.startswith("templates._game"))
print(json.dumps({"shared": shared, "templates": templates.__file__}))
"""


@pytest.mark.parametrize("name", ["who_is_the_spy", "werewolves"])
def test_a_rendered_game_workspace_runs_from_its_folder_on_the_installed_package(tmp_path, name):
    """``swarm run workflow.py`` loads the workflow by path from the workspace folder: the game's own
    modules are the folder's files, the shared game base comes from the installed ``templates`` package,
    and the data builder's command line works there too."""
    root = Path(templates.__file__).resolve().parent.parent
    rendered = render(name, {"n_tasks": 2}, tmp_path / name)
    assert not (rendered.folder / "_game").exists()  # shared code is imported, not copied

    def python(*args: str) -> str:
        env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=rendered.folder, env=env
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    loaded = json.loads(python("-c", _WORKSPACE_CHECK).strip().splitlines()[-1])
    assert "templates._game.players" in loaded["shared"] and "templates._game.table" in loaded["shared"]
    assert Path(loaded["templates"]).resolve() == root / "templates" / "__init__.py"
    python("data.py", "--out", "again.jsonl", "--n-tasks", "2")
    assert (rendered.folder / "again.jsonl").read_text() == rendered.tasks.read_text()


def test_trainable_agents_of_multi_agent_templates(tmp_path):
    spy = get_template("who_is_the_spy")
    assert spy.trainable_agents({"train_roles": "spy", "n_players": 6, "n_spies": 2}) == ["spy_1", "spy_2"]
    assert spy.trainable_agents({"train_roles": "civilian"}) == ["civilian_1", "civilian_2"]  # 3 players
    assert spy.trainable_agents({"train_roles": "civilian", "n_players": 4}) == [
        "civilian_1",
        "civilian_2",
        "civilian_3",
    ]
    assert get_template("math").trainable_agents() is None
    rendered = render("who_is_the_spy", {"train_roles": "spy", "n_tasks": 5}, tmp_path / "s")
    assert json.loads(rendered.params.read_text())["trainable_agents"] == ["spy_1"]
    tasks = [json.loads(line) for line in rendered.tasks.read_text().splitlines()]
    assert all(t["trainable_agents"] == ["spy_1"] for t in tasks)


def test_render_substitutes_params(tmp_path):
    rendered = render(
        "arithmetic", {"level": 2, "n_tasks": 7, "max_tokens": 8, "fewshot": False}, tmp_path / "a"
    )
    tree = ast.parse(rendered.workflow.read_text())
    params = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and node.target.id == "PARAMS"
    )
    assert params == {"fewshot": False, "max_tokens": 8, "temperature": 1.0}
    tasks = [json.loads(line) for line in rendered.tasks.read_text().splitlines()]
    assert len(tasks) == 7 and all(t["level"] == 2 for t in tasks)


def test_render_refuses_a_non_empty_folder_and_bad_params(tmp_path):
    (tmp_path / "x.txt").write_text("keep me")
    with pytest.raises(TemplateRenderError, match="not empty"):
        render("math", {}, tmp_path)
    with pytest.raises(TemplateParamError):
        render("math", {"dataset": "mmlu"}, tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.fixture
def rendered_math(tmp_path):
    return render("math", {"limit": 3}, tmp_path / "m")


def test_validate_catches_a_reward_that_always_pays(rendered_math):
    reward = rendered_math.reward
    reward.write_text(reward.read_text() + "\n\ndef reward(completion, answer, **kwargs):\n    return 1.0\n")
    report = validate(rendered_math.folder)
    assert not report.ok and report.step == "checks" and "garbage" in report.detail
    with pytest.raises(TemplateValidationError, match="checks"):
        report.raise_for_failure()


def test_validate_catches_syntax_import_data_and_timeout_errors(rendered_math):
    folder = rendered_math.folder
    workflow = rendered_math.workflow
    source = workflow.read_text()
    workflow.write_text(source + "\ndef broken(:\n")
    assert validate(folder).step == "compile"
    workflow.write_text(source + "\nimport no_such_module_anywhere\n")
    report = validate(folder)
    assert report.step == "import" and "no_such_module_anywhere" in report.detail
    workflow.write_text(source.replace("async def run(", "async def _renamed("))
    assert validate(folder).step == "import"
    workflow.write_text(source)
    rendered_math.tasks.write_text('{"id": "a"}\n{"id": "a"}\n')
    assert validate(folder).step == "data"
    rendered_math.tasks.write_text('{"id": "a", "answer": "1"}\n')
    rendered_math.reward.write_text(rendered_math.reward.read_text() + "\nimport time\ntime.sleep(60)\n")
    assert validate(folder, timeout_s=3).step == "timeout"
    with pytest.raises(TemplateValidationError):
        validate(folder / "nowhere")


def test_rendered_tests_file_passes_under_pytest(rendered_math):
    root = Path(templates.__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(rendered_math.tests)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=rendered_math.folder,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


def test_rendered_copies_are_independent(tmp_path):
    from templates._loader import load_module

    a = render("arithmetic", {"n_tasks": 2}, tmp_path / "a")
    b = render("arithmetic", {"n_tasks": 2}, tmp_path / "b")
    b.reward.write_text(
        b.reward.read_text().replace("MAX_COMPLETION_CHARS = 400", "MAX_COMPLETION_CHARS = 5")
    )
    assert load_module(a.folder, "reward").MAX_COMPLETION_CHARS == 400
    assert load_module(b.folder, "reward").MAX_COMPLETION_CHARS == 5
    assert load_module(a.folder, "workflow")._reward is load_module(a.folder, "reward")
    # an edited (patched) file is read again on the next load, as the runner re-reads workflows
    a.reward.write_text(
        a.reward.read_text().replace("MAX_COMPLETION_CHARS = 400", "MAX_COMPLETION_CHARS = 77")
    )
    assert load_module(a.folder, "reward").MAX_COMPLETION_CHARS == 77


def test_the_dry_run_says_where_measured_defaults_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app as a3r_app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(a3r_app, ["vibe", "train who-is-the-spy", "--dry-run"])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if "(defaults:" in line]
    assert line.strip() == f"(defaults: {get_template('who_is_the_spy').meta.defaults_evidence})"
    readme = get_template("who_is_the_spy").folder / "README.md"
    assert "templates/who_is_the_spy/README.md" in line and "## Defaults from pilots" in readme.read_text()
    plain = CliRunner().invoke(a3r_app, ["vibe", "train arithmetic", "--dry-run"])
    assert plain.exit_code == 0 and "(defaults:" not in plain.output  # no claim where nothing was measured
