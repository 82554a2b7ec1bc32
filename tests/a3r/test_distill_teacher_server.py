"""a3r serves a checkpoint-directory teacher itself (issue 38): a distilling run's server starts after
a ``swarm serve --model DIR --no-train`` teacher, gets its URL and client token, passes swarm serve's
teacher check at start (reachable with that token, same tokenizer), and both stop together. Real
``swarm serve`` subprocesses on loopback, a tiny model saved as the teacher's checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from a3r.graph import RunContext, RunSpec
from a3r.graph.context import Ledger
from a3r.providers import OfflineProvider
from a3r.study.plans import TrainingSettings
from a3r.swarmops.execution import Workspace, _Recorder, _release, _server_for
from a3r.swarmops.teacher import teacher_key
from memory import Store

pytestmark = pytest.mark.slow


def test_a_checkpoint_teacher_is_started_beside_the_distilling_run(
    tmp_path: Path, tiny_model: Any, tokenizer: Any
) -> None:
    folder = tmp_path / "teacher-checkpoint"
    tiny_model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    store = Store(tmp_path / "memory.db")
    run = store.start_run(store.create_experiment(store.create_study("distil").id, "e").id, name="d")
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "ledger.db"),
        thread_id="d",
        root=tmp_path,
        model=str(folder),  # the student: the same tiny model, so that both start in seconds
    )
    settings = TrainingSettings(
        steps=1, batch_size=1, group_size=2, lora_rank=0, teacher=str(folder), distill=True
    )
    spec = RunSpec(key="d", purpose="train", settings=settings)
    (tmp_path / "ws").mkdir()
    student = _server_for(spec, ctx, Workspace(tmp_path / "ws"), _Recorder(ctx, run.id))
    teacher = ctx.servers[teacher_key("d")]
    try:
        assert teacher.process is not None and student.process is not None
        with student.client() as control:
            distill = control.config().training["distill"]
        assert (distill["teacher_url"], distill["mode"]) == (teacher.url, "pure")
        assert "SWARM_TEACHER_TOKEN" not in " ".join(student.process.popen.args)  # never on a command line
        answer = httpx.post(
            f"{teacher.url}/v1/score",
            json={"token_ids": [1, 2, 3, 4], "start": 2},
            headers={"Authorization": f"Bearer {teacher.client_token}"},
            timeout=30,
        )
        assert answer.status_code == 200 and len(answer.json()["logprobs"]) == 2
        assert "teacher server started at" in " ".join(e.message for e in store.events(run_id=run.id))
    finally:
        _release(spec, ctx, None)
    assert teacher.process.poll() is not None and student.process.poll() is not None
    assert not ctx.servers
    store.close()
