"""The model a swarm server serves, seen from a program that drives servers: check a ``--model`` before
starting ``swarm serve`` with it, and load its tokenizer to read the token ids a server recorded.

Both take what ``swarm serve --model`` takes and locate models as the server does
(`swarm.engine.model_loading`), offline. They import the engine package (torch) when called, so that
importing ``swarm.client`` imports neither torch nor transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_model_path(model: str | Path) -> Path:
    """The ``--model`` path if it can be a model (a Hugging Face directory or a ``.gguf`` file); cheap,
    nothing is read or converted.

    Args:
        model: A local Hugging Face model directory or ``.gguf`` file (``~`` is expanded).

    Returns:
        The expanded path.

    Raises:
        swarm.errors.ModelLoadError: The path does not exist or is neither a model directory (with a
            ``config.json``) nor a ``.gguf`` file.
    """
    from swarm.engine.model_loading import check_model_path as check

    return check(model)


def load_tokenizer(model: str | Path | None = None) -> Any:
    """The Hugging Face tokenizer of a model, loaded offline.

    Args:
        model: ``None`` for the embedded SmolLM2-135M-Instruct, a model directory or a ``.gguf`` file
            (converted once into the model cache, as ``swarm serve`` does).

    Returns:
        A ``transformers`` tokenizer (``PreTrainedTokenizerBase``).

    Raises:
        swarm.errors.ModelLoadError: The model cannot be located (see `check_model_path`) or converted.
        ValueError, OSError: ``transformers`` finds no tokenizer it can read in the model directory.
    """
    from transformers import AutoTokenizer

    from swarm.engine.model_loading import resolve_model

    source = resolve_model(model)
    return AutoTokenizer.from_pretrained(str(source.directory), local_files_only=True)
