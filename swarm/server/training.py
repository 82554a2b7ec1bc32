"""The server's training loop: batch selection, drain, GRPO/PPO step, live weight update, checkpoints.

It moves the server's state machine (`swarm.server.phase`, docs/ARCHITECTURE.md §State machine)
through ``draining`` and ``training``: a ready batch drains the open episodes, then one step trains on
it (docs/ARCHITECTURE.md §The training step).

Asynchronous mode (``max_staleness = K``): no ``draining``; ``rolling ──batch ready──► training``, and
``begin`` is admitted during ``training`` too. The staleness of an episode trained by the step that
updates policy version ``s`` to ``s + 1`` is ``s − v``, ``v`` the policy version of its oldest call. No
episode keeps sampling once it is K versions behind: when a step starts, open episodes with
``v < s + 1 − K`` are aborted as infra failures (the runner re-runs them), and admission holds at most
``(K + 1)·B·G`` train episodes ahead of the trainer (AReaL's rule), so the pool cannot run away from
it when rollouts are faster than updates. Finished episodes are never dropped: like in synchronous mode, one that waits in the pool for the rest of its group is trained with
the group (``staleness_max`` reports it). The loss corrects for the older sampler with the recorded
logprobs (``tis_cap``), the decoupled PPO objective of AReaL (Fu et al. 2025: clip against the current
policy, importance weight from the behaviour policy).

What a client sees: in ``draining`` and ``training`` (and ``paused``) ``POST /api/v1/episodes`` answers
``503`` with ``Retry-After`` (``SwarmClient`` waits and retries); completions of episodes that are still
open while draining are served normally; at the drain timeout they are aborted as infrastructure
failures (excluded from groups, never trained). During ``training`` generation is paused
(`Engine.pause`), so any completion request waits and is then sampled by the new weights.

Crash safety: an episode is marked consumed (``trained_step``) only after the step's update. On restart
the newest checkpoint is loaded and :meth:`Pool.rewind` un-marks episodes consumed by later steps
(their update was lost with the process), so each pooled episode trains exactly once for the persisted
policy line, and the step counter continues from the checkpoint (``checkpoint_every=1`` makes that the
last completed step).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from swarm.batch import (
    Batch,
    BatchConfig,
    BatchPolicy,
    ClientVotes,
    EpisodeSummary,
    FamilyQuotas,
    admit,
    select_batch,
)
from swarm.config import TrainingConfig, check_weighting
from swarm.engine.base import Engine
from swarm.errors import RequestError, Unavailable
from swarm.pool import Pool, StoredEpisode
from swarm.precision import MixedPrecision
from swarm.protocol import (
    ConfigPatch,
    EngineState,
    EpisodeKind,
    EpisodeStatus,
    SamplingDefaults,
    ServerStepMetrics,
    StepMetrics,
)
from swarm.server.checkpoints import latest_checkpoint, load_trainer_state, load_weights, save_checkpoint
from swarm.server.episodes import OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.phase import Phase
from swarm.tracking.merge import LossWeighting, MergeStats, aggregate_stats, build_samples
from swarm.tracking.records import CallRecord, Sample
from swarm.train import (
    LIVE_FIELDS,
    TorchTrainer,
    TrainerConfig,
    TrainerError,
    episode_advantages,
)


def _problem(err: Any) -> tuple[str, str | None]:
    """(``"field: message"``, field) of one pydantic error of a staged config; the field is named as in
    the PATCH body where it has a name there."""
    loc = [str(p) for p in err.get("loc", ())]
    field = {"policy": "batch_policy", "shares": "quotas"}.get(loc[0], loc[0]) if loc else None
    message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"{field}: {message}" if field else message), field


TRAINER_FIELDS = (frozenset(LIVE_FIELDS) & frozenset(ConfigPatch.model_fields)) - {"temperature"}
"""Patch fields that go to the trainer. Not ``temperature``: the patch's is the *sampling* default, while
the trainer's must stay at the temperature the engine records logprobs with (1.0), or every importance
ratio of the next step would be off."""
# Policies whose batch is B·G episodes that always form once admitted episodes end. Not
# `informative_tasks`: zero-signal groups are consumed only when an informative batch forms, so holding
# admission on them could wait forever on a task the policy always fails.
_SIZED_POLICIES = frozenset({BatchPolicy.EPISODES, BatchPolicy.TASKS})


def _summary(ep: StoredEpisode) -> EpisodeSummary:
    kind: Literal["train", "eval"] = "train" if ep.kind is EpisodeKind.TRAIN else "eval"
    return EpisodeSummary(
        episode_id=ep.id,
        task_id=ep.task_id,
        client_id=ep.client_id,
        family=ep.family,
        kind=kind,
        status=ep.status,
        reward=ep.reward,
        finished_at=ep.finished_at,
    )


def agent_advantages(
    groups: dict[str, list[str]],
    rewards: dict[str, float],
    agent_rewards: dict[str, dict[str, float]],
    *,
    normalize_std: bool = True,
) -> dict[tuple[str, str], float]:
    """GRPO advantages per agent for multi-agent episodes that report per-agent rewards.

    For each group (task) and each agent named in any of its episodes' ``agent_rewards``, the agent's
    rewards across the G episodes form its own group: ``A_{i,a} = (r_{i,a} − mean_j r_{j,a}) / std_j r_{j,a}``
    (Shao et al. 2024, eq. of §4.1.2, applied per agent), where an episode that did not report agent
    ``a`` falls back to its scalar reward. Agents without per-agent rewards use the episode advantage.

    Args:
        groups: task_id → episode ids (``Batch.groups``).
        rewards: episode_id → scalar reward (``Batch.rewards``).
        agent_rewards: episode_id → {agent: reward} for episodes that reported them.
        normalize_std: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        (episode_id, agent) → advantage, for every agent named in ``agent_rewards`` of the group.
    """
    import torch

    from swarm.train import grpo_advantages

    out: dict[tuple[str, str], float] = {}
    for episode_ids in groups.values():
        agents = sorted({a for e in episode_ids for a in agent_rewards.get(e, {})})
        for agent in agents:
            rewards_G = torch.tensor(
                [agent_rewards.get(e, {}).get(agent, rewards[e]) for e in episode_ids], dtype=torch.float64
            )
            adv_G = grpo_advantages(rewards_G, normalize_std=normalize_std)
            out.update({(e, agent): float(a) for e, a in zip(episode_ids, adv_G.tolist(), strict=True)})
    return out


@dataclass(frozen=True)
class _Drain:
    """What happened to open episodes before a step (reported in its metrics)."""

    seconds: float = 0.0
    """Spent draining (synchronous)."""
    aborted: int = 0
    """Aborted at the drain timeout (synchronous)."""
    stale_aborted: int = 0
    """Aborted as too stale when the step started (asynchronous)."""


class TrainingLoop:
    """Owns the trainer, the policy step counter, votes, quotas window, metrics history and checkpoints.

    Built from the server's parts, never the server itself: it reads ended episodes from ``pool``
    (indexed as ``episodes`` ends them: it subscribes to their on-end callback), moves ``phase`` through
    draining and training, updates ``engine``'s weights through the `Engine` protocol and logs to
    ``events``.

    Args:
        config: training configuration (live patches change it in place).
        engine: the engine being sampled; the trainer updates its `Engine.trainable_module`.
        pool: the episode pool.
        episodes: the open episodes (drained or aborted before a step).
        events: the server's event log.
        phase: the server's state machine.
        run_dir: holds ``metrics.jsonl`` and ``checkpoints/``.
        sampling: the server's sampling defaults (live patches of temperature, top_p and max_tokens
            change them in place).
        mixed_precision: compute dtype of the trainer's forward passes; the engine's, whose logprobs
            are the behaviour policy (resolved, not ``AUTO``).
    """

    def __init__(
        self,
        config: TrainingConfig,
        *,
        engine: Engine,
        pool: Pool,
        episodes: OpenEpisodes,
        events: EventLog,
        phase: Phase,
        run_dir: Path,
        sampling: SamplingDefaults,
        mixed_precision: MixedPrecision,
    ) -> None:
        self.config = config
        self.engine = engine
        self.pool = pool
        self.episodes = episodes
        self.events = events
        self.phase = phase
        self.run_dir = run_dir
        self.sampling = sampling
        pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
        self.trainer = TorchTrainer(
            engine.trainable_module(), config.trainer, pad_token_id=int(pad), mixed_precision=mixed_precision
        )
        self.step = 0
        """The last completed step: the policy version being sampled once its update is visible."""
        self.votes = ClientVotes(config.client_timeout_s)
        self.window: Counter[str] = Counter()
        """Train episodes admitted per family since the last step (for quotas)."""
        self.metrics_path = run_dir / "metrics.jsonl"
        self.history: list[ServerStepMetrics] = []
        self._pending_trainer: dict[str, Any] = {}
        self._wakeup: asyncio.Event | None = None
        self._restore()
        # Ended, untrained train episodes in commit order: an in-memory index of the pool so that the
        # batch check after every finish costs O(pending) in memory, not a database scan.
        self._pending_lock = threading.Lock()
        self._pending: dict[str, EpisodeSummary] = {
            e.id: _summary(e) for e in pool.pending(EpisodeKind.TRAIN)
        }
        # Task → train episodes admitted and not yet consumed or retired (asynchronous admission).
        self._ahead: Counter[str] = Counter(
            p.task_id for p in self._pending.values() if p.status is not EpisodeStatus.INFRA_FAILURE
        )
        # Pending episode → policy version of its oldest call (staleness metrics).
        self._oldest_version: dict[str, int] = {
            eid: min(c.policy_version for c in calls)
            for eid, calls in pool.calls(list(self._pending)).items()
            if calls
        }
        episodes.on_end(self.released)

    # -- restore -----------------------------------------------------------------------------------------
    def _restore(self) -> None:
        latest = latest_checkpoint(self.run_dir)
        step = 0
        if latest is not None:
            step, path = latest
            load_weights(path, self.trainer.model)
            self.trainer.sync_sampling_model()
            self.trainer.load_state_dict(load_trainer_state(path))
            self.events.emit("checkpoint.loaded", f"resumed from checkpoint step {step}", step=step)
        rewound = self.pool.rewind(step)
        if rewound:
            self.events.emit(
                "pool.rewound",
                f"{rewound} episodes consumed after step {step} will be trained again (their update was lost)",
                level="warning",
                episodes=rewound,
            )
        self.step = step
        with self.engine.pause():  # with LoRA the engine samples the merged copy (or the adapters)
            self.engine.load_weights(self.trainer.sampling_model, step)
        kept = []
        if self.metrics_path.exists():
            for line in self.metrics_path.read_text().splitlines():
                try:
                    m = ServerStepMetrics.model_validate_json(line)
                except ValueError:
                    continue  # a torn last line from a crash
                if m.step <= step:
                    kept.append(m)
            self.metrics_path.write_text("".join(m.model_dump_json() + "\n" for m in kept))
        self.history = kept

    # -- admission and votes -----------------------------------------------------------------------------
    def admit(self, family: str | None, kind: EpisodeKind, task_id: str) -> None:
        """Admit a new train episode: family quotas (429) and, asynchronous, the bound on episodes ahead
        of the trainer (503), both with ``Retry-After``."""
        if kind is not EpisodeKind.TRAIN:
            return
        self._admit_ahead(task_id)
        if self.config.quotas is not None:
            decision = admit(self.config.quotas, dict(self.window), family)
            if not decision.allowed:
                raise Unavailable(decision.reason, retry_after_s=decision.retry_after_s, status_code=429)
            self.window[family or ""] += 1
        with self._pending_lock:
            self._ahead[task_id] += 1

    def _admit_ahead(self, task_id: str) -> None:
        """Asynchronous back-pressure (AReaL's admission rule): at most ``(K + 1)·B·G`` train episodes
        admitted and not yet consumed by a step, so rollouts run at most K steps ahead of the trainer
        (the `episodes` and `tasks` policies; see `_SIZED_POLICIES`).
        A group already begun may always complete, or a `tasks` batch could never form."""
        k, batch = self.config.max_staleness, self.config.batch
        if k is None or batch.policy not in _SIZED_POLICIES:
            return
        limit = (k + 1) * batch.batch_size * batch.group_size
        with self._pending_lock:
            ahead = sum(self._ahead.values())
            group_open = 0 < self._ahead[task_id] < batch.group_size
        if ahead < limit or (group_open and batch.policy is not BatchPolicy.EPISODES):
            return
        raise Unavailable(
            f"asynchronous training: {ahead} train episodes are ahead of the trainer and max_staleness "
            f"{k} allows (K+1)·B·G = {limit}; retry after the next step",
            retry_after_s=1.0,
        )

    def released(self, episode: StoredEpisode, calls: list[CallRecord]) -> None:
        """An episode ended (and is in the pool): index it, give infra failures' quota slots back, wake."""
        if episode.kind is not EpisodeKind.TRAIN or episode.status is EpisodeStatus.PREPARED:
            return  # a prepared member is indexed when its transaction commits (or aborts)
        family = episode.family or ""
        if episode.status is EpisodeStatus.INFRA_FAILURE and self.window[family] > 0:
            self.window[family] -= 1
        with self._pending_lock:
            self._pending[episode.id] = _summary(episode)
            if calls:
                self._oldest_version[episode.id] = min(c.policy_version for c in calls)
            if episode.status is EpisodeStatus.INFRA_FAILURE:  # retired, never trained: no longer ahead
                self._less_ahead(episode.task_id)
        self.wake()

    def _less_ahead(self, task_id: str) -> None:
        self._ahead[task_id] -= 1
        if self._ahead[task_id] <= 0:
            del self._ahead[task_id]

    def _consumed(self, episode_ids: list[str], step: int) -> None:
        self.pool.mark_trained(episode_ids, step)
        with self._pending_lock:
            for eid in episode_ids:
                summary = self._pending.pop(eid, None)
                self._oldest_version.pop(eid, None)
                if summary is not None and summary.status is not EpisodeStatus.INFRA_FAILURE:
                    self._less_ahead(summary.task_id)

    def vote(self, client_id: str, ready: bool) -> None:
        self.votes.vote(client_id, ready)
        self.wake()

    def touch(self, client_id: str) -> None:
        """A sign of life from ``client_id`` (it stays active for the voting policies)."""
        self.votes.touch(client_id)

    def leave(self, client_id: str) -> None:
        """``client_id`` said goodbye: it no longer counts as active (nor its vote); the policy is rechecked."""
        self.votes.forget(client_id)
        self.wake()

    def _recheck_s(self) -> float | None:
        """Seconds between batch checks with no wake-up: the voting policies' liveness makes a batch
        ready by the clock alone (a silent client times out), so they are rechecked every second or
        quarter timeout; the other policies only change on a finish, a vote or a patch."""
        timeout = self.votes.active_timeout_s
        if timeout is None or self.config.batch.policy in _SIZED_POLICIES | {BatchPolicy.INFORMATIVE_TASKS}:
            return None
        return min(1.0, timeout / 4)

    def wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # -- live config -------------------------------------------------------------------------------------
    def apply(self, patch: ConfigPatch) -> dict[str, Any]:
        """Validate and stage a live config change; returns the fields changed.

        Raises:
            RequestError: the combined configuration is invalid (422).
        """
        nulls = sorted(name for name in patch.model_fields_set if getattr(patch, name) is None)
        if nulls:
            hint = (
                "; the synchronous/asynchronous mode is set at start (restart without --max-staleness "
                "to train synchronously)"
                if nulls[0] == "max_staleness"
                else ""
            )
            raise RequestError(
                f"invalid config change: {nulls[0]}: null is not a value (leave a field out to keep it){hint}",
                status_code=422,
                param=nulls[0],
            )
        changes = patch.model_dump(exclude_none=True)
        if "max_staleness" in changes and self.config.max_staleness is None:
            raise RequestError(
                "invalid config change: max_staleness: this server trains synchronously; "
                "start it with --max-staleness K to run asynchronously",
                status_code=422,
                param="max_staleness",
            )
        trainer_changes = {k: v for k, v in changes.items() if k in TRAINER_FIELDS}
        try:
            if trainer_changes:
                merged = {**self.trainer.config.model_dump(), **self._pending_trainer, **trainer_changes}
                new = TrainerConfig.model_validate(merged)
                check_weighting(self.config.loss_weighting, new.loss_agg)
                if new.kl_coef > 0 and new.lora is None and self.config.trainer.kl_coef == 0:
                    raise ValueError(
                        "kl_coef > 0 with full fine-tuning needs the server started with kl_coef > 0"
                    )
            batch_fields = {"batch_policy": "policy", "batch_size": "batch_size", "group_size": "group_size"}
            batch_changes = {batch_fields[k]: v for k, v in changes.items() if k in batch_fields}
            new_batch = (
                BatchConfig.model_validate({**self.config.batch.model_dump(), **batch_changes})
                if batch_changes
                else None
            )
            quotas: FamilyQuotas | Literal[False] | None = False
            if "quotas" in changes:
                shares = changes["quotas"]
                group = new_batch.group_size if new_batch else self.config.batch.group_size
                quotas = FamilyQuotas(shares=shares, slack=group) if shares else None
        except ValidationError as exc:  # one readable line: "field: what is wrong; …"
            problems = [_problem(err) for err in exc.errors()]
            # A check across fields (group_size 1 with the `tasks` policy) has no location: name the
            # first field of the patch it concerns.
            involved = [name for name in changes if name in ("batch_policy", "batch_size", "group_size")]
            param = (problems[0][1] if problems else None) or (involved[0] if involved else None)
            raise RequestError(
                f"invalid config change: {'; '.join(p for p, _ in problems)}", status_code=422, param=param
            ) from None
        except ValueError as exc:
            raise RequestError(f"invalid config change: {exc}", status_code=422) from exc
        self._pending_trainer.update(trainer_changes)
        if new_batch is not None:
            self.config.batch = new_batch
        if quotas is not False:
            self.config.quotas = quotas
            self.window.clear()
        for name in ("temperature", "top_p", "max_tokens"):
            if name in changes:
                setattr(self.sampling, name, changes[name])
        for name, attr in (
            ("normalize_std", "normalize_std"),
            ("training_enabled", "enabled"),
            ("drain_timeout_s", "drain_timeout_s"),
            ("max_staleness", "max_staleness"),
            ("checkpoint_every", "checkpoint_every"),
            ("max_steps", "max_steps"),
        ):
            if name in changes:
                setattr(self.config, attr, changes[name])
        self.events.emit("config.changed", f"config changed: {sorted(changes)}", changes=changes)
        self.wake()
        return changes

    def effective_config(self) -> dict[str, Any]:
        """The configuration the next step will use (staged changes included)."""
        trainer = {**self.trainer.config.model_dump(mode="json"), **self._pending_trainer}
        return {
            "training": {**self.config.model_dump(mode="json", exclude={"trainer"}), "trainer": trainer},
            "sampling": self.sampling.model_dump(),
        }

    # -- the loop ----------------------------------------------------------------------------------------
    def _can_train(self) -> bool:
        if not self.config.enabled or self.phase.state is EngineState.PAUSED:
            return False
        return self.config.max_steps is None or self.step < self.config.max_steps

    def _select(self) -> Batch | None:
        with self._pending_lock:
            pending = list(self._pending.values())
        if not pending:
            return None
        return select_batch(self.config.batch, pending, self.votes)

    async def run(self) -> None:
        """Background task: wait for wake-ups, train whenever the batch policy is satisfied."""
        self._wakeup = asyncio.Event()
        self._wakeup.set()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=self._recheck_s())
            await asyncio.sleep(0.02)  # coalesce a burst of finishes into one batch check
            self._wakeup.clear()
            try:
                await self._maybe_step()
            except Exception as exc:  # a failed step must not kill the server: report it and keep serving
                self.phase.end_step()
                self.events.emit(
                    "train.failed", f"training step failed: {type(exc).__name__}: {exc}", level="error"
                )
                await asyncio.sleep(1.0)

    async def _maybe_step(self) -> None:
        if not self._can_train() or self._select() is None:
            return
        if self.config.max_staleness is not None:
            await self._step(_Drain(stale_aborted=len(self._abort_too_stale())))
            return
        self.phase.drain()
        drain_started = time.monotonic()
        deadline = drain_started + self.config.drain_timeout_s
        while len(self.episodes) and time.monotonic() < deadline and self.phase.state is EngineState.DRAINING:
            await asyncio.sleep(0.05)
        if self.phase.state is not EngineState.DRAINING:  # paused while draining
            return
        aborted = self.episodes.abort_open("aborted at the drain timeout before a training step")
        await self._step(_Drain(seconds=time.monotonic() - drain_started, aborted=len(aborted)))

    def _abort_too_stale(self) -> list[str]:
        """Asynchronous mode: abort open episodes that the staleness bound keeps out of every later step."""
        assert self.config.max_staleness is not None
        version = self.step + 1 - self.config.max_staleness
        return self.episodes.abort_older_than(
            version,
            f"too stale: a call was sampled before policy version {version} and max_staleness is "
            f"{self.config.max_staleness} (step {self.step + 1} is starting)",
        )

    async def _step(self, drain: _Drain) -> None:
        """Train on the next batch (the phase is ``idle``/``rolling``/``draining``; ``rolling`` after)."""
        batch = self._select()
        if batch is None:
            self.phase.end_step()
            return
        self.phase.train()
        self.events.emit(
            "train.started", f"training step {self.step + 1}: {batch.reason}", episodes=len(batch.episode_ids)
        )
        try:
            metrics = await asyncio.to_thread(self._step_blocking, batch, drain)
        finally:
            self.phase.end_step()
        if metrics is not None:
            self.events.emit(
                "train.step",
                f"step {metrics.step}: reward {metrics.reward_mean}, loss {metrics.loss:.4f}, {metrics.tokens} tokens",
                **json.loads(
                    metrics.model_dump_json(
                        include={"step", "reward_mean", "loss", "kl", "tokens", "grad_norm"}
                    )
                ),
            )
        self.wake()  # another batch may already be waiting

    def _step_blocking(self, batch: Batch, drain: _Drain) -> ServerStepMetrics | None:
        """One training step: samples and advantages → trainer.step → new weights served → episodes
        marked consumed → checkpoint → metrics logged."""
        samples, advantages, merge = self._samples(batch)
        staleness = self._staleness(batch)
        consumed = [*batch.episode_ids, *batch.dropped]
        if not samples:
            self._skip(consumed, "batch has no trainable tokens; consumed without an update", "warning")
            return None
        with self.engine.pause():  # generation waits; afterwards it samples the new weights
            self._apply_staged_trainer_config()
            self.engine.release_memory()
            try:
                base = self.trainer.step(samples, advantages, rewards=list(batch.rewards.values()))
            except TrainerError as exc:
                self._skip(consumed, f"batch rejected by the trainer: {exc}", "error")
                return None
            finally:
                self.engine.restore_memory()
            step = self.trainer.step_count
            self.engine.load_weights(self.trainer.sampling_model, step)  # waiting calls sample `step`
            # Order matters for crash safety: consumed before the checkpoint (a crash in between rewinds
            # them at restart), and the new step made visible last.
            self._consumed(consumed, step)
            self.window.clear()
            self.votes.reset()
            checkpoint_s = self._checkpoint_locked() if self._checkpoint_due(step) else 0.0
        metrics = self._metrics(base, batch, merge, drain, staleness, checkpoint_s)
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(metrics.model_dump_json() + "\n")
        self.history.append(metrics)
        self.step = step
        return metrics

    # -- the step's parts --------------------------------------------------------------------------------
    def _samples(self, batch: Batch) -> tuple[list[Sample], list[float], MergeStats]:
        """The batch's training samples (those with trained tokens), their advantages and merge stats."""
        calls = self.pool.calls(batch.episode_ids)
        stored = self.pool.episodes(batch.episode_ids)
        agent_rewards = {eid: ep.agent_rewards for eid, ep in stored.items() if ep.agent_rewards}
        advantages = episode_advantages(batch.groups, batch.rewards, normalize_std=self.config.normalize_std)
        by_agent = agent_advantages(
            batch.groups, batch.rewards, agent_rewards, normalize_std=self.config.normalize_std
        )
        weighting = LossWeighting(self.config.loss_weighting)
        samples: list[Sample] = []
        advs: list[float] = []
        stats = []
        for eid in batch.episode_ids:
            built, st = build_samples(eid, calls[eid], weighting)
            stats.append(st)
            for s in built:
                if any(s.loss_mask):
                    samples.append(s)
                    advs.append(by_agent.get((eid, s.agent), advantages.get(eid, 0.0)))
        return samples, advs, aggregate_stats(stats)

    def _staleness(self, batch: Batch) -> list[int]:
        """Per trained episode: policy version being updated − version of its oldest call."""
        with self._pending_lock:
            return [self.step - self._oldest_version.get(eid, self.step) for eid in batch.episode_ids]

    def _skip(self, consumed: list[str], message: str, level: Literal["warning", "error"]) -> None:
        """Consume a batch without an update (it would fail again) and say why."""
        self._consumed(consumed, self.step + 1)
        self.events.emit("train.skipped", message, level=level)

    def _apply_staged_trainer_config(self) -> None:
        if self._pending_trainer:
            self.trainer.update_config(**self._pending_trainer)
            self._pending_trainer.clear()

    def _checkpoint_due(self, step: int) -> bool:
        every, last = self.config.checkpoint_every, self.config.max_steps
        return step % every == 0 or (last is not None and step >= last)

    def _metrics(
        self,
        base: StepMetrics,
        batch: Batch,
        merge: MergeStats,
        drain: _Drain,
        staleness: list[int],
        checkpoint_s: float,
    ) -> ServerStepMetrics:
        return ServerStepMetrics(
            **base.model_dump(),
            batch_policy=self.config.batch.policy.value,
            groups=len(batch.groups),
            episodes_dropped=len(batch.dropped),
            calls=merge.calls,
            merge_ratio=merge.merge_ratio,
            prefix_breaks=dict(merge.prefix_breaks),
            splices=merge.splices,
            tokens_saved=merge.tokens_saved,
            drain_s=drain.seconds,
            drain_aborted=drain.aborted,
            stale_aborted=drain.stale_aborted,
            staleness_mean=sum(staleness) / len(staleness) if staleness else 0.0,
            staleness_max=max(staleness, default=0),
            checkpoint_s=checkpoint_s,
        )

    def _checkpoint_locked(self) -> float:
        started = time.perf_counter()
        save_checkpoint(
            self.run_dir,
            self.trainer.step_count,
            self.trainer.model,
            self.engine.tokenizer,
            self.trainer.state_dict(),
            keep=self.config.keep_checkpoints,
        )
        elapsed = time.perf_counter() - started
        self.events.emit(
            "checkpoint.saved",
            f"checkpoint step {self.trainer.step_count} ({elapsed:.1f} s)",
            step=self.trainer.step_count,
        )
        return elapsed

    def checkpoint(self) -> int:
        """Save a checkpoint now (blocking; generation pauses meanwhile); returns the step saved.

        A step already checkpointed (the last step of ``max_steps``, or a repeated request) is not
        written or logged again: no update happened since, so the checkpoint on disk is this state."""
        with self.engine.pause():
            latest = latest_checkpoint(self.run_dir)
            if latest is None or latest[0] != self.trainer.step_count:
                self._checkpoint_locked()
            return self.trainer.step_count


__all__ = ["TrainingLoop", "agent_advantages"]
