"""``swarm serve`` with instrumented checkpoints: a kill -9 test's server (tests/server/test_checkpoint_skip.py).

Run as ``python -m tests.server.slow_checkpoint_serve serve …`` (the ``swarm`` command line). Two
environment variables instrument it; everything else is the real server:

- ``SWARM_TEST_CHECKPOINT_GATE``: a path; while that file exists, a checkpoint write waits before it
  starts (the real `swarm.server.checkpoints.save_checkpoint`, wrapped): the test holds a write in
  flight for as many steps as it likes.
- ``SWARM_TEST_WEIGHTS_DIR``: a folder; after each step the trained model's tensors go to
  ``step-N.pt`` there (this process's weights, for comparing a restart's replay with).
- ``SWARM_TEST_STEP_GATE``: a path; while that file exists, a training step waits before it starts
  (`TorchTrainer.step`, wrapped): the test stops the server in the middle of a step
  (tests/server/test_serve_stop.py).
- ``SWARM_TEST_NONFINITE_BACKWARD``: a number N; a gradient hook on the trainer's first trainable
  parameter (the real module's) makes the process's N-th backward pass non-finite
  (tests/server/test_checkpoint_nonfinite.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

import swarm.server.checkpoints as checkpoints
from swarm.cli import main
from swarm.server.training import TrainingLoop
from swarm.train import TorchTrainer


def _gated(save: Any, gate: Path) -> Any:
    def save_checkpoint(*args: Any, **kwargs: Any) -> Path:
        while gate.exists():
            time.sleep(0.01)
        path: Path = save(*args, **kwargs)
        return path

    return save_checkpoint


def _gated_step(step: Any, gate: Path) -> Any:
    def gated(self: TorchTrainer, *args: Any, **kwargs: Any) -> Any:
        while gate.exists():
            time.sleep(0.01)
        return step(self, *args, **kwargs)

    return gated


def _dumping(step_blocking: Any, folder: Path) -> Any:
    def _step_blocking(self: TrainingLoop, *args: Any, **kwargs: Any) -> Any:
        metrics = step_blocking(self, *args, **kwargs)
        if metrics is not None:
            weights = {k: v.detach().clone() for k, v in self.trainer.model.state_dict().items()}
            tmp = folder / f".step-{metrics.step}.pt"
            torch.save(weights, tmp)
            os.replace(tmp, folder / f"step-{metrics.step}.pt")
        return metrics

    return _step_blocking


def _poisoning(init: Any, nth: int) -> Any:
    def __init__(self: TorchTrainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        calls = [0]

        def poison(grad: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return grad * float("nan") if calls[0] == nth else grad

        self.trainable_parameters[0].register_hook(poison)

    return __init__


if __name__ == "__main__":
    if gate := os.environ.get("SWARM_TEST_CHECKPOINT_GATE"):
        checkpoints.save_checkpoint = _gated(checkpoints.save_checkpoint, Path(gate))
    if folder := os.environ.get("SWARM_TEST_WEIGHTS_DIR"):
        TrainingLoop._step_blocking = _dumping(TrainingLoop._step_blocking, Path(folder))  # type: ignore[method-assign]
    if step_gate := os.environ.get("SWARM_TEST_STEP_GATE"):
        TorchTrainer.step = _gated_step(TorchTrainer.step, Path(step_gate))  # type: ignore[method-assign]
    if nth := os.environ.get("SWARM_TEST_NONFINITE_BACKWARD"):
        TorchTrainer.__init__ = _poisoning(TorchTrainer.__init__, int(nth))  # type: ignore[method-assign]
    main()
