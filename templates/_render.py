"""Rendering a template into a folder with parameters substituted, and validating rendered code.

A rendered folder holds ``workflow.py`` (its ``PARAMS`` block set to the workflow parameters),
``reward.py`` and the template's other modules, the data builder ``data.py`` (with its ``data/``
files), ``tasks.jsonl`` (built with the data parameters), ``params.json`` (parameters and, for multi-agent
templates, ``trainable_agents``), ``meta.json``, ``README.md``
and ``test_template.py`` (pytest: gold answers earn full reward, garbage earns 0, the workflow
imports). Modules import each other through :mod:`templates._loader`, so the folder works wherever
the ``templates`` package is importable.
"""

from __future__ import annotations

import json
import os
import pprint
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import TemplateRenderError, TemplateValidationError
from ._meta import ParamTarget
from ._registry import PACKAGE_DIR, get_template

_PARAMS_BLOCK = re.compile(r"(# <params>[^\n]*\n)(.*?)(# </params>)", re.DOTALL)
_SKIP = {"meta.py", "__init__.py"}
CHECKED_TASKS = 20
"""How many tasks of ``tasks.jsonl`` the reward self-check runs on."""

TEST_FILE = '''"""Checks of a rendered template (written by templates.render; run with pytest)."""

import inspect
import json
from pathlib import Path

from templates._loader import load_module

HERE = Path(__file__).resolve().parent


def _tasks():
    with open(HERE / "tasks.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_tasks_have_unique_ids():
    ids = [task["id"] for task in _tasks()]
    assert ids and len(ids) == len(set(ids))


def test_reward_self_check():
    failures = load_module(HERE, "reward").self_check(_tasks()[:{checked}])
    assert failures == []


def test_workflow_defines_async_run():
    run = load_module(HERE, "workflow").run
    assert inspect.iscoroutinefunction(run)
    assert len(inspect.signature(run).parameters) == 2
'''

_CHECK_SCRIPT = """
import importlib.util, inspect, json, sys
from pathlib import Path
from templates._loader import load_module
folder, checked = Path(sys.argv[1]), int(sys.argv[2])
step = "import"
spec = importlib.util.spec_from_file_location("workflow", folder / "workflow.py")
workflow = importlib.util.module_from_spec(spec)
spec.loader.exec_module(workflow)
run = getattr(workflow, "run", None)
if not inspect.iscoroutinefunction(run) or len(inspect.signature(run).parameters) != 2:
    print(json.dumps({"step": "import", "detail": "workflow.py must define async def run(task, llm)"}))
    sys.exit(0)
reward = load_module(folder, "reward")
with open(folder / "tasks.jsonl", encoding="utf-8") as f:
    tasks = [json.loads(line) for line in f if line.strip()]
ids = [t.get("id") for t in tasks]
if not tasks or None in ids or len(set(ids)) != len(ids):
    print(json.dumps({"step": "data", "detail": "tasks.jsonl is empty or has missing/duplicate ids"}))
    sys.exit(0)
failures = reward.self_check(tasks[:checked])
print(json.dumps({"step": "checks" if failures else "ok", "detail": "; ".join(failures[:10]), "tasks": len(tasks)}))
"""


@dataclass(frozen=True)
class RenderedTemplate:
    """Paths of a rendered template."""

    folder: Path
    workflow: Path
    reward: Path
    data_builder: Path
    tasks: Path
    params: Path
    tests: Path


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of :func:`validate`."""

    ok: bool
    """Every step passed."""
    step: str
    """The failing step (``compile``, ``import``, ``data``, ``checks``, ``timeout``), or ``ok``."""
    detail: str = ""
    """What failed (compiler message, traceback tail, failed checks)."""
    tasks: int = 0
    """Tasks found in ``tasks.jsonl``."""

    def raise_for_failure(self) -> None:
        """Raise :class:`TemplateValidationError` unless ``ok``."""
        if not self.ok:
            raise TemplateValidationError(self.step, self.detail)


def substitute_params(source: str, params: dict[str, Any]) -> str:
    """Replace the ``# <params>`` ... ``# </params>`` block of a workflow with ``PARAMS = {params}``.

    Raises:
        TemplateRenderError: The source has no params block.
    """
    if not _PARAMS_BLOCK.search(source):
        raise TemplateRenderError("workflow.py has no '# <params>' ... '# </params>' block")
    body = (
        "PARAMS: dict[str, Any] = "
        + pprint.pformat(dict(sorted(params.items())), width=100, sort_dicts=True)
        + "\n"
    )
    return _PARAMS_BLOCK.sub(lambda m: m.group(1) + body + m.group(3), source, count=1)


def render(name: str, params: dict[str, Any] | None, out_dir: str | Path) -> RenderedTemplate:
    """Write template ``name`` with ``params`` into ``out_dir`` (see module docstring).

    Args:
        name: Template name.
        params: Parameter values (missing ones take defaults).
        out_dir: Output folder; created if absent, must be empty if present.

    Returns:
        The paths written.

    Raises:
        UnknownTemplateError: No such template.
        TemplateParamError: Invalid parameters.
        TemplateRenderError: ``out_dir`` exists and is not empty, or cannot be written.
    """
    template = get_template(name)
    resolved = template.resolve(params)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TemplateRenderError(f"output folder {out} exists and is not empty")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for item in sorted(template.folder.iterdir()):
            if item.name in _SKIP or item.name.startswith((".", "__")):
                continue
            if item.is_dir():
                shutil.copytree(item, out / item.name, ignore=shutil.ignore_patterns("__pycache__"))
            elif item.suffix in {".py", ".md"}:
                shutil.copy2(item, out / item.name)
        workflow_params = {
            p.name: resolved[p.name] for p in template.meta.parameters if p.target == ParamTarget.WORKFLOW
        }
        workflow = out / "workflow.py"
        workflow.write_text(
            substitute_params(workflow.read_text(encoding="utf-8"), workflow_params), encoding="utf-8"
        )
        (out / "params.json").write_text(
            json.dumps(
                {
                    "template": template.name,
                    "params": resolved,
                    "trainable_agents": template.trainable_agents(resolved),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
        (out / "meta.json").write_text(template.meta.model_dump_json(indent=2) + "\n", encoding="utf-8")
        with open(out / "tasks.jsonl", "w", encoding="utf-8") as f:
            for task in template.build_tasks(resolved):
                f.write(json.dumps(task, ensure_ascii=False) + "\n")
        (out / "test_template.py").write_text(
            TEST_FILE.replace("{checked}", str(CHECKED_TASKS)), encoding="utf-8"
        )
    except OSError as exc:
        raise TemplateRenderError(f"cannot write {out}: {exc}") from exc
    return RenderedTemplate(
        folder=out,
        workflow=workflow,
        reward=out / "reward.py",
        data_builder=out / "data.py",
        tasks=out / "tasks.jsonl",
        params=out / "params.json",
        tests=out / "test_template.py",
    )


def validate(out_dir: str | Path, *, timeout_s: float = 120.0) -> ValidationReport:
    """Check rendered code: every ``.py`` compiles; in a subprocess (with a timeout) the workflow imports
    and defines ``async def run(task, llm)``, ``tasks.jsonl`` has unique ids, and the reward's
    ``self_check`` passes on the first :data:`CHECKED_TASKS` tasks (gold earns 1, garbage earns 0).

    Args:
        out_dir: A folder written by :func:`render` (possibly edited since).
        timeout_s: Limit for the subprocess, in seconds.

    Returns:
        The report (``ok`` or the failing step with details).

    Raises:
        TemplateValidationError: ``out_dir`` is not a rendered template (no ``workflow.py``).
    """
    folder = Path(out_dir).resolve()
    if not (folder / "workflow.py").is_file():
        raise TemplateValidationError("compile", f"{folder} has no workflow.py")
    for path in sorted(folder.rglob("*.py")):
        try:
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            return ValidationReport(False, "compile", f"{path.name}: {exc}")
    env = dict(os.environ)
    root = str(PACKAGE_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHECK_SCRIPT, str(folder), str(CHECKED_TASKS)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=folder,
        )
    except subprocess.TimeoutExpired:
        return ValidationReport(False, "timeout", f"validation subprocess exceeded {timeout_s:g} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return ValidationReport(
            False, "import", proc.stderr.strip()[-2000:] or f"exit code {proc.returncode}"
        )
    result = json.loads(lines[-1])
    ok = result["step"] == "ok"
    return ValidationReport(ok, result["step"], result.get("detail", ""), int(result.get("tasks", 0)))
