"""The background checkpoint's restart half: a journaled step whose checkpoint never reached the disk is
replayed to the same weights, step and metrics row; the snapshot is a copy the next step cannot touch;
steps taken while a write is in flight are journaled without a snapshot and the next one covers them."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from swarm.batch import Batch
from swarm.pool import Pool
from swarm.server import checkpoints
from swarm.server.checkpoints import (
    CheckpointWriter,
    JournalEntry,
    latest_checkpoint,
    load_weights,
    resume,
    snapshot,
    write_journal,
)
from swarm.server.events import EventLog
from swarm.server.step_batch import StepBatch
from swarm.server.step_history import Drain, StepHistory
from swarm.tracking.merge import MergeStats
from swarm.train import TorchTrainer, TrainerConfig
from tests.conftest import build_tiny_model
from tests.train.factories import PAD, make_sample


def _batch(seed: int) -> StepBatch:
    samples = [make_sample(f"e{seed}-{i}", 12, 4, seed=seed * 10 + i) for i in range(2)]
    ids = [s.episode_id for s in samples]
    batch = Batch(episode_ids=ids, groups={"t": ids}, rewards={ids[0]: 1.0, ids[1]: 0.0}, reason="test")
    return StepBatch(batch, samples, [1.0, -1.0], MergeStats(), [0, 0])


def _trainer(embedded_source: Any, device: str = "cpu") -> TorchTrainer:
    model = build_tiny_model(embedded_source, seed=4).to(device)
    return TorchTrainer(model, TrainerConfig(lr=1e-2), pad_token_id=PAD)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]


def test_a_journaled_step_is_replayed_to_the_same_weights(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    run = tmp_path / "run"
    events = EventLog(None)
    trainer, history = _trainer(embedded_source), StepHistory(run / "metrics.jsonl")
    writer = CheckpointWriter(run, trainer.model, tokenizer, events=events)
    for step in (1, 2):
        batch = _batch(step)
        base = trainer.step(batch.samples, batch.advantages, rewards=batch.rewards)
        writer.checkpoint(trainer, batch, policy="episodes", keep=2)
        writer.wait()
        if step == 1:
            history.record(base, batch, policy="episodes", drain=Drain(), checkpoint_s=0.0)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    second = run / "checkpoints" / "step-000002"
    journal = run / "checkpoints" / "journal"
    assert latest_checkpoint(run) == (2, second) and not list(journal.glob("step-*"))  # written: pruned
    # the state a kill -9 leaves while step 2's checkpoint is being written (its metrics row not yet
    # written either): checkpoint 1, the journal entry of step 2 and a half-written folder
    shutil.rmtree(second)
    write_journal(run, JournalEntry(2, _batch(2), trainer.config.model_dump(), "episodes"))
    (run / "checkpoints" / ".step-000002.half").mkdir()

    restarted = _trainer(embedded_source)
    history = StepHistory(run / "metrics.jsonl")
    pool = Pool(run / "pool.db")
    try:
        step = resume(run, restarted, pool, history, events, tokenizer=tokenizer, keep=2)
    finally:
        pool.close()
    assert step == 2 and restarted.step_count == 2
    for name, value in restarted.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert [row.step for row in history.rows] == [1, 2] and history.rewound_steps == []
    assert latest_checkpoint(run) == (2, second) and not list(journal.glob("step-*"))
    assert not list((run / "checkpoints").glob(".step-*"))
    assert [e.kind for e in events.recent() if e.kind.startswith("checkpoint.")][-1] == "checkpoint.replayed"
    # the replay's checkpoint has its checkpoint.saved event, as every checkpoint does (it had none)
    saved = [e.data for e in events.recent() if e.kind == "checkpoint.saved"][-1]
    assert saved["step"] == 2 and saved["replay"] is True and saved["write_s"] >= 0, saved


@pytest.mark.parametrize("device", DEVICES)
def test_a_snapshot_is_a_copy_the_next_step_does_not_change(embedded_source: Any, device: str) -> None:
    """On CUDA the copies go to pinned memory (queued, waited for once) and the next snapshot reuses it."""
    trainer = _trainer(embedded_source, device)
    batch = _batch(1)
    trainer.step(batch.samples, batch.advantages)
    snap = snapshot(trainer)
    before = {k: v.clone() for k, v in snap.weights.items()}
    trainer.step(batch.samples, batch.advantages)
    assert snap.step == 1 and all(torch.equal(v, before[k]) for k, v in snap.weights.items())
    exp_avg = snap.trainer_state["optimizer"]["state"][0]["exp_avg"]
    assert not torch.equal(exp_avg, trainer.state_dict()["optimizer"]["state"][0]["exp_avg"].cpu())
    assert all(v.device.type == "cpu" and v.is_pinned() == (device == "cuda") for v in snap.weights.values())
    assert exp_avg.is_pinned() == (device == "cuda")
    again = snapshot(trainer, reuse=snap)  # the next step's copy goes into the same buffers
    live = trainer.model.state_dict()
    assert all(again.weights[k] is v and torch.equal(v, live[k].cpu()) for k, v in snap.weights.items())
    state = trainer.state_dict()["optimizer"]["state"][0]["exp_avg"].cpu()
    assert again.trainer_state["optimizer"]["state"][0]["exp_avg"] is exp_avg and torch.equal(exp_avg, state)


def test_steps_during_a_write_are_journaled_and_the_next_idle_moment_checkpoints_the_newest(
    tmp_path: Path, embedded_source: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    events = EventLog(None)
    release = threading.Event()
    real = checkpoints.save_checkpoint

    def slow_save(*args: Any, **kwargs: Any) -> Path:  # the real write, held until released
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "save_checkpoint", slow_save)
    trainer = _trainer(embedded_source)
    writer = CheckpointWriter(run, trainer.model, tokenizer, events=events)
    spent = []
    for step in (1, 2, 3):
        batch = _batch(step)
        trainer.step(batch.samples, batch.advantages, rewards=batch.rewards)
        spent.append(writer.checkpoint(trainer, batch, policy="episodes", keep=1))
    assert writer.busy and writer.owed == [2, 3]  # step 1's write is in flight; 2 and 3 only journaled
    assert writer.catch_up(trainer, keep=1) is False  # still writing
    journal = run / "checkpoints" / "journal"
    assert sorted(p.name for p in journal.glob("step-*")) == [f"step-00000{i}.pt" for i in (1, 2, 3)]
    assert max(spent[1:]) < 10  # nobody waited for the held write (it is held up to 60 s)
    release.set()
    writer.wait()
    assert latest_checkpoint(run) == (1, run / "checkpoints" / "step-000001")
    assert writer.catch_up(trainer, keep=1) is True and writer.owed == []
    writer.wait()
    assert latest_checkpoint(run) == (3, run / "checkpoints" / "step-000003")
    assert not (run / "checkpoints" / "step-000001").exists()  # keep=1
    assert not list(journal.glob("step-*"))  # checkpoint 3 covers steps 2 and 3
    saved = [e.data for e in events.recent() if e.kind == "checkpoint.saved"]
    assert [(d["step"], d["skipped"]) for d in saved] == [(1, []), (3, [2, 3])]
    restarted = _trainer(embedded_source)
    load_weights(run / "checkpoints" / "step-000003", restarted.model)
    live = trainer.model.state_dict()
    assert all(torch.equal(v, live[k]) for k, v in restarted.model.state_dict().items())
    writer.flush(trainer, keep=1)  # nothing owed: writes nothing
    assert len([e for e in events.recent() if e.kind == "checkpoint.saved"]) == 2
