"""Inference engines behind one interface (:class:`Engine`): ``hf`` (embedded default) and optional vLLM."""

from swarm.engine.base import Completion, Engine, SampledToken, SamplingParams, TokenCallback
from swarm.engine.hf import HFEngine
from swarm.engine.model_loading import ModelSource, embedded_gguf_path, load_model, resolve_model

__all__ = [
    "Completion",
    "Engine",
    "HFEngine",
    "ModelSource",
    "SampledToken",
    "SamplingParams",
    "TokenCallback",
    "embedded_gguf_path",
    "load_model",
    "resolve_model",
]
