"""Checkpoints in the run dir: Hugging Face-compatible weights plus trainer state, written atomically.

Layout: ``<run_dir>/checkpoints/step-000012/`` holds ``model.safetensors`` + ``config.json`` (full
fine-tuning: loadable with ``AutoModelForCausalLM.from_pretrained``) or ``adapter_model.safetensors`` +
``adapter_config.json`` (LoRA: loadable with ``PeftModel.from_pretrained``), the tokenizer files,
``trainer_state.pt`` (optimizer, step, live config) and ``meta.json`` (step, time). A checkpoint is
written into a temporary folder and renamed into place, so a crash never leaves a half checkpoint.

:func:`resume` is the restart half of crash safety (docs/ARCHITECTURE.md §Crash safety): the newest
checkpoint is loaded, the pool forgets what later steps consumed, and the metrics rows of those steps
are dropped; :func:`checkpoint_now` is the save half, with its event.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from swarm.pool import Pool
from swarm.server.events import EventLog
from swarm.server.step_history import StepHistory
from swarm.train import TrainerBackend

_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint ``(step, path)``, or ``None``."""
    root = checkpoint_dir(run_dir)
    found = []
    for path in root.glob("step-*") if root.exists() else []:
        m = _NAME.match(path.name)
        if m and (path / "meta.json").exists():
            found.append((int(m.group(1)), path))
    return max(found) if found else None


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any], keep: int
) -> Path:
    """Write checkpoint ``step`` atomically and prune all but the newest ``keep``; returns its path."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / "trainer_state.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time()}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    complete = sorted(
        (int(m.group(1)), p)
        for p in root.glob("step-*")
        if (m := _NAME.match(p.name)) and (p / "meta.json").exists()
    )
    for _, old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_weights(path: Path, model: Any) -> None:
    """Load a checkpoint's weights into ``model`` in place (full model or peft adapters)."""
    from safetensors.torch import load_file

    adapter = path / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("model*.safetensors")):
        state.update(load_file(str(shard)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings are saved once; anything else missing means a wrong checkpoint
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def load_trainer_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    return state


def checkpoint_now(
    run_dir: Path, trainer: TrainerBackend, tokenizer: Any, *, keep: int, events: EventLog
) -> float:
    """Save the trainer's current step (`save_checkpoint`) and log ``checkpoint.saved``; returns the
    seconds it took."""
    started = time.perf_counter()
    save_checkpoint(run_dir, trainer.step_count, trainer.model, tokenizer, trainer.state_dict(), keep=keep)
    elapsed = time.perf_counter() - started
    events.emit(
        "checkpoint.saved", f"checkpoint step {trainer.step_count} ({elapsed:.1f} s)", step=trainer.step_count
    )
    return elapsed


def resume(run_dir: Path, trainer: TrainerBackend, pool: Pool, history: StepHistory, events: EventLog) -> int:
    """Restart where the run's last checkpoint left it; returns that step (0: none, a fresh run).

    Loads the newest checkpoint into ``trainer`` (weights, sampling copy, optimizer and live config),
    un-marks episodes consumed by later steps (`Pool.rewind`: their update died with the process, so
    they are trained again), drops the later rows of ``history`` and sets ``history.rewound_steps`` to
    the steps lost, each with its event.
    """
    latest = latest_checkpoint(run_dir)
    step = 0
    if latest is not None:
        step, path = latest
        load_weights(path, trainer.model)
        trainer.sync_sampling_model()
        trainer.load_state_dict(load_trainer_state(path))
        events.emit("checkpoint.loaded", f"resumed from checkpoint step {step}", step=step)
    lost = set(pool.trained_steps_after(step))
    rewound = pool.rewind(step)
    if rewound:
        events.emit(
            "pool.rewound",
            f"{rewound} episodes consumed after step {step} will be trained again (their update was lost)",
            level="warning",
            episodes=rewound,
        )
    history.rewound_steps = sorted(lost | history.resume(step))
    if history.rewound_steps:
        events.emit(
            "train.rewound",
            f"steps {_span(history.rewound_steps)} were lost with the previous process (last checkpoint: "
            f"step {step}); the next update is step {step + 1} again",
            level="warning",
            rewound_steps=history.rewound_steps,
            resumed_from=step,
        )
    return step


def _span(steps: list[int]) -> str:
    """``6-8`` for consecutive steps, else ``6, 8``."""
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 1:
        return f"{steps[0]}-{steps[-1]}"
    return ", ".join(str(s) for s in steps)
