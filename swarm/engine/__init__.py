"""Inference engines behind one interface (:class:`Engine`): ``hf`` (embedded default) and optional vLLM."""

from swarm.engine.base import Completion, Engine, SamplingParams
from swarm.engine.hf import HFEngine
from swarm.engine.model_loading import ModelSource, embedded_gguf_path, load_model, resolve_model

__all__ = [
    "Completion",
    "Engine",
    "HFEngine",
    "ModelSource",
    "SamplingParams",
    "embedded_gguf_path",
    "load_model",
    "resolve_model",
]
