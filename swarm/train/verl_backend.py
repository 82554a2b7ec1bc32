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
   data-parallel size × mini-batches × micro-batch rows (:func:`micro_batch_layout`) that verl's
   dispatch, data loader and micro-batching need; none is dropped.
2. π_θ_old: when the step makes more than one optimizer update (``ppo_epochs · minibatches > 1``, or
   ``recompute_old_logprobs``; the torch trainer's rule), the worker group recomputes it with a no-grad
   forward (``compute_log_prob``) and, with ``tis_cap``, the truncated importance weights
   ``min(π_θ_old/μ, C)`` go in as ``rollout_is_weights``. With one update the step is on-policy: no
   extra forward; verl's loss takes π_θ_old as the detached logprobs of the update's own forward
   (ratio 1, as the torch trainer does) and computes the TIS weights from them
   (:func:`on_policy_ppo_loss`). With KL, π_ref comes from ``compute_ref_log_prob``.
3. ``update_actor`` runs verl's ``ppo_loss`` (PPO-clip, low-variance KL = our k3, entropy bonus) and its
   optimizer; :class:`VerlTrainer` turns the returned metrics into our :class:`StepMetrics`.
4. The actor's full state dict is gathered from FSDP to rank 0 and copied into the server's Hugging Face
   module (:attr:`VerlTrainer.sampling_model`), which the server then hands to ``Engine.load_weights``
   (vLLM: CUDA IPC push) and to checkpoints. With LoRA only the adapters are gathered. With
   ``VerlSettings.weight_sync`` ``direct`` (or ``ipc``, ``broadcast``) nothing is gathered:
   :meth:`VerlTrainer.push_weights` sends the weights from the actor's GPU into vLLM in checksummed buckets
   (`swarm.train.weight_buckets`), by CUDA IPC where vLLM shares rank 0's GPU, else broadcast over a group
   of rank 0 and vLLM's workers (`swarm.train.weight_transport`), and the copy is gathered only when a
   checkpoint reads it.

Optimizer state: :meth:`VerlTrainer.state_dict` has each actor rank copy its shard of AdamW into CPU
memory and write it in a background thread (torch.distributed.checkpoint, ``async_save``) into a staging
folder beside the checkpoints; the state dict carries only a reference to that folder
(`swarm.train.state_files.StagedFiles`) and the LR schedule's state, and the server's checkpoint writer
waits for the folder and moves it into the checkpoint (``verl_optimizer/``) before marking the checkpoint
complete. A resume loads it back with DCP's ``load`` (resharded if the rank count changed), so AdamW
continues. No optimizer tensor goes through Ray or the server process.

Loss parity (``tests/train/test_verl_parity.py``): our :func:`swarm.train.losses.aggregate_loss` has
per-sample weights ``w_s`` and verl's ``agg_loss`` has none. Since ``-min(r·cÂ, clip(r)·cÂ) = c·(-min(rÂ,
clip(r)Â))`` for ``c ≥ 0``, writing ``c_s·Â_s`` with ``c_s = w_s · D_verl / D_ours`` (the two
normalisers: trained tokens or non-empty sequences) makes verl's policy loss equal ours exactly. The KL
and entropy terms are aggregated by verl unweighted, i.e. equal to ours when every weight is 1
(``LossWeighting.SAMPLE``, or episodes that merge into one sample each, the usual case).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from swarm.errors import ConfigError
from swarm.tracking.records import Sample
from swarm.train.backend import TrainBatch, TrainerBackend, TrainerClosed, TrainerError
from swarm.train.config import LossAggregation, TrainerConfig, VerlSettings
from swarm.train.lora import add_adapters, merge_adapters
from swarm.train.losses import batch_statistics, loss_normalizer, selective_log_softmax
from swarm.train.metrics import StepMetrics, StepTimings
from swarm.train.ray_connection import RAY_CLOSE_TIMEOUT_S, RayConnection
from swarm.train.state_files import StagedFiles, StateFiles, StateFilesError
from swarm.train.weight_buckets import WeightSyncError, bounded, check_fingerprints, fingerprint, pack_stream
from swarm.train.weight_transport import (
    BroadcastTransport,
    BucketTransport,
    GroupAddress,
    IpcTransport,
    Transport,
    choose_transport,
)

if TYPE_CHECKING:
    from omegaconf import DictConfig

log = logging.getLogger(__name__)

__all__ = [
    "RAY_CONNECTION_ATTR",
    "RAY_FORWARDED_ENV",
    "VERL_LIVE_FIELDS",
    "VERL_VERSION",
    "VerlBatch",
    "VerlTrainer",
    "VerlUnavailable",
    "check_ray_address",
    "check_verl_available",
    "load_adapter_state_dict",
    "load_full_state_dict",
    "micro_batch_layout",
    "on_policy_ppo_loss",
    "ray_worker_group",
    "to_verl_batch",
    "verl_actor_config",
    "verl_loss_agg_mode",
]

VERL_LIVE_FIELDS: frozenset[str] = frozenset({"ppo_epochs", "minibatches", "recompute_old_logprobs"})
"""Trainer fields a live ``PATCH`` may change under ``--trainer verl`` (sent with each batch, or read by
the controller before it)."""

ON_POLICY_KEY = "swarm_on_policy"
"""Non-tensor entry of ``update_actor``'s input: ``True`` when the step is on-policy and π_θ_old is the
update's own detached forward (:func:`on_policy_ppo_loss`)."""

TIS_CAP_KEY = "swarm_tis_cap"
"""Non-tensor entry of an on-policy ``update_actor`` input: C of the truncated importance weights."""

ON_POLICY_METRICS = (
    "swarm/tokens",
    "swarm/entropy_sum",
    "swarm/drift_sum",
    "swarm/drift_max",
    "swarm/tis_sum",
)
"""What :func:`on_policy_ppo_loss` adds to verl's metrics per micro-batch (sums over trained tokens, and the
largest |μ − π_θ_old|): the statistics the skipped ``compute_log_prob`` pass used to give."""

OPTIMIZER_FILES = "verl_optimizer"
"""The checkpoint's folder of the actor's AdamW state (torch.distributed.checkpoint: one file per rank)."""
DCP_MARKER = ".metadata"
"""torch.distributed.checkpoint's metadata file: written last, by a rename, once every rank's file is."""
OPTIMIZER_WRITE_TIMEOUT_S = 900.0
"""How long a checkpoint waits for the actor's ranks to write their optimizer shards."""

VERL_VERSION = "0.9.1"
"""The verl release this module is written against (its worker API changes between minor versions)."""

ADAPTER_KEY = "lora_"
"""Substring of every LoRA tensor's state-dict name (peft)."""

FSDP1_PREFIX = "_fsdp_wrapped_module."
"""What FSDP1 inserts into state-dict names (FSDP2 keeps the module's own)."""

VERL_LORA_DROPOUT = (
    "--trainer verl: verl 0.9.1's FSDP LoRA adapters have no dropout; leave the LoRA dropout at 0"
)

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

RAY_CONNECTION_ATTR = "swarm_ray_connection"
"""Attribute of a worker group :func:`ray_worker_group` built: the `RayConnection` it runs on, which
:meth:`VerlTrainer.close` closes with the group's actors (an injected worker group has none)."""

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


MISPLACED: dict[str, str] = {
    "ipc": "--verl-weight-sync ipc: vLLM's worker is not on the actor's rank-0 GPU (CUDA IPC maps memory on "
    "that GPU); use broadcast or direct",
    "broadcast": "--verl-weight-sync broadcast: vLLM's worker is on the actor's rank-0 GPU and NCCL cannot "
    "place two ranks on one GPU; use ipc or direct",
}
"""Why a forced transport cannot serve the layout (`VerlTrainer._transport_for`)."""


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
        multiple: Rows are padded to a multiple of this (the trainer passes :func:`micro_batch_layout`'s).
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
    TrainBatch.checked(samples, advantages)
    if multiple < 1 or minibatches < 1:
        raise TrainerError(f"multiple and minibatches must be ≥ 1, got {multiple}, {minibatches}")
    firsts: list[int] = []
    for s in samples:
        scored = [t for t, m in enumerate(s.loss_mask) if m]
        firsts.append(scored[0] if scored else len(s.input_ids) - 1)
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


def micro_batch_layout(rows: int, ranks: int, minibatches: int, micro_batch_size: int) -> tuple[int, int]:
    """How a batch of ``rows`` samples is padded and cut for verl: ``(multiple, micro)``.

    verl cuts each rank's mini-batch into micro-batches of exactly ``micro`` rows and refuses a remainder.
    With ``per`` = ⌈rows / (ranks · minibatches)⌉ rows per rank and mini-batch, ``k`` = ⌈per /
    micro_batch_size⌉ passes are needed; ``micro`` = ⌈per / k⌉ ≤ ``micro_batch_size`` spreads the rows
    evenly over them, so padding (to a multiple of ``multiple`` = ranks · minibatches · micro) adds fewer
    than ``k`` rows per rank and mini-batch (a batch of 2 with micro-batches of 4: one pass of 2, not 2
    padding rows).
    """
    per = -(-rows // (ranks * minibatches))
    passes = -(-per // micro_batch_size)
    micro = -(-per // passes)
    return ranks * minibatches * micro, micro


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


def on_policy_ppo_loss(
    inner: Callable[..., tuple[torch.Tensor, dict[str, Any]]],
    model_output: dict[str, Any],
    data: Any,
    dp_group: Any = None,
    *,
    entropy_coef: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's loss (``inner``: ``ppo_loss`` with the actor's config) with π_θ_old taken from the update's own
    forward when the batch says it is on-policy (``ON_POLICY_KEY``), as the torch trainer does with one
    optimizer update: ``old_log_probs`` = the detached response logprobs of this forward (ratio exactly 1)
    and, with ``TIS_CAP_KEY``, ``rollout_is_weights`` = ``min(exp(old − μ), C)`` on trained tokens (μ =
    ``rollout_log_probs``). Otherwise ``inner`` runs unchanged (π_θ_old recomputed by ``compute_log_prob``).

    On-policy, the statistics the skipped pass gave are added as verl ``Metric`` s (``ON_POLICY_METRICS``):
    trained tokens, sums of entropy, |μ − π_θ_old| and TIS weights over them, the largest |μ − π_θ_old|.
    The entropy is computed for them (``calculate_entropy``) but enters the loss only with
    ``entropy_coef > 0``, as in the torch trainer.

    Args:
        inner: verl's loss for this actor.
        model_output: This micro-batch's forward: ``log_probs`` (and ``entropy``), no-padding nested tensors.
        data: The micro-batch (``response_mask``, ``rollout_log_probs`` (b, R); non-tensor flags).
        dp_group: Passed to ``inner``.
        entropy_coef: The actor's entropy coefficient.

    Returns:
        ``inner``'s ``(loss, metrics)``, metrics extended on-policy.
    """
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    if not tu.get_non_tensor_data(data=data, key=ON_POLICY_KEY, default=False):
        return inner(model_output=model_output, data=data, dp_group=dp_group)
    mask = data["response_mask"].bool()  # (b, R)
    old = no_padding_2_padding(model_output["log_probs"], data).detach()  # (b, R)
    behaviour = data["rollout_log_probs"]  # (b, R)
    data["old_log_probs"] = old
    drift = (behaviour - old).abs()[mask]
    ours = {"swarm/tokens": mask.sum(), "swarm/drift_sum": drift.sum()}
    cap = tu.get_non_tensor_data(data=data, key=TIS_CAP_KEY, default=None)
    if cap is not None:
        weights = (old - behaviour).exp().clamp(max=float(cap)) * mask
        data["rollout_is_weights"] = weights
        ours["swarm/tis_sum"] = weights[mask].sum()
    entropy = model_output.get("entropy")
    if entropy is not None:
        ours["swarm/entropy_sum"] = no_padding_2_padding(entropy, data).detach()[mask].sum()
        if entropy_coef <= 0:  # measured only: keep it out of verl's loss and its graph
            model_output = {k: v for k, v in model_output.items() if k != "entropy"}
    loss, metrics = inner(model_output=model_output, data=data, dp_group=dp_group)
    metrics = dict(metrics)
    metrics.update({k: Metric(AggregationType.SUM, v) for k, v in ours.items()})
    metrics["swarm/drift_max"] = Metric(AggregationType.MAX, drift.max() if drift.numel() else 0.0)
    return loss, metrics


def vectorized_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True
) -> torch.Tensor:
    """Drop-in for verl's ``logprobs_from_logits`` without flash-attn: ``logit[label] − logsumexp`` over
    chunks of 1024 rows (`swarm.train.losses.selective_log_softmax`, the torch trainer's), where verl's
    fallback (``logprobs_from_logits_v2``) runs one ``logsumexp`` per token, a Python loop of ~2,000
    iterations and their autograd nodes per micro-batch at the 1.5B bench shape. ``inplace_backward`` is
    flash-attn's option, ignored. Same values (the same per-row reduction), same gradient."""
    return selective_log_softmax(logits, labels)


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
        # One rank holds every parameter whole: resharding after each layer's forward frees a copy that
        # the backward then gathers again (a copy through NCCL per layer and pass, for nothing). Keep the
        # gathered parameters between forward and backward there, as the torch trainer's plain module does.
        f"actor_rollout_ref.actor.fsdp_config.reshard_after_forward={settings.world_size > 1}",
        # One rank: reduce-scatter the gradients once per mini-batch, not after every micro-batch's
        # backward (each a copy of all gradients on one rank); several ranks keep verl's default.
        f"actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation={settings.world_size == 1}",
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
        loss_fn: Callable[..., tuple[torch.Tensor, dict[str, Any]]]
        """The actor's loss (verl's ``ppo_loss``, wrapped by :func:`on_policy_ppo_loss`)."""

        def __init__(self, config: Any, role: str, **kwargs: Any) -> None:
            super().__init__(config, "actor", **kwargs)
            if role == "actor_ref":
                self.role, self._is_ref = "actor_ref", True

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def init_model(self) -> None:
            """verl's ``init_model``, then two choices of ours: the actor's loss takes π_θ_old from its own
            forward on on-policy steps (:func:`on_policy_ppo_loss`), and without flash-attn the token
            logprobs are computed vectorised (:func:`vectorized_logprobs`) instead of by verl's per-token
            loop."""
            import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
            from verl.utils import torch_functional

            super().init_model()
            if not torch_functional.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE:  # verl's own spelling
                fsdp_impl.logprobs_from_logits = vectorized_logprobs
            coef = float(self.config.actor.entropy_coeff)
            self.loss_fn = functools.partial(on_policy_ppo_loss, self.loss_fn, entropy_coef=coef)
            self.actor.set_loss_fn(self.loss_fn)

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

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def pack_weight_buckets(
            self, dtype: str, bucket_bytes: int, handle: str
        ) -> list[dict[str, Any]] | None:
            """The direct weight path's sending side: every rank takes part in the gathers, rank 0 casts
            the full tensors to ``dtype`` on its device and packs them into buckets (`pack_stream`), kept
            alive until :meth:`release_weight_buckets`. Rank 0 returns, per bucket, its layout, its
            fingerprint and its handle: ``"cuda_ipc"``, CUDA IPC rebuild arguments (a few hundred bytes
            through Ray, the bytes stay on the GPU); ``"tensor"``, the CPU buffer itself (the CPU tests);
            ``"none"``, nothing (the buckets go by :meth:`broadcast_weight_buckets`). ``None`` elsewhere."""
            from torch.multiprocessing.reductions import reduce_tensor

            params, _ = self.actor.engine.get_per_tensor_param()
            if torch.distributed.get_rank() != 0:
                for _ in params:  # each full tensor is a collective: take part, keep nothing
                    pass
                return None
            self._buckets = []
            out = []
            for bucket, flat in pack_stream(params, dtype=getattr(torch, dtype), bucket_bytes=bucket_bytes):
                self._buckets.append(flat)
                sent = {"cuda_ipc": lambda t: reduce_tensor(t)[1], "tensor": lambda t: t}.get(handle)
                out.append(
                    {"bucket": bucket, "fingerprint": fingerprint(flat), "handle": sent and sent(flat)}
                )
            return out

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def weight_sync_identity(self) -> dict[str, Any] | None:
            """Rank 0's `DeviceIdentity` (host, address, GPU UUID) and a TCP port free on its host (the
            broadcast group's store, which rank 0 opens); ``None`` elsewhere."""
            from swarm.train.weight_transport import free_port, local_identity

            if torch.distributed.get_rank() != 0:
                return None
            return {"identity": local_identity(_actor_device()), "port": free_port()}

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def join_weight_group(self, address: GroupAddress) -> None:
            """Rank 0 opens the broadcast group at ``address`` as its root (other ranks: nothing); returns
            once the engine's workers have joined, or raises after ``address.timeout_s``."""
            from swarm.train.weight_transport import open_broadcast_group

            if torch.distributed.get_rank() != 0:
                return
            self._weight_group = bounded(
                lambda: open_broadcast_group(address, 0, _actor_device()),
                timeout_s=address.timeout_s,
                what="the actor joining the weight group",
            )
            self._weight_group_timeout_s = address.timeout_s

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def broadcast_weight_buckets(self) -> None:
            """Rank 0 broadcasts the buckets of :meth:`pack_weight_buckets`, in order, to the group of
            :meth:`join_weight_group` (the engine's workers receive them at the same time); bounded by the
            group's timeout. Other ranks: nothing."""
            from swarm.train.weight_transport import send_broadcast

            if torch.distributed.get_rank() != 0:
                return
            send_broadcast(self._weight_group, self._buckets, timeout_s=self._weight_group_timeout_s)

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def release_weight_buckets(self) -> None:
            """Free the buckets of :meth:`pack_weight_buckets` (the engine has copied them)."""
            self._buckets = []
            from verl.utils.device import get_torch_device

            get_torch_device().empty_cache()

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def adapter_state_dict(self) -> dict[str, torch.Tensor] | None:
            """The actor's LoRA tensors by peft state-dict name (``…q_proj.lora_A.default.weight``), full
            and on CPU on rank 0 (every rank takes part in the gathers); ``None`` elsewhere."""
            engine = self.actor.engine
            rank0 = torch.distributed.get_rank() == 0
            out = {}
            with _resident(engine, optimizer=False):
                for name, tensor in engine.module.state_dict().items():
                    if ADAPTER_KEY in name:
                        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                        if rank0:
                            out[name.replace(FSDP1_PREFIX, "")] = full.detach().to("cpu", copy=True)
            return out if rank0 else None

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def load_adapter_state(self, state: Mapping[str, torch.Tensor]) -> None:
            """Set the actor's LoRA tensors from full tensors by peft state-dict name (each rank keeps
            its shard).

            Raises:
                ValueError: a name the actor's adapters lack, or adapters of the actor left unset.
            """
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            engine = self.actor.engine
            own = {n.replace(FSDP1_PREFIX, "") for n in engine.module.state_dict() if ADAPTER_KEY in n}
            if own != set(state):
                raise ValueError(
                    f"LoRA adapters differ: the actor's lack {sorted(set(state) - own)[:3]}, "
                    f"the server's lack {sorted(own - set(state))[:3]}"
                )
            with _resident(engine, optimizer=False):
                set_model_state_dict(
                    engine.module, dict(state), options=StateDictOptions(full_state_dict=True, strict=False)
                )

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def optimizer_state(self) -> dict[str, Any] | None:
            """The actor's AdamW state (unsharded: parameter names as keys, CPU tensors) and LR schedule on
            rank 0; ``None`` elsewhere. Independent of the number of ranks, so a resume may use another."""
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            engine = self.actor.engine
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            with _resident(engine, optimizer=True):
                optimizer = get_optimizer_state_dict(engine.module, engine.optimizer, options=options)
            if torch.distributed.get_rank() != 0:
                return None
            return {"optimizer": optimizer, "lr_scheduler": engine.lr_scheduler.state_dict()}

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def stage_optimizer(self, folder: str) -> dict[str, Any] | None:
            """Copy this rank's shard of the actor's AdamW state into CPU memory now (the call returns
            then) and write it into ``folder`` in a background thread: torch.distributed.checkpoint's
            ``async_save``, every rank its own shard, its planning collectives on a gloo group of their
            own (never the training's), DCP's ``.metadata`` written last by rank 0 (by a rename: the
            folder is complete). A failed write leaves ``FAILED`` in the folder with the error. A
            previous write still running is waited for first. The staging buffers are kept between
            snapshots where torch allows (`swarm.train.dcp_staging`: not on torch 2.11.0). Rank 0 returns
            the LR schedule's state (small); ``None`` elsewhere."""
            from concurrent.futures import Future

            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
            from torch.distributed.checkpoint.state_dict_saver import async_save

            from swarm.train.dcp_staging import OptimizerStagers

            self.finish_optimizer_write()
            engine = self.actor.engine
            if getattr(self, "_stagers", None) is None:
                self._stagers = OptimizerStagers(pinned=torch.cuda.is_available())
            with _resident(engine, optimizer=True):  # sharded: this rank's DTensors, no gather, no copy
                shard = get_optimizer_state_dict(engine.module, engine.optimizer)
                written = async_save(
                    {"optimizer": shard},
                    checkpoint_id=folder,
                    process_group=self.checkpoint_group(),
                    async_stager=self._stagers.next(),
                )  # returns once the shard is staged in CPU memory
            assert isinstance(written, Future)  # a synchronous stager: the write's future
            written.add_done_callback(functools.partial(_report_failed_write, Path(folder)))
            self._optimizer_write: Future[Any] | None = written
            if torch.distributed.get_rank() != 0:
                return None
            return dict(engine.lr_scheduler.state_dict())

        def checkpoint_group(self) -> Any:
            """The gloo group of the actor's ranks that the optimizer files' collectives use (DCP's
            planning; a background write's must never share the training's group). Made on first use,
            by every rank in the same call (a collective)."""
            if getattr(self, "_checkpoint_group", None) is None:
                self._checkpoint_group = torch.distributed.new_group(backend="gloo")
            return self._checkpoint_group

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def finish_optimizer_write(self) -> None:
            """Wait for :meth:`stage_optimizer`'s background write, if one runs (its error is in the
            folder's ``FAILED``, not raised here)."""
            written = getattr(self, "_optimizer_write", None)
            self._optimizer_write = None
            if written is not None:
                written.exception()  # waits

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def load_optimizer_files(self, folder: str, lr_scheduler: Mapping[str, Any] | None) -> None:
            """Restore the AdamW state :meth:`stage_optimizer` wrote into ``folder`` into this rank's
            shard (DCP's ``load`` reads the slices this rank owns: another rank count than the
            writer's reshards), and the LR schedule's state."""
            from torch.distributed.checkpoint.state_dict import (
                get_optimizer_state_dict,
                set_optimizer_state_dict,
            )
            from torch.distributed.checkpoint.state_dict_loader import load

            engine = self.actor.engine
            with _resident(engine, optimizer=True):
                # the template: this rank's shards (AdamW's state initialised if it has none yet)
                state = {"optimizer": get_optimizer_state_dict(engine.module, engine.optimizer)}
                load(state, checkpoint_id=folder, process_group=self.checkpoint_group())
                set_optimizer_state_dict(engine.module, engine.optimizer, state["optimizer"])
            if lr_scheduler is not None:
                engine.lr_scheduler.load_state_dict(dict(lr_scheduler))

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
        def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
            """Restore :meth:`optimizer_state` output (a checkpoint written before the optimizer's files,
            with the unsharded state in ``trainer_state.pt``) into this rank's shard of the optimizer."""
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            engine = self.actor.engine
            with _resident(engine, optimizer=True):
                set_optimizer_state_dict(
                    engine.module,
                    engine.optimizer,
                    dict(state["optimizer"]),
                    options=StateDictOptions(full_state_dict=True),
                )
            engine.lr_scheduler.load_state_dict(state["lr_scheduler"])

    return SwarmActorWorker


def _report_failed_write(folder: Path, written: Any) -> None:
    """A background optimizer write's end: on an error, ``FAILED`` in its folder (the checkpoint writer
    waiting for the folder reads it)."""
    from swarm.train.state_files import FAILED

    error = written.exception()
    if error is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FAILED).write_text(f"rank {torch.distributed.get_rank()}: {type(error).__name__}: {error}")


def read_optimizer_files(folder: Path) -> dict[str, Any]:
    """The AdamW state verl's actor wrote into a checkpoint's ``verl_optimizer/`` folder, unsharded, as
    :meth:`SwarmActorWorker.optimizer_state` returns it: ``state`` (by parameter name: ``step``,
    ``exp_avg``, ``exp_avg_sq``, full float32 CPU tensors) and ``param_groups``. For inspection (the
    AdamW check of ``bench/multi_gpu_resume.py``); no process group needed; reads the whole state
    (2 × the trained parameters' float32 bytes) through a temporary file.

    Raises:
        FileNotFoundError: ``folder`` has no checkpoint.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(folder, Path(scratch) / "optimizer.pt")
        state = torch.load(Path(scratch) / "optimizer.pt", map_location="cpu", weights_only=False)
    optimizer: dict[str, Any] = state["optimizer"]
    return optimizer


def _actor_device() -> torch.device:
    """The device this actor rank computes on (verl's platform: a CUDA GPU, or the CPU in the tests)."""
    from verl.utils.device import get_device_name

    name = get_device_name()
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device(name)


class _resident:
    """Context: the actor's parameters (and optimizer state) on the device while inside, offloaded again
    after where verl's ``param_offload``/``optimizer_offload`` keep them on CPU between passes."""

    def __init__(self, engine: Any, *, optimizer: bool) -> None:
        self.engine = engine
        self.model = bool(engine.is_param_offload_enabled)
        self.optimizer = optimizer and bool(engine.is_optimizer_offload_enabled)

    def __enter__(self) -> None:
        from verl.utils.device import get_device_name

        if self.model or self.optimizer:
            self.engine.to(get_device_name(), model=self.model, optimizer=self.optimizer, grad=False)

    def __exit__(self, *exc: object) -> None:
        if self.model or self.optimizer:
            self.engine.to("cpu", model=self.model, optimizer=self.optimizer, grad=False)


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
    return _copy_into(own, state)


def _copy_into(own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> int:
    """Copy each ``state`` tensor into ``own``'s of its name, in place (dtype and device of ``own`` kept).

    Raises:
        TrainerError: a shape mismatch.
    """
    with torch.no_grad():
        for name, value in state.items():
            target = own[name]
            if tuple(target.shape) != tuple(value.shape):
                raise TrainerError(
                    f"{name}: verl actor shape {tuple(value.shape)} vs served {tuple(target.shape)}"
                )
            target.copy_(value.to(device=target.device, dtype=target.dtype))
    return len(state)


def ray_worker_group(settings: VerlSettings, node: DictConfig, role: str) -> Any:
    """verl's Ray worker group of ``settings.world_size`` FSDP ranks (``SwarmActorWorker``), started and
    with its model built (``init_model``). Joins ``settings.ray_address`` or starts a local Ray
    (`swarm.train.ray_connection.RayConnection`, kept on the group as ``RAY_CONNECTION_ATTR`` for
    :meth:`VerlTrainer.close`).

    Raises:
        TrainerError: no CUDA GPU and no Ray address, an unreachable Ray address, or a Ray cluster with
            fewer GPUs than the actor needs (Ray would otherwise wait forever for the placement group).
    """
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    if settings.ray_address is None and not torch.cuda.is_available():
        raise TrainerError(
            "--trainer verl: verl's FSDP actor needs CUDA GPUs and this machine has none "
            "(give a Ray cluster with GPUs through the verl settings' ray_address, or use --trainer torch)"
        )
    if settings.ray_address is not None:
        check_ray_address(settings.ray_address)
    forwarded = {k: os.environ[k] for k in RAY_FORWARDED_ENV if k in os.environ}
    try:
        connection = RayConnection.open(
            settings.ray_address, runtime_env={"env_vars": forwarded} if forwarded else None
        )
    except ConnectionError as exc:
        raise TrainerError(f"--ray-address {settings.ray_address}: {exc}") from None
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if gpus < settings.world_size:
        # Ray would wait forever for a placement group the cluster cannot fill.
        raise TrainerError(
            f"--trainer verl: the Ray cluster has {gpus:g} GPU(s) and the actor needs "
            f"{settings.world_size} ({settings.nnodes} node(s) × {settings.n_gpus_per_node})"
        )
    pool = RayResourcePool(process_on_nodes=[settings.n_gpus_per_node] * settings.nnodes)
    cls = RayClassWithInitArgs(cls=ray.remote(_worker_class()), config=node, role=role)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls)
    try:
        wg.init_model()
    except BaseException:  # a model that cannot load: its actors go now, not with the process
        connection.close(wg.workers)
        raise
    setattr(wg, RAY_CONNECTION_ATTR, connection)
    return wg


def load_adapter_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor]) -> int:
    """Copy the actor's gathered LoRA tensors into the server's peft-wrapped copy in place.

    Returns:
        Tensors copied.

    Raises:
        TrainerError: the two sets of adapter names differ, or a shape does.
    """
    own = {name: t for name, t in module.state_dict().items() if ADAPTER_KEY in name}
    if set(own) != set(state):
        raise TrainerError(
            f"verl actor adapters differ from the served model's: {sorted(set(state) ^ set(own))[:3]}"
        )
    return _copy_into(own, state)


class VerlTrainer(TrainerBackend):
    """GRPO/PPO trainer backend driving verl's FSDP actor (and reference) through its Ray worker group.

    Same surface as :class:`~swarm.train.TorchTrainer` for the server's training loop (``step``,
    ``step_count``, ``model``, ``sampling_model``, ``sync_sampling_model``, ``update_config``,
    ``state_dict``/``load_state_dict``, ``config``). The server keeps one Hugging Face copy of the weights
    (``module``, the engine's ``trainable_module()``): after every update the actor's gathered weights are
    copied into it, so the engine push and the checkpoints read it as they read the torch trainer's model.
    With LoRA the copy gets the same adapters (`swarm.train.lora.add_adapters`), only the actor's adapter
    tensors are gathered, and a merged sampling copy follows them as the torch trainer's does.

    Args:
        module: The server's Hugging Face model (receives the actor's weights after each step).
        model_path: Hugging Face directory verl's actor loads (the same weights as ``module``; with LoRA
            the base model's, never a checkpoint's adapter folder).
        config: Trainer hyper-parameters (``lora``: verl's FSDP LoRA, ``lora_rank``; no dropout).
        pad_token_id: Fills padding.
        settings: Worker layout (GPUs, nodes, FSDP strategy, Ray address).
        compute_dtype: Compute dtype of the actor's forward passes (``float32`` or ``bfloat16``).
        start: Start Ray and the worker group now (``None``: when CUDA is visible or a Ray address is
            set; otherwise on the first step).
        worker_group: Builds the started worker group from verl's ``actor_rollout_ref`` config and the
            role (``"actor"`` or ``"actor_ref"``); default :func:`ray_worker_group` (verl's Ray worker group
            on ``settings``' GPUs). The CPU tests pass one in-process worker.
        state_dir: Where the actor's ranks write their optimizer shards for :meth:`state_dict` (the run's
            ``checkpoints/`` folder, so the checkpoint takes the folder by a rename; it must be shared
            by every node of the actor); ``None``: the system's temporary folder.

    Raises:
        VerlUnavailable: verl is not installed.
        TrainerError: LoRA with dropout (verl's adapters have none); when the workers start, no CUDA GPU
            and no Ray address, or a Ray cluster with fewer GPUs than ``settings.world_size`` (Ray would
            otherwise wait forever for the placement group).
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
        worker_group: Callable[[DictConfig, str], Any] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        check_verl_available()
        self._sampler: nn.Module | None = None
        if config.lora is not None:
            if config.lora.dropout > 0:
                raise TrainerError(VERL_LORA_DROPOUT)
            module, self._sampler = add_adapters(module, config.lora)
        self._module = module
        self.model_path = Path(model_path)
        self.config = config
        self.pad_token_id = pad_token_id
        self.settings = settings or VerlSettings()
        self.compute_dtype = compute_dtype
        self._step = 0
        self._wg: Any = None
        self._closed = False
        self._build_workers = worker_group
        self._copy_stale = False
        """``direct`` weight sync: the actor moved on since the server's copy was last gathered."""
        self.last_push: dict[str, float | int | str] = {}
        """The last direct sync: ``transport``, ``pack_s``, ``load_s`` (the engine's load, or the broadcast
        and receive), ``buckets``, ``bytes``."""
        self._transport: BucketTransport | None = None
        """The direct path's transport, chosen at the first push (:meth:`_transport_for`)."""
        self._group_failed: str | None = None
        """Why the broadcast group failed: a hung collective cannot be undone, so no push is tried again."""
        self.state_dir = Path(state_dir) if state_dir is not None else Path(tempfile.gettempdir())
        self._pending_optimizer: Mapping[str, Any] | None = None
        """Optimizer state loaded before the workers started (``verl_optimizer`` and
        ``verl_lr_scheduler`` of :meth:`load_state_dict`'s state): handed to them when they do."""
        if (
            start is None
        ):  # start now wherever GPUs can be had: the caller's (main) thread, errors at start-up
            start = self.settings.ray_address is not None or torch.cuda.is_available()
        if start:
            self._workers()

    # -- worker group ------------------------------------------------------------------------------------
    def _workers(self) -> Any:
        """The worker group, started on first use (Ray, FSDP init and model load take a while); optimizer
        state restored before it started is loaded into it.

        Raises:
            TrainerError: the trainer was closed (:meth:`close`).
        """
        if self._wg is not None:
            return self._wg
        if self._closed:
            raise TrainerError("the verl trainer is closed (the server is stopping)")
        node = verl_actor_config(
            self.model_path,
            self.config,
            self.settings,
            mini_batch_rows=self.settings.world_size * self.config.minibatches,
            compute_dtype=self.compute_dtype,
        )
        role = "actor_ref" if self.config.kl_coef > 0 else "actor"
        if self._build_workers is not None:
            wg = self._build_workers(node, role)
        else:
            wg = ray_worker_group(self.settings, node, role)
        self._wg = wg
        if self.config.lora is not None:  # the server's adapters (fresh, or a checkpoint's) seed the actor's
            self._push_adapters()
        if self._pending_optimizer is not None:
            self._load_optimizer(wg, self._pending_optimizer)
            self._pending_optimizer = None
        return wg

    def _push_adapters(self) -> None:
        """The server's copy's LoRA tensors into the actor's adapters (started workers)."""
        adapters = {k: v.detach().cpu() for k, v in self._module.state_dict().items() if ADAPTER_KEY in k}
        self._wg.load_adapter_state(adapters)

    def close(self, timeout_s: float = RAY_CLOSE_TIMEOUT_S) -> TrainerClosed | None:
        """Kill the worker group's actors (their GPU weights and optimizer state) and end this process's
        connection to Ray: ``ray.shutdown`` stops a local Ray it started, or leaves a joined cluster
        (`RayConnection.close`), within ``timeout_s`` seconds. Idempotent; never raises.

        Returns:
            What was freed (``None``: the workers never started, or an injected worker group).
        """
        wg, self._wg, self._closed = self._wg, None, True
        connection = getattr(wg, RAY_CONNECTION_ATTR, None)
        if not isinstance(connection, RayConnection):
            return None
        closed = connection.close(getattr(wg, "workers", ()), timeout_s)
        return TrainerClosed(
            message=f"verl trainer closed: {closed.message}",
            complete=not closed.timed_out and closed.error is None,
            data={
                "actors": closed.actors,
                "stopped_ray": closed.stopped_ray,
                "disconnected": closed.disconnected,
                "close_s": round(closed.seconds, 3),
                "timed_out": closed.timed_out,
                "error": closed.error,
            },
        )

    # -- TorchTrainer's surface --------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The server's Hugging Face copy (checkpoints save it; with LoRA the peft-wrapped copy, whose
        checkpoints hold the adapters). With ``weight_sync="direct"`` it is gathered from the actor here,
        when read after a step (a checkpoint), instead of after every step."""
        if self._copy_stale:
            load_full_state_dict(self._module, self._workers().full_state_dict()[0])
            self._copy_stale = False
        return self._module

    @property
    def direct(self) -> bool:
        """Whether the engine receives the weights from the actor directly (:meth:`push_weights`)."""
        return self.settings.weight_sync != "gather" and self.config.lora is None

    @property
    def sampling_model(self) -> nn.Module:
        """What the engine serves: the copy, refreshed from the actor after each step (with LoRA and
        ``merge_for_sampling``: the merged copy)."""
        return self.model if self._sampler is None else self._sampler

    def push_weights(self, engine: Any, policy_version: int) -> bool:
        """The direct weight path (``weight_sync`` ``direct``, ``ipc`` or ``broadcast``): the actor's weights
        into ``engine`` as ``policy_version`` without a CPU or Ray object-store hop, then each bucket's
        fingerprint compared between the actor and the engine. Returns ``False`` (nothing done: the caller
        loads :attr:`sampling_model` as usual) under ``gather``. Times land in :attr:`last_push`.

        Rank 0 packs the buckets; the transport chosen at the first push (:meth:`_transport_for`) delivers
        them: `IpcTransport` (``engine.load_weight_buckets``: vLLM maps them by CUDA IPC) or
        `BroadcastTransport` (rank 0 broadcasts them while ``engine.receive_weight_buckets`` receives them).

        Raises:
            TrainerError: the engine cannot receive buckets by the transport asked for.
            WeightSyncError: a part took longer than ``weight_sync_timeout_s``, failed, or the engine's
                fingerprints differ from the actor's; and every push after a broadcast group failed.
        """
        if not self.direct:
            return False
        if self._group_failed is not None:
            raise WeightSyncError(
                f"weight sync: the broadcast group failed earlier ({self._group_failed}); restart the server"
            )
        wg, timeout = self._workers(), self.settings.weight_sync_timeout_s
        transport = self._transport_for(engine)
        dtype = str(next(self._module.parameters()).dtype).removeprefix("torch.")
        t0 = time.perf_counter()
        packed: list[dict[str, Any]] = bounded(
            lambda: wg.pack_weight_buckets(dtype, self.settings.bucket_mb << 20, transport.handle)[0],
            timeout_s=timeout,
            what="packing the actor's weights",
        )
        t1 = time.perf_counter()
        try:
            received = transport.deliver(packed, policy_version)
        except WeightSyncError as exc:
            if transport.breaks_on_failure:
                self._group_failed = str(exc)
            raise
        finally:
            wg.release_weight_buckets()
        check_fingerprints([p["fingerprint"] for p in packed], received)
        self.last_push = {
            "transport": transport.name,
            "pack_s": t1 - t0,
            "load_s": time.perf_counter() - t1,
            "buckets": len(packed),
            "bytes": sum(p["bucket"].nbytes for p in packed),
        }
        return True

    def _transport_for(self, engine: Any) -> BucketTransport:
        """The direct path's transport, chosen once per engine: ``ipc`` or ``broadcast`` as configured, or for
        ``direct`` from where rank 0 and the engine's workers run (`choose_transport`; an engine that
        reports no devices, the CPU receiver, gets ``ipc``). For ``broadcast`` the group is formed here:
        rank 0 (the root, hosting the store on a free port of its host) and each engine worker join it at
        once, bounded by ``weight_sync_timeout_s``.

        Raises:
            TrainerError: the engine lacks the methods of the chosen transport, or a forced transport
                cannot serve the layout (:data:`MISPLACED`).
            WeightSyncError: the group did not form in time, or the layout fits neither transport.
        """
        if self._transport is not None and self._transport.engine is engine:
            return self._transport
        wg, mode, timeout = self._workers(), self.settings.weight_sync, self.settings.weight_sync_timeout_s
        devices = getattr(engine, "weight_sync_devices", None)
        receivers = None if devices is None else list(devices())
        actor: dict[str, Any] | None = None
        name: Transport
        placed: Transport | None = None  # what the layout allows, where the engine reports its devices
        if receivers is not None:
            actor = wg.weight_sync_identity()[0]
            placed = choose_transport(actor["identity"], receivers)
        if mode in ("ipc", "broadcast"):
            name = "ipc" if mode == "ipc" else "broadcast"
            if placed is not None and placed != name:
                raise TrainerError(MISPLACED[name])
        else:
            name = placed or "ipc"
        needs = "receive_weight_buckets" if name == "broadcast" else "load_weight_buckets"
        if not hasattr(engine, needs) or (name == "broadcast" and receivers is None):
            raise TrainerError(
                f"--verl-weight-sync {mode}: the {type(engine).__name__} cannot receive buckets by {name}"
            )
        transport: BucketTransport
        if name == "ipc":
            transport = IpcTransport(engine, timeout)
        else:
            assert receivers is not None and actor is not None
            identity = actor["identity"]
            address = GroupAddress(
                host="127.0.0.1" if all(r.host == identity.host for r in receivers) else identity.address,
                port=int(actor["port"]),
                world_size=1 + len(receivers),
                backend="nccl" if identity.device == "cuda" else "gloo",
                timeout_s=timeout,
            )
            try:
                transport = BroadcastTransport(wg, engine, address)
            except WeightSyncError as exc:
                self._group_failed = str(exc)
                raise
        log.info("verl weight sync: %s (%s)", name, mode)
        self._transport = transport
        return transport

    def sync_sampling_model(self) -> None:
        """With LoRA's merged sampling copy: merge the copy's adapters into it (after every step and after
        loading a checkpoint); otherwise nothing (the copy holds full weights)."""
        if self._sampler is None:
            return
        merge_adapters(self._module, self._sampler)

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
        """Step, config and verl's optimizer state: ``verl_optimizer``, a `StagedFiles` folder in
        :attr:`state_dir` into which every actor rank writes its shard of AdamW in the background (each
        copied into CPU memory before this returns: the call's cost), and ``verl_lr_scheduler``, the LR
        schedule's state. The checkpoint writer waits for the folder and moves it into the checkpoint
        (`swarm.train.state_files.commit_state_files`); a caller that does not checkpoint it removes it
        (`StagedFiles.discard`, after `StagedFiles.wait`). Without started workers (no step yet on this
        process) the optimizer state restored by :meth:`load_state_dict`, if any, is passed on
        unchanged."""
        state: dict[str, Any] = {"step": self._step, "config": self.config.model_dump()}
        if self._wg is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            # ".step-*": a restart removes a staging folder a crash left (`checkpoints.resume`)
            staging = Path(
                tempfile.mkdtemp(prefix=f".step-{self._step:06d}.{OPTIMIZER_FILES}.", dir=self.state_dir)
            )
            lr_scheduler = self._wg.stage_optimizer(str(staging))[0]
            state["verl_optimizer"] = StagedFiles(
                staging, OPTIMIZER_FILES, marker=DCP_MARKER, timeout_s=OPTIMIZER_WRITE_TIMEOUT_S
            )
            state["verl_lr_scheduler"] = lr_scheduler
        elif self._pending_optimizer is not None:
            state.update(self._pending_optimizer)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the step and verl's optimizer state (into the workers now, or when they start), so a
        resume continues AdamW. The weights come from the checkpoint folder: the actor is built from
        ``model_path`` (full fine-tuning: the server passes the newest checkpoint's folder) and, with
        LoRA, the adapters are pushed into the actor from the server's copy, which the caller loaded from
        the checkpoint before this call (`swarm.server.checkpoints.resume` does): now if the workers
        run, else when they start. ``verl_optimizer``: a loaded checkpoint's `StateFiles` (its folder
        checked here), or the unsharded state dict of a checkpoint written before those files.

        Raises:
            TrainerError: the checkpoint's optimizer folder is missing or incomplete (a resume would
                silently restart AdamW).
        """
        self._step = int(state["step"])
        if self.config.lora is not None and self._wg is not None:  # started before the copy was loaded
            self._push_adapters()
        optimizer = state.get("verl_optimizer")
        if optimizer is None:
            return
        if isinstance(optimizer, StateFiles):
            try:
                optimizer.check()
            except StateFilesError as exc:
                raise TrainerError(
                    f"verl's optimizer state: {exc}; AdamW cannot continue from this checkpoint (remove "
                    "the checkpoint folder to resume from the previous one)"
                ) from None
        restored = {"verl_optimizer": optimizer, "verl_lr_scheduler": state.get("verl_lr_scheduler")}
        if self._wg is not None:
            self._load_optimizer(self._wg, restored)
        else:
            self._pending_optimizer = restored

    @staticmethod
    def _load_optimizer(wg: Any, state: Mapping[str, Any]) -> None:
        """``verl_optimizer`` (a checked `StateFiles`, or an older checkpoint's unsharded dict) and
        ``verl_lr_scheduler`` into the started workers."""
        optimizer = state["verl_optimizer"]
        if isinstance(optimizer, StateFiles):
            wg.load_optimizer_files(str(optimizer.check()), state.get("verl_lr_scheduler"))
        else:
            wg.load_optimizer_state(optimizer)

    # -- the step ----------------------------------------------------------------------------------------
    def _train(self, batch: TrainBatch) -> StepMetrics:
        """One policy update on verl's actor, then its weights copied into :attr:`model`.

        Unlike :class:`~swarm.train.TorchTrainer`, which stops a step at its first non-finite update,
        verl's actor skips each non-finite update and makes the step's later ones; ``batch.max_updates``
        (a journal replay) cannot stop it early, so a replay redoes every update and matches the original
        step when the non-finite gradient recurs (verl skips it again).

        Raises:
            TrainerError: Per-token advantages (distillation runs on the torch trainer for now) or a
                non-finite gradient norm at every update (nothing applied).
        """
        scalars = [float(a) for a in batch.advantages if isinstance(a, float | int)]
        if len(scalars) != len(batch.advantages):
            raise TrainerError("the verl trainer takes one advantage per sample; distil with --trainer torch")
        return self._step_scalars(batch.samples, scalars, batch.rewards)

    def _step_scalars(
        self, samples: Sequence[Sample], advantages: Sequence[float], rewards: Sequence[float] | None
    ) -> StepMetrics:
        t_start = time.perf_counter()
        cfg = self.config
        wg = self._workers()
        multiple, micro = micro_batch_layout(
            len(samples), self.settings.world_size, cfg.minibatches, cfg.micro_batch_size
        )
        batch = to_verl_batch(
            samples,
            advantages,
            pad_token_id=self.pad_token_id,
            loss_agg=cfg.loss_agg,
            norm_tokens=cfg.norm_tokens,
            multiple=multiple,
            minibatches=cfg.minibatches,
        )
        timings = StepTimings()
        recompute = self.recomputes_old_logprobs
        old, entropy = self._old_and_ref_logprobs(wg, batch.data, timings, micro, recompute=recompute)
        metrics = self._update_actor(wg, batch, timings, micro, on_policy=not recompute)
        t0 = time.perf_counter()
        if self.direct:  # the engine gets the weights from the actor (push_weights); the copy on demand
            self._copy_stale = True
        elif self.config.lora is None:
            load_full_state_dict(self._module, wg.full_state_dict()[0])
        else:  # the adapters only: the base weights never change
            load_adapter_state_dict(self._module, wg.adapter_state_dict()[0])
            self.sync_sampling_model()
        timings.weight_sync_s = time.perf_counter() - t0
        self._step += 1
        timings.total_s = time.perf_counter() - t_start
        return self._step_metrics(
            samples, advantages, rewards, batch.data, old, entropy, metrics, timings, micro
        )

    @property
    def recomputes_old_logprobs(self) -> bool:
        """Whether the next step recomputes π_θ_old with a no-grad forward (``compute_log_prob``): the torch
        trainer's rule, ``recompute_old_logprobs``, or when unset (auto) more than one optimizer update a
        step. Otherwise the step is on-policy and verl's loss takes π_θ_old from the update's own forward
        (:func:`on_policy_ppo_loss`): one forward less a step. Stale episodes (``--max-staleness``) do not
        change this: π_θ_old is the weights that start the step, not the policy that sampled the tokens,
        so the update's own forward is exactly π_θ_old for every episode, stale or not; a stale episode's
        mismatch is its μ (kept from sampling) against π_θ_old, which only the TIS weights
        ``min(π_θ_old/μ, tis_cap)`` correct, as in the torch trainer (``tests/train/test_verl_cpu.py``:
        a stale batch gives the torch trainer's loss, gradient and update; taking μ as π_θ_old would
        not)."""
        cfg = self.config
        if cfg.recompute_old_logprobs is not None:
            return cfg.recompute_old_logprobs
        return cfg.updates_per_step > 1

    def _old_and_ref_logprobs(
        self, wg: Any, data: Any, timings: StepTimings, micro: int, *, recompute: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """With ``recompute``: π_θ_old and entropy of every response token, (B, R) each, written into
        ``data`` with the truncated importance weights (``tis_cap``); ``micro`` rows a pass. Without:
        ``(None, None)`` and the behaviour logprobs stand in as ``old_log_probs`` (verl's loss requires
        the field; :func:`on_policy_ppo_loss` replaces it). π_ref (``kl_coef > 0``) either way."""
        cfg = self.config
        meta = {"compute_loss": False, "temperature": cfg.temperature, "micro_batch_size_per_gpu": micro}
        old: torch.Tensor | None = None
        entropy: torch.Tensor | None = None
        if recompute:
            t0 = time.perf_counter()
            td = worker_input(data, calculate_entropy=True, **meta)
            out = wg.compute_log_prob(td)
            old = response_values(out, "log_probs", td)
            entropy = response_values(out, "entropy", td)
            data.batch["old_log_probs"] = old
            timings.old_logprobs_s = time.perf_counter() - t0
        else:
            data.batch["old_log_probs"] = data.batch["rollout_log_probs"].clone()
        if cfg.kl_coef > 0:
            t0 = time.perf_counter()
            td = worker_input(data, calculate_entropy=False, **meta)
            data.batch["ref_log_prob"] = response_values(wg.compute_ref_log_prob(td), "log_probs", td)
            timings.ref_logprobs_s = time.perf_counter() - t0
        if cfg.tis_cap is not None and old is not None:
            mask = data.batch["response_mask"].bool()
            behaviour = data.batch["rollout_log_probs"]
            data.batch["rollout_is_weights"] = (old - behaviour).exp().clamp(max=cfg.tis_cap) * mask
        return old, entropy

    def _update_actor(
        self, wg: Any, batch: VerlBatch, timings: StepTimings, micro: int, *, on_policy: bool
    ) -> Mapping[str, Any]:
        """verl's ``update_actor`` on the batch, ``micro`` rows a forward/backward pass; returns its metrics.
        ``on_policy``: π_θ_old from this forward (:func:`on_policy_ppo_loss`), entropy computed for the
        step's statistics.

        verl's FSDP engine skips an update whose gradient norm is non-finite (zeroes its gradients) and
        goes on with the step's next one; the step counts while any update was applied (the metrics say
        how many were skipped, ``updates_nonfinite``).

        Raises:
            TrainerError: every update's gradient norm was non-finite (nothing was applied).
        """
        from verl.utils import tensordict_utils as tu

        cfg = self.config
        t0 = time.perf_counter()
        rows = batch.data.batch["input_ids"].shape[0]
        flags: dict[str, Any] = {ON_POLICY_KEY: on_policy}
        if on_policy and cfg.tis_cap is not None:
            flags[TIS_CAP_KEY] = cfg.tis_cap
        td = worker_input(
            batch.data,
            calculate_entropy=cfg.entropy_coef > 0 or on_policy,
            global_batch_size=batch.global_batch_size,
            mini_batch_size=rows // cfg.minibatches,
            epochs=cfg.ppo_epochs,
            seed=0,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
            temperature=cfg.temperature,
            micro_batch_size_per_gpu=micro,
            **flags,
        )
        metrics: Mapping[str, Any] = tu.get(wg.update_actor(td), "metrics")
        timings.fwd_bwd_s = time.perf_counter() - t0
        norms = _values(metrics, "grad_norm", "actor/grad_norm")
        if norms and not any(math.isfinite(v) for v in norms):
            raise TrainerError(
                f"non-finite gradient norm ({norms[0]}) at every update of verl's step; nothing was applied "
                "(lower lr, check rewards/advantages and logprobs)"
            )
        return metrics

    def _step_metrics(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float],
        rewards: Sequence[float] | None,
        data: Any,
        old: torch.Tensor | None,
        entropy: torch.Tensor | None,
        metrics: Mapping[str, Any],
        timings: StepTimings,
        micro: int,
    ) -> StepMetrics:
        cfg = self.config
        mask = data.batch["response_mask"].bool()
        rows = data.batch["input_ids"].shape[0]
        tokens = int(mask.sum())
        stats = _token_statistics(data, mask, old, entropy, metrics, tis=cfg.tis_cap is not None)
        norms = _values(metrics, "grad_norm", "actor/grad_norm")
        finite = [v for v in norms if math.isfinite(v)]
        nonfinite = len(norms) - len(finite)
        updates = cfg.ppo_epochs * cfg.minibatches - nonfinite
        if nonfinite:  # the loss statistics of the applied updates only (as the torch trainer's)
            metrics = {k: _applied(metrics, k, norms) for k in metrics}
        pg = _mean(metrics, "actor/pg_loss", "pg_loss") or 0.0
        kl = _mean(metrics, "kl_loss", "actor/kl_loss")
        total = _mean(metrics, "loss")
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
            entropy=stats["entropy"],
            grad_norm=sum(finite) / len(finite) if finite else 0.0,
            grad_norm_max=max(finite, default=0.0),
            # verl reports ppo_kl = mean(old − new logprob) over trained tokens; exp(−ppo_kl) is the
            # geometric mean of the ratio (our torch trainer reports the arithmetic mean).
            ratio_mean=math.exp(-(_mean(metrics, "actor/ppo_kl", "ppo_kl") or 0.0)),
            logprob_drift_mean=stats["drift_mean"],
            logprob_drift_max=stats["drift_max"],
            tis_weight_mean=stats["tis_mean"] if cfg.tis_cap is not None else None,
            lr=cfg.lr,
            updates=updates,
            updates_nonfinite=nonfinite,
            # per rank: each of the world_size ranks runs this many micro-batches
            micro_batches=(updates + nonfinite)
            * -(-rows // (cfg.minibatches * self.settings.world_size * micro)),
            time_s=timings,
            created_at=time.time(),
        )


def _token_statistics(
    data: Any,
    mask: torch.Tensor,
    old: torch.Tensor | None,
    entropy: torch.Tensor | None,
    metrics: Mapping[str, Any],
    *,
    tis: bool,
) -> dict[str, float]:
    """Means over trained tokens of entropy, |μ − π_θ_old| and the TIS weight, and the largest |μ − π_θ_old|:
    from the recomputed π_θ_old (``old``, ``entropy``: (B, R)) or, on-policy, from the sums
    :func:`on_policy_ppo_loss` reported in verl's ``metrics``."""
    if old is not None and entropy is not None:
        if not bool(mask.any()):
            return {"entropy": 0.0, "drift_mean": 0.0, "drift_max": 0.0, "tis_mean": 0.0}
        drift = (data.batch["rollout_log_probs"] - old).abs()[mask]
        return {
            "entropy": float(entropy[mask].mean()),
            "drift_mean": float(drift.mean()),
            "drift_max": float(drift.max()),
            "tis_mean": float(data.batch["rollout_is_weights"][mask].mean()) if tis else 0.0,
        }
    tokens = sum(_values(metrics, "swarm/tokens"))
    per_token = 1.0 / tokens if tokens > 0 else 0.0
    return {
        "entropy": sum(_values(metrics, "swarm/entropy_sum")) * per_token,
        "drift_mean": sum(_values(metrics, "swarm/drift_sum")) * per_token,
        "drift_max": _max(metrics, "swarm/drift_max") or 0.0,
        "tis_mean": sum(_values(metrics, "swarm/tis_sum")) * per_token,
    }


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


def _applied(metrics: Mapping[str, Any], key: str, norms: Sequence[float]) -> Any:
    """``metrics[key]`` without the values of the updates whose gradient norm (``norms``, one per update)
    was non-finite, where its values split evenly into the updates (a value per update or per
    micro-batch); else as it is. The ``swarm/`` token sums (statistics of the step's starting weights)
    are kept whole."""
    value = metrics[key]
    if key.startswith("swarm/") or not isinstance(value, list | tuple) or len(value) % len(norms):
        return value
    per = len(value) // len(norms)
    return [v for i, v in enumerate(value) if math.isfinite(norms[i // per])]


def _mean(metrics: Mapping[str, Any], *keys: str) -> float | None:
    vals = _values(metrics, *keys)
    return sum(vals) / len(vals) if vals else None


def _max(metrics: Mapping[str, Any], *keys: str) -> float | None:
    vals = _values(metrics, *keys)
    return max(vals) if vals else None
