"""The embedded torch trainer backend: one GRPO/PPO policy update per :meth:`TorchTrainer.step`.

A step (around it, the server's side: docs/ARCHITECTURE.md §The training step), for samples ``i``
(token sequences with a loss mask) and their advantages ``Â_i``:

1. Bucket samples by length into micro-batches (right-padded, attention mask); split the batch into
   ``minibatches`` (one optimizer update each) and repeat for ``ppo_epochs``.
2. π_θ_old: log-probs of the scored tokens under the weights that start the step (no grad, eval mode),
   recomputed by the trainer; the engine's behaviour log-probs only feed the drift metric.
3. π_ref (only when ``kl_coef > 0``): the base model with LoRA adapters disabled, or a frozen copy of the
   initial weights for full fine-tuning.
4. Per micro-batch: forward with grad, ``loss_t = -min(r Â, clip(r) Â) + β k3 - c H`` per scored token
   (:mod:`swarm.train.losses`), aggregated with the normaliser of the whole minibatch so that gradient
   accumulation over micro-batches equals one big batch exactly, then ``backward``.
5. Clip the global gradient norm, AdamW step, zero the gradients.

Positions: logits at position ``t`` predict token ``t+1``, so the model is fed ``input_ids[:-1]`` and scored
on ``input_ids[1:]`` where ``loss_mask[1:] == 1``. Only scored positions go through the LM head (the
``(N, V)`` logits of completion tokens, not of prompts), which is what makes this step cheaper than scoring
every position.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from swarm.heap import return_freed_memory
from swarm.precision import MixedPrecision, autocast, require_resolved
from swarm.tracking.records import Sample
from swarm.train.adapters import NamedAdapter, adapter_parameters
from swarm.train.backend import Advantage, StepInterrupted, TrainBatch, TrainerBackend, TrainerError
from swarm.train.config import LIVE_FIELDS, TrainerConfig
from swarm.train.lora import add_adapters, merge_adapters
from swarm.train.losses import (
    aggregate_loss,
    batch_statistics,
    entropy_from_logits,
    kl_k3,
    loss_normalizer,
    ppo_clip_loss,
    selective_log_softmax,
    truncated_importance_weights,
)
from swarm.train.metrics import StepMetrics, StepTimings

__all__ = ["TorchTrainer", "TrainerError"]


@dataclass
class _MicroBatch:
    """Right-padded tensors of a few samples; ``b`` sequences, ``L`` = longest length − 1."""

    rows: list[int]
    """Indices of the samples (into the step's sample list)."""
    input_ids: torch.Tensor
    """(b, L) int64: ``input_ids[:-1]`` of each sample, padded with the pad id."""
    attention_mask: torch.Tensor | None
    """(b, L) int64, or ``None`` when no row is padded."""
    target_ids: torch.Tensor
    """(b, L) int64: ``input_ids[1:]``."""
    score_mask: torch.Tensor
    """(b, L) bool: ``loss_mask[1:] == 1``."""
    behaviour_logprobs: torch.Tensor
    """(N,) float32: engine log-probs of the scored tokens, row-major."""
    advantages_N: torch.Tensor
    """(N,) float32: advantage of each scored token (its sample's, or its own: `Advantage`)."""
    weights_b: torch.Tensor
    """(b,) float32: sample weights."""

    @property
    def tokens(self) -> int:
        return int(self.score_mask.sum())


@dataclass
class _Totals:
    """Sums over a step's micro-batches and updates; `TorchTrainer._step_metrics` turns them into means."""

    sums: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("loss", "policy_loss", "kl", "clip", "entropy", "ratio", "tokens", "drift", "grad_norm", "tis"),
            0.0,
        )
    )
    drift_max: float = 0.0
    grad_norm_max: float = 0.0
    micro_batches: int = 0

    def add(self, stats: Mapping[str, float]) -> None:
        """Add a micro-batch's sums (``drift_max`` is a running maximum)."""
        for k, v in stats.items():
            if k == "drift_max":
                self.drift_max = max(self.drift_max, v)
            else:
                self.sums[k] += v

    def merge(self, other: _Totals, *, drift_only: bool = False) -> None:
        """Add an update's totals (``drift_only``: its engine-vs-trainer drift alone, which describes the
        step's starting weights whether or not the update was applied)."""
        if drift_only:
            self.add({"drift": other.sums["drift"], "drift_max": other.drift_max})
            return
        self.add({**other.sums, "drift_max": other.drift_max})
        self.grad_norm_max = max(self.grad_norm_max, other.grad_norm_max)
        self.micro_batches += other.micro_batches


def advantage_values(samples: Sequence[Sample], advantages: Sequence[Advantage]) -> list[float]:
    """The advantages the step's statistics describe: a sample's scalar once, a per-token advantage at
    each of its trained tokens."""
    out: list[float] = []
    for s, a in zip(samples, advantages, strict=True):
        if isinstance(a, float | int):
            out.append(float(a))
        else:
            out.extend(float(x) for x, m in zip(a, s.loss_mask, strict=True) if m)
    return out


class TorchTrainer(TrainerBackend):
    """GRPO/PPO trainer over a Hugging Face causal LM, with LoRA (peft) or full fine-tuning and AdamW.

    The objective is GRPO's (Shao et al. 2024, arXiv:2402.03300, eq. 3): PPO-clip (Schulman et al. 2017,
    eq. 7) with group-relative advantages, optional DAPO clip-higher and token-level aggregation (Yu et al.
    2025), optional Dr. GRPO aggregation (Liu et al. 2025), optional k3 KL to a reference; AdamW is
    Loshchilov & Hutter 2019 (decoupled weight decay). The formulas live in :mod:`swarm.train.losses`.

    The trainer owns the optimizer and, with LoRA, wraps the model with adapters: generation must use
    :attr:`model`. A step leaves the model in eval mode.

    Args:
        model: A ``transformers`` causal LM (e.g. Llama/SmolLM2), any dtype (fp32 on CPU).
        config: Hyper-parameters.
        pad_token_id: Id used to right-pad micro-batches (never scored).
        mixed_precision: Compute dtype of the forward passes (:mod:`swarm.precision`; resolved, not
            ``AUTO``): ``BF16`` autocasts them to bfloat16 while trainable parameters, gradients and AdamW
            states stay in their dtype. It must match the engine's, whose logprobs are the behaviour policy.
        adapter: train only this named LoRA adapter of ``model``, a peft model holding several
            (`swarm.train.adapters`, a LoRA tenant): no wrapping and no merged sampling copy; each step
            makes it the active adapter (the others and the base frozen); :attr:`model` is its
            `NamedAdapter` view (checkpoints hold it alone); π_ref is the base (adapters disabled).

    Raises:
        TrainerError: The model has no trainable parameters.
        ValueError: ``mixed_precision`` is ``AUTO``.
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainerConfig,
        pad_token_id: int,
        *,
        mixed_precision: MixedPrecision = MixedPrecision.NO,
        adapter: str | None = None,
    ) -> None:
        require_resolved(mixed_precision)
        self.mixed_precision = mixed_precision
        self.config = config
        self.pad_token_id = pad_token_id
        self._step = 0
        self._ref_model: nn.Module | None = None
        self._sampler: nn.Module | None = None
        self._adapter: NamedAdapter | None = None
        self._model: nn.Module
        if adapter is not None:
            if config.lora is None:
                raise TrainerError("training a named adapter needs LoRA settings (config.lora)")
            self._model = model
            self._adapter = NamedAdapter(model, adapter)
            for param in adapter_parameters(model, adapter):
                param.requires_grad_(True)
        elif config.lora is not None:
            peft_model, self._sampler = add_adapters(model, config.lora)
            self._model = peft_model
        else:
            self._model = model
            if config.kl_coef > 0:
                self._ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self._params = (
            [p for p in self._model.parameters() if p.requires_grad]
            if adapter is None
            else adapter_parameters(model, adapter)
        )
        if not self._params:
            raise TrainerError("the model has no trainable parameters")
        self._interrupted = threading.Event()
        self.optimizer = torch.optim.AdamW(
            self._params,
            lr=config.lr,
            betas=config.betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            # The fused kernel (one pass over all parameters) exists for CPU and CUDA tensors in torch >= 2.4.
            fused=all(p.device.type in ("cpu", "cuda") for p in self._params),
        )
        self._model.eval()

    @property
    def model(self) -> nn.Module:
        """The (possibly peft-wrapped) model being trained; checkpoints save it (a named adapter: its
        `NamedAdapter` view)."""
        return self._model if self._adapter is None else cast(nn.Module, self._adapter)

    @property
    def sampling_model(self) -> nn.Module:
        """The model the engine must generate with: :attr:`model`, or with LoRA's ``merge_for_sampling`` a
        plain copy holding base + adapter weights (see :meth:`sync_sampling_model`)."""
        return self._model if self._sampler is None else self._sampler

    @torch.no_grad()
    def sync_sampling_model(self) -> None:
        """Write base + adapter delta (W + (α/r)·B·A, Hu et al. 2021 eq. 3) into the sampling copy's linear
        layers. Computed in float32 from the frozen base each time (no rounding drift), stored in the copy's
        dtype. Called after every update; call it after loading adapter weights from a checkpoint."""
        if self._sampler is None:
            return
        merge_adapters(self._model, self._sampler)

    @property
    def live_fields(self) -> frozenset[str]:
        """Every field of ``LIVE_FIELDS``: the next step reads them all."""
        return LIVE_FIELDS

    def interrupt(self) -> bool:
        """Every step from now on gives up at its next micro-batch, until its first update is applied
        (`StepInterrupted`; a step with several updates that applied one runs to its end). Thread-safe."""
        self._interrupted.set()
        return True

    def _give_up_if_interrupted(self) -> None:
        if self._interrupted.is_set():
            raise StepInterrupted(
                f"step {self._step + 1} given up before its first update: the server is stopping"
            )

    @property
    def step_count(self) -> int:
        """Optimizer-visible policy version: number of completed :meth:`step` calls."""
        return self._step

    @property
    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimizer updates (the adapters with LoRA, all weights otherwise)."""
        return list(self._params)

    # ----------------------------------------------------------------------------------------- config, state

    def update_config(self, **changes: Any) -> TrainerConfig:
        """Change live hyper-parameters; effective from the next step.

        Args:
            **changes: Fields of :class:`TrainerConfig` listed in ``LIVE_FIELDS`` (lr, clip, kl_coef, …).

        Returns:
            The new config.

        Raises:
            TrainerError: Unknown or non-live field, invalid value, or ``kl_coef > 0`` with full fine-tuning
                when the trainer was built without a reference copy.
        """
        fixed = set(changes) - LIVE_FIELDS
        if fixed:
            raise TrainerError(
                f"cannot change {sorted(fixed)} on a live trainer (live fields: {sorted(LIVE_FIELDS)})"
            )
        try:
            new = TrainerConfig.model_validate({**self.config.model_dump(), **changes})
        except ValueError as e:
            raise TrainerError(f"invalid trainer config change {changes}: {e}") from e
        if new.kl_coef > 0 and new.lora is None and self._ref_model is None:
            raise TrainerError(
                "kl_coef > 0 with full fine-tuning needs a reference copy of the initial weights; "
                "build the trainer with kl_coef > 0"
            )
        self.config = new
        for group in self.optimizer.param_groups:
            group["lr"] = new.lr
            group["weight_decay"] = new.weight_decay
            group["betas"] = new.betas
        return new

    def state_dict(self) -> dict[str, Any]:
        """Trainer state to checkpoint besides the weights: optimizer, step, config.

        Like ``torch.optim.Optimizer.state_dict``, the optimizer tensors are the live ones (no copy):
        serialise it (``torch.save``) before the next :meth:`step`.
        """
        return {
            "step": self._step,
            "optimizer": self.optimizer.state_dict(),
            "config": self.config.model_dump(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (weights are loaded separately by the caller).

        The saved live hyper-parameters (lr, clip, KL, …) are re-applied, so ``PATCH``-ed values survive a
        restart; call :meth:`update_config` afterwards to override them.
        """
        self._step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        live = {k: v for k, v in state.get("config", {}).items() if k in LIVE_FIELDS}
        if live:
            self.update_config(**live)

    # ----------------------------------------------------------------------------------------- batching

    def _micro_batches(
        self, samples: Sequence[Sample], rows: Sequence[int], adv: Sequence[Advantage]
    ) -> list[_MicroBatch]:
        """Group ``rows`` into length-sorted micro-batches (longest first)."""
        cfg = self.config
        order = sorted(rows, key=lambda i: (-len(samples[i].input_ids), i))
        chunks: list[list[int]] = []
        for i in order:
            L = len(samples[i].input_ids) - 1
            if chunks:
                cur = chunks[-1]
                longest = len(samples[cur[0]].input_ids) - 1
                fits = len(cur) < cfg.micro_batch_size and (
                    cfg.micro_batch_tokens is None
                    or (len(cur) + 1) * max(longest, L) <= cfg.micro_batch_tokens
                )
                if fits:
                    cur.append(i)
                    continue
            chunks.append([i])
        return [self._collate(samples, chunk, adv) for chunk in chunks]

    def _collate(self, samples: Sequence[Sample], rows: list[int], adv: Sequence[Advantage]) -> _MicroBatch:
        L = max(len(samples[i].input_ids) for i in rows) - 1
        b = len(rows)
        input_ids = torch.full((b, L), self.pad_token_id, dtype=torch.long)  # (b, L)
        target_ids = torch.zeros((b, L), dtype=torch.long)  # (b, L)
        attention = torch.zeros((b, L), dtype=torch.long)  # (b, L)
        score = torch.zeros((b, L), dtype=torch.bool)  # (b, L)
        behaviour = torch.zeros((b, L), dtype=torch.float32)  # (b, L)
        adv_bL = torch.zeros((b, L), dtype=torch.float32)  # (b, L)
        for r, i in enumerate(rows):
            s = samples[i]
            n = len(s.input_ids) - 1
            ids = torch.tensor(s.input_ids, dtype=torch.long)
            input_ids[r, :n] = ids[:-1]
            target_ids[r, :n] = ids[1:]
            attention[r, :n] = 1
            score[r, :n] = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
            behaviour[r, :n] = torch.tensor(s.behaviour_logprobs[1:], dtype=torch.float32)
            a = adv[i]
            adv_bL[r, :n] = (
                float(a) if isinstance(a, float | int) else torch.tensor(a[1:], dtype=torch.float32)
            )
        return _MicroBatch(
            rows=list(rows),
            input_ids=input_ids,
            attention_mask=None if bool(attention.all()) else attention,
            target_ids=target_ids,
            score_mask=score,
            behaviour_logprobs=behaviour[score],
            advantages_N=adv_bL[score],
            weights_b=torch.tensor([samples[i].weight for i in rows], dtype=torch.float32),
        )

    # ----------------------------------------------------------------------------------------- forward

    def _device(self) -> torch.device:
        return self._params[0].device

    def _scored_logits(self, model: nn.Module, mb: _MicroBatch) -> torch.Tensor:
        """Logits of the scored positions only, shape (N, V), float32, divided by the temperature."""
        device = self._device()
        input_ids = mb.input_ids.to(device)
        attention = None if mb.attention_mask is None else mb.attention_mask.to(device)
        score = mb.score_mask.to(device)
        causal_lm: Any = model
        if hasattr(
            model, "get_base_model"
        ):  # peft: adapters are injected in place, so its modules carry them
            causal_lm = model.get_base_model()  # type: ignore[operator]
        cfg = causal_lm.config
        plain_head = all(
            getattr(cfg, name, None) in (None, 1.0) for name in ("final_logit_softcapping", "logit_scale")
        )
        with autocast(device, self.mixed_precision):
            if plain_head:
                # Backbone once, then the LM head on scored positions only (saves the prompt positions' (·, V)).
                hidden = causal_lm.get_decoder()(
                    input_ids=input_ids, attention_mask=attention, use_cache=False
                )
                hidden_NH = hidden.last_hidden_state[score]  # (N, H)
                logits_NV = causal_lm.get_output_embeddings()(hidden_NH)  # (N, V)
            else:
                logits_NV = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits[
                    score
                ]
        logits_NV = logits_NV.float()
        if self.config.temperature != 1.0:
            logits_NV = logits_NV / self.config.temperature
        return logits_NV

    @torch.no_grad()
    def _logprobs(self, model: nn.Module, mb: _MicroBatch) -> torch.Tensor:
        """No-grad log-probs of the scored tokens, shape (N,)."""
        logits_NV = self._scored_logits(model, mb)
        return selective_log_softmax(
            logits_NV, mb.target_ids.to(logits_NV.device)[mb.score_mask.to(logits_NV.device)]
        )

    def _reference(self) -> AbstractContextManager[Any]:
        if self.config.lora is not None:
            return self._model.disable_adapter()  # type: ignore[operator, unused-ignore]
        return nullcontext()

    def reference_logprobs(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Reference-policy log-probs of each sample's scored tokens (for tests and diagnostics).

        Returns:
            One (N_i,) float32 tensor per sample, in sample order.

        Raises:
            TrainerError: Full fine-tuning built without a reference copy.
        """
        ref = self._ref_model if self.config.lora is None else self._model
        if ref is None:
            raise TrainerError("no reference policy: full fine-tuning trainer built with kl_coef == 0")
        was_training = self._model.training
        self._model.eval()
        out: list[torch.Tensor] = []
        with self._reference():
            for i in range(len(samples)):
                out.append(self._logprobs(ref, self._collate(samples, [i], [0.0] * len(samples))).cpu())
        self._model.train(was_training)
        return out

    # ----------------------------------------------------------------------------------------- the step

    def _train(self, batch: TrainBatch) -> StepMetrics:
        """Make one policy update (``ppo_epochs · minibatches`` optimizer steps) on a checked batch
        (:meth:`TrainerBackend.step` checks it).

        A non-finite gradient norm stops the step before that update is applied (the skip of torch.amp's
        ``GradScaler`` and of DeepSpeed/Megatron, without going on to the step's later updates). If an
        earlier update of the step was applied, the step counts: the counter advances, the sampling
        model is synced and the metrics say ``updates`` (applied) and ``updates_nonfinite = 1``. At most
        ``batch.max_updates`` updates are made (a journal replay of such a step, `swarm.server.checkpoints`).

        Raises:
            StepInterrupted: :meth:`interrupt` was called before the step's first update: nothing was
                applied (weights, optimizer state and step counter are as before the call).
            TrainerError: The step's first update has a non-finite gradient: nothing was applied (weights,
                optimizer state and step counter are as before the call).
        """
        t_start = time.perf_counter()
        try:
            if self._adapter is not None:  # its adapter active and trainable; the other adapters frozen
                self._model.set_adapter(self._adapter.name)  # type: ignore[operator]
            return self._step_checked(
                batch.samples,
                batch.advantages,
                batch.rewards,
                batch.scored_tokens,
                t_start,
                max_updates=batch.max_updates,
            )
        finally:
            # Whatever happened (including an exception mid-step), leave no stale gradient and eval mode.
            self.optimizer.zero_grad(set_to_none=True)
            self._model.eval()

    def _step_checked(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[Advantage],
        rewards: Sequence[float] | None,
        total_tokens: int,
        t_start: float,
        *,
        max_updates: int | None = None,
    ) -> StepMetrics:
        cfg = self.config
        n_mb = cfg.minibatches if cfg.minibatches <= len(samples) else len(samples)
        minibatch_rows = [list(range(len(samples)))[k::n_mb] for k in range(n_mb)]
        batches = [self._micro_batches(samples, rows, advantages) for rows in minibatch_rows]
        timings = StepTimings()
        recompute = cfg.recompute_old_logprobs
        if recompute is None:
            recompute = cfg.updates_per_step > 1
        # π_θ_old (and π_ref) of every scored token, computed once under the step's starting weights.
        self._give_up_if_interrupted()
        self._model.eval()
        old = self._old_logprobs(batches, timings) if recompute else {}
        ref = self._ref_logprobs(batches, timings) if cfg.kl_coef > 0 else {}
        totals = _Totals()
        if recompute:
            for mb in (mb for mbs in batches for mb in mbs):
                diff_N = (mb.behaviour_logprobs - old[id(mb)].cpu()).abs()
                totals.add(
                    {
                        "drift": float(diff_N.sum()),
                        "drift_max": float(diff_N.max()) if diff_N.numel() else 0.0,
                    }
                )
        self._model.train()
        planned = [(epoch, mbs) for epoch in range(cfg.ppo_epochs) for mbs in batches]
        applied, nonfinite = 0, 0
        for epoch, mbs in planned[:max_updates]:
            update = _Totals()
            grad_norm = self._update(
                mbs,
                old,
                ref,
                update,
                timings,
                measure_drift=epoch == 0 and not recompute,
                may_give_up=applied == 0,
            )
            if not math.isfinite(grad_norm):
                if applied == 0:
                    raise TrainerError(
                        f"non-finite gradient norm ({grad_norm}) at the first update of step "
                        f"{self._step + 1}; nothing was applied (lower lr, check rewards/advantages and "
                        "logprobs)"
                    )
                totals.merge(update, drift_only=True)
                nonfinite = 1
                break
            totals.merge(update)
            applied += 1
        self._model.eval()
        self.sync_sampling_model()
        if self._device().type == "cpu":
            return_freed_memory()
        self._step += 1
        timings.total_s = time.perf_counter() - t_start
        metrics = self._step_metrics(samples, advantages, rewards, total_tokens, totals, applied, timings)
        return metrics.model_copy(update={"updates_nonfinite": nonfinite}) if nonfinite else metrics

    def _old_logprobs(
        self, batches: list[list[_MicroBatch]], timings: StepTimings
    ) -> dict[int, torch.Tensor]:
        """π_θ_old of every micro-batch's scored tokens: id(micro-batch) → (N,)."""
        t0 = time.perf_counter()
        old = {id(mb): self._logprobs(self._model, mb) for mbs in batches for mb in mbs}
        timings.old_logprobs_s = time.perf_counter() - t0
        return old

    def _ref_logprobs(
        self, batches: list[list[_MicroBatch]], timings: StepTimings
    ) -> dict[int, torch.Tensor]:
        """π_ref of every micro-batch's scored tokens: id(micro-batch) → (N,)."""
        t0 = time.perf_counter()
        ref_model = self._ref_model if self.config.lora is None else self._model
        if ref_model is None:
            raise TrainerError(
                "kl_coef > 0 but no reference copy exists (full fine-tuning built with kl_coef 0)"
            )
        with self._reference():
            ref = {id(mb): self._logprobs(ref_model, mb) for mbs in batches for mb in mbs}
        timings.ref_logprobs_s = time.perf_counter() - t0
        return ref

    def _update(
        self,
        mbs: list[_MicroBatch],
        old: Mapping[int, torch.Tensor],
        ref: Mapping[int, torch.Tensor],
        totals: _Totals,
        timings: StepTimings,
        *,
        measure_drift: bool,
        may_give_up: bool = False,
    ) -> float:
        """One optimizer update on a minibatch: forward/backward of its micro-batches, clip, AdamW; returns
        the pre-clip gradient norm. A non-finite norm applies nothing (its gradients are dropped).
        ``may_give_up`` (no update of the step applied yet): an interrupt (:meth:`interrupt`) raises
        `StepInterrupted` before any micro-batch and before the update."""
        cfg = self.config
        # Normaliser of the whole minibatch: micro-batch losses then sum to the minibatch loss.
        norm = sum(
            loss_normalizer(mb.score_mask, mb.weights_b, cfg.loss_agg, norm_tokens=cfg.norm_tokens)
            for mb in mbs
        )
        t0 = time.perf_counter()
        for mb in mbs:
            if may_give_up:
                self._give_up_if_interrupted()
            totals.add(self._forward_backward(mb, old, ref, norm, measure_drift=measure_drift))
            totals.micro_batches += 1
        if may_give_up:
            self._give_up_if_interrupted()
        timings.fwd_bwd_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm))
        if math.isfinite(grad_norm):
            totals.sums["grad_norm"] += grad_norm
            totals.grad_norm_max = max(totals.grad_norm_max, grad_norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        timings.optim_s += time.perf_counter() - t0
        return grad_norm

    def _step_metrics(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[Advantage],
        rewards: Sequence[float] | None,
        total_tokens: int,
        totals: _Totals,
        updates: int,
        timings: StepTimings,
    ) -> StepMetrics:
        cfg = self.config
        sums = totals.sums
        scored = max(sums["tokens"], 1.0)
        return StepMetrics(
            step=self._step,
            samples=len(samples),
            episodes=len({s.episode_id for s in samples}),
            tokens=int(total_tokens),
            **batch_statistics(advantage_values(samples, advantages), rewards),
            loss=sums["loss"] / updates,
            policy_loss=sums["policy_loss"] / updates,
            kl=sums["kl"] / scored if cfg.kl_coef > 0 else None,
            clip_frac=sums["clip"] / scored,
            entropy=sums["entropy"] / scored,
            grad_norm=sums["grad_norm"] / updates,
            grad_norm_max=totals.grad_norm_max,
            ratio_mean=sums["ratio"] / scored,
            logprob_drift_mean=sums["drift"] / total_tokens,
            tis_weight_mean=sums["tis"] / scored if cfg.tis_cap is not None else None,
            logprob_drift_max=totals.drift_max,
            lr=cfg.lr,
            updates=updates,
            micro_batches=totals.micro_batches,
            time_s=timings,
            created_at=time.time(),
        )

    def _forward_backward(
        self,
        mb: _MicroBatch,
        old: Mapping[int, torch.Tensor],
        ref: Mapping[int, torch.Tensor],
        normalizer: float,
        *,
        measure_drift: bool,
    ) -> dict[str, float]:
        """Loss of one micro-batch (scaled by the minibatch normaliser) and its backward; returns sums."""
        cfg = self.config
        device = self._device()
        score = mb.score_mask.to(device)
        logits_NV = self._scored_logits(self._model, mb)  # (N, V)
        targets_N = mb.target_ids.to(device)[score]
        logprobs_N = selective_log_softmax(logits_NV, targets_N)  # (N,)
        old_N = old[id(mb)].to(device) if id(mb) in old else logprobs_N.detach()
        adv_N = mb.advantages_N.to(device)
        loss_N, clipped_N = ppo_clip_loss(logprobs_N, old_N, adv_N, cfg.clip_eps_low, cfg.clip_eps_high)
        tis_N: torch.Tensor | None = None
        if cfg.tis_cap is not None:
            tis_N = truncated_importance_weights(old_N, mb.behaviour_logprobs.to(device), cfg.tis_cap)
            loss_N = loss_N * tis_N
        policy_N = loss_N
        kl_N: torch.Tensor | None = None
        if cfg.kl_coef > 0:
            kl_N = kl_k3(logprobs_N, ref[id(mb)].to(device))
            loss_N = loss_N + cfg.kl_coef * kl_N
        if cfg.entropy_coef > 0:
            entropy_N = entropy_from_logits(logits_NV)
            loss_N = loss_N - cfg.entropy_coef * entropy_N
        else:
            with torch.no_grad():
                entropy_N = entropy_from_logits(logits_NV.detach())

        def to_bL(x_N: torch.Tensor) -> torch.Tensor:
            return torch.zeros(score.shape, dtype=x_N.dtype, device=device).masked_scatter(score, x_N)

        weights = mb.weights_b.to(device)
        loss = aggregate_loss(
            to_bL(loss_N), score, weights, cfg.loss_agg, norm_tokens=cfg.norm_tokens, normalizer=normalizer
        )
        loss.backward()
        with torch.no_grad():
            policy_loss = aggregate_loss(
                to_bL(policy_N.detach()),
                score,
                weights,
                cfg.loss_agg,
                norm_tokens=cfg.norm_tokens,
                normalizer=normalizer,
            )
            stats = {
                "loss": float(loss),
                "policy_loss": float(policy_loss),
                "kl": float(kl_N.sum()) if kl_N is not None else 0.0,
                "clip": float(clipped_N.sum()),
                "entropy": float(entropy_N.sum()),
                "ratio": float(torch.exp(logprobs_N.detach() - old_N).sum()),
                "tokens": float(score.sum()),
                "tis": float(tis_N.sum()) if tis_N is not None else 0.0,
            }
            if measure_drift:
                diff = (mb.behaviour_logprobs.to(device) - old_N).abs()
                stats["drift"] = float(diff.sum())
                stats["drift_max"] = float(diff.max()) if diff.numel() else 0.0
        return stats
