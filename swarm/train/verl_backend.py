"""verl as the server's distributed trainer backend: the one module that knows verl (0.9).

``swarm serve --trainer verl`` trains through verl's FSDP actor instead of :class:`~swarm.train.TorchTrainer`;
batch selection, samples, advantages, checkpoints and the weight push stay the server's
(docs/ARCHITECTURE.md §The verl trainer). verl is an optional extra, imported lazily
(:func:`check_verl_available` refuses in one line without it).

A step, for samples ``s`` (token sequences with a loss mask) and their GRPO advantages ``Â_s``:

1. :func:`to_verl_batch` lays the samples out as verl's ``DataProto`` (prompt left-padded, response
   right-padded): a sample's *prompt* is everything before its first trained token, its *response*
   everything from there, with ``response_mask`` = our loss mask (a multi-turn sample keeps its tool and
   user tokens in the response, masked out, as verl's agent loop does). Our advantages are written into
   ``advantages``; verl never computes them. Rows are padded with zero-mask rows up to the multiple of
   data-parallel size × mini-batches that verl's dispatch and data loader need; none is dropped.
2. The worker group recomputes π_θ_old (``compute_log_prob``) and, with KL, π_ref
   (``compute_ref_log_prob``); with ``tis_cap`` the truncated importance weights
   ``min(π_θ_old/μ, C)`` go in as ``rollout_is_weights``.
3. ``update_actor`` runs verl's ``ppo_loss`` (PPO-clip, low-variance KL = our k3, entropy bonus) and its
   optimizer; :class:`VerlTrainer` turns the returned metrics into our :class:`StepMetrics`.
4. The actor's full state dict is gathered from FSDP to rank 0 and copied into the server's Hugging Face
   module (:attr:`VerlTrainer.sampling_model`), which the server then hands to ``Engine.load_weights``
   (vLLM: CUDA IPC push) and to checkpoints.

Loss parity (``tests/train/test_verl_parity.py``): our :func:`swarm.train.losses.aggregate_loss` has
per-sample weights ``w_s`` and verl's ``agg_loss`` has none. Since ``-min(r·cÂ, clip(r)·cÂ) = c·(-min(rÂ,
clip(r)Â))`` for ``c ≥ 0``, writing ``c_s·Â_s`` with ``c_s = w_s · D_verl / D_ours`` (the two
normalisers: trained tokens or non-empty sequences) makes verl's policy loss equal ours exactly. The KL
and entropy terms are aggregated by verl unweighted, i.e. equal to ours when every weight is 1
(``LossWeighting.SAMPLE``, or episodes that merge into one sample each, the usual case).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from swarm.errors import ConfigError
from swarm.tracking.records import Sample
from swarm.train.backend import Advantage
from swarm.train.config import LossAggregation, TrainerConfig, VerlSettings
from swarm.train.losses import batch_statistics, loss_normalizer
from swarm.train.metrics import StepMetrics, StepTimings
from swarm.train.trainer import TrainerError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "RAY_FORWARDED_ENV",
    "VERL_LIVE_FIELDS",
    "VERL_VERSION",
    "VerlBatch",
    "VerlTrainer",
    "VerlUnavailable",
    "check_ray_address",
    "check_verl_available",
    "to_verl_batch",
    "verl_actor_config",
    "verl_loss_agg_mode",
]

VERL_LIVE_FIELDS: frozenset[str] = frozenset({"ppo_epochs", "minibatches"})
"""Trainer fields a live ``PATCH`` may change under ``--trainer verl`` (sent with each batch)."""

VERL_VERSION = "0.9.1"
"""The verl release this module is written against (its worker API changes between minor versions)."""

INSTALL_HINT = (
    f'pip install -e ".[verl]" && pip install --no-deps verl=={VERL_VERSION} tensordict==0.10.0 pyvers==0.1.0 '
    "(verl is installed without its dependencies: it pins transformers < 5.11)"
)


RAY_FORWARDED_ENV: tuple[str, ...] = (
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)
"""Variables of the server's environment passed to every Ray worker of the job (``runtime_env``), where set:
a local Ray's workers inherit the server's environment anyway, but those of a cluster started by ``ray
start`` elsewhere do not. These keep NVLink multicast off in NCCL, torch's symmetric memory and NVSHMEM."""

RAY_CONNECT_TIMEOUT_S = 5.0
"""How long :func:`check_ray_address` waits for a TCP answer from the Ray head (seconds)."""


def check_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise unless a Ray cluster answers at ``address`` (``auto``, ``host:port`` or ``ray://host:port``).

    ``ray.init`` itself retries an unreachable GCS for ever (and ignores SIGTERM off the main thread), and
    ``auto`` without a cluster ends in a traceback; this turns both into one line before Ray starts.
    ``auto`` is resolved as Ray resolves it (``RAY_ADDRESS``, then the last ``ray start`` on this machine).

    Raises:
        TrainerError: ``--ray-address …: why`` in one line.
    """
    target = address.removeprefix("ray://")
    if target == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address_or_die
        except ImportError:  # another Ray layout: leave it to ray.init
            return
        try:
            target = canonicalize_bootstrap_address_or_die("auto")
        except ConnectionError:
            raise TrainerError(
                "--ray-address auto: no running Ray cluster found on this machine "
                "(start one with `ray start --head`, or give the head's host:port)"
            ) from None
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TrainerError(f"--ray-address {address!r}: expected auto, host:port or ray://host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise TrainerError(
            f"--ray-address {address}: no Ray head answers at {host}:{port} within {timeout_s:g} s ({why}); "
            f"start it with `ray start --head --port {port}`"
        ) from None


class VerlUnavailable(ConfigError):
    """``--trainer verl`` on a machine without verl (or with another verl release)."""


def check_verl_available() -> None:
    """Raise unless verl and the packages this module imports from it can be imported.

    Raises:
        VerlUnavailable: one line naming what is missing and the install command.
    """
    try:
        import verl
        from verl.trainer.ppo import core_algos  # noqa: F401  (pulls tensordict, omegaconf, ray)
    except ImportError as exc:
        raise VerlUnavailable(f"--trainer verl: {exc.msg}; install it with {INSTALL_HINT}") from None
    version = getattr(verl, "__version__", "?")
    if version != VERL_VERSION:
        raise VerlUnavailable(
            f"--trainer verl: verl {version} is installed, this server drives verl {VERL_VERSION}; "
            f"install it with {INSTALL_HINT}"
        )


def verl_loss_agg_mode(mode: LossAggregation, norm_tokens: int) -> tuple[str, int | None]:
    """verl's ``loss_agg_mode`` and ``loss_scale_factor`` for our aggregation.

    ``SEQ_MEAN_TOKEN_SUM_NORM`` with L = 1 is verl's ``seq-mean-token-sum``; with L > 1 it is
    ``seq-mean-token-sum-norm`` with ``loss_scale_factor = L`` (Dr. GRPO's constant, never verl's default
    of the padded response length, which changes from batch to batch).

    Returns:
        ``(loss_agg_mode, loss_scale_factor)``.
    """
    if mode is LossAggregation.TOKEN_MEAN:
        return "token-mean", None
    if mode is LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        return "seq-mean-token-mean", None
    if norm_tokens == 1:
        return "seq-mean-token-sum", None
    return "seq-mean-token-sum-norm", norm_tokens


def _verl_normalizer(mask_BT: torch.Tensor, mode: LossAggregation) -> float:
    """verl's ``agg_loss`` denominator for a whole mini-batch: trained tokens (``token-mean``) or non-empty
    sequences (the seq modes, with ``global_batch_size`` set to it; the L of Dr. GRPO is applied by both)."""
    tokens_B = mask_BT.sum(-1)
    if mode is LossAggregation.TOKEN_MEAN:
        return float(tokens_B.sum())
    return float((tokens_B > 0).sum())


@dataclass
class VerlBatch:
    """A batch laid out for verl, with what the trainer needs besides it.

    ``B`` rows (samples, then padding rows), ``P`` prompt and ``R`` response positions.
    """

    data: Any
    """verl ``DataProto`` with tensors ``prompts`` (B, P), ``responses`` (B, R), ``input_ids`` (B, P+R),
    ``attention_mask`` (B, P+R), ``position_ids`` (B, P+R), ``response_mask`` (B, R), ``advantages``
    (B, R) float32 (``c_s·Â_s`` on trained tokens, 0 elsewhere) and ``rollout_log_probs`` (B, R) float32
    (the engine's behaviour logprobs μ)."""
    rows: int
    """Rows that are samples (the first ``rows``); the rest are zero-mask padding rows."""
    global_batch_size: int
    """Non-empty sequences per mini-batch: verl's seq-mean denominator (≥ 1)."""
    loss_agg_mode: str
    loss_scale_factor: int | None
    advantage_scale: list[float] = field(default_factory=list)
    """``c_s`` of each sample (see the module docstring)."""


def to_verl_batch(
    samples: Sequence[Sample],
    advantages: Sequence[float],
    *,
    pad_token_id: int,
    loss_agg: LossAggregation,
    norm_tokens: int = 1024,
    multiple: int = 1,
    minibatches: int = 1,
) -> VerlBatch:
    """Lay out samples and our advantages as verl's padded ``DataProto`` for ``update_actor``.

    Args:
        samples: Training samples (``Sample.input_ids``/``loss_mask``/``behaviour_logprobs`` of equal
            length T ≥ 2, first token unscored; ``weight`` ≥ 0).
        advantages: One advantage per sample (our GRPO advantages, written in as they are).
        pad_token_id: Fills padding positions and padding rows. Each padding row attends to one prompt
            and one response token (verl's no-padding layout has no empty sequence) and has a zero
            response mask, so it is never trained.
        loss_agg: Our aggregation, mapped by :func:`verl_loss_agg_mode`.
        norm_tokens: L of ``seq_mean_token_sum_norm``.
        multiple: Rows are padded to a multiple of this (data-parallel size × mini-batches).
        minibatches: Optimizer updates per epoch (verl splits the rows into this many mini-batches;
            the normalisers are per mini-batch, exact for 1).

    Returns:
        The batch (see :class:`VerlBatch`).

    Raises:
        TrainerError: Empty batch, misaligned advantages, malformed sample, or no trained token.
    """
    from verl import DataProto

    firsts = _first_scored(samples, advantages, multiple, minibatches)
    n = len(samples)
    B = -(-n // multiple) * multiple
    tensors = _padded_layout(samples, firsts, B, pad_token_id)
    response_mask = tensors["response_mask"]
    if not bool(response_mask.any()):
        raise TrainerError("no sample has a scored token (all loss masks are 0)")
    mask64 = response_mask.to(torch.float64)
    scale = _advantage_scale(samples, mask64, loss_agg, norm_tokens)
    adv_B = torch.zeros(B, dtype=torch.float64)
    adv_B[:n] = torch.tensor(list(advantages), dtype=torch.float64) * torch.tensor(scale, dtype=torch.float64)
    behaviour = tensors.pop("rollout_log_probs")  # the DataProto keeps the layout's key order: last
    tensors["advantages"] = (adv_B[:, None] * mask64).to(torch.float32)  # (B, R)
    tensors["rollout_log_probs"] = behaviour
    mode, factor = verl_loss_agg_mode(loss_agg, norm_tokens)
    nonempty = int((response_mask.sum(-1) > 0).sum())
    return VerlBatch(
        data=DataProto.from_dict(tensors=tensors),
        rows=n,
        global_batch_size=max(1, round(nonempty / minibatches)),
        loss_agg_mode=mode,
        loss_scale_factor=factor,
        advantage_scale=scale,
    )


def _first_scored(
    samples: Sequence[Sample], advantages: Sequence[float], multiple: int, minibatches: int
) -> list[int]:
    """Each sample's first scored position (its response starts there; ``T − 1`` when none is scored).

    Raises:
        TrainerError: see :func:`to_verl_batch`.
    """
    if not samples:
        raise TrainerError("cannot train on an empty batch")
    if len(advantages) != len(samples):
        raise TrainerError(f"got {len(advantages)} advantages for {len(samples)} samples")
    if multiple < 1 or minibatches < 1:
        raise TrainerError(f"multiple and minibatches must be ≥ 1, got {multiple}, {minibatches}")
    firsts: list[int] = []
    for i, s in enumerate(samples):
        T = len(s.input_ids)
        if T < 2 or len(s.loss_mask) != T or len(s.behaviour_logprobs) != T or s.loss_mask[0]:
            raise TrainerError(
                f"sample {i} (episode {s.episode_id!r}): needs ≥ 2 tokens, equal lengths of input_ids, "
                "loss_mask and behaviour_logprobs, and an unscored first token"
            )
        if not math.isfinite(advantages[i]) or s.weight < 0 or not math.isfinite(s.weight):
            raise TrainerError(f"sample {i}: advantage {advantages[i]} / weight {s.weight} must be finite")
        scored = [t for t, m in enumerate(s.loss_mask) if m]
        firsts.append(scored[0] if scored else T - 1)
    return firsts


def _padded_layout(
    samples: Sequence[Sample], firsts: list[int], B: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """verl's padded tensors of the samples (left-padded prompts, right-padded responses) and ``B − n``
    padding rows, all but ``advantages``."""
    n = len(samples)
    P = max(firsts)
    R = max(len(s.input_ids) - f for s, f in zip(samples, firsts, strict=True))
    prompts = torch.full((B, P), pad_token_id, dtype=torch.long)  # (B, P) left-padded
    prompt_attn = torch.zeros((B, P), dtype=torch.long)  # (B, P)
    responses = torch.full((B, R), pad_token_id, dtype=torch.long)  # (B, R) right-padded
    response_attn = torch.zeros((B, R), dtype=torch.long)  # (B, R)
    response_mask = torch.zeros((B, R), dtype=torch.long)  # (B, R)
    behaviour = torch.zeros((B, R), dtype=torch.float32)  # (B, R)
    for r, (s, f) in enumerate(zip(samples, firsts, strict=True)):
        ids = torch.tensor(s.input_ids, dtype=torch.long)
        prompts[r, P - f :] = ids[:f]
        prompt_attn[r, P - f :] = 1
        k = len(s.input_ids) - f
        responses[r, :k] = ids[f:]
        response_attn[r, :k] = 1
        response_mask[r, :k] = torch.tensor(s.loss_mask[f:], dtype=torch.long)
        behaviour[r, :k] = torch.tensor(s.behaviour_logprobs[f:], dtype=torch.float32)
    # Padding rows: one prompt and one response token, attended (verl's no-padding layout and its
    # response slicing need both non-empty), never trained.
    prompt_attn[n:, P - 1] = 1
    response_attn[n:, 0] = 1
    attention = torch.cat([prompt_attn, response_attn], dim=1)  # (B, P+R)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),  # (B, P+R)
        "response_mask": response_mask,
        "rollout_log_probs": behaviour,
    }


def _advantage_scale(
    samples: Sequence[Sample], mask64: torch.Tensor, loss_agg: LossAggregation, norm_tokens: int
) -> list[float]:
    """``c_s`` of each sample: its weight times verl's normaliser over ours (module docstring)."""
    n = len(samples)
    weights_B = torch.zeros(mask64.shape[0], dtype=torch.float64)  # (B,)
    weights_B[:n] = torch.tensor([s.weight for s in samples], dtype=torch.float64)
    ours = loss_normalizer(mask64, weights_B, loss_agg, norm_tokens=norm_tokens)
    if loss_agg is LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM:
        ours /= norm_tokens  # verl divides by L itself (loss_scale_factor)
    verls = _verl_normalizer(mask64, loss_agg)
    return [float(w) * verls / ours if ours > 0 else 0.0 for w in weights_B[:n].tolist()]


def worker_input(data: Any, **meta: Any) -> Any:
    """verl's worker input: the padded ``DataProto`` as a no-padding ``TensorDict`` (nested tensors) with
    ``meta`` assigned as non-tensor entries, as ``RayPPOTrainer`` builds it before each worker call."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, **meta)
    return td


def response_values(output: Any, key: str, td: Any) -> torch.Tensor:
    """A worker output's per-token values (``log_probs``, ``entropy``) as (B, R) float32 aligned with
    ``responses``."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(tu.get(output, key), td).float()


# ----------------------------------------------------------------------------------------- configuration


def verl_actor_config(
    model_path: str | Path,
    config: TrainerConfig,
    settings: VerlSettings,
    *,
    mini_batch_rows: int,
    compute_dtype: str = "float32",
) -> DictConfig:
    """verl's ``actor_rollout_ref`` config (its own Hydra defaults, ``ppo_trainer.yaml``) for our trainer
    config: optimizer, clip, KL, entropy, aggregation, micro-batching, FSDP layout.

    Args:
        model_path: Hugging Face model directory the actor (and reference) loads.
        config: Our trainer hyper-parameters.
        settings: Worker layout.
        mini_batch_rows: Rows of one mini-batch (verl's ``ppo_mini_batch_size``; our batches vary in size,
            so the trainer passes each step's value with the batch instead, and this only has to validate).
        compute_dtype: Compute dtype of the actor's forward passes (``float32``, or ``bfloat16`` for our
            ``--mixed-precision bf16``); the parameters stay float32 master weights.

    Returns:
        The ``actor_rollout_ref`` node (verl 0.9's TensorDict workers of ``verl.workers.engine_workers``
        read it).
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict
    from verl.trainer import config as verl_config

    overrides = _actor_overrides(model_path, config, settings, mini_batch_rows, compute_dtype)
    config_dir = Path(verl_config.__file__).parent
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    node = cfg.actor_rollout_ref
    _, factor = verl_loss_agg_mode(config.loss_agg, config.norm_tokens)
    if factor is not None:
        with open_dict(node):
            node.actor.loss_scale_factor = factor
    OmegaConf.resolve(node)
    return node


def _actor_overrides(
    model_path: str | Path,
    config: TrainerConfig,
    settings: VerlSettings,
    mini_batch_rows: int,
    compute_dtype: str,
) -> list[str]:
    """The Hydra overrides of verl's ``ppo_trainer`` config that :func:`verl_actor_config` composes."""
    mode, _ = verl_loss_agg_mode(config.loss_agg, config.norm_tokens)
    mb = config.micro_batch_size
    lora = config.lora
    overrides = [
        f"trainer.n_gpus_per_node={settings.n_gpus_per_node}",
        f"trainer.nnodes={settings.nnodes}",
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={settings.gradient_checkpointing}",
        # Packed (padding-free) sequences need flash-attention's varlen kernels; with SDPA verl pads
        # (transformers' SDPA attends across packed sequences: measured on CPU, |Δlogit| 0.15).
        f"actor_rollout_ref.model.use_remove_padding={settings.attn_implementation == 'flash_attention_2'}",
        f"+actor_rollout_ref.model.override_config.attn_implementation={settings.attn_implementation}",
        f"actor_rollout_ref.actor.strategy={settings.strategy}",
        f"actor_rollout_ref.actor.optim.lr={config.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={config.weight_decay}",
        f"actor_rollout_ref.actor.optim.betas=[{config.betas[0]},{config.betas[1]}]",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        f"actor_rollout_ref.actor.optim.clip_grad={config.max_grad_norm or 1e9}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch_rows}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mb}",
        f"actor_rollout_ref.actor.ppo_epochs={config.ppo_epochs}",
        "actor_rollout_ref.actor.shuffle=False",
        f"actor_rollout_ref.actor.clip_ratio_low={config.clip_eps_low}",
        f"actor_rollout_ref.actor.clip_ratio_high={config.clip_eps_high}",
        # verl's dual-clip bound only acts on negative advantages beyond 1/(1-ε) … set it out of reach:
        # our objective is plain PPO-clip.
        "actor_rollout_ref.actor.clip_ratio_c=1e9",
        f"actor_rollout_ref.actor.use_kl_loss={config.kl_coef > 0}",
        f"actor_rollout_ref.actor.kl_loss_coef={config.kl_coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.actor.entropy_coeff={config.entropy_coef}",
        f"actor_rollout_ref.actor.loss_agg_mode={mode}",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={settings.param_offload}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={settings.optimizer_offload}",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",  # float32 master weights
        f"actor_rollout_ref.actor.fsdp_config.dtype={_verl_dtype(compute_dtype)}",
        # verl's FSDP engine computes in FSDP's MixedPrecision(param_dtype), bf16 unless this dict says
        # otherwise (``fsdp_config.dtype`` is not read by it): measured on the H200, leaving it out made a
        # "float32" actor's logprobs drift 0.04 per token from the float32 sampler's.
        *(
            f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision="
            f"{{param_dtype:{_precision(compute_dtype)},reduce_dtype:fp32,buffer_dtype:fp32}}"
            for role in ("actor", "ref")
        ),
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={mb}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={mb}",
        f"actor_rollout_ref.rollout.temperature={config.temperature}",
        *settings.overrides,
    ]
    if lora is not None:
        overrides += [
            f"actor_rollout_ref.model.lora_rank={lora.r}",
            f"actor_rollout_ref.model.lora_alpha={lora.alpha}",
            f"actor_rollout_ref.model.target_modules=[{','.join(lora.target_modules)}]",
        ]
    return overrides


def _verl_dtype(dtype: str) -> str:
    return {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(dtype, "float32")


def _precision(dtype: str) -> str:
    """verl's precision name (``PrecisionType``) for a torch dtype name."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, "fp32")


# ----------------------------------------------------------------------------------------- the backend


def _worker_class() -> type:
    """verl's ``ActorRolloutRefWorker`` plus one method that gathers the actor's full state dict.

    Built on call, since verl is imported lazily. Role ``"actor_ref"`` (built as ``actor`` and renamed
    before ``init_model``, whose checks are substring tests) builds the actor and a reference model but no
    rollout engine: the server's own engine samples.
    """
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class SwarmActorWorker(ActorRolloutRefWorker):  # type: ignore[misc]  # verl is untyped (Any)
        def __init__(self, config: Any, role: str, **kwargs: Any) -> None:
            super().__init__(config, "actor", **kwargs)
            if role == "actor_ref":
                self.role, self._is_ref = "actor_ref", True

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def full_state_dict(self) -> dict[str, torch.Tensor] | None:
            """Hugging Face-named full tensors on CPU on rank 0 (every rank takes part in the gathers)."""
            params, _ = self.actor.engine.get_per_tensor_param()
            rank0 = torch.distributed.get_rank() == 0
            out = {}
            for name, tensor in params:
                full = tensor.detach()
                if rank0:
                    out[name] = full.to("cpu", copy=True)
            return out if rank0 else None

    return SwarmActorWorker


def load_full_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor]) -> int:
    """Copy gathered verl actor weights into a Hugging Face module in place (dtype and device of the
    module's own tensors kept).

    verl names parameters as Hugging Face does (``model.layers.0.self_attn.q_proj.weight`` …); a tied
    output embedding (``lm_head.weight``) may be missing from the gather and is then left to the tie.

    Returns:
        Tensors copied.

    Raises:
        TrainerError: A name the module does not have, a module tensor the gather lacks (other than a tied
            one), or a shape mismatch.
    """
    own = dict(module.state_dict())
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise TrainerError(f"verl actor weights {unknown[:3]} are not in the served model")
    tied = (
        {"lm_head.weight"}
        if getattr(getattr(module, "config", None), "tie_word_embeddings", False)
        else set()
    )
    missing = sorted(set(own) - set(state) - tied)
    if missing:
        raise TrainerError(f"verl actor weights lack {missing[:3]} of the served model")
    with torch.no_grad():
        for name, value in state.items():
            target = own[name]
            if tuple(target.shape) != tuple(value.shape):
                raise TrainerError(
                    f"{name}: verl actor shape {tuple(value.shape)} vs served {tuple(target.shape)}"
                )
            target.copy_(value.to(device=target.device, dtype=target.dtype))
    return len(state)


class VerlTrainer:
    """GRPO/PPO trainer backend driving verl's FSDP actor (and reference) through its Ray worker group.

    Same surface as :class:`~swarm.train.TorchTrainer` for the server's training loop (``step``,
    ``step_count``, ``model``, ``sampling_model``, ``sync_sampling_model``, ``update_config``,
    ``state_dict``/``load_state_dict``, ``config``). The server keeps one Hugging Face copy of the weights
    (``module``, the engine's ``trainable_module()``): after every update the actor's gathered weights are
    copied into it, so the engine push and the checkpoints read it as they read the torch trainer's model.

    Args:
        module: The server's Hugging Face model (receives the actor's weights after each step).
        model_path: Hugging Face directory verl's actor loads (the same weights as ``module``).
        config: Trainer hyper-parameters (full fine-tuning; ``lora`` is refused).
        pad_token_id: Fills padding.
        settings: Worker layout (GPUs, nodes, FSDP strategy, Ray address).
        compute_dtype: Compute dtype of the actor's forward passes (``float32`` or ``bfloat16``).
        start: Start Ray and the worker group now (``None``: when CUDA is visible or a Ray address is
            set; otherwise on the first step).

    Raises:
        VerlUnavailable: verl is not installed.
        TrainerError: LoRA (the merged gather is not wired yet); when the workers start, no CUDA GPU and no
            Ray address, or a Ray cluster with fewer GPUs than ``settings.world_size`` (Ray would otherwise
            wait forever for the placement group).
    """

    def __init__(
        self,
        module: nn.Module,
        model_path: str | Path,
        config: TrainerConfig,
        pad_token_id: int,
        *,
        settings: VerlSettings | None = None,
        compute_dtype: str = "float32",
        start: bool | None = None,
    ) -> None:
        check_verl_available()
        if config.lora is not None:
            raise TrainerError("--trainer verl trains all weights for now (no --lora-rank)")
        self._module = module
        self.model_path = Path(model_path)
        self.config = config
        self.pad_token_id = pad_token_id
        self.settings = settings or VerlSettings()
        self.compute_dtype = compute_dtype
        self._step = 0
        self._wg: Any = None
        if (
            start is None
        ):  # start now wherever GPUs can be had: the caller's (main) thread, errors at start-up
            start = self.settings.ray_address is not None or torch.cuda.is_available()
        if start:
            self._workers()

    # -- worker group ------------------------------------------------------------------------------------
    def _workers(self) -> Any:
        """The Ray worker group, started on first use (Ray, FSDP init and model load take a while)."""
        if self._wg is not None:
            return self._wg
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        if self.settings.ray_address is None and not torch.cuda.is_available():
            raise TrainerError(
                "--trainer verl: verl's FSDP actor needs CUDA GPUs and this machine has none "
                "(give a Ray cluster with GPUs through the verl settings' ray_address, or use --trainer torch)"
            )
        if self.settings.ray_address is not None:
            check_ray_address(self.settings.ray_address)
        if not ray.is_initialized():
            forwarded = {k: os.environ[k] for k in RAY_FORWARDED_ENV if k in os.environ}
            try:
                ray.init(
                    address=self.settings.ray_address,
                    ignore_reinit_error=True,
                    runtime_env={"env_vars": forwarded} if forwarded else None,
                )
            except ConnectionError as exc:
                raise TrainerError(f"--ray-address {self.settings.ray_address}: {exc}") from None
        gpus = ray.cluster_resources().get("GPU", 0.0)
        if gpus < self.settings.world_size:
            # Ray would wait forever for a placement group the cluster cannot fill.
            raise TrainerError(
                f"--trainer verl: the Ray cluster has {gpus:g} GPU(s) and the actor needs "
                f"{self.settings.world_size} ({self.settings.nnodes} node(s) × {self.settings.n_gpus_per_node})"
            )
        node = verl_actor_config(
            self.model_path,
            self.config,
            self.settings,
            mini_batch_rows=self.settings.world_size * self.config.minibatches,
            compute_dtype=self.compute_dtype,
        )
        role = "actor_ref" if self.config.kl_coef > 0 else "actor"
        pool = RayResourcePool(process_on_nodes=[self.settings.n_gpus_per_node] * self.settings.nnodes)
        cls = RayClassWithInitArgs(cls=ray.remote(_worker_class()), config=node, role=role)
        wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls)
        wg.init_model()
        self._wg = wg
        return wg

    # -- TorchTrainer's surface --------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The server's Hugging Face copy (checkpoints save it)."""
        return self._module

    @property
    def sampling_model(self) -> nn.Module:
        """What the engine serves: the same copy, refreshed from the actor after each step."""
        return self._module

    def sync_sampling_model(self) -> None:
        """Nothing to merge: the copy holds full weights."""

    @property
    def step_count(self) -> int:
        return self._step

    @property
    def live_fields(self) -> frozenset[str]:
        """What verl takes with each batch: ``ppo_epochs`` and ``minibatches``. Everything else (optimizer,
        clip, KL, entropy, aggregation) is in the actor's config, fixed when its workers start."""
        return VERL_LIVE_FIELDS

    def update_config(self, **changes: Any) -> TrainerConfig:
        """Change ``ppo_epochs`` or ``minibatches`` from the next step.

        Raises:
            TrainerError: Another field (fixed in verl's actor config), or an invalid value.
        """
        fixed = set(changes) - VERL_LIVE_FIELDS
        if fixed:
            raise TrainerError(
                f"--trainer verl: {sorted(fixed)} are fixed once verl's actor is built (live: "
                f"{sorted(VERL_LIVE_FIELDS)}); restart the server to change them"
            )
        try:
            self.config = TrainerConfig.model_validate({**self.config.model_dump(), **changes})
        except ValueError as e:
            raise TrainerError(f"invalid trainer config change {changes}: {e}") from e
        return self.config

    def state_dict(self) -> dict[str, Any]:
        """Step and config (verl's optimizer state lives in its workers and is not checkpointed yet)."""
        return {"step": self._step, "config": self.config.model_dump()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the step; the actor is rebuilt from ``model_path`` on first use, so resuming with verl
        needs ``model_path`` to be the checkpoint's folder (the server passes it)."""
        self._step = int(state["step"])

    # -- the step ----------------------------------------------------------------------------------------
    def step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[Advantage],
        rewards: Sequence[float] | None = None,
    ) -> StepMetrics:
        """One policy update on verl's actor, then its weights copied into :attr:`model`.

        Raises:
            TrainerError: Bad input (see :func:`to_verl_batch`), per-token advantages (distillation runs
                on the torch trainer for now) or a non-finite gradient norm.
        """
        scalars = [float(a) for a in advantages if isinstance(a, float | int)]
        if len(scalars) != len(advantages):
            raise TrainerError("the verl trainer takes one advantage per sample; distil with --trainer torch")
        return self._step_scalars(samples, scalars, rewards)

    def _step_scalars(
        self, samples: Sequence[Sample], advantages: Sequence[float], rewards: Sequence[float] | None
    ) -> StepMetrics:
        t_start = time.perf_counter()
        cfg = self.config
        wg = self._workers()
        batch = to_verl_batch(
            samples,
            advantages,
            pad_token_id=self.pad_token_id,
            loss_agg=cfg.loss_agg,
            norm_tokens=cfg.norm_tokens,
            multiple=self.settings.world_size * cfg.minibatches,
            minibatches=cfg.minibatches,
        )
        timings = StepTimings()
        old, entropy = self._old_and_ref_logprobs(wg, batch.data, timings)
        metrics = self._update_actor(wg, batch, timings)
        t0 = time.perf_counter()
        load_full_state_dict(self._module, wg.full_state_dict()[0])
        timings.weight_sync_s = time.perf_counter() - t0
        self._step += 1
        timings.total_s = time.perf_counter() - t_start
        return self._step_metrics(samples, advantages, rewards, batch.data, old, entropy, metrics, timings)

    def _old_and_ref_logprobs(
        self, wg: Any, data: Any, timings: StepTimings
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """π_θ_old and entropy of every response token, (B, R) each, written into ``data`` with π_ref
        (``kl_coef > 0``) and the truncated importance weights (``tis_cap``)."""
        cfg = self.config
        t0 = time.perf_counter()
        td = worker_input(data, calculate_entropy=True, compute_loss=False, temperature=cfg.temperature)
        out = wg.compute_log_prob(td)
        old = response_values(out, "log_probs", td)
        entropy = response_values(out, "entropy", td)
        data.batch["old_log_probs"] = old
        timings.old_logprobs_s = time.perf_counter() - t0
        if cfg.kl_coef > 0:
            t0 = time.perf_counter()
            td = worker_input(data, calculate_entropy=False, compute_loss=False, temperature=cfg.temperature)
            data.batch["ref_log_prob"] = response_values(wg.compute_ref_log_prob(td), "log_probs", td)
            timings.ref_logprobs_s = time.perf_counter() - t0
        if cfg.tis_cap is not None:
            mask = data.batch["response_mask"].bool()
            behaviour = data.batch["rollout_log_probs"]
            data.batch["rollout_is_weights"] = (old - behaviour).exp().clamp(max=cfg.tis_cap) * mask
        return old, entropy

    def _update_actor(self, wg: Any, batch: VerlBatch, timings: StepTimings) -> Mapping[str, Any]:
        """verl's ``update_actor`` on the batch; returns its metrics.

        Raises:
            TrainerError: a non-finite gradient norm.
        """
        from verl.utils import tensordict_utils as tu

        cfg = self.config
        t0 = time.perf_counter()
        rows = batch.data.batch["input_ids"].shape[0]
        td = worker_input(
            batch.data,
            calculate_entropy=cfg.entropy_coef > 0,
            global_batch_size=batch.global_batch_size,
            mini_batch_size=rows // cfg.minibatches,
            epochs=cfg.ppo_epochs,
            seed=0,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
            temperature=cfg.temperature,
        )
        metrics: Mapping[str, Any] = tu.get(wg.update_actor(td), "metrics")
        timings.fwd_bwd_s = time.perf_counter() - t0
        grad_norm = _mean(metrics, "grad_norm", "actor/grad_norm")
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise TrainerError(f"non-finite gradient norm ({grad_norm}) in verl's update")
        return metrics

    def _step_metrics(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float],
        rewards: Sequence[float] | None,
        data: Any,
        old: torch.Tensor,
        entropy: torch.Tensor,
        metrics: Mapping[str, Any],
        timings: StepTimings,
    ) -> StepMetrics:
        cfg = self.config
        mask = data.batch["response_mask"].bool()
        rows = data.batch["input_ids"].shape[0]
        drift = (data.batch["rollout_log_probs"] - old).abs()[mask]
        tokens = int(mask.sum())
        pg = _mean(metrics, "actor/pg_loss", "pg_loss") or 0.0
        kl = _mean(metrics, "kl_loss", "actor/kl_loss")
        total = _mean(metrics, "loss")
        updates = cfg.ppo_epochs * cfg.minibatches
        return StepMetrics(
            step=self._step,
            samples=len(samples),
            episodes=len({s.episode_id for s in samples}),
            tokens=tokens,
            **batch_statistics(advantages, rewards),
            loss=total if total is not None else pg + cfg.kl_coef * (kl or 0.0),
            policy_loss=pg,
            kl=kl if cfg.kl_coef > 0 else None,
            clip_frac=_mean(metrics, "actor/pg_clipfrac", "pg_clipfrac") or 0.0,
            entropy=float(entropy[mask].mean()) if tokens else 0.0,
            grad_norm=_mean(metrics, "grad_norm", "actor/grad_norm") or 0.0,
            grad_norm_max=_max(metrics, "grad_norm", "actor/grad_norm") or 0.0,
            # verl reports ppo_kl = mean(old − new logprob) over trained tokens; exp(−ppo_kl) is the
            # geometric mean of the ratio (our torch trainer reports the arithmetic mean).
            ratio_mean=math.exp(-(_mean(metrics, "actor/ppo_kl", "ppo_kl") or 0.0)),
            logprob_drift_mean=float(drift.mean()) if tokens else 0.0,
            logprob_drift_max=float(drift.max()) if tokens else 0.0,
            tis_weight_mean=(
                float(data.batch["rollout_is_weights"][mask].mean()) if cfg.tis_cap is not None else None
            ),
            lr=cfg.lr,
            updates=updates,
            # per rank: each of the world_size ranks runs this many micro-batches
            micro_batches=updates
            * -(-rows // (cfg.minibatches * self.settings.world_size * cfg.micro_batch_size)),
            time_s=timings,
            created_at=time.time(),
        )


def _values(metrics: Mapping[str, Any], *keys: str) -> list[float]:
    for key in keys:
        if key in metrics:
            value = metrics[key]
            items = value if isinstance(value, list | tuple) else [value]
            out: list[float] = []
            for item in items:
                v: Any = item.aggregate() if hasattr(item, "aggregate") else item  # verl's Metric
                out.append(float(v.item() if isinstance(v, torch.Tensor) else v))
            return out
    return []


def _mean(metrics: Mapping[str, Any], *keys: str) -> float | None:
    vals = _values(metrics, *keys)
    return sum(vals) / len(vals) if vals else None


def _max(metrics: Mapping[str, Any], *keys: str) -> float | None:
    vals = _values(metrics, *keys)
    return max(vals) if vals else None
