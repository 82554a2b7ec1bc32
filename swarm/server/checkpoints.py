"""Checkpoints in the run dir: Hugging Face-compatible weights plus trainer state, written atomically.

Layout: ``<run_dir>/checkpoints/step-000012/`` holds ``model.safetensors`` + ``config.json`` (full
fine-tuning: loadable with ``AutoModelForCausalLM.from_pretrained``) or ``adapter_model.safetensors`` +
``adapter_config.json`` (LoRA: loadable with ``PeftModel.from_pretrained``), the tokenizer files,
``trainer_state.pt`` (optimizer, step, live config) and ``meta.json`` (step, time). A checkpoint is
written into a temporary folder and renamed into place, so a crash never leaves a half checkpoint.
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
