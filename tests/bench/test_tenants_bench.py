"""bench/tenants.py's servers (the run itself: bench/README.md): both ways serve one weights dtype,
bfloat16 on vLLM (its LoRA kernels take no float32), float32 on hf as before."""

from __future__ import annotations

from tenants import common_flags, parse_args


def test_both_ways_serve_one_dtype_bf16_on_vllm() -> None:
    def dtype(*argv: str) -> str:
        flags = common_flags(parse_args(argv))
        return flags[flags.index("--dtype") + 1]

    assert dtype() == "float32"
    assert dtype("--engine", "vllm", "--device", "cuda") == "bfloat16"
    assert dtype("--engine", "vllm", "--dtype", "float16") == "float16"
    assert dtype("--dtype", "auto") == "auto"
