"""Build the engine a server configuration names (``ServerConfig.engine``)."""

from __future__ import annotations

from typing import assert_never

from swarm.config import ServerConfig
from swarm.engine.base import Engine
from swarm.engine.hf import HFEngine
from swarm.engine.model_loading import load_model, resolve_model
from swarm.precision import resolve_mixed_precision


def load_engine(config: ServerConfig) -> Engine:
    """Resolve and load ``config.model`` into the engine ``config.engine`` names.

    ``hf``: a transformers model in ``config.weights_dtype`` on ``config.device``, sampled in static
    batches, forward passes under ``config.mixed_precision`` (``AUTO`` resolved for the device).
    ``vllm``: vLLM serves ``config.weights_dtype`` on the GPU with ``config.gpu_memory_utilization`` of
    its memory; the trainer's copy lives on ``config.device``.

    Raises:
        ModelLoadError: The model cannot be found or loaded (`swarm.engine.vllm.EngineUnavailable`
            when ``vllm`` is asked for without vLLM or without a CUDA GPU).
    """
    if config.engine == "hf":
        source = resolve_model(config.model, cache_dir=config.cache_dir)
        model, tokenizer = load_model(source, dtype=config.weights_dtype, device=config.device)
        return HFEngine(
            model,
            tokenizer,
            source.name,
            max_batch_size=config.max_batch_size,
            batch_window_s=config.batch_window_s,
            mixed_precision=resolve_mixed_precision(config.mixed_precision, config.device),
            sample_while_training=bool(config.tenants) and config.tenant_overlap,
        )
    if config.engine == "vllm":
        from swarm.engine.vllm import VLLMEngine  # vLLM is optional: imported only when asked for

        source = resolve_model(config.model, cache_dir=config.cache_dir)
        return VLLMEngine(
            source,
            dtype=config.weights_dtype,
            device=config.device,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_loras=config.tenants,
            max_lora_rank=config.training.trainer.lora.r if config.training.trainer.lora is not None else 16,
        )
    assert_never(config.engine)
