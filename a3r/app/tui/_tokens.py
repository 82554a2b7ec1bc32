"""Turning token ids back into the text pieces the token view shows."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from swarm.client import load_tokenizer

__all__ = ["Detokenizer", "HFDetokenizer"]


class Detokenizer(Protocol):
    """Maps token ids to their text pieces, one piece per id (``len(result) == len(ids)``)."""

    def __call__(self, ids: Sequence[int]) -> list[str]: ...


class HFDetokenizer:
    """A Hugging Face tokenizer as a `Detokenizer`, loaded on first use (off the UI thread).

    Each id is decoded on its own, so a piece is exactly what that token adds to the text (a UTF-8
    character split across tokens shows as U+FFFD on each part).

    Args:
        model: What `swarm.client.load_tokenizer` accepts: ``None`` for the embedded
            SmolLM2-135M-Instruct, a model directory or a ``.gguf`` file; or an already loaded
            tokenizer via `from_tokenizer`.

    Raises:
        swarm.client.ModelLoadError: On first call, when the tokenizer cannot be loaded.
    """

    def __init__(self, model: str | Path | None = None) -> None:
        self._model = model
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> HFDetokenizer:
        """Wrap a loaded ``transformers`` tokenizer."""
        made = cls()
        made._tokenizer = tokenizer
        return made

    def _load(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self._model)
            return self._tokenizer

    def __call__(self, ids: Sequence[int]) -> list[str]:
        tokenizer = self._load()
        pieces: list[str] = tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False)
        return pieces
