"""`swarm.train.adapters.add_adapter` wraps a base model without transformers' FutureWarning about
``is_gradient_checkpointing`` (peft reads that deprecated property; fresh-s5 #14: printed on every tenants
server start), and without hiding any other warning. A fresh process each: a warning is shown once per place
per process, so a test in a process that saw it already would pass either way."""

from __future__ import annotations

import subprocess
import sys

_WRAP = """
import warnings
from transformers import LlamaConfig, LlamaForCausalLM
from swarm.train.adapters import add_adapter
from swarm.train.config import LoraSettings
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2)
peft = add_adapter(LlamaForCausalLM(config), "ta", LoraSettings(r=2, target_modules=["q_proj", "v_proj"]))
add_adapter(peft, "tb", LoraSettings(r=2, target_modules=["q_proj", "v_proj"]))
warnings.warn("`is_gradient_checkpointing` is deprecated, from elsewhere", FutureWarning)
print(sorted(peft.peft_config))
"""


def test_wrapping_a_base_model_prints_no_deprecation_of_peft_s_probe() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", _WRAP], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ta', 'tb']"
    assert "is deprecated and will be removed in v6" not in done.stderr, done.stderr
    assert "from elsewhere" in done.stderr  # the filter is narrow: the same words from our code still show
