"""The examples run as workflows (through the runner) and as scripts against a real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.client import load_workflow, run_workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("name", ["math_openai", "math_langchain", "math_http"])
def test_math_example_as_workflow(name: str, server, tmp_path: Path) -> None:
    workflow = load_workflow(EXAMPLES / f"{name}.py")
    summary = run_workflow(
        workflow,
        server.url,
        EXAMPLES / "data" / "math.jsonl",
        max_tasks=1,
        group_size=2,
        concurrency=2,
        client_id=f"test-{name}",
        show_progress=False,
    )
    assert summary.finished == 2, summary
    assert summary.agent_failures == summary.infra_failures == 0
