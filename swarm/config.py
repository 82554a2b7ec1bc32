"""Typed configuration of the swarm server (one place for defaults).

``swarm serve``'s flags (:class:`swarm.serve_options.ServeOptions`, flat) build a :class:`ServerConfig`;
tests build one directly. Nothing reads environment variables
except the CLI (``SWARM_ADMIN_TOKEN``), which passes the value in here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from swarm.batch import BatchConfig, FamilyQuotas, tenant_policy_refusal
from swarm.engine.model_loading import DEFAULT_CACHE_DIR
from swarm.precision import MixedPrecision, resolve_dtype
from swarm.protocol import (
    ADMIN_OWNER,
    MIN_TOKEN_CHARS,
    Limits,
    LossAggregation,
    SamplingDefaults,
    check_token_chars,
)
from swarm.tracking.merge import LossWeighting, MergeMode
from swarm.train.config import TrainerConfig, VerlSettings

__all__ = ["DistillConfig", "SamplingDefaults", "ServerConfig", "TrainingConfig", "check_weighting"]


class DistillConfig(BaseModel):
    """On-policy distillation from a teacher server (``swarm serve --teacher URL``; docs/ARCHITECTURE.md
    §On-policy distillation, formulas in `swarm.train.distill`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    teacher_url: str
    """Base URL of the teacher: another swarm server (``POST /v1/score``) or vLLM's OpenAI server
    (``/v1/completions`` with ``prompt_logprobs``); it must use this server's tokenizer."""
    mode: Literal["pure", "mixed"] = "pure"
    """``pure``: the per-token reverse-KL advantage alone; ``mixed``: the task reward's GRPO advantage +
    ``coef`` × it."""
    coef: float = Field(default=1.0, ge=0.0)
    """Weight of the reverse-KL advantage in ``mixed`` mode (live: ``PATCH /api/v1/config``
    ``{"distill_coef": …}``)."""
    wait_s: float = Field(default=30.0, ge=0.0)
    """A ready batch waits at most this long for the teacher to score its episodes; those still unscored
    are left out of the step (they stay in the pool) and counted in ``distill/unscored_episodes``."""
    concurrency: int = Field(default=8, ge=1)
    """Scoring requests in flight to the teacher at once."""
    timeout_s: float = Field(default=60.0, gt=0.0)
    """Per scoring request."""
    attempts: int = Field(default=3, ge=1)
    """Tries per scoring request (transport errors, timeouts, 5xx and 429 are retried with backoff)."""
    retry_after_s: float = Field(default=10.0, ge=0.0)
    """An episode whose scoring failed is tried again after this long (the teacher may be back), or
    sooner once the teacher has answered another request since it failed."""


class TrainingConfig(BaseModel):
    """When and how the server trains on its pooled episodes.

    See docs/ARCHITECTURE.md §Batch policies and quotas, §The training step.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    """Train when the batch policy is satisfied; ``False`` only serves and records (inference mode)."""
    batch: BatchConfig = Field(default_factory=BatchConfig)
    """Batch policy, batch size B and group size G."""
    trainer: TrainerConfig = Field(
        default_factory=lambda: TrainerConfig(loss_agg=LossAggregation.SEQ_MEAN_TOKEN_MEAN)
    )
    """Optimizer, PPO clip, KL, LoRA, micro-batching. The default aggregation is GRPO's original
    sequence-mean of token-means, where with ``loss_weighting="episode"`` the "sequence" is the episode."""
    backend: Literal["torch", "verl"] = "torch"
    """Trainer backend: ``torch`` (:class:`swarm.train.TorchTrainer`, in the server's process on its
    device) or ``verl`` (verl's FSDP actor in a Ray worker group, ``swarm serve --trainer verl``; optional
    extra; full fine-tuning or LoRA without dropout)."""
    verl: VerlSettings = Field(default_factory=VerlSettings)
    """Worker layout of the ``verl`` backend (GPUs, nodes, Ray address)."""
    normalize_std: bool = True
    """Divide group-centred rewards by the group std (GRPO); ``False`` gives Dr. GRPO advantages."""
    loss_weighting: LossWeighting = LossWeighting.EPISODE
    """How an episode split into several samples is weighted (default: it counts once)."""
    merge: MergeMode = MergeMode.TOKEN
    """How calls join samples: token-exact prefixes only, or text-level too (think-stripping templates;
    `swarm.tracking.merge`)."""
    quotas: FamilyQuotas | None = None
    """Task-family mix enforced at episode admission (429 + Retry-After), e.g. math 0.4 / code 0.6."""
    drain_timeout_s: float = Field(default=120.0, ge=0.0)
    """Once a batch is ready, open episodes may still finish for this long; then they are aborted
    (synchronous mode only)."""
    max_staleness: int | None = Field(default=None, ge=0)
    """``None``: synchronous (drain open episodes before every step). ``K``: asynchronous: a step starts
    as soon as its batch is ready, and episodes keep being admitted and served meanwhile (their calls wait
    for the update). Back-pressure: with the ``episodes`` and ``tasks`` policies at most
    ``(K+1)·B·G`` train episodes may be admitted and not yet consumed (503 + Retry-After beyond; a begun
    group may complete), so rollouts run at most about K steps ahead. When a step starts, open episodes
    with a call sampled more than ``K`` versions before the policy it produces are aborted as infra
    failures (the runner re-runs them); finished episodes are always trained. Pair it with
    ``trainer.tis_cap`` (the sampler's logprobs are an older policy's)."""
    client_timeout_s: float | None = Field(default=120.0, gt=0.0)
    """Liveness for the ``*_client_ready`` policies: a client not seen (episode begun or ended, episode or
    client heartbeat, vote) for this many seconds stops counting as active, so a dead client stops
    blocking ``all_clients_ready``. ``None``: clients stay active until they leave."""
    checkpoint_every: int = Field(default=1, ge=1)
    """Save weights + optimizer + step every N steps (and on ``POST /api/v1/checkpoint``). A checkpoint is
    snapshotted to CPU memory and written in the background (its step journaled meanwhile), so every
    step costs a memory copy (``bench/checkpoint.py``) and a crash loses no step; with N > 1 a crash
    redoes the steps since the last checkpoint (``train.rewound``)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """How many recent checkpoints to keep on disk."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop training (keep serving) after this many policy versions."""
    distill: DistillConfig | None = None
    """On-policy distillation from a teacher (``None``: none; `DistillConfig`)."""

    @model_validator(mode="after")
    def _weighting_matches_aggregation(self) -> TrainingConfig:
        if "loss_agg" not in self.trainer.model_fields_set:  # not chosen: take the server's default
            self.trainer = self.trainer.model_copy(update={"loss_agg": LossAggregation.SEQ_MEAN_TOKEN_MEAN})
        check_weighting(self.loss_weighting, self.trainer.loss_agg)
        if self.backend == "verl" and self.trainer.lora is not None and self.trainer.lora.dropout > 0:
            raise ValueError(
                "the verl trainer's LoRA adapters have no dropout (verl 0.9.1): set lora.dropout to 0"
            )
        if self.backend == "verl" and self.distill is not None:
            raise ValueError("distillation (--teacher) needs per-token advantages: use --trainer torch")
        return self


def check_weighting(weighting: LossWeighting, aggregation: LossAggregation) -> None:
    """Refuse a loss weighting that the aggregation would distort.

    ``episode`` weights (an episode's samples share weight 1 by trained tokens) are exact under the
    sequence-mean aggregations; under ``token_mean`` they would weight an episode's tokens unevenly, so
    ``token_mean`` pairs with ``sample`` (every token counts once) or ``token`` weighting.

    Raises:
        ValueError: the pair is inconsistent.
    """
    if weighting is LossWeighting.EPISODE and aggregation is LossAggregation.TOKEN_MEAN:
        raise ValueError(
            "loss_weighting='episode' needs a sequence-mean loss_agg (seq_mean_token_mean or "
            "seq_mean_token_sum_norm); with loss_agg='token_mean' use loss_weighting='sample'"
        )


class ServerConfig(BaseModel):
    """Everything ``swarm serve`` needs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str | None = None
    """``None`` for the embedded default, else a local HF directory or a ``.gguf`` file."""
    engine: Literal["hf", "vllm"] = "hf"
    """Inference engine (`swarm.engine.factory.load_engine`): ``hf`` samples with transformers in
    process (static batches); ``vllm`` samples with vLLM's AsyncLLM on a CUDA GPU (continuous batching,
    optional extra ``a3r[vllm]``) while the trainer updates its own copy of the weights."""
    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    """``vllm`` only: fraction of the GPU's memory vLLM takes for weights and KV cache; the rest is the
    trainer's (the KV cache is released during each step)."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    run_dir: Path = Path("runs/default")
    """Holds the pool database, checkpoints, metrics JSONL and logs; reusing it resumes the run."""
    admin_token: SecretStr | None = None
    """Bearer token for control routes; ``None`` makes control routes loopback-only and open."""
    teacher_token: SecretStr | None = None
    """Bearer credential sent to the distillation teacher (``SWARM_TEACHER_TOKEN`` or
    ``--teacher-token-file``); never logged, never stored."""
    client_tokens: dict[str, SecretStr] = Field(default_factory=dict)
    """Client tokens by name: with any, beginning an episode needs one and an episode is finished,
    aborted, heartbeated and read only with its episode key, the token that began it or the admin token
    (docs/ARCHITECTURE.md §Credentials and limits). Empty: episodes need no credential (trusted network)."""
    limits: Limits = Field(default_factory=Limits)
    """Per-token, per-request and per-server limits (live-patchable)."""
    request_tokens_share: float | None = Field(default=None, gt=0.0, le=1.0)
    """Where ``limits.max_tokens`` is unset: cap a chat request's ``max_tokens`` at this share of the
    model's context window (`swarm.server.limits.context_cap`; ``swarm serve``'s default is 0.5, so one
    caller cannot ask for the whole context). ``None``: the context window is the only cap."""
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest request head (target plus header lines, bytes): a larger one is answered 431 and its
    connection closed before the app sees it (`swarm.server.http_protocol`, whose ``MAX_HEADER_BYTES`` is
    this default). Fixed for the server's life (the protocol reads it at start; not in :attr:`limits`)."""
    public_url: str | None = None
    """Base URL handed to clients in ``EpisodeCreated.base_url``; defaults to the request's own URL."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Storage dtype of the weights. Full fine-tuning needs float32 (AdamW updates of lr ~1e-5 are below
    bfloat16's resolution and would be lost); low-precision weights are for LoRA or serving only.
    ``auto``: bfloat16 for LoRA or serving where bf16 is fast, else float32 (see :attr:`weights_dtype`)."""
    mixed_precision: MixedPrecision = MixedPrecision.NO
    """Compute dtype of forward passes (generation and training), see :mod:`swarm.precision`: ``bf16``
    autocasts to bfloat16 (2-3× faster on AMX CPUs and GPUs; logprobs carry bf16 rounding), ``auto``
    picks ``bf16`` where the device has fast bf16 kernels, ``no`` keeps float32-exact logprobs."""
    device: str = "cpu"
    cache_dir: Path = DEFAULT_CACHE_DIR
    """Where GGUF models are converted to safetensors once."""
    torch_threads: int | None = Field(default=None, ge=1)
    """CPU threads for torch (``None``: torch's default, one per core). Use 1 when other busy processes
    share the cores: oversubscribed OpenMP threads spin and slow every process down."""
    max_batch_size: int = Field(default=32, ge=1)
    batch_window_s: float = Field(default=0.005, ge=0.0)
    episode_timeout_s: float = Field(default=600.0, gt=0)
    """An open episode with no call and no heartbeat for this long is reclaimed (infra failure)."""
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    reclaim_period_s: float = Field(default=5.0, gt=0)
    """How often open episodes are checked for the idle timeout (and prepared ones for theirs)."""
    tenants: int = Field(default=0, ge=0)
    """Most LoRA tenants hosted at once over the frozen base model (``swarm serve --tenants N``;
    `swarm.server.tenants`): each its own adapter, AdamW state, settings, pool partition, steps and
    checkpoints, created by the admin over the control API. ``0``: no tenants, the one policy of
    :attr:`training` (as before). With tenants the base model is never trained: an episode without a
    tenant samples the frozen base and is only recorded. On the ``vllm`` engine the weights must be
    bfloat16 or float16 (:attr:`weights_dtype`; vLLM's LoRA kernels take no float32): ``--dtype auto``
    gives bfloat16 on CUDA GPUs of compute capability ≥ 8.0."""
    tenant_overlap: bool = False
    """LoRA tenants on the ``hf`` engine: the engine samples every tenant on a twin of the peft model
    that shares the base weights (`swarm.engine.adapter_twin`; the adapters held twice), so the other
    tenants keep sampling during a tenant's step (``swarm serve --tenant-overlap``). ``False``: a step
    pauses sampling. (``vllm`` always samples during a step: its trainer has its own copy.)"""
    prepare_timeout_s: float = Field(default=60.0, gt=0)
    """A member of a multi-server finish still ``prepared`` this long after it was stored is resolved by
    the server (`swarm.server.transactions`): the primary aborts, a secondary follows its primary."""

    @model_validator(mode="after")
    def _check_client_tokens(self) -> ServerConfig:
        if self.admin_token is not None and len(self.admin_token.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(f"the admin token needs at least {MIN_TOKEN_CHARS} characters")
        if self.admin_token is not None:
            try:
                check_token_chars(self.admin_token.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"the admin token: {exc}") from None
        seen: set[str] = set()
        for name, token in self.client_tokens.items():
            secret = token.get_secret_value()
            if not name or len(secret) < MIN_TOKEN_CHARS:
                raise ValueError(
                    f"client token {name!r}: a token needs a name and at least {MIN_TOKEN_CHARS} characters"
                )
            try:
                check_token_chars(secret)
            except ValueError as exc:
                raise ValueError(f"client token {name!r}: {exc}") from None
            if name == ADMIN_OWNER:
                raise ValueError(f"client token {name!r}: the name is reserved for the admin token")
            if secret in seen or (
                self.admin_token is not None and secret == self.admin_token.get_secret_value()
            ):
                raise ValueError(
                    f"client token {name!r}: the same secret is given twice (or is the admin token)"
                )
            seen.add(secret)
        return self

    @model_validator(mode="after")
    def _check_tenants(self) -> ServerConfig:
        if self.tenants and (self.training.trainer.lora is None or self.training.backend != "torch"):
            fix = "add --lora-rank" if self.training.trainer.lora is None else "leave --trainer torch"
            raise ValueError(f"tenants are LoRA adapters trained by the torch trainer: {fix}")
        if self.tenants and not self.training.enabled:
            # tenants always train (each its own settings; the base never does): --no-train would change
            # nothing but the start banner's "training off"
            raise ValueError(
                "--no-train with --tenants: every tenant trains its adapter (the base never trains); to "
                "stop one, pause it (POST /api/v1/tenants/{id}/pause); to serve without training, leave "
                "--tenants out"
            )
        if self.tenants and self.training.trainer.lr <= 0:
            # the tenants' default lr: a tenant at lr 0 never changes (peft's LoRA B starts at zero); a
            # one-policy server keeps lr 0 (bench/gpu_engine.py measures logprob drift with frozen weights)
            raise ValueError("--lr 0 with --tenants: a tenant at lr 0 never changes: give --lr above 0")
        if self.tenants and (refusal := tenant_policy_refusal(self.training.batch.policy)) is not None:
            raise ValueError(f"--batch-policy with --tenants: {refusal}")
        if self.tenants and self.training.distill is not None:
            raise ValueError("distillation (--teacher) trains the one policy: leave --tenants out for now")
        if self.tenants and self.engine == "vllm" and self.weights_dtype == "float32":
            # vLLM's LoRA (punica) kernels assert fp16/bf16 weights; a server without tenants merges
            # the adapter into full weights and pushes those, so float32 serves there
            fix = "add --dtype bfloat16, float16 or auto"
            if self.dtype == "auto":  # a device without fast bf16 (`swarm.precision.fast_bf16`)
                fix = f"--dtype auto gives float32 on {self.device} (no fast bfloat16): give --dtype float16 or bfloat16"
            raise ValueError(
                f"--tenants on --engine vllm: vLLM serves LoRA adapters on bfloat16 or float16 weights only: {fix}"
            )
        return self

    @property
    def _full_finetuning(self) -> bool:
        return self.training.enabled and self.training.trainer.lora is None

    @property
    def weights_dtype(self) -> str:
        """The storage dtype with ``auto`` resolved for :attr:`device` (``float32`` under full fine-tuning)."""
        return resolve_dtype(self.dtype, self.device, full_finetuning=self._full_finetuning)

    @model_validator(mode="after")
    def _check_full_finetuning_dtype(self) -> ServerConfig:
        if self._full_finetuning and self.dtype not in ("float32", "auto"):
            raise ValueError(
                f"full fine-tuning of {self.dtype} weights loses AdamW updates below {self.dtype}'s "
                "resolution: keep float32 weights (--dtype float32; add --mixed-precision bf16 for speed) or train "
                "LoRA adapters (--lora-rank)"
            )
        return self

    @model_validator(mode="after")
    def _check_direct_weight_sync(self) -> ServerConfig:
        t = self.training
        sync = t.verl.weight_sync
        direct = t.enabled and t.backend == "verl" and sync != "gather"
        if direct and (self.engine != "vllm" or t.trainer.lora is not None):
            raise ValueError(
                f"--verl-weight-sync {sync} sends full weights into vLLM's workers: it needs --engine vllm "
                "and full fine-tuning (LoRA's adapters are small: leave it at gather)"
            )
        return self
