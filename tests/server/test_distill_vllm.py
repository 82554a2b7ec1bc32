"""The teacher client against a real ``vllm serve`` (vLLM's OpenAI server) of the embedded model: the
tokenizer check passes and ``/v1/completions`` prompt logprobs equal the model's own forward pass.

Needs vLLM and a CUDA GPU (skipped otherwise, with the reason); on the H200:
``pytest tests/server/test_distill_vllm.py -q``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from swarm.engine import ModelSource, load_model
from swarm.server.teacher import TeacherClient, TeacherSettings, check_teacher
from tests.conftest import free_port, vllm_skip_reason, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_skip_reason() is not None, reason=str(vllm_skip_reason())),
]


@pytest.fixture(scope="module")
def vllm_server(embedded_source: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    binary = Path(sys.executable).with_name("vllm")
    cmd = [str(binary), "serve", str(embedded_source.directory), "--port", str(port), "--dtype", "float32"]
    cmd += ["--max-model-len", "2048", "--gpu-memory-utilization", "0.25", "--served-model-name", "teacher"]
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            return httpx.get(f"{url}/v1/models", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 600, "vllm serve")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def test_vllm_serve_scores_like_the_models_forward_pass(
    vllm_server: str, embedded_source: ModelSource
) -> None:
    model, tokenizer = load_model(embedded_source)
    info = check_teacher(TeacherSettings(url=vllm_server), tokenizer)
    assert info.kind == "vllm" and info.model == "teacher"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}], add_generation_prompt=True, tokenize=True
    )
    ids = [int(i) for i in (ids["input_ids"] if isinstance(ids, dict) else ids)]
    ids += tokenizer.encode("Red, green and blue.", add_special_tokens=False)
    start = len(ids) - 6

    async def score() -> list[float]:
        client = TeacherClient(TeacherSettings(url=vllm_server), tokenizer, info)
        try:
            logprobs, _ = await client.score(ids, start)
            return logprobs
        finally:
            await client.aclose()

    scored = asyncio.run(score())
    with torch.no_grad():
        logits: Any = model(torch.tensor([ids])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    expected = [float(reference[i - 1, ids[i]]) for i in range(start, len(ids))]
    assert max(abs(a - b) for a, b in zip(scored, expected, strict=True)) < 2e-2  # vLLM's fp32 kernels
