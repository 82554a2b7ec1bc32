"""Typed configuration of the trainer backends (live-editable fields are marked) and the loss
aggregation modes they take.

Torch-free: the wire protocol (`swarm.protocol`) re-exports :class:`LossAggregation` for ``PATCH
/api/v1/config``, and the client must not load torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["LIVE_FIELDS", "LoraSettings", "LossAggregation", "TrainerConfig", "VerlSettings"]


class LossAggregation(StrEnum):
    """How per-token losses of a batch reduce to one scalar (with per-sequence weights ``w_i``).

    With sample weights summing to 1 per episode (``swarm.tracking.merge.LossWeighting.EPISODE``), an
    episode split into k samples counts as one sequence whose loss is the weight-average of its samples in
    every mode; with ``EPISODE`` weights (``n_s / N_e``) and ``SEQ_MEAN_TOKEN_MEAN`` that is exactly the
    episode's token mean, whatever the split. For ``TOKEN_MEAN`` use weights 1 (``LossWeighting.SAMPLE``):
    each trained token then counts once, and no token is ever trained by two samples.
    """

    TOKEN_MEAN = "token_mean"
    """``Σ_i w_i Σ_t l_it / Σ_i w_i |o_i|``: every token counts equally (DAPO, Yu et al. 2025, eq. 12 "token-level
    policy gradient loss"; TRL ``loss_type="dapo"``)."""
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    """``Σ_i w_i (1/|o_i|) Σ_t l_it / Σ_i w_i``: mean over tokens, then over sequences (original GRPO,
    Shao et al. 2024 eq. 3; TRL ``loss_type="grpo"``). Biased towards short sequences."""
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"
    """``Σ_i w_i Σ_t l_it / (L · Σ_i w_i)`` with a constant L (the generation budget): Dr. GRPO (Liu et al. 2025,
    §3.1), removing the length bias; TRL ``loss_type="dr_grpo"`` (which uses ``max_completion_length``)."""


class LoraSettings(BaseModel):
    """LoRA adapters (Hu et al. 2021, arXiv:2106.09685) built with ``peft``; the base weights stay frozen."""

    model_config = ConfigDict(frozen=True)

    r: int = Field(default=16, ge=1)
    """Adapter rank."""
    alpha: int = Field(default=32, ge=1)
    """Scaling numerator: the adapter output is multiplied by ``alpha / r``."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input (training forward only; old/reference logprobs run without it)."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the linear layers that get adapters (Llama naming)."""
    merge_for_sampling: bool | None = None
    """Sample from a separate copy of the model whose weights are base + adapter delta, merged once after
    every update (:attr:`TorchTrainer.sampling_model`): no adapter work per generated token, at the cost of
    one more copy of the weights in memory. ``False``: sample through the unmerged adapters. ``None``
    (auto): merge only float32 base weights. Rounding W + ΔW to bfloat16 swamps an early ΔW: on the
    embedded model the merged bf16 copy's logprobs differed from the trained model's by about as much as
    the first update changed them (0.065 vs 0.072 nats, mean over the vocabulary)."""


class TrainerConfig(BaseModel):
    """Hyper-parameters of one GRPO/PPO update (see :class:`swarm.train.TorchTrainer`).

    Symbols: ε_low/ε_high = ``clip_eps_low``/``clip_eps_high``, β = ``kl_coef``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lr: float = Field(default=1e-5, ge=0.0, le=1.0)
    """AdamW learning rate (live)."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW decoupled weight decay (live)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW β1, β2 (live)."""
    adam_eps: float = Field(default=1e-8, gt=0.0)
    max_grad_norm: float | None = Field(default=1.0, gt=0.0)
    """Clip the global gradient L2 norm to this value before each optimizer step; ``None`` disables (live)."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Sequences per forward/backward pass (gradients are accumulated over micro-batches)."""
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Optional cap on padded tokens (sequences × longest length) per micro-batch; a longer single sequence
    still forms its own micro-batch."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over the batch per step (live)."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per pass: the batch is split into this many minibatches (live)."""
    clip_eps_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    """ε_low of the PPO clip (live)."""
    clip_eps_high: float = Field(default=0.2, ge=0.0)
    """ε_high of the PPO clip; DAPO's clip-higher uses 0.28 (live)."""
    kl_coef: float = Field(default=0.0, ge=0.0)
    """β: weight of the k3 KL penalty to the reference policy; 0 disables it (live, but with full fine-tuning
    a reference copy exists only if the trainer was built with ``kl_coef > 0``)."""
    tis_cap: float | None = Field(default=None, gt=0.0)
    """C of truncated importance sampling: each token's policy loss is weighted by min(π_θ_old/μ, C), μ the
    engine's recorded behaviour logprob (:func:`swarm.train.losses.truncated_importance_weights`). Corrects
    the sampler/trainer mismatch of bf16 sampling or stale episodes; ``None`` disables (live)."""
    entropy_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss) (live)."""
    loss_agg: LossAggregation = LossAggregation.SEQ_MEAN_TOKEN_MEAN
    """How per-token losses reduce to a scalar (live). The default matches the sample-weight contract of
    :class:`swarm.tracking.merge.LossWeighting` (``EPISODE`` weights: each episode counts once, as the mean of
    its trained tokens); pair ``token_mean`` (DAPO) with ``LossWeighting.SAMPLE`` for a split-invariant
    token-level loss."""
    norm_tokens: int = Field(default=1024, ge=1)
    """L for ``seq_mean_token_sum_norm`` (Dr. GRPO): the generation budget in tokens (live)."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Logits are divided by this before log-softmax; must match the temperature of the behaviour logprobs
    (the engine records them at 1.0) (live)."""
    recompute_old_logprobs: bool | None = None
    """Recompute π_θ_old with a separate no-grad forward at step start. ``None`` (auto): only when the step
    makes more than one optimizer update (``ppo_epochs · minibatches > 1``); with one update, π_θ_old equals
    π_θ at the time of the single forward, so the detached logprobs of that forward are exactly π_θ_old (as
    TRL does for ``num_iterations=1``). (live)"""
    lora: LoraSettings | None = None
    """LoRA adapters, or ``None`` for full fine-tuning (fixed at construction)."""

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        b1, b2 = self.betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {self.betas}")
        return self

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per :meth:`TorchTrainer.step`."""
        return self.ppo_epochs * self.minibatches


LIVE_FIELDS: frozenset[str] = frozenset(TrainerConfig.model_fields) - {"lora", "adam_eps"}
"""Fields :meth:`TorchTrainer.update_config` may change between steps."""


class VerlSettings(BaseModel):
    """Layout of verl's worker group for ``--trainer verl`` (:class:`swarm.train.verl_backend.VerlTrainer`).

    The hyper-parameters come from :class:`TrainerConfig`; these say where the FSDP actor runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_gpus_per_node: int = Field(default=1, ge=1)
    """GPUs per node of the actor's worker group (one FSDP rank each)."""
    nnodes: int = Field(default=1, ge=1)
    """Nodes of the Ray cluster the worker group spans."""
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    """verl's actor strategy: FSDP1 or FSDP2 (``fully_shard``)."""
    param_offload: bool = False
    """Keep the actor's parameters on CPU between its passes (verl ``fsdp_config.param_offload``)."""
    optimizer_offload: bool = False
    """Keep AdamW states on CPU between steps (verl ``fsdp_config.optimizer_offload``)."""
    attn_implementation: Literal["sdpa", "flash_attention_2"] = "sdpa"
    """Attention kernels of the actor. ``flash_attention_2`` (needs the ``flash-attn`` package) lets verl
    pack sequences without padding; ``sdpa`` runs everywhere and pads each micro-batch."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory for long sequences)."""
    ray_address: str | None = None
    """``None``: start a local Ray instance; ``"auto"`` or ``"ray://HOST:10001"``: join that cluster."""
    weight_sync: Literal["gather", "direct", "ipc", "broadcast"] = "gather"
    """How the actor's weights reach the engine after a step. ``gather``: into the server's Hugging Face
    copy through Ray, which the engine then loads (every engine; the CPU path). The others send them
    straight from the actor into vLLM's workers: rank 0 packs them into buckets in the engine's dtype on
    its GPU, each bucket checksummed on both sides, each call bounded by ``weight_sync_timeout_s`` (full
    fine-tuning; the server's copy is gathered only when a checkpoint reads it). ``ipc``: vLLM maps the
    buckets by CUDA IPC (vLLM on the actor's GPU 0). ``broadcast``: rank 0 broadcasts them to vLLM's
    workers over a group of their own (NCCL; vLLM on other GPUs or nodes). ``direct``: ``ipc`` when vLLM's
    workers share rank 0's GPU, else ``broadcast`` (`swarm.train.weight_transport.choose_transport`)."""
    weight_sync_timeout_s: float = Field(default=300.0, gt=0.0)
    """Most seconds one part of a direct sync (the pack, the engine's load or receive with the actor's
    broadcast, the group's forming) may take; then the step fails loudly (``WeightSyncError``) instead
    of hanging."""
    bucket_mb: int = Field(default=512, ge=1)
    """Most MiB of one direct bucket (the engine maps or receives, and loads, one bucket at a time)."""
    overrides: tuple[str, ...] = ()
    """Further Hydra overrides of verl's ``ppo_trainer`` config, e.g.
    ``actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384``."""

    @property
    def world_size(self) -> int:
        """FSDP ranks: ``n_gpus_per_node · nnodes`` (the data-parallel size)."""
        return self.n_gpus_per_node * self.nnodes
