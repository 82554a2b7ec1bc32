"""The coder: renders the plan's template (or, with an LLM provider, writes new task code) into the
study's workspace, splits off held-out data, freezes an evaluator copy, validates the code in a
subprocess with a timeout, and stores the files as versioned code artifacts.

Code an LLM wrote gets repaired: when its check fails (a compile error, an import traceback, failing
reward self-checks, a timeout), the provider is shown the failure and its code (`CodeFailure`) and
writes the code again, up to ``RunContext.code_attempts`` attempts; then the thread stops with one
line naming the last failure (the full output is in the store's events).

Workspace layout (``<root>/studies/<study id>/``): the rendered template (``workflow.py``,
``reward.py``, ``data.py``, ``tasks.jsonl``...), ``heldout.jsonl`` (never trained on, never patched),
``evaluator/`` (frozen copy of the code used for held-out evaluation), ``runs/`` and ``servers/``.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

import templates
from a3r.graph.context import RunContext
from a3r.graph.state import ResearchState
from a3r.providers import CodeFailure
from a3r.study.plans import GeneratedCode, PlanDraft
from memory import ArtifactKind

__all__ = ["coder", "heldout_capacity", "write_generated"]

_ARTIFACTS = (
    ("workflow.py", ArtifactKind.workflow),
    ("reward.py", ArtifactKind.reward),
    ("data.py", ArtifactKind.data),
    ("tasks.jsonl", ArtifactKind.data),
)
_NOT_EVALUATOR = {"runs", "servers", "evaluator", "tasks.jsonl", "heldout.jsonl", "test_template.py"}
_WORKSPACE_CODE = {"workflow.py", "reward.py", "data.py"}
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
VALIDATION_TIMEOUT_S = 120.0
"""Seconds the validation subprocess of the study's code may take."""
HELDOUT_SEED_OFFSET = 1_000_003
"""Held-out tasks of seeded generators use ``seed + HELDOUT_SEED_OFFSET`` (disjoint from training)."""


def write_generated(ws: Path, code: GeneratedCode) -> None:
    """Write LLM-generated task code into an empty workspace."""
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "workflow.py").write_text(code.workflow, encoding="utf-8")
    (ws / "reward.py").write_text(code.reward, encoding="utf-8")
    (ws / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in code.tasks), encoding="utf-8")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def heldout_capacity(plan: PlanDraft) -> int | None:
    """Most held-out tasks `_heldout` can write for ``plan``: a seeded generator's largest ``n_tasks``,
    else a quarter of the template's tasks (the split `_heldout` makes); ``None`` for new code (not
    known before it is written)."""
    if plan.template is None:
        return None
    template = templates.get_template(plan.template)
    specs = {p.name: p for p in template.meta.parameters if p.target == templates.ParamTarget.DATA}
    if {"seed", "n_tasks"} <= set(specs):
        most = specs["n_tasks"].maximum
        return int(most) if most is not None else None
    rows = len(template.build_tasks(plan.params))
    return rows if rows < 2 else max(1, rows // 4)


def _heldout(ws: Path, plan: PlanDraft, n: int) -> None:
    """Write ``heldout.jsonl``: fresh tasks of a seeded generator, else the last tasks split off (at
    most `heldout_capacity`)."""
    target = ws / "heldout.jsonl"
    if target.exists():
        return
    if plan.template is not None:
        template = templates.get_template(plan.template)
        data_params = {p.name for p in template.meta.parameters if p.target == templates.ParamTarget.DATA}
        if {"seed", "n_tasks"} <= data_params:
            params = {
                **plan.params,
                "seed": int(plan.params.get("seed") or 0) + HELDOUT_SEED_OFFSET,
                "n_tasks": n,
            }
            _write_jsonl(target, template.build_tasks(params))
            return
    rows = _read_jsonl(ws / "tasks.jsonl")
    k = max(1, min(n, len(rows) // 4))
    if len(rows) < 2:
        _write_jsonl(target, rows)
        return
    _write_jsonl(ws / "tasks.jsonl", rows[:-k])
    _write_jsonl(target, rows[-k:])


def _freeze_evaluator(ws: Path) -> None:
    folder = ws / "evaluator"
    if (folder / "workflow.py").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for item in ws.iterdir():
        if item.name in _NOT_EVALUATOR or item.name.startswith((".", "__")):
            continue
        if item.is_dir():
            shutil.copytree(item, folder / item.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif item.suffix in (".py", ".json"):
            shutil.copy2(item, folder / item.name)


def _one_line(step: str, detail: str) -> str:
    """A failed check in one line: a traceback's exception line and the workspace file and line it
    was raised in, else the first line of the output (≤ 300 characters)."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    if not lines:
        return f"step {step}"
    text = lines[0]
    if any(line.startswith("Traceback") for line in lines):
        text = lines[-1]
        where = [m for m in _FRAME.finditer(detail) if Path(m.group(1)).name in _WORKSPACE_CODE]
        if where:
            text += f" ({Path(where[-1].group(1)).name} line {where[-1].group(2)})"
    return f"step {step}: {text}"[:300]


def _ask(ctx: RunContext, request: str, plan: PlanDraft, failure: CodeFailure | None) -> dict[str, Any]:
    return ctx.provider.write_code(request, plan, failure=failure).model_dump()


def _write_until_valid(
    ws: Path, state: ResearchState, ctx: RunContext
) -> tuple[templates.ValidationReport, int]:
    """Ask the provider for task code and check it; after a failed check show the provider the failure
    (`CodeFailure`: the check's step and full output, and the failed code) and check its repair, up to
    ``ctx.code_attempts`` attempts. Every answer is kept in the ledger, so a re-run replays them.

    Returns:
        The last check's report and the attempts made.
    """
    plan = state["plan"]
    attempts = max(1, ctx.code_attempts)
    failure: CodeFailure | None = None
    report = templates.ValidationReport(False, "import", "no attempt")
    for attempt in range(1, attempts + 1):
        generated = ctx.ledger.once(
            ctx.key("coder", "generated" if attempt == 1 else f"generated-{attempt}"),
            functools.partial(_ask, ctx, state["request"], plan, failure),
        )
        code = GeneratedCode.model_validate(generated)
        if ws.exists():
            shutil.rmtree(ws)  # an earlier attempt, or a write cut short by a crash: no run used it
        write_generated(ws, code)
        _heldout(ws, plan, max(ctx.eval_tasks, 1))
        _freeze_evaluator(ws)
        report = templates.validate(ws, timeout_s=VALIDATION_TIMEOUT_S)
        if report.ok:
            return report, attempt
        failure = CodeFailure(attempt=attempt, step=report.step, detail=report.detail, code=code)
        line = f"coder: attempt {attempt} of {attempts} failed its check at {_one_line(report.step, report.detail)}"
        ctx.store.log_event(f"{line}\n{report.detail[-4000:]}", study_id=state["study_id"], level="warning")
        ctx.say(line + (f"; asking {ctx.provider.name} for a repair" if attempt < attempts else ""))
    return report, attempts


def coder(state: ResearchState, runtime: Runtime[RunContext]) -> Command[Literal["runner", "reporter"]]:
    """Render or write, split, freeze, validate and store the study's code (idempotent on re-run).

    A rendered template is checked once; code an LLM provider wrote is repaired after a failed check,
    up to ``code_attempts`` attempts (`_write_until_valid`).
    """
    ctx = runtime.context
    plan, study_id = state["plan"], state["study_id"]
    ws = ctx.root / "studies" / str(study_id)
    attempts = 1
    if plan.template is not None:
        if not (ws / "workflow.py").exists() or not (ws / "tasks.jsonl").exists():
            if ws.exists():
                shutil.rmtree(ws)  # a render cut short by a crash; the workspace has no runs yet
            templates.render(plan.template, plan.params, ws)
        _heldout(ws, plan, max(ctx.eval_tasks, 1))
        _freeze_evaluator(ws)
        report = templates.validate(ws, timeout_s=VALIDATION_TIMEOUT_S)
    else:
        report, attempts = _write_until_valid(ws, state, ctx)
    artifacts: dict[str, int] = {}
    for name, kind in _ARTIFACTS:
        path = ws / name
        if path.exists():
            artifacts[name] = ctx.store.add_artifact(
                study_id, kind, name, path.read_text(encoding="utf-8")
            ).id
    if not report.ok:
        if plan.template is not None:
            text = f"stopped: the rendered code failed validation at {_one_line(report.step, report.detail)}"
        else:
            text = (
                f"stopped: the generated code failed its check {attempts} "
                f"{'time' if attempts == 1 else 'times'}; the last failure, at {_one_line(report.step, report.detail)}"
            )
        ctx.store.log_event(f"{text}\n{report.detail[-4000:]}", study_id=study_id, level="error")
        ctx.say(text)
        return Command(
            goto="reporter",
            update={
                "workspace": str(ws),
                "artifacts": artifacts,
                "conclusion": text,
                "queue": [],
                "stage": "done",
            },
        )
    repaired = f" after {attempts - 1} {'repair' if attempts == 2 else 'repairs'}" if attempts > 1 else ""
    held_out = sum(1 for _ in (ws / "heldout.jsonl").open())
    fewer = (
        f" of the {ctx.eval_tasks} asked (--eval-tasks): the template's held-out split has no more"
        if held_out < ctx.eval_tasks
        else ""
    )
    line = f"coder: workspace {ws} validated{repaired} ({report.tasks} tasks; held-out {held_out}{fewer})"
    ctx.store.log_event(line, study_id=study_id)
    ctx.say(line)
    return Command(goto="runner", update={"workspace": str(ws), "artifacts": artifacts, "log": [line]})
