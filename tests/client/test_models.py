"""The model functions of ``swarm.client``: the same model location as ``swarm serve``, with torch loaded
only when one is called."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarm.client import ModelLoadError, check_model_path, load_tokenizer


def test_importing_the_client_loads_neither_torch_nor_transformers_nor_typer() -> None:
    heavy = ("torch", "transformers", "typer", "swarm.engine")
    code = f"import sys, swarm.client; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_check_model_path_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        check_model_path(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"neither a model directory nor a \.gguf file"):
        check_model_path(tmp_path / "notes.txt")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        check_model_path(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert check_model_path(tmp_path) == tmp_path


def test_load_tokenizer_loads_the_served_models_tokenizer(tokenizer: Any, tmp_path: Path) -> None:
    loaded = load_tokenizer()  # the embedded default, as `swarm serve` without --model
    text = "Hello, swarm! 12 + 30 = 42"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.eos_token_id == tokenizer.eos_token_id
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
