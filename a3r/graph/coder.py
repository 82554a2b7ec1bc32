"""The coder: renders the plan's template (or, with an LLM provider, writes new task code) into the
study's workspace, splits off held-out data, freezes an evaluator copy, validates the code in a
subprocess with a timeout, and stores the files as versioned code artifacts.

Workspace layout (``<root>/studies/<study id>/``): the rendered template (``workflow.py``,
``reward.py``, ``data.py``, ``tasks.jsonl``...), ``heldout.jsonl`` (never trained on, never patched),
``evaluator/`` (frozen copy of the code used for held-out evaluation), ``runs/`` and ``servers/``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

import templates
from a3r.graph.context import RunContext
from a3r.graph.state import ResearchState
from a3r.study.plans import GeneratedCode, PlanDraft
from memory import ArtifactKind

__all__ = ["coder", "write_generated"]

_ARTIFACTS = (
    ("workflow.py", ArtifactKind.workflow),
    ("reward.py", ArtifactKind.reward),
    ("data.py", ArtifactKind.data),
    ("tasks.jsonl", ArtifactKind.data),
)
_NOT_EVALUATOR = {"runs", "servers", "evaluator", "tasks.jsonl", "heldout.jsonl", "test_template.py"}
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


def _heldout(ws: Path, plan: PlanDraft, n: int) -> None:
    """Write ``heldout.jsonl``: fresh tasks of a seeded generator, else the last tasks split off."""
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


def coder(state: ResearchState, runtime: Runtime[RunContext]) -> Command[Literal["runner", "reporter"]]:
    """Render, split, freeze, validate and store the study's code (idempotent on re-run)."""
    ctx = runtime.context
    plan, study_id = state["plan"], state["study_id"]
    ws = ctx.root / "studies" / str(study_id)
    if not (ws / "workflow.py").exists() or not (ws / "tasks.jsonl").exists():
        if ws.exists():
            shutil.rmtree(ws)  # a render cut short by a crash; the workspace has no runs yet
        if plan.template is not None:
            templates.render(plan.template, plan.params, ws)
        else:
            generated = ctx.ledger.once(
                ctx.key("coder", "generated"),
                lambda: ctx.provider.write_code(state["request"], plan).model_dump(),
            )
            write_generated(ws, GeneratedCode.model_validate(generated))
    _heldout(ws, plan, max(ctx.eval_tasks, 1))
    _freeze_evaluator(ws)
    report = templates.validate(ws, timeout_s=120.0)
    artifacts: dict[str, int] = {}
    for name, kind in _ARTIFACTS:
        path = ws / name
        if path.exists():
            artifacts[name] = ctx.store.add_artifact(
                study_id, kind, name, path.read_text(encoding="utf-8")
            ).id
    if not report.ok:
        text = f"stopped: the {'rendered' if plan.template else 'generated'} code failed validation at step {report.step}: {report.detail[:800]}"
        ctx.store.log_event(text, study_id=study_id, level="error")
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
    line = f"coder: workspace {ws} validated ({report.tasks} tasks; held-out {sum(1 for _ in (ws / 'heldout.jsonl').open())})"
    ctx.store.log_event(line, study_id=study_id)
    ctx.say(line)
    return Command(goto="runner", update={"workspace": str(ws), "artifacts": artifacts, "log": [line]})
