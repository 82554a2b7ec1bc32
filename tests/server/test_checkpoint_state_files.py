"""State files a trainer's workers write beside the checkpoint writer (`swarm.train.state_files`; verl's
optimizer shards, issue 37): a checkpoint is complete only once they are, a failed or late write leaves
no checkpoint, a loaded reference is checked and carried into the next checkpoint.

The workers are played by this test writing files (the real ones, verl's actor ranks writing with
torch.distributed.checkpoint, are in tests/train/test_verl_cpu.py); the model, tokenizer and
`save_checkpoint` are real.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from swarm.server.checkpoints import checkpoint_dir, latest_checkpoint, load_trainer_state, save_checkpoint
from swarm.train.state_files import FAILED, StagedFiles, StateFiles, StateFilesError

MARKER = ".metadata"


def staged(run_dir: Path, timeout_s: float = 30.0) -> StagedFiles:
    """A staging folder as a trainer's ``state_dict()`` makes one: a shard written, no marker yet."""
    staging = checkpoint_dir(run_dir) / ".step-000001.opt.test"
    staging.mkdir(parents=True)
    (staging / "__0_0.distcp").write_bytes(b"shard")
    return StagedFiles(staging, "opt", marker=MARKER, timeout_s=timeout_s)


def finish(staging: Path) -> None:
    """The workers' last act: the marker, by a rename."""
    (staging / f"{MARKER}.tmp").write_bytes(b"meta")
    os.replace(staging / f"{MARKER}.tmp", staging / MARKER)


def test_a_checkpoint_is_complete_only_once_the_workers_files_are(
    tmp_path: Path, tiny_model: Any, tokenizer: Any
) -> None:
    files = staged(tmp_path)
    saved: list[Path] = []
    writer = threading.Thread(
        target=lambda: saved.append(
            save_checkpoint(tmp_path, 1, tiny_model, tokenizer, {"step": 1, "opt": files}, keep=2)
        )
    )
    writer.start()
    time.sleep(1.0)
    assert writer.is_alive()  # waiting for the marker: a kill now leaves no complete checkpoint
    assert latest_checkpoint(tmp_path) is None and not (checkpoint_dir(tmp_path) / "step-000001").exists()
    finish(files.staging)
    writer.join(30)
    assert latest_checkpoint(tmp_path) == (1, saved[0])
    assert not files.staging.exists() and (saved[0] / "opt" / "__0_0.distcp").read_bytes() == b"shard"
    stored = load_trainer_state(saved[0])["opt"]
    assert stored == StateFiles("opt", MARKER, saved[0] / "opt") and stored.check() == saved[0] / "opt"


@pytest.mark.parametrize("failure", ["failed", "late"])
def test_a_failed_or_late_worker_write_leaves_no_checkpoint_and_no_staging(
    tmp_path: Path, tiny_model: Any, tokenizer: Any, failure: str
) -> None:
    files = staged(tmp_path, timeout_s=0.5)
    if failure == "failed":
        (files.staging / FAILED).write_text("rank 1: OSError: No space left on device")
    with pytest.raises(StateFilesError) as raised:
        save_checkpoint(tmp_path, 1, tiny_model, tokenizer, {"step": 1, "opt": files}, keep=2)
    expected = "No space left on device" if failure == "failed" else "did not end within 0.5 s (no .metadata)"
    assert expected in str(raised.value)
    assert latest_checkpoint(tmp_path) is None and not files.staging.exists()
    assert not list(checkpoint_dir(tmp_path).glob(".step-*"))  # the temporary checkpoint folder too


def test_a_loaded_reference_is_checked_and_carried_into_the_next_checkpoint(
    tmp_path: Path, tiny_model: Any, tokenizer: Any
) -> None:
    """A state restored but not trained on yet (a trainer whose workers have not started) is saved again:
    the next checkpoint gets the files (linked), and survives the pruning of the first."""
    files = staged(tmp_path)
    finish(files.staging)
    first = save_checkpoint(tmp_path, 1, tiny_model, tokenizer, {"step": 1, "opt": files}, keep=1)
    second = save_checkpoint(tmp_path, 2, tiny_model, tokenizer, load_trainer_state(first), keep=1)
    assert not first.exists()  # pruned
    assert load_trainer_state(second)["opt"].check() == second / "opt"
    assert (second / "opt" / "__0_0.distcp").read_bytes() == b"shard"
    (second / "opt" / MARKER).unlink()
    with pytest.raises(StateFilesError, match=r"opt is incomplete \(no \.metadata\)"):
        load_trainer_state(second)["opt"].check()
